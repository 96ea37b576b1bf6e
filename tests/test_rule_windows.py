"""Window aggregates (vllm_doctor/state/windows.py): kept by the state line by line, bounded per
window, read by the rules; long windows are evaluated exactly, never skipped (issue 10, item 4)."""

from __future__ import annotations

import random

import pytest

from vllm_doctor.diagnosis.expr import slope_per_hour
from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.pipeline import Pipeline
from vllm_doctor.state.windows import MAX_BUCKETS, WindowAggregate

RULESET = load_rules()
# vLLM 0.4's V0 stats line (engine/metrics.py), as in tests/fixtures/corpus/logs/126-*.log
V0_STATS = ("INFO 07-24 {hh:02d}:{mm:02d}:{ss:02d} metrics.py:334] Avg prompt throughput: {prompt:.1f} tokens/s, "
            "Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, Swapped: 0 reqs, "
            "Pending: {waiting} reqs, GPU KV cache usage: {kv:.1f}%, CPU KV cache usage: 0.0%")


def _line(second: int, **kw) -> str:
    t = 9 * 3600 + 50 * 60 + second
    return V0_STATS.format(hh=t // 3600, mm=t // 60 % 60, ss=t % 60, **kw)


def _diagnose(lines: list[str], ruleset=RULESET):
    p = Pipeline(ruleset, follow=False, base_year=2025)
    p.run_files([("long.log", [("\n".join(lines) + "\n").encode()])])
    return p, p.report()


def test_kv_capacity_bound_over_12000_stats_lines_in_its_window_is_exact():
    # 12,000 stats lines within 250 s (48 a second), all inside VD004's 300 s window; every 4th
    # line has the KV cache full with requests waiting
    lines = [_line(i // 48, prompt=0.0, gen=1000.0, running=100 + i % 50, waiting=10 + i % 7,
                   kv=99.0 if i % 4 == 0 else 50.0) for i in range(12_000)]
    p, rep = _diagnose(lines)
    assert rep.rule_errors == {}
    f = {x.rule_id: x for x in rep.findings}["VD004"]
    full = [i for i in range(12_000) if i % 4 == 0]
    assert f.values["n_full"] == len(full) == 3000
    assert f.values["running_at_full"] == max(100 + i % 50 for i in full) == 148
    assert f.values["waiting_peak"] == max(10 + i % 7 for i in full) == 16
    # running + waiting at most 149 + 16, below the V0 default max_num_seqs of 256
    assert f.values["demand"] == max(100 + i % 50 + 10 + i % 7 for i in range(12_000)) == 165
    # the evidence is bounded (first and last lines of the window), not 3000 lines
    assert 1 <= len(f.evidence) <= 8
    # memory is bounded per window: one bucket per second at most, whatever the number of lines
    for aggs in p.engine._windows.values():
        for agg in aggs.values():
            assert agg.memory_items() <= min(251, agg.max_buckets) + 1


def test_prefill_blocking_over_12000_stats_lines_in_its_window_is_exact():
    # 12,000 lines in 100 s (VD003's window is 120 s): every 10th line is a long prefill that
    # stalls decode (generation 0) with requests waiting
    lines = []
    for i in range(12_000):
        stalled = i % 10 == 0
        lines.append(_line(i // 120, prompt=1000.0 + i % 100 if stalled else 0.0, gen=0.0 if stalled else 300.0,
                           running=20, waiting=1 + i % 9, kv=30.0))
    _, rep = _diagnose(lines)
    assert rep.rule_errors == {}
    f = {x.rule_id: x for x in rep.findings}["VD003"]
    stalled = [i for i in range(12_000) if i % 10 == 0]
    assert f.values["n_stalled"] == len(stalled) == 1200
    assert f.values["prompt_peak"] == max(1000.0 + i % 100 for i in stalled) == 1090.0
    assert f.values["gen_low"] == 0.0
    assert f.values["waiting_peak"] == 9
    assert f.values["gen_peak"] == 300.0


def test_a_rule_whose_window_condition_fails_is_a_visible_vd000_finding_and_a_metric(tmp_path):
    (tmp_path / "XX100-bad-window.yaml").write_text(
        "id: XX100\nname: bad-window\ntitle: t\nseverity: warning\ncategory: test\nwindow: 300\n"
        "windows:\n  odd:\n    of: stats\n    where: int('x%d' % num_running) > 0\n    fields: [num_running]\n"
        "when:\n  all:\n    - odd.count > 0\nmessage: m\ndocs: {why: w, example_log: e}\n")
    rs = load_rules([tmp_path])
    _, rep = _diagnose([_line(i, prompt=0.0, gen=10.0, running=3, waiting=0, kv=10.0) for i in range(5)], rs)
    assert "XX100" in rep.rule_errors
    assert "ValueError" in rep.rule_errors["XX100"][-1]
    vd000 = {x.rule_id: x for x in rep.findings}["VD000"]
    assert "XX100 (bad-window)" in vd000.message
    p = Pipeline(rs, follow=False, base_year=2025)
    p.run_files([("a.log", [("\n".join(_line(i, prompt=0.0, gen=10.0, running=3, waiting=0, kv=10.0)
                                       for i in range(5)) + "\n").encode()])])
    assert p.engine.rule_errors_total["XX100"] >= 1


def _agg(span: float = 300.0, quantiles=("v",)) -> WindowAggregate:
    return WindowAggregate("w", span, {"v": lambda x: x[1]}, None, quantiles)


def test_aggregate_counts_maxima_slope_and_quantiles_exactly():
    rng = random.Random(7)
    agg = _agg()
    pts = [(1000.0 + i * 0.5, rng.uniform(0.0, 100.0)) for i in range(500)]  # 250 s, 2 a second
    for p in pts:
        agg.add(p, p[0])
    v = agg.view(None)
    vals = [p[1] for p in pts]
    assert v.count == 500
    assert v.max("v") == max(vals) and v.min("v") == min(vals)
    assert v.at_max("v") == pts[vals.index(max(vals))]
    assert v.sum("v") == pytest.approx(sum(vals))
    assert v.first("v") == vals[0] and v.last("v") == vals[-1]
    assert v.span_seconds == 249.5
    assert v.slope_per_hour("v") == pytest.approx(slope_per_hour(vals, [p[0] for p in pts]), rel=1e-9)
    exact = sorted(vals)[int(0.99 * 499)]
    assert v.quantile("v", 0.99) == pytest.approx(exact, rel=0.02)
    # a window's old edge, to the second: the lines at or after 1100 s
    w = agg.view(1100.0)
    assert w.count == sum(1 for p in pts if p[0] >= 1100.0)
    assert w.max("v") == max(p[1] for p in pts if p[0] >= 1100.0)


def test_aggregate_memory_is_bounded_by_its_window_not_by_the_lines():
    agg = _agg(span=3600.0)
    t = 0.0
    for i in range(200_000):  # 200,000 lines over 10 h
        t += 0.18
        agg.add((t, float(i % 1000)), t)
    assert agg.memory_items() <= agg.max_buckets + 1 <= MAX_BUCKETS + 3
    assert agg.view(t - 3600).max("v") == 999.0



def test_a_window_condition_outside_the_per_line_language_is_a_load_error(tmp_path):
    from vllm_doctor.errors import RuleLoadError

    (tmp_path / "XX101-comprehension.yaml").write_text(
        "id: XX101\nname: comprehension-where\ntitle: t\nseverity: warning\ncategory: test\nwindow: 300\n"
        "windows:\n  odd:\n    of: stats\n    where: any([x for x in [num_running]])\n    fields: [num_running]\n"
        "when:\n  all:\n    - odd.count > 0\nmessage: m\ndocs: {why: w, example_log: e}\n")
    with pytest.raises(RuleLoadError, match=r"XX101-comprehension.yaml:10: windows.odd.where: .*comparisons"):
        load_rules([tmp_path])


@pytest.mark.parametrize("span", [5, 30, 300, 2000])
def test_sliding_max_is_the_window_max_at_every_line(span):
    """``peak(f)`` of a ``where`` reads ``sliding_max`` on every line (a monotonic queue, O(1) a
    line): it equals the maximum over the window's buckets, whatever the gaps, clock steps back,
    untimed lines, missing values and trimmed buckets."""
    for seed in range(40):
        r = random.Random(seed * 7919 + span)
        agg = WindowAggregate("x", span, {"v": lambda it: it})
        ts, now = 1000.0, None
        for i in range(r.randint(1, 2500)):
            ts += r.choice([0, 0, 0.3, 1, 2.5, 7, -0.5 if r.random() < 0.02 else 0, 400 if r.random() < 0.01 else 0])
            v = r.choice([None, r.random() * 100, r.randint(0, 5)])
            agg.add(v, ts if r.random() > 0.01 else None)
            now = ts if now is None or ts > now else now  # the state's clock only moves forward
            assert agg.sliding_max("v", now - span) == agg.view(now - span).max("v"), (seed, i)


def test_an_aggregate_keeps_the_fit_only_of_the_fields_a_rule_fits_and_batches_match_line_by_line():
    """A window keeps the least-squares sums only of the fields some rule reads a slope of
    (VD005: the idle stats lines' KV cache usage, the GPU memory); the stats lines of one second
    are folded as one batch, and what the rules read equals the same lines added one by one."""
    p = Pipeline(RULESET, follow=False, base_year=2025)
    fits = {a.name: a.fit_fields for a in p.state.windows["stats"] + p.state.windows["gpu"]}
    assert fits["idle"] == {"kv_cache_usage_ratio"} and fits["gpu_memory"] == {"memory_used_bytes"}
    assert fits["all_stats"] == set() and fits["stalled"] == set()
    r = random.Random(5)
    lines = [_line(s // 7, prompt=r.choice([0.0, 900.0]), gen=r.random() * 100, running=r.choice([0, 3, 9]),
                   waiting=r.choice([0, 0, 4]), kv=r.choice([0.0, 40.0, 99.0])) for s in range(7 * 600)]
    p.run_files([("batch.log", [("\n".join(lines) + "\n").encode()])])
    one = Pipeline(RULESET, follow=False, base_year=2025)
    for agg in one.state.windows["stats"]:
        agg.fit_fields = None  # every sum, as add() keeps them
    for e in p.state.stats:  # the same lines again, line by line
        for agg in one.state.windows["stats"]:
            agg.add(e, e.meta.ts)
    for a, b in zip(p.state.windows["stats"], one.state.windows["stats"]):
        if hasattr(a.where, "begin"):
            continue  # a where with peak() reads the state's clock, line by line or not (see VD003's test)
        va, vb = a.view(None), b.view(None)
        assert va.count == vb.count, a.name
        # plateau needs max_concurrency (no such line); ramp 16 or more waiting (these lines have at most 4)
        assert va.count > 0 or a.name in ("plateau", "ramp"), a.name
        for f in a.names:
            assert (va.max(f), va.min(f), va.first(f), va.last(f), va.at_max(f), va.at_min(f)) == \
                (vb.max(f), vb.min(f), vb.first(f), vb.last(f), vb.at_max(f), vb.at_min(f)), (a.name, f)
            if vb.sum(f) is None:
                assert va.sum(f) is None and va.count == 0, (a.name, f)
            else:
                assert va.sum(f) == pytest.approx(vb.sum(f), rel=1e-12, abs=1e-12), (a.name, f)
        if a.name == "idle" and va.count >= 3:
            assert va.slope_per_hour("kv_cache_usage_ratio") == pytest.approx(vb.slope_per_hour("kv_cache_usage_ratio"),
                                                                               rel=1e-9, abs=1e-12)


def test_a_where_on_a_fact_the_stats_lines_move_judges_each_line_on_its_own_state(tmp_path):
    """A user rule's condition on ``peak_num_running`` (moved by every stats line) reads it as it
    is once the line is taken in, line by line: with running rising on every line, every line is
    at the peak (a batch, or the facts cache, would read a stale peak and miss most of them)."""
    (tmp_path / "XX101-at-peak.yaml").write_text(
        "id: XX101\nname: at-peak\ntitle: t\nseverity: info\ncategory: test\nwindow: 300\n"
        "windows:\n  top:\n    of: stats\n    where: num_running >= peak_num_running\n    fields: [num_running]\n"
        "values:\n  n_top: top.count\n"
        "when:\n  all:\n    - top.count > 0\nmessage: '{n_top} lines at the peak'\ndocs: {why: w, example_log: e}\n")
    rs = load_rules([tmp_path])
    lines = [_line(i // 4, prompt=0.0, gen=10.0, running=i + 1, waiting=0, kv=10.0) for i in range(240)]
    _, rep = _diagnose(lines, rs)
    f = {x.rule_id: x for x in rep.findings}["XX101"]
    assert f.message == "240 lines at the peak", f.message
