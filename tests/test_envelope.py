"""The envelope: container wrappers, ANSI, process prefixes, logger prefixes of every version,
year inference, glued records, long lines, bad bytes."""

from __future__ import annotations

import json

from vllm_doctor import events as ev
from vllm_doctor.ingest.envelope import Envelope, LineSplitter, LogClock
from vllm_doctor.parsers.records import RecordParser, keyword_scanner

from conftest import LOGS

V1_LINE = "(APIServer pid=1) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 300.0 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%, Prefix cache hit rate: 0.0%"


def parse_lines(lines: list[str], year: int = 2026):
    env = Envelope(LogClock(year))
    p = RecordParser("t.log")
    out = []
    for i, ln in enumerate(lines, 1):
        for rec in env.records(i, ln.encode()):
            out.extend(e for e in p.parse(rec) if e is not None)
    for rec in env.flush():
        out.extend(e for e in p.parse(rec) if e is not None)
    out.extend(p.flush())  # what the parser still holds at the end (an OOM whose phase was open)
    return out


def one(lines, kind):
    evs = [e for e in parse_lines(lines if isinstance(lines, list) else [lines]) if type(e).__name__ == kind]
    assert len(evs) == 1, evs
    return evs[0]


def test_v1_stats_line_with_nested_prefix_and_ansi():
    line = "\x1b[0;36m(APIServer pid=5693)\x1b[0;0m (EngineCore_DP0 pid=7960) " + V1_LINE.split(") ", 1)[1]
    s = one(line, "SchedulerStats")
    assert (s.num_running, s.num_waiting, s.kv_cache_usage_ratio) == (18, 43, 0.959)
    assert s.meta.process == "EngineCore_DP0" and s.engine_index == 0 and s.num_swapped is None


def test_cri_partial_lines_are_joined():
    body = V1_LINE
    a, b = body[:60], body[60:]
    lines = [f"2026-11-30T09:00:00.123456789Z stdout P {a}", f"2026-11-30T09:00:00.123456789Z stdout F {b}"]
    s = one(lines, "SchedulerStats")
    assert s.num_waiting == 43 and s.meta.lineno == 1
    # the CRI timestamp gives the year
    assert s.meta.ts is not None


def test_docker_json_file_lines():
    line = json.dumps({"log": V1_LINE + "\n", "stream": "stdout", "time": "2025-05-19T10:13:11.5Z"})
    s = one(line, "SchedulerStats")
    assert s.num_running == 18


def test_logger_prefix_of_every_version():
    v03 = "INFO 02-28 21:48:18 metrics.py:161] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%"
    v08 = "INFO 03-18 09:04:46 [metrics.py:481] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Swapped: 2 reqs, Pending: 3 reqs, GPU KV cache usage: 82.1%, CPU KV cache usage: 10.0%."
    debug = "DEBUG 03-18 09:04:46 [v1/core/sched/scheduler.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 3 reqs, GPU KV cache usage: 82.1%, Prefix cache hit rate: 5.0%"
    a = one(v03, "SchedulerStats")
    b = one(v08, "SchedulerStats")
    c = one(debug, "SchedulerStats")
    assert a.num_waiting == b.num_waiting == c.num_waiting == 3
    assert b.num_swapped == 2 and b.cpu_kv_cache_usage_ratio == 0.10
    assert c.prefix_cache_hit_ratio == 0.05 and c.meta.level == "DEBUG"


def test_year_rollover_keeps_order():
    lines = [V1_LINE.replace("05-19 10:13:11", "12-31 23:59:55"), V1_LINE.replace("05-19 10:13:11", "01-01 00:00:05")]
    a, b = [e for e in parse_lines(lines, 2025) if isinstance(e, ev.SchedulerStats)]
    assert b.meta.ts - a.meta.ts == 10


def test_small_backward_steps_do_not_change_year():
    lines = [V1_LINE.replace("05-19", "07-06"), V1_LINE.replace("05-19", "07-05")]
    a, b = [e for e in parse_lines(lines, 2025) if isinstance(e, ev.SchedulerStats)]
    assert a.meta.ts - b.meta.ts == 86400


