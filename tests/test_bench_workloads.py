"""The benchmarks' workloads are what their figures say they are (bench/bench_memory.py,
bench/bench_diagnose.py): every line of the "keyword-bearing" log passes the keyword scan, each
kind of keyword line gives the event its name says, and the floor's minimal builders give the
same values as the parser on the same lines (so the floor is a lower bound of the same work)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_diagnose  # noqa: E402
import bench_memory  # noqa: E402

from vllm_doctor import events as ev  # noqa: E402
from vllm_doctor.ingest.envelope import Envelope, LineSplitter, LogClock, candidate_spans  # noqa: E402
from vllm_doctor.parsers.records import RecordParser, keyword_scanner  # noqa: E402


def test_every_line_of_the_keyword_log_passes_the_scan(tmp_path):
    path = tmp_path / "kw.log"
    bench_memory.write_keyword_log(path, 3000)
    data = path.read_bytes()
    split = LineSplitter()
    spans = split.feed(data) + split.flush()
    scanner = keyword_scanner()
    total = passed = 0
    for buf, a, b in spans:
        starts, _, _, nlines, _ = candidate_spans(scanner, buf, a, b)
        total += nlines
        passed += len(starts)
    assert total == 3000
    assert passed == 3000  # the short lines too: each holds one of the scan's keywords


def _events(line: str) -> list:
    env, parser = Envelope(LogClock(2026)), RecordParser("bench.log")
    out = [e for r in list(env.records(1, line.encode())) + list(env.flush()) for e in parser.parse(r)]
    return [e for e in out + parser.flush() if e is not None]


@pytest.mark.parametrize("kind,expected", [
    ("V1 stats line", ev.SchedulerStats), ("V0 preemption warning", ev.Preemption), ("OOM line", ev.OutOfMemory)])
def test_each_keyword_kind_gives_its_event_and_the_floor_builds_the_same_values(kind, expected):
    import re

    for i in (0, 1, 537):
        line = bench_diagnose.KEYWORD_LINES[kind].format(md="11-30", hms="00:00:01", a=i % 1000, b=(i * 7) % 97,
                                                        c=(i * 13) % 89)
        got = [e for e in _events(line) if type(e) is expected]
        assert len(got) == 1, (kind, _events(line))
        real = got[0]
        pattern, build = bench_diagnose.FLOOR[kind]
        cut = line.find("] ")
        msg = line[cut + 2 :] if cut >= 0 else line
        floor = build(ev.Meta(), re.compile(pattern).match(msg).groups())
        fields = [f for f in type(real).__slots__ if f not in ("meta", "phase")]
        assert [getattr(floor, f) for f in fields] == [getattr(real, f) for f in fields], kind


def test_short_lines_give_no_event():
    for i, tpl in enumerate(bench_memory.SHORT_LINES):
        assert _events(tpl.format(md="11-30", hms="00:00:01", i=i).rstrip("\n")) == []
