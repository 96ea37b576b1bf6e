"""What one rule evaluation costs does not grow with the history the state keeps (issue 26 item
10, the stats8 shape: a week of 8 data-parallel engines' stats lines). A window's stats lines are
found by bisection while the kept lines are in time order, and the stall search is skipped while
no kept line shows an engine making no progress."""

from __future__ import annotations

from dataclasses import replace

from vllm_doctor import events as ev
from vllm_doctor.state.core import State, Window, stalls

T0 = 1_764_460_800.0


class CountingMeta:
    """Test double of :class:`vllm_doctor.events.Meta` that counts the reads of its timestamp."""

    reads = 0

    def __init__(self, meta: ev.Meta) -> None:
        self._meta = meta

    @property
    def ts(self):
        CountingMeta.reads += 1
        return self._meta.ts

    def __getattr__(self, name: str):
        return getattr(self._meta, name)


def stats_line(ts: float | None, engine: int, lineno: int, waiting: int = 0, tps: float = 1500.0) -> ev.SchedulerStats:
    return ev.SchedulerStats(meta=ev.Meta("stats8.log", lineno, lineno, ts), prompt_tps=tps, generation_tps=tps,
                             num_running=20, num_waiting=waiting, kv_cache_usage_ratio=0.5, engine_index=engine)


def two_hours(state: State, engines: int = 8, start: float = T0) -> int:
    """What the state keeps of a data-parallel server: 8 engines' stats lines every 10 s for 2 h."""
    n = 0
    for step in range(720):
        for e in range(engines):
            n += 1
            state.apply(stats_line(start + 10 * step, e, n))
    return n


def brute(state: State, start: float | None) -> list:
    return [s for s in state.stats if start is None or s.meta.ts is None or s.meta.ts >= start]


def test_a_window_reads_its_own_lines_not_every_kept_one():
    state = State()
    two_hours(state)
    assert len(state.stats) == 5760
    state.stats = type(state.stats)(replace(s, meta=CountingMeta(s.meta)) for s in state.stats)
    win = Window(state, 300.0)
    CountingMeta.reads = 0
    got = win.stats()
    reads = CountingMeta.reads
    assert [s.meta.lineno for s in got] == [s.meta.lineno for s in brute(state, state.now - 300.0)]
    assert len(got) == 8 * 31  # 300 s of 8 engines, both edges included
    assert reads <= 2 * 13 + 2  # a bisection of 5,760 lines (was one read per kept line: 5,760)


def test_lines_out_of_time_order_are_read_one_by_one_until_they_leave_the_kept_history():
    state = State()
    n = two_hours(state)
    late = stats_line(T0 + 7000, 3, n + 1)  # an engine's line written late: older than the one before it
    untimed = stats_line(None, 4, n + 2)
    state.apply(late)
    state.apply(untimed)
    for seconds in (60.0, 300.0, 1800.0, None):
        got = Window(state, seconds).stats()
        assert got == brute(state, Window(state, seconds).start)
    assert late in Window(state, 300.0).stats() and untimed in Window(state, 60.0).stats()
    assert Window(state, 60.0).stats()[-1] is untimed
    # (an untimed line stops the trim by time) max_items more lines push both out: the
    # bisection is back, and agrees
    for _ in range(state.max_items):
        n += 1
        state.apply(stats_line(state.now + 1, 0, n))
    assert late not in state.stats and untimed not in state.stats
    assert state._stats_unordered_seq < state._stats_seq - len(state.stats)
    assert Window(state, 300.0).stats() == brute(state, state.now - 300.0)


def test_the_stall_search_runs_only_when_a_kept_line_shows_no_progress():
    state = State(max_window_seconds=600.0)
    n = two_hours(state, engines=2)
    assert not state.may_stall()
    assert stalls(list(state.stats), [], state.now, 3) == []
    for _ in range(4):  # engine 1: requests waiting, no token processed for 40 s
        n += 1
        state.apply(stats_line(state.now + 10, 1, n, waiting=12, tps=0.0))
    assert state.may_stall()
    found = stalls(list(state.stats), [], state.now, 3)
    assert [(s.engine, s.intervals, s.waiting) for s in found] == [(1, 4, 12)]
    two_hours(state, engines=2, start=state.now + 10)  # the stall has left the kept 10 min
    assert not state.may_stall()
    assert stalls(list(state.stats), [], state.now, 3) == []
