"""One Pipeline(ruleset, clock, schedule), fixed at construction; the schedule derived from what each
rule reads (diagnosis/schedule.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_doctor.diagnosis.loader import RuleSet, load_rules
from vllm_doctor.diagnosis.schedule import Schedule
from vllm_doctor.pipeline import LogTime, Pipeline, SidecarTime

LOGS = Path(__file__).parent / "fixtures" / "logs"


def _only(*names: str) -> RuleSet:
    rs = load_rules()
    return RuleSet(tuple(r for r in rs.rules if r.name in names), rs.thresholds)


def test_rules_declare_the_event_kinds_they_read():
    rs = load_rules()
    # (and the state's broadcast waits since the last progress, hang_waits(): a derived view)
    assert rs.by_key("engine-dead").reads == {"*", "EngineFailure", "ExceptionRaised"}
    assert rs.by_key("nccl-failure").reads == {"NcclError"}
    assert rs.by_key("log-unread").reads == {"UnreadLine"}
    # reads facts or series as well: any event may move them
    assert rs.by_key("unknown-flag").reads == {"*", "UnknownFlag"}
    assert "*" in rs.by_key("preemption-storm").reads


def test_the_whole_log_schedule_is_derived_from_what_the_rules_read():
    s = Schedule(_only("nccl-failure", "log-unread"))
    assert not s.any_incident and s.trigger_kinds == {"NcclError", "UnreadLine"}
    for kind in ("ServerReady", "EngineFailure", "SchedulerStats"):
        s.note(kind)
    assert not s.pending  # no rule of this set reads them: nothing to run
    s.note("NcclError")
    assert s.pending and s.due(100.0) == {"VD006", "VD031"} and not s.pending
    s.note("UnreadLine")
    assert s.due(105.0) == set() and s.pending  # at most every eval_interval (10 s)
    assert s.due(110.0) == {"VD006", "VD031"}
    full = Schedule(load_rules())
    assert full.any_incident  # a built-in whole-log rule reads facts: any incident triggers them
    full.note("SchedulerStats")
    full.note("VersionSeen")
    assert not full.pending  # a stats line or an engine start is no incident
    full.note("ServerReady")
    assert full.pending


def test_a_pipeline_of_event_only_rules_does_not_evaluate_on_other_events():
    p = Pipeline(_only("nccl-failure"), clock=LogTime())
    calls = []
    real = p.engine.evaluate
    p.engine.evaluate = lambda st, due=None: calls.append(due) or real(st, due)  # type: ignore[method-assign]
    p.run([("v.log", [(LOGS / "cpu-basic-serve-and-load.log").read_bytes()])])
    assert calls == [None]  # no NCCL error in a healthy log: only the final evaluation ran


def test_the_clock_is_fixed_at_construction():
    p = Pipeline(load_rules(), follow=True)
    with pytest.raises(AttributeError):
        p.follow = False  # type: ignore[misc]
    replaying = [False]
    p = Pipeline(load_rules(), clock=SidecarTime(lambda: replaying[0], now=lambda: 1e9))
    assert p.follow and not p.engine.log_time
    replaying[0] = True  # what the clock answers follows the sidecar's view of the log's age
    assert not p.follow and p.engine.log_time and p.clock.now() == 1e9


def test_the_sidecar_never_swaps_its_pipelines_clock(tmp_path):
    from serve_helpers import live_sidecar, wait_for

    log = tmp_path / "vllm.log"
    log.write_bytes((LOGS / "cpu-preemption-tiny-kv-cache.log").read_bytes())  # a log of 2025: replayed
    with live_sidecar({"logs": [str(log)], "from_start": True}) as live:
        sc = live.sidecar
        clock, engine = sc.pipeline.clock, sc.pipeline.engine
        assert isinstance(clock, SidecarTime)
        wait_for(lambda: sc.pipeline.state.lines_total.get(str(log)) == 235 or None, 60, "the log read")
        sc.evaluate()
        assert sc.replaying() and sc.pipeline.clock is clock and sc.pipeline.engine is engine
        assert clock.follows_log and engine.log_time  # judged on the log's clock, as diagnose does
        assert {f.name for f in sc.pipeline.engine.findings.values()} >= {"kv-capacity-bound"}
