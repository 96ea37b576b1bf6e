"""Window aggregates of the state: what rules read about a window, updated once per event.

A rule declares the aggregates it needs (``windows:`` in its YAML, see docs/rules.md): which series
(``stats``: the periodic stats lines, ``engine_metrics``: /metrics samples per engine, ``gpu``: the
summed GPU memory of each NVML poll), an optional per-line condition (``where``) and the fields to
aggregate. The state feeds every line of that series to the aggregate as it arrives
(:meth:`WindowAggregate.add`); a rule reads a :class:`WindowView` of its window: counts, sums,
running maxima / minima (and the line that set them), first / last values, a least-squares slope,
and quantiles from a DDSketch (``ddsketch``: relative error 1 %, mergeable).

Memory is bounded by design, whatever the number of lines: an aggregate keeps one bucket per
``resolution`` seconds of its window (at most :data:`MAX_BUCKETS` + 2 buckets; the resolution is
1 s for windows up to 15 min, the log's own timestamp resolution), and each bucket holds a fixed
number of numbers per field, its first and last line (evidence) and, for the fields asked for, one
sketch. A window's old edge is exact to the bucket's resolution. Lines without a timestamp go into
one extra bucket that every window includes (as :class:`vllm_doctor.state.core.Window` treats them).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddsketch import DDSketch

#: Most buckets one aggregate keeps (its window / resolution).
MAX_BUCKETS = 900
#: Lines a view offers as evidence: the first and the last of them in the window.
LINES_KEPT = 4
SKETCH_RELATIVE_ACCURACY = 0.01


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One NVML poll, summed over the GPUs seen (the ``gpu`` series of window aggregates)."""

    ts: float
    memory_used_bytes: int
    memory_total_bytes: int | None


_NUMBER = (int, float)
_NUMBER_SET = frozenset(_NUMBER)


def resolution_for(window_seconds: float) -> int:
    """Bucket width (s) of an aggregate over ``window_seconds``: 1 s up to MAX_BUCKETS s."""
    return max(1, math.ceil(window_seconds / MAX_BUCKETS))


class FieldAgg:
    """Count, sum, min, max (and the lines that set them), first, last, and the sums of a
    least-squares fit over time (times relative to the aggregate's origin) of one field."""

    __slots__ = ("n", "sum", "min", "max", "at_min", "at_max", "first", "last", "tn", "st", "sv", "stt", "stv",
                 "t0", "t1")

    def __init__(self) -> None:
        self.n = 0
        self.sum = 0.0
        self.min = self.max = self.first = self.last = None
        self.at_min = self.at_max = None
        self.tn = 0  # values with a time (the fit's points)
        self.st = self.sv = self.stt = self.stv = 0.0
        self.t0 = self.t1 = None  # times of the first and last timed value

    def add(self, v: float, t: float | None, item: Any) -> None:
        self.n += 1
        self.sum += v
        if self.min is None or v <= self.min:  # ties: the newest line
            self.min, self.at_min = v, item
        if self.max is None or v >= self.max:
            self.max, self.at_max = v, item
        if self.first is None:
            self.first = v
        self.last = v
        if t is not None:
            self.tn += 1
            self.st += t
            self.sv += v
            self.stt += t * t
            self.stv += t * v
            if self.t0 is None:
                self.t0 = t
            self.t1 = t

    def add_many(self, vs: list, ts: list | None, items: list, total: float | None = None) -> None:
        """:meth:`add` of each value in turn (``vs`` numbers, ``ts`` their times, not None;
        ``ts`` None: the fit is not kept; ``total``: ``sum(vs)`` when the caller has it)."""
        n = len(vs)
        self.n += n
        self.sum = self.sum + (sum(vs) if total is None else total)
        lo = min(vs)
        if self.min is None or lo <= self.min:  # ties: the newest line
            self.min, self.at_min = lo, items[n - 1 - vs[::-1].index(lo)]
        hi = max(vs)
        if self.max is None or hi >= self.max:
            self.max, self.at_max = hi, items[n - 1 - vs[::-1].index(hi)]
        if self.first is None:
            self.first = vs[0]
        self.last = vs[-1]
        if ts is None:
            return
        self.tn += n
        self.st = sum(ts, self.st)
        self.sv = sum(vs, self.sv)
        self.stt = sum(map(operator.mul, ts, ts), self.stt)
        self.stv = sum(map(operator.mul, ts, vs), self.stv)
        if self.t0 is None:
            self.t0 = ts[0]
        self.t1 = ts[-1]

    def merge(self, o: FieldAgg) -> None:
        """Fold ``o`` (a later bucket) into this one."""
        if o.n == 0:
            return
        self.n += o.n
        self.sum += o.sum
        if self.min is None or o.min <= self.min:
            self.min, self.at_min = o.min, o.at_min
        if self.max is None or o.max >= self.max:
            self.max, self.at_max = o.max, o.at_max
        if self.first is None:
            self.first = o.first
        self.last = o.last
        self.tn += o.tn
        self.st += o.st
        self.sv += o.sv
        self.stt += o.stt
        self.stv += o.stv
        if self.t0 is None:
            self.t0 = o.t0
        if o.t1 is not None:
            self.t1 = o.t1