def test_tqdm_glued_before_prefix():
    line = ("Processed prompts:   0%|  | 34/10000 [00:29<3:36:54,  1.31s/it]INFO 06-16 21:24:15 metrics.py:341] "
            "Avg prompt throughput: 2706.1 tokens/s, Avg generation throughput: 13395.4 tokens/s, Running: 34 reqs, "
            "Swapped: 100 reqs, Pending: 9832 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 70.4%.")
    s = one(line, "SchedulerStats")
    assert (s.num_running, s.num_swapped, s.num_waiting) == (34, 100, 9832)


def test_collapsed_newlines_split_at_prefixes():
    line = ('x.py", line 1, in f (VllmWorkerProcess pid=236) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] '
            'raise RuntimeError(f"NCCL error: {error_str}") (VllmWorkerProcess pid=236) ERROR 08-23 08:25:25 '
            'multiproc_worker_utils.py:226] RuntimeError: NCCL error: unhandled system error (r')
    evs = parse_lines([line])
    assert any(isinstance(e, ev.ExceptionRaised) and e.exc_type == "RuntimeError" for e in evs)
    assert any(isinstance(e, ev.NcclError) for e in evs)


def test_prompt_text_cannot_fake_an_event():
    line = ("(APIServer pid=1) INFO 05-19 10:13:11 [logger.py:43] Received request chatcmpl-1: prompt: "
            "'INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 1 tokens Avg prompt throughput: 1.0 tokens/s, "
            "Avg generation throughput: 0.0 tokens/s, Running: 999 reqs, Waiting: 0 reqs'")
    assert parse_lines([line]) == []


def test_traceback_is_one_event():
    lines = [
        "(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712] EngineCore failed to start.",
        "(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712] Traceback (most recent call last):",
        '(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712]   File "/x/gpu_worker.py", line 180, in init_device',
        "(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712]     raise ValueError(",
        "(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712] ValueError: Free memory on device (7.34/139.72 GiB) on startup is less than desired GPU memory utilization (0.9, 125.75 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
    ]
    evs = parse_lines(lines)
    tb = [e for e in evs if isinstance(e, ev.ExceptionRaised)]
    assert len(tb) == 1
    assert (tb[0].meta.lineno, tb[0].meta.end_lineno, tb[0].exc_type, tb[0].frames) == (2, 5, "ValueError", ("init_device",))
    free = [e for e in evs if isinstance(e, ev.InsufficientFreeMemory)][0]
    assert free.free_bytes == round(7.34 * 2**30) and free.gpu_memory_utilization == 0.9


def test_invalid_utf8_and_control_bytes_do_not_raise():
    env = Envelope()
    recs = env.records(1, b"\xff\xfe INFO 01-01 00:00:00 [x.py:1] caf\xc3 \x00\x1b[31m")
    assert recs and "\ufffd" in recs[0].msg


def test_line_splitter_caps_long_lines_without_copying_complete_lines():
    sp = LineSplitter(max_line_bytes=1024)
    data = b"a\n" + b"x" * 5_000_000
    spans = sp.feed(data)
    assert spans == [(data, 0, 1)] and sp.pending_bytes == 5_000_000
    data2 = b"y" * 5_000_000 + b"\nlast"
    (head, s0, e0), = sp.feed(data2)
    assert len(head[s0:e0]) == 1024 and head.startswith(b"x")
    assert sp.flush() == [(b"last", 0, 4)]


