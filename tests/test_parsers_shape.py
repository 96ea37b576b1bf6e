"""The parser's table of message shapes (digits 1-9 read as 0): what the matcher table makes of a
message is worked out once per shape. These tests check that the shortcut changes no result:
the digit-blindness check on which it rests, messages of one shape with different values, the
digit-sensitive matcher (engine-init's ``V0`` / ``V1``), the bound, and every corpus log parsed
with and without the table."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from vllm_doctor import events as ev
from vllm_doctor.parsers import records as parsers
from vllm_doctor.ingest.envelope import Record
from vllm_doctor.parsers.records import MATCHERS, RecordParser, _digit_blind

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gen_golden_events import dump  # noqa: E402

LOGS = sorted((ROOT / "tests" / "fixtures" / "corpus" / "logs").glob("*.log")) + sorted(
    (ROOT / "tests" / "fixtures" / "logs").glob("*.log"))


@pytest.mark.parametrize("pattern, blind", [
    (r"\d+ tokens", True),
    (r"[\d.,]+x", True),
    (r"[0-9a-f]{8}", True),  # a range over every digit
    (r"\w+(?![\d.])", True),
    (r"V[01]", False),  # tells 0 and 1 apart
    (r"[1-9]\d*", False),
    (r"GPU 0", False),
    (r"[^5]", False),
    (r"(a)\1", False),  # a back-reference compares text
    (r"(?i)cuda out of memory", True),
])
def test_digit_blind(pattern, blind):
    assert _digit_blind(re.compile(pattern)) is blind


def test_only_digit_sensitive_matchers_are_always_run():
    sensitive = {m.name for m in MATCHERS if id(m) in parsers._SENSITIVE}
    assert sensitive == {m.name for m in MATCHERS if not _digit_blind(m.regex)}
    assert "engine-init" in sensitive  # (?P<eng>V[01])
    assert "stats" not in sensitive and "cuda-oom" not in sensitive


def _rec(lineno: int, msg: str) -> Record:
    return Record(lineno, msg, "INFO", 1_700_000_000.0 + lineno, "APIServer", 1, "loggers.py:271")


def test_same_shape_messages_keep_their_own_values():
    p = RecordParser("x.log")
    line = "Engine 000: Avg prompt throughput: {a}.5 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: {u}%, Prefix cache hit rate: 0.0%"
    first = p.parse(_rec(1, line.format(a=1, r=3, u="50.0")))
    second = p.parse(_rec(2, line.format(a=9, r=7, u="99.9")))
    s1 = [e for e in first if isinstance(e, ev.SchedulerStats)][0]
    s2 = [e for e in second if isinstance(e, ev.SchedulerStats)][0]
    assert (s1.prompt_tps, s1.num_running, s1.kv_cache_usage_ratio) == (1.5, 3, 0.5)
    assert (s2.prompt_tps, s2.num_running, s2.kv_cache_usage_ratio) == (9.5, 7, 0.999)
    # the same shape, a usage no KV cache can have: the builder still reads the real value
    assert p.parse(_rec(3, line.format(a=1, r=3, u="900.0"))) == []


def test_engine_init_v0_and_v1_of_one_shape():
    p = RecordParser("x.log")
    line = "Initializing a V{e} LLM engine (v0.8.3) with config: model='m', max_seq_len=4096, tensor_parallel_size=1"
    got = [[(e.version, e.engine) for e in p.parse(_rec(i, line.format(e=e))) if isinstance(e, ev.VersionSeen)]
           for i, e in ((1, 2), (2, 0), (3, 1), (4, 2))]
    # "V2" is no engine vLLM has: no match; the V0 and V1 lines of that same shape still match
    assert got == [[], [("0.8.3", "v0")], [("0.8.3", "v1")], []]


def test_shape_table_is_bounded(monkeypatch):
    monkeypatch.setattr(parsers, "_SHAPES", {})
    p = RecordParser("x.log")
    for i in range(parsers.MAX_SHAPES + 300):
        p.parse(_rec(i + 1, "x" * (i % 50) + "y" * (i // 50) + " out of memory"))
    assert 0 < len(parsers._SHAPES) <= parsers.MAX_SHAPES
    p.parse(_rec(1, "CUDA out of memory. " + "z" * (parsers.MAX_SHAPE_BYTES + 1)))  # too long to keep
    assert all(len(k) <= parsers.MAX_SHAPE_BYTES for k in parsers._SHAPES)


def test_corpus_events_are_the_same_without_the_table(monkeypatch):
    logs = LOGS  # the corpus and the handed-out logs
    warm = [dump(log) for log in logs]
    assert parsers._SHAPES, "the table was used"
    monkeypatch.setattr(parsers, "MAX_SHAPE_BYTES", -1)  # every message worked out afresh
    monkeypatch.setattr(parsers, "_SHAPES", {})
    assert [dump(log) for log in logs] == warm
    assert parsers._SHAPES == {}
    assert sum(len(w.splitlines()) for w in warm) > 500