class _Bucket:
    __slots__ = ("key", "n", "fields", "first", "last", "sketches", "t0", "t1")

    def __init__(self, key: int | None, names: tuple[str, ...], quantiles: tuple[str, ...]) -> None:
        self.key = key
        self.n = 0
        self.t0 = self.t1 = None  # times of its first and last line
        self.fields = {f: FieldAgg() for f in names}
        self.first = self.last = None
        self.sketches = {f: DDSketch(SKETCH_RELATIVE_ACCURACY) for f in quantiles}


class WindowAggregate:
    """The aggregate of one series over the last ``span`` seconds, in buckets of ``resolution`` s.

    fields: name -> how to read it from a line (None: not known for that line); where: the line's
    condition (None: every line). A condition or field that raises is counted in ``errors``
    (the rule engine makes it a finding about vllm-doctor), the line is not counted."""

    def __init__(self, name: str, span: float, fields: dict[str, Callable[[Any], Any]],
                 where: Callable[[Any], Any] | None = None, quantiles: tuple[str, ...] = ()) -> None:
        self.name = name
        self.span = float(span)
        self.resolution = resolution_for(span)
        self.max_buckets = math.ceil(self.span / self.resolution) + 2
        self.fields = fields
        self.names = tuple(fields)
        self.where = where
        self.quantiles = tuple(quantiles)
        self.buckets: deque[_Bucket] = deque()
        self.untimed = _Bucket(None, self.names, self.quantiles)
        self.origin: float | None = None  # fit times are relative to this (precision)
        self.errors: list[str] = []
        #: fields whose least-squares fit (slope_per_hour) is read: a batch keeps the fit's sums of
        #: these only (None: every field)
        self.fit_fields: set[str] | None = None
        # sliding_max: per field, (bucket key, max) of the closed buckets, the maxima decreasing
        # from front to back (a monotonic queue: O(1) a line, whatever the window holds)
        self._maxq: dict[str, deque] | None = None

    def add(self, item: Any, ts: float | None) -> None:
        """Fold one line of the series in (a line that fails ``where`` is skipped)."""
        if self.where is not None:
            try:
                ok = self.where(item)
            except Exception as e:  # noqa: BLE001 - counted and shown as a rule error, never raised
                self._error(e)
                return
            if not ok:
                return
        if ts is None:
            b = self.untimed
            t = None
        else:
            if self.origin is None:
                self.origin = ts
            t = ts - self.origin
            b = self._bucket(int(ts // self.resolution))
        fields = b.fields
        for name, get in self.fields.items():
            try:
                v = get(item)
            except Exception as e:  # noqa: BLE001
                self._error(e)
                continue
            if type(v) not in _NUMBER or v != v:  # None, a bool, NaN: no value
                continue
            fields[name].add(v, t, item)
            if self.quantiles and name in b.sketches:
                b.sketches[name].add(v)
        b.n += 1
        if ts is not None:
            if b.t0 is None:
                b.t0 = ts
            b.t1 = ts
        if b.first is None:
            b.first = item
        b.last = item

    def add_batch(self, items: list) -> None:
        """Fold timed lines of one second in (``item.meta.ts``, all within the same whole second,
        in order): what as many :meth:`add` calls would do, with the per-field numbers taken by
        builtins over the batch. Sums are ``sum()`` over the batch (Python 3.12+ compensates
        them: equal to the per-line sums within float rounding)."""
        where = self.where
        if where is not None:
            batch = getattr(where, "batch", None)
            test = getattr(where, "test", None)
            kept = None
            if batch is None and test is not None:
                try:  # the usual case, every line decided: one comprehension
                    kept = [it for it in items if test(it)]
                except Exception:  # noqa: BLE001 - missing data or a fault: line by line below
                    kept = None
            if kept is None:
                kept = []
                for i, it in enumerate(items):
                    if batch is not None:
                        batch[1] = i
                    try:
                        ok = where(it) if test is None else test(it)
                    except (TypeError, AttributeError, ZeroDivisionError):
                        continue  # None in a comparison: the line does not say, so it does not count
                    except Exception as e:  # noqa: BLE001 - counted and shown as a rule error, never raised
                        self._error(e)
                        continue
                    if ok:
                        kept.append(it)
            items = kept
        if not items:
            return
        tss = [it.meta.ts for it in items]
        if self.origin is None:
            self.origin = tss[0]
        b = self._bucket(int(tss[0] // self.resolution))
        origin = self.origin
        fit = self.fit_fields
        rel = [t - origin for t in tss] if fit is None or fit else None
        for name, get in self.fields.items():
            try:
                vals = [get(it) for it in items]
            except Exception:  # noqa: BLE001 - a field that raises: line by line, as add() counts it
                vals = []
                for it in items:
                    try:
                        vals.append(get(it))
                    except Exception as e:  # noqa: BLE001
                        self._error(e)
                        vals.append(None)
            times = rel if fit is None or name in fit else None
            total = sum(vals) if _NUMBER_SET.issuperset(map(type, vals)) else None
            if total is not None and total == total:  # all numbers, none NaN: the usual batch
                b.fields[name].add_many(vals, times, items, total)
                vs = vals
            else:  # None, a bool, NaN: no value
                keep = [i for i, v in enumerate(vals) if type(v) in _NUMBER and v == v]
                if not keep:
                    continue
                vs = [vals[i] for i in keep]
                b.fields[name].add_many(vs, None if times is None else [times[i] for i in keep],
                                        [items[i] for i in keep])
            if self.quantiles and name in b.sketches:
                sk = b.sketches[name]
                for v in vs:
                    sk.add(v)
        b.n += len(items)
        if b.t0 is None:
            b.t0 = tss[0]
        b.t1 = tss[-1]
        if b.first is None:
            b.first = items[0]
        b.last = items[-1]

    def _bucket(self, key: int) -> _Bucket:
        """The bucket of ``key``: the newest one when it is that key (or the clock stepped back),
        else a new one (the newest is then closed, and the oldest beyond the window dropped)."""
        if self.buckets and self.buckets[-1].key >= key:
            return self.buckets[-1]
        if self._maxq is not None and self.buckets:
            self._close(self.buckets[-1])
        b = _Bucket(key, self.names, self.quantiles)
        self.buckets.append(b)
        self._trim(key)
        return b

    def _close(self, b: _Bucket) -> None:
        """Bucket ``b`` gets no more lines: its maxima join the monotonic queues."""
        for name, q in self._maxq.items():
            m = b.fields[name].max
            if m is None:
                continue
            while q and q[-1][1] <= m:
                q.pop()
            q.append((b.key, m))

    def sliding_max(self, f: str, start: float | None):
        """``view(start).max(f)`` in O(1) amortized (the ``peak(f)`` of a ``where``, read on every
        line): the window's start only moves forward."""
        if self._maxq is None:
            self._maxq = {n: deque() for n in self.names}
            for b in list(self.buckets)[:-1]:
                self._close(b)
        best = self.untimed.fields[f].max if self.untimed.n else None
        if self.buckets:
            last = self.buckets[-1]
            first_key = None if start is None else int(start // self.resolution)
            q = self._maxq[f]
            oldest = self.buckets[0].key if first_key is None else max(first_key, self.buckets[0].key)
            while q and q[0][0] < oldest:
                q.popleft()
            if q:
                best = q[0][1] if best is None or q[0][1] > best else best
            if first_key is None or last.key >= first_key:
                m = last.fields[f].max
                if m is not None and (best is None or m > best):
                    best = m
        return best

    def _error(self, e: Exception) -> None:
        if len(self.errors) < 5:
            self.errors.append(f"window {self.name!r}: {type(e).__name__}: {e}")

    def _trim(self, newest: int) -> None:
        oldest = newest - self.max_buckets + 1
        while self.buckets and (self.buckets[0].key < oldest or len(self.buckets) > self.max_buckets):
            self.buckets.popleft()

    def view(self, start: float | None) -> WindowView:
        """The lines at or after ``start`` (None: every one kept), to the bucket's resolution."""
        if start is None:
            inside = list(self.buckets)
        else:
            first_key = int(start // self.resolution)
            inside = [b for b in self.buckets if b.key >= first_key]
        if self.untimed.n:
            inside.insert(0, self.untimed)
        return WindowView(self, inside)

    def memory_items(self) -> int:
        """Buckets held (for tests and the memory benchmark: bounded by ``max_buckets`` + 1)."""
        return len(self.buckets) + 1


class WindowView:
    """What a rule reads about one aggregate over its window (names exposed to expressions:
    ``count``, ``max(f)``, ``min(f)``, ``sum(f)``, ``mean(f)``, ``first(f)``, ``last(f)``,
    ``at_max(f)`` / ``at_min(f)`` (the line that set it; the newest on ties), ``quantile(f, q)``,
    ``slope_per_hour(f)``, ``span_seconds`` and ``lines`` (evidence: the first and last
    :data:`LINES_KEPT` lines in the window)."""

    __slots__ = ("_agg", "_buckets", "_merged", "count")

    def __init__(self, agg: WindowAggregate, buckets: list[_Bucket]) -> None:
        self._agg = agg
        self._buckets = buckets
        self._merged: dict[str, FieldAgg] = {}
        self.count = sum(b.n for b in buckets)

    def _f(self, name: str) -> FieldAgg:
        got = self._merged.get(name)
        if got is None:
            if name not in self._agg.fields:
                raise KeyError(f"window {self._agg.name!r} does not aggregate {name!r}")
            got = FieldAgg()
            for b in self._buckets:
                got.merge(b.fields[name])
            self._merged[name] = got
        return got

    def max(self, f: str):
        return self._f(f).max

    def min(self, f: str):
        return self._f(f).min

    def sum(self, f: str):
        a = self._f(f)
        return a.sum if a.n else None

    def mean(self, f: str):
        a = self._f(f)
        return a.sum / a.n if a.n else None

    def first(self, f: str):
        return self._f(f).first

    def last(self, f: str):
        return self._f(f).last

    def at_max(self, f: str):
        return self._f(f).at_max

    def at_min(self, f: str):
        return self._f(f).at_min

    def quantile(self, f: str, q: float):
        """The ``q`` quantile (0..1) of field ``f``, within 1 % (a DDSketch merged over the window)."""
        if f not in self._agg.quantiles:
            raise KeyError(f"window {self._agg.name!r} keeps no quantile sketch of {f!r}")
        sk = DDSketch(SKETCH_RELATIVE_ACCURACY)
        for b in self._buckets:
            if b.sketches[f].count:
                sk.merge(b.sketches[f])
        return sk.get_quantile_value(q) if sk.count else None

    def slope_per_hour(self, f: str):
        """Least-squares slope of ``f`` over time, per hour; None with fewer than 3 timed values
        or when they span under a minute (as :func:`vllm_doctor.diagnosis.expr.slope_per_hour`)."""
        a = self._f(f)
        if a.tn < 3 or a.t0 is None or a.t1 - a.t0 < 60:
            return None
        den = a.tn * a.stt - a.st * a.st
        if den <= 0:
            return None
        return (a.tn * a.stv - a.st * a.sv) / den * 3600.0

    @property
    def span_seconds(self) -> float:
        """Seconds from the first to the last timed line in the window (0 with none)."""
        timed = [b for b in self._buckets if b.t0 is not None]
        return timed[-1].t1 - timed[0].t0 if timed else 0.0

    @property
    def lines(self) -> list:
        """The first and last lines in the window (at most 2 x LINES_KEPT), oldest first."""
        items: list = []
        for b in self._buckets:
            for x in (b.first, b.last):
                if x is not None and (not items or items[-1] is not x):
                    items.append(x)
        out: list = []
        seen: set[int] = set()
        for x in items[:LINES_KEPT] + items[-LINES_KEPT:]:
            if x is not None and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
        return out

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0