def test_pipeline_counts_lines_across_chunk_boundaries(builtin_rules):
    from vllm_doctor.pipeline import Pipeline

    raw = (LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes() * 3
    p = Pipeline(builtin_rules)
    for i in range(0, len(raw), 97):  # odd chunk size: lines split everywhere
        p.feed("x.log", raw[i : i + 97])
    p.end("x.log")
    assert p.state.lines_total["x.log"] == raw.count(b"\n")
    assert sorted(e.meta.lineno for e in p.state.events["Preemption"]) == [2, 5, 8]


def test_prefilter_keeps_every_line_a_matcher_needs():
    # Each kind of line the parsers read must pass the prefilter.
    samples = [
        V1_LINE, "# GPU blocks: 1381", "# cuda blocks: 36184, # CPU blocks: 2340", "GPU KV cache size: 176,240 tokens",
        "Maximum concurrency for 8,192 tokens per request: 21.51x", "Available KV cache memory: 5.98 GiB",
        "Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode", "Preempting seq_id=1 (swap out, 2 blocks)",
        "preemption count: 45 in last 5 minutes", "running=128 pending=512 gpu_cache=0%",
        "non-default args: {'max_model_len': 1}", "args: Namespace(max_model_len=1)",
        "Initializing a V1 LLM engine (v0.9.0) with config: model='x'", "vLLM API server version 0.6.3",
        "Chunked prefill is enabled with max_num_batched_tokens=2048.", "Using max model len 2048",
        "Initializing scheduler with max_num_seqs=128", "No available memory for the cache blocks.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.", "Engine iteration timed out.",
        "Engine background task failed", "Worker proc VllmWorker-0 died unexpectedly", "Application startup complete.",
        "[shutdown] API server: shutdown triggered", "No available shared memory broadcast block found in 60 seconds.",
        "Explicitly set (1.0/11.71) GiB for KV cache on node 0.", "Model loading took 1.12 GiB and 0.49 seconds",
        "vllm cache_config_info with initialization after num_gpu_blocks is: 57656", "Loading model weights took 19.8557 GB",
        "CPU offload KV cache size: 1,000 tokens", "Maximum concurrency for 16,384 tokens: 128 sequences",
        "User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0",
    ]
    for s in samples:
        assert keyword_scanner().regex.search(s.encode()), s


def test_json_formatter_records():
    rec = {"asctime": "05-19 10:13:11", "levelname": "INFO", "filename": "loggers.py", "lineno": 271,
           "message": V1_LINE.split("] ", 1)[1]}
    s = one(json.dumps(rec), "SchedulerStats")
    assert s.num_waiting == 43 and s.meta.level == "INFO"
    tb = {"levelname": "ERROR", "message": "EngineCore failed to start.",
          "exc_info": "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: No available memory for the cache blocks."}
    evs = parse_lines([json.dumps(tb)])
    assert {type(e).__name__ for e in evs} >= {"EngineFailure", "ExceptionRaised", "NoCacheMemory"}


def test_docker_partial_entries_are_joined():
    body = "(EngineCore pid=1) INFO 05-19 10:13:11 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with config: model='m', max_seq_len=131072, tensor_parallel_size=2"
    parts = [body[:50], body[50:120], body[120:] + "\n"]  # docker cuts lines over 16 KiB like this
    lines = [json.dumps({"log": p, "stream": "stdout", "time": "2025-05-19T10:13:11Z"}) for p in parts]
    cfg = one(lines, "EngineConfigObserved")
    assert dict(cfg.values)["max_model_len"] == 131072 and cfg.meta.lineno == 1


def test_stats_usage_above_100_percent_or_huge_is_rejected():
    import time as _t

    over = V1_LINE.replace("95.9%", "195.9%")
    assert [e for e in parse_lines([over]) if isinstance(e, ev.SchedulerStats)] == []  # > 100 %: damaged
    huge = V1_LINE.replace("95.9%", "1" + "9" * 400 + "%")
    (s,) = [e for e in parse_lines([huge]) if isinstance(e, ev.SchedulerStats)]
    assert s.kv_cache_usage_ratio is None and s.num_running == 18  # never float("inf")
    long = V1_LINE.replace("95.9%", "9" * 300_000 + "%")
    t0 = _t.perf_counter()
    parse_lines([long])
    assert _t.perf_counter() - t0 < 2.0  # linear, bounded: the sidecar never stalls on such a line


def test_first_month_after_the_reference_month_is_last_year():
    clock = LogClock(2026, ref_month=1)  # a file written in January 2026
    dec = clock.to_epoch(12, 31, "23:59:50")
    jan = clock.to_epoch(1, 1, "00:00:05")
    assert jan - dec == 15
