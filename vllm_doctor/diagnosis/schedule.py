"""When rules run on the log's clock (``diagnose``, and ``serve`` reading an old or replayed log),
derived from the rules themselves.

Each rule declares what it reads (:attr:`Rule.reads <vllm_doctor.diagnosis.loader.Rule.reads>`,
derived at load from its expressions and evidence: the event kinds it names, plus ``*`` when it
also reads the state's facts, series or derived views, which any event may move). From that:

* a **windowed** rule runs every ``max(eval_interval, window / 2)`` seconds of log time
  (consecutive evaluations overlap by half a window, so events less than half a window apart are
  always judged together);
* a **whole-log** rule runs, at most every ``eval_interval`` seconds, once an event arrived that a
  whole-log rule reads (:meth:`Schedule.note`): a kind one of them names, or, when one of them
  reads ``*``, any event but a stats line or an engine start (those are no incident);
* every rule runs at the end of the input and before a restart cuts the run (the pipeline's).

A :class:`Schedule` is built once per pipeline, from the ruleset, and holds when each rule last
ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_doctor.diagnosis.loader import RuleSet

#: Events that are no incident whatever a rule reads: the periodic stats line and what an engine
#: writes as it starts (read as facts, judged with the next incident or at the end)
NOT_TRIGGERS = frozenset({"SchedulerStats", "EngineConfigObserved", "VersionSeen"})


class Schedule:
    """The rules' schedule on the log's clock (see the module doc)."""

    def __init__(self, ruleset: RuleSet, eval_interval: float = 10.0) -> None:
        self.eval_interval = eval_interval
        #: (rule id, window seconds or None for a whole-log rule), in rule order
        self.windows: list[tuple[str, float | None]] = [(r.id, ruleset.window_seconds(r)) for r in ruleset.rules]
        reads: set[str] = set()
        for r in ruleset.rules:
            if ruleset.window_seconds(r) is None:
                reads |= r.reads
        #: any incident triggers the whole-log rules (one of them reads more than named events)
        self.any_incident = "*" in reads
        #: else the event kinds that trigger them
        self.trigger_kinds = frozenset(k.split(":")[0] for k in reads - {"*"}) - NOT_TRIGGERS
        self.last: dict[str, float] = {}  # rule id -> log time it last ran
        self.pending = False  # an event a whole-log rule reads arrived since they last ran
        self.next_windowed = self.next_whole = float("-inf")  # see due

    def note(self, kind: str) -> None:
        """An event of ``kind`` was applied."""
        if kind not in NOT_TRIGGERS and (self.any_incident or kind in self.trigger_kinds):
            self.pending = True

    def may_be_due(self, ts: float) -> bool:
        """False when no rule is due at ``ts`` (one comparison for most events)."""
        return ts >= self.next_windowed or (self.pending and ts >= self.next_whole)

    def due(self, ts: float, among: frozenset[str] | None = None) -> set[str]:
        """The ids of the rules due at log time ``ts``, marked as run; ``among``: of these rules
        only (the fleet's quiet steps: the long-window rules)."""
        if not self.may_be_due(ts):
            return set()
        due = set()
        whole_due = False
        for rid, w in self.windows:
            if among is not None and rid not in among:
                continue
            last = self.last.get(rid)
            if w is None:
                if self.pending and (last is None or ts - last >= self.eval_interval):
                    due.add(rid)
                    whole_due = True
            elif last is None or ts - last >= max(self.eval_interval, w / 2):
                due.add(rid)
        for rid in due:
            self.last[rid] = ts
        if whole_due:
            self.pending = False
        inf = float("inf")
        nw = nh = inf
        for rid, w in self.windows:
            last = self.last.get(rid)
            if w is None:
                nh = min(nh, -inf if last is None else last + self.eval_interval)
            else:
                nw = min(nw, -inf if last is None else last + max(self.eval_interval, w / 2))
        # a millisecond early: the test above is exact (ts - last >= period), this one only skips
        self.next_windowed, self.next_whole = nw - 1e-3, nh - 1e-3
        return due
