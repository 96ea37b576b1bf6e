"""The charts' time series (vllm_doctor/report/timeline.py): bounded whatever the log's length, one point
per stats line until the cap, peaks kept when downsampled, one series per data-parallel engine."""

from __future__ import annotations

import re

from conftest import LOGS

from vllm_doctor.ingest.oneshot import diagnose
from vllm_doctor.report.timeline import Timeline, charts, nice_top

# A real vLLM 0.32 stats line (cpu-preemption-tiny-kv-cache.log:138)
LINE = next(ln for ln in (LOGS / "cpu-preemption-tiny-kv-cache.log").read_text().splitlines()
            if "KV cache usage: 100.0%" in ln)


def stamped(i: int, line: str = LINE) -> str:
    """The line ``i`` x 10 s after 2026-11-30 00:00:00 (its own MM-DD HH:MM:SS replaced)."""
    t = i * 10
    return re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", f"11-30 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}",
                  line, count=1)


def test_long_log_is_downsampled_within_the_cap(tmp_path):
    n = 5000  # 13.9 h of 10 s stats lines
    lines = []
    for i in range(n):
        ln = stamped(i)
        if i == 3333:  # one spike must survive the downsampling
            ln = ln.replace("Waiting: 12 reqs", "Waiting: 977 reqs")
        else:
            ln = ln.replace("KV cache usage: 100.0%", "KV cache usage: 40.0%")
        lines.append(ln)
    p = tmp_path / "long.log"
    p.write_text("\n".join(lines) + "\n")
    tl = diagnose([str(p)]).timeline
    pts = tl["series"]["0"]
    assert len(pts) <= 600 and tl["stride"]["0"] == 16  # 5000 / 16 = 313 points (+ a partial one)
    assert len(pts) == -(-n // 16)
    assert max(p[3] for p in pts) == 977  # the waiting spike is kept
    assert max(p[1] for p in pts) == 1.0 and min(p[1] for p in pts) == 0.4  # the spike line is at 100 %
    assert pts[0][0] < pts[-1][0]


def test_one_point_per_stats_line_below_the_cap():
    tl = Timeline(capacity=600)
    rep = diagnose([str(LOGS / "052-v0.13-v1-single-long-generation-kv-grows.log")])
    assert len(rep.timeline["series"]["0"]) == 10 and rep.timeline["stride"]["0"] == 1
    assert tl.snapshot()["series"] == {}


def test_data_parallel_engines_are_separate_series(tmp_path):
    lines = []
    for i in range(8):
        lines.append(stamped(i))
        lines.append(stamped(i).replace("Engine 000:", "Engine 001:").replace("Waiting: 12 reqs", "Waiting: 300 reqs"))
    p = tmp_path / "dp.log"
    p.write_text("\n".join(lines) + "\n")
    rep = diagnose([str(p)])
    s = rep.timeline["series"]
    assert sorted(s) == ["0", "1"] and len(s["0"]) == len(s["1"]) == 8
    assert {pt[3] for pt in s["1"]} == {300} and {pt[3] for pt in s["0"]} == {12}
    req = next(c for c in charts(rep.timeline) if c.id == "requests")
    assert sorted(ln.label for ln in req.lines) == ["running (engine 0)", "running (engine 1)",
                                                    "waiting (engine 0)", "waiting (engine 1)"]
    assert all(ln.n == 8 for ln in req.lines)


def test_spans_and_axis():
    snap = {"series": {"": [[100.0, 0.5, 1, 0, 10.0, 20.0, None], [200.0, 1.0, 2, 5, 0.0, 30.0, None]]}}
    chs = charts(snap, [{"first_seen": 150.0, "last_seen": 250.0, "severity": "warning", "label": "VD001 x"},
                        {"first_seen": 500.0, "last_seen": 600.0, "severity": "critical", "label": "out of range"}])
    kv = chs[0]
    assert len(kv.spans) == 1 and kv.spans[0]["x"] > 56 and kv.spans[0]["color"] == "#ef6c00"
    assert [t for _, t in kv.yticks] == ["0", "50", "100"]
    assert chs[3].empty == "no preemption count over time in these inputs"
    assert "105 in total" in charts(snap, [], preemptions_total=105)[3].empty
    assert (nice_top(151), nice_top(14), nice_top(1252.3), nice_top(0)) == (200, 20, 2000, 1.0)


def test_a_gap_in_the_data_breaks_the_chart_line(tmp_path):
    # ten stats lines, an hour and five minutes without any, ten more: two lines, none drawn across the gap
    p = tmp_path / "gap.log"
    p.write_text("\n".join(stamped(i) for i in [*range(10), *range(400, 410)]) + "\n")
    chs = {c.id: c for c in charts(diagnose([str(p)]).timeline)}
    kv = [ln for ln in chs["kv"].lines if ln.name == "kv"]
    assert [ln.n for ln in kv] == [10, 10]
    assert max(float(xy.split(",")[0]) for xy in kv[0].points.split()) < min(
        float(xy.split(",")[0]) for xy in kv[1].points.split())
    # steady lines (one every 10 s, and a pause of five of them) draw one line
    q = tmp_path / "steady.log"
    q.write_text("\n".join(stamped(i) for i in [*range(10), *range(15, 25)]) + "\n")
    assert [ln.n for ln in charts(diagnose([str(q)]).timeline)[0].lines] == [20]
