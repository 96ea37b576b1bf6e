"""Fuzzing (issue 21 item 10), bounded in time: a fixed number of examples, derandomized (the same
inputs on every run), each test well under 20 s. The envelope and the pipeline never raise on any
bytes and no text inside a client's value, written by vLLM's formatter, ever gives an event; the
/metrics parser never raises and never keeps an impossible value."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_doctor.ingest.envelope import Envelope, LogClock, Record
from vllm_doctor.ingest.scrape import MAX_BUCKETS, MAX_ENGINES, MAX_VALUE, parse_metrics
from wrapping import WRAPPERS, run, wrap

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
FUZZ_PIPELINE = settings(FUZZ, max_examples=20)  # a pipeline per example (its rules, state and windows)

# Pieces that vLLM's lines, wrappers and hostile text are made of: a fuzzer that only drew random
# bytes would almost never write a logger prefix.
PIECES = st.sampled_from([
    "INFO 11-30 10:00:00 [kv_cache_utils.py:1] ", "(EngineCore_DP0 pid=1) ", "ERROR 12-31 23:59:59 [core.py:1] ",
    "GPU KV cache size: 16 tokens", "torch.OutOfMemoryError: CUDA out of memory. ", "NCCL error: unhandled system error",
    "EngineCore failed to start.", "Traceback (most recent call last):", "Added request ", "Received request x: prompt: '",
    "2026-11-30T10:00:00.1Z stdout P ", "2026-11-30T10:00:00.1Z stderr F ", '{"log": "', '"stream": "stderr"}', "\r", "\n",
    "\x00", "\x1b[31m", "> ", "vllm-1  | ", "Nov 30 10:00:00 host vllm[1]: ", "Avg prompt throughput: 1.0 tokens/s, ",
    "Running: 9999 reqs, Waiting: 1 reqs, GPU KV cache usage: 100.0%", "}", "{", '"', "\\", "é", "\u2028",
])
TEXT = st.lists(st.one_of(PIECES, st.text(max_size=20)), max_size=30).map("".join)


@FUZZ
@given(lines=st.lists(st.one_of(TEXT.map(str.encode), st.binary(max_size=200)), max_size=20))
def test_the_envelope_never_raises(lines):
    env = Envelope(LogClock(2026))
    for n, raw in enumerate(lines, 1):
        for rec in env.records(n, raw.replace(b"\n", b" ")):
            assert isinstance(rec, Record) and isinstance(rec.msg, str)
    for rec in env.flush():
        assert isinstance(rec.msg, str)


@FUZZ_PIPELINE
@given(data=TEXT, chunk=st.integers(min_value=1, max_value=64), serve=st.booleans())
def test_the_pipeline_never_raises(data, chunk, serve):
    pipe, _ = run(data, serve=serve, chunk=chunk)
    pipe.evaluate()
    pipe.report().to_dict()


PREFIXES = ["(APIServer pid=7) INFO 11-30 10:00:00 [async_llm.py:578] ", "INFO 11-30 10:00:00 [async_llm.py:204] ",
            "INFO 11-30 10:00:00 async_llm_engine.py:211] "]


@FUZZ_PIPELINE
@given(value=TEXT, prefix=st.sampled_from(PREFIXES), wrapper=st.sampled_from([w for w in WRAPPERS if w != "json"]),
       serve=st.booleans())
def test_no_event_from_a_request_id_written_by_vllms_formatter(value, prefix, wrapper, serve):
    # NewLineFormatter: every newline of the message becomes "\r\n" + the message's prefix
    msg = prefix + "Added request " + value.replace("\r", "") + "."
    lines = msg.replace("\n", "\r\n" + prefix).split("\n")
    pipe, events = run(wrap(wrapper, lines), serve=serve, chunk=4096 if serve else 0)
    assert events == [], [type(e).__name__ for e in events]


LABEL = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
NAMES = st.sampled_from(["vllm:num_requests_running", "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc",
                         "vllm:time_to_first_token_seconds_bucket", "vllm:cache_config_info", "vllm:prompt_tokens_total",
                         "x", "# HELP", "# TYPE vllm:num_requests_running gauge"])
VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "0", "x"]))
SAMPLE = st.tuples(NAMES, st.dictionaries(st.sampled_from(["le", "engine", "model_name", "block_size"]), LABEL, max_size=3),
                   VALUES).map(lambda t: t[0] + ("{" + ",".join(f'{k}="{v}"' for k, v in t[1].items()) + "}" if t[1] else "")
                               + " " + t[2])


@FUZZ
@given(lines=st.lists(st.one_of(SAMPLE, st.text(max_size=40)), max_size=40))
def test_the_metrics_parser_never_raises_nor_keeps_an_impossible_value(lines):
    p = parse_metrics("\n".join(lines) + "\n", now=0.0)
    s = p.sample
    for f in ("num_running", "num_waiting", "num_preemptions_total", "prompt_tokens_total", "kv_cache_usage_ratio"):
        v = getattr(s, f)
        assert v is None or (math.isfinite(v) and 0 <= v <= MAX_VALUE), (f, v)
    assert len(s.ttft_buckets) <= MAX_BUCKETS and len(s.engines) <= MAX_ENGINES
