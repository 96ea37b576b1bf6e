"""State.preemptions_inferred (V1 logs print no preemption line: the stats show its signature) is
kept as the stats lines arrive, not found again by a pass over every kept line at each rule
evaluation: that pass made a week of 8 data-parallel engines' stats lines (bench/gen_log.py
--shape stats8) spend most of its time there. Same answer as the pass over the kept lines,
whatever falls out of the deque (its length, the time window) and whatever the engines."""

from __future__ import annotations

import random
from collections import deque

from vllm_doctor import events as ev
from vllm_doctor.state.core import State


def _by_pass(st: State) -> bool:
    """The definition: two consecutive kept lines of one engine, the KV cache >= 90% at the first,
    requests waiting at both, fewer running at the second."""
    if st.preemptions_reported:
        return False
    prevs: dict = {}
    for s in st.stats:
        p = prevs.get(s.engine_index)
        if (p is not None and s.kv_cache_usage_ratio is not None and p.kv_cache_usage_ratio is not None
                and p.kv_cache_usage_ratio >= 0.9 and s.num_waiting > 0 and p.num_waiting > 0
                and s.num_running < p.num_running):
            return True
        prevs[s.engine_index] = s
    return False


def _line(t: float, rnd: random.Random, engine: int | None) -> ev.SchedulerStats:
    full = rnd.random() < 0.5
    return ev.SchedulerStats(ev.Meta(source="x.log", ts=t), 100.0, 200.0, rnd.randint(0, 6), rnd.randint(0, 2) if full else 0,
                             None, rnd.choice((None, 0.95, 0.99)) if full else 0.5, None, None, None, engine)


class _CountedDeque(deque):
    passes = 0

    def __iter__(self):
        _CountedDeque.passes += 1
        return super().__iter__()


def test_the_inferred_preemptions_match_a_pass_over_the_kept_lines_without_one():
    rnd = random.Random(5)
    checked = {True: 0, False: 0}
    for max_items, window, engines in ((8, 7200.0, (None,)), (30, 60.0, (0, 1, 2)), (500, 7200.0, (0, 1, 2, 3, 4, 5, 6, 7))):
        st = State(max_window_seconds=window, max_items=max_items)
        st.stats = _CountedDeque(st.stats)
        t = 1764460800.0
        for _ in range(3000):
            t += rnd.choice((0.0, 1.0, 10.0, 120.0 if rnd.random() < 0.01 else 10.0))
            st.apply(_line(t, rnd, rnd.choice(engines)))
            _CountedDeque.passes = 0
            got = st.preemptions_inferred()
            assert _CountedDeque.passes == 0  # no pass over the kept lines
            want = _by_pass(st)
            assert got is want
            checked[want] += 1
    assert checked[True] > 100 and checked[False] > 100  # both answers were met
