"""A log clock that one line cannot push: the time of a line far ahead of the lines around it
(a forged or garbled timestamp, a client's text carrying a date) is flagged and does not move the
windows.

Time moves forward by any step the lines that follow confirm. A record whose time is more than
``step`` seconds ahead of the last accepted time is held, with the records after it that carry
the same time, until a record with a time of its own arrives: when that time is also that far
ahead (within ``tolerance``), the step was real and the held records go on as they are (so they
do when it is far before both: another clock, which tells nothing of the step); when it is back
near the old time, the held records are a jump: they are stamped with the last accepted
time and counted (``jumps``, ``jump_lines``). What is still held when the source ends (or when
``serve`` evaluates: :meth:`release`) is judged against the wall clock: a time more than
``max_ahead`` seconds ahead of it (vLLM logs local time with no zone, up to 14 h from UTC) is a
jump. Bounded: at most ``max_held`` records are held (more: the step is taken as real).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vllm_doctor.ingest.envelope import Record

STEP_SECONDS = 30.0
TOLERANCE_SECONDS = 5.0
MAX_AHEAD_SECONDS = 14 * 3600.0 + 900.0
MAX_HELD = 256
JUMP_LINES_KEPT = 5


class ClockGuard:
    """See the module doc. ``push(rec)`` returns the records to pass on now (in order)."""

    def __init__(self, step: float = STEP_SECONDS, tolerance: float = TOLERANCE_SECONDS,
                 max_ahead: float = MAX_AHEAD_SECONDS, max_held: int = MAX_HELD,
                 wall: Callable[[], float] = time.time) -> None:
        self.step, self.tolerance, self.max_ahead, self.max_held = step, tolerance, max_ahead, max_held
        self.wall = wall
        self.last: float | None = None  # the last accepted time
        self.jump: float | None = None  # the time of the held records
        self.held: list[Record] = []
        self.jumps = 0
        self.jump_lines: list[int] = []

    def push(self, rec: Record) -> list[Record]:
        ts = rec.ts
        if self.held:
            if ts is None or ts == self.jump:
                if len(self.held) < self.max_held:
                    self.held.append(rec)
                    return []
                return self._accept() + [rec]
            if ts >= self.jump - self.tolerance or (self.last is not None and ts < self.last - self.step):
                # the lines after it confirm the step; or they are far before both (another clock:
                # a wrapper's dated prefix, a year that differs), which tells nothing of the step
                out = self._accept()
            else:
                out = self._refuse()
            return out + self.push(rec)
        if ts is None:
            return [rec]
        last = self.last
        if last is None or ts <= last + self.step:
            if last is None or ts > last:
                self.last = ts
            return [rec]
        self.jump = ts
        self.held = [rec]
        return []

    def release(self, now: float | None = None) -> list[Record]:
        """The held records, judged on the wall clock (``now``, else ``wall()``): the end of a
        source, an evaluation of ``serve``."""
        if not self.held:
            return []
        wall = self.wall() if now is None else now
        if self.jump is not None and self.jump > wall + self.max_ahead:
            return self._refuse()
        return self._accept()

    def _accept(self) -> list[Record]:
        out, self.held = self.held, []
        if self.jump is not None and (self.last is None or self.jump > self.last):
            self.last = self.jump
        self.jump = None
        return out

    def _refuse(self) -> list[Record]:
        out, self.held = self.held, []
        jump, self.jump = self.jump, None
        self.jumps += 1
        if len(self.jump_lines) < JUMP_LINES_KEPT:
            self.jump_lines.append(out[0].lineno)
        return [r._replace(ts=self.last) if r.ts == jump else r for r in out]
