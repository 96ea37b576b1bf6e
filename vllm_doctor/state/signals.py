"""Derived signals of one deployment, computed once, in the state, from the /metrics samples as
the state applies them, on the samples' own clock: the TTFT quantiles over the recent window
(``histogram_quantile(q, rate(h[window]))``) and the prefix cache hit ratio over it (hits / queries
of the window). The scraper only parses; the sidecar's /metrics, /api/state and ``watch`` read
:class:`Signals` (``state.signals``); the rules' ``ttft_p99()`` (:func:`quantile_between`) and the
prefix-cache collapse series (:func:`hit_ratio_between`) read the same arithmetic over their own
window.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

#: Snapshots kept per window (bounded whatever the clock does)
SNAPSHOTS_KEPT = 4096


def histogram_quantile(q: float, buckets: tuple[tuple[float, float], ...] | list) -> float | None:
    """Prometheus' ``histogram_quantile``: q in [0, 1] over cumulative (le, count) buckets,
    linear interpolation inside the bucket; the last finite bound when the rank falls in
    ``+Inf``. None when the histogram is empty."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def buckets_delta(old: tuple[tuple[float, float], ...] | list,
                  new: tuple[tuple[float, float], ...] | list) -> tuple[tuple[float, float], ...]:
    """What a cumulative histogram counted between two scrapes: ``new`` minus ``old``, bucket by
    bucket (a bucket ``old`` lacks counts from 0)."""
    before = dict(old)
    return tuple((le, c - before.get(le, 0.0)) for le, c in new)


def quantile_between(q: float, old: tuple[tuple[float, float], ...] | list,
                     new: tuple[tuple[float, float], ...] | list) -> float | None:
    """The q-quantile of what a histogram observed between two scrapes (``old`` then ``new``,
    cumulative buckets); None when it observed nothing in between."""
    diff = buckets_delta(old, new)
    if not diff or diff[-1][1] <= 0:
        return None
    return histogram_quantile(q, diff)


def hit_ratio_between(queries_before: float, hits_before: float, queries: float, hits: float) -> float | None:
    """Prefix cache hits / queries between two readings of vLLM's counters
    (``prefix_cache_queries_total``, ``prefix_cache_hits_total``); None when nothing was queried in
    between or the counters do not add up (a reset: hits fell, or more hits than queries)."""
    q, h = queries - queries_before, hits - hits_before
    return h / q if q > 0 and 0 <= h <= q else None


class HistogramWindow:
    """Quantiles of a cumulative histogram over the last ``window_seconds``, like
    ``histogram_quantile(q, rate(h[window]))``: the newest snapshot minus the newest one at
    least ``window_seconds`` old (or the oldest kept). A counter reset (vLLM restarted)
    restarts the window."""

    def __init__(self, window_seconds: float = 300.0) -> None:
        self.window_seconds = window_seconds
        # at most SNAPSHOTS_KEPT (a clock that stands still, an old log replayed, trims nothing)
        self._snaps: deque[tuple[float, tuple[tuple[float, float], ...]]] = deque(maxlen=SNAPSHOTS_KEPT)

    def add(self, t: float, buckets: tuple[tuple[float, float], ...]) -> None:
        """Record a scrape's buckets at time t (the sample's own)."""
        if not buckets:
            return
        if self._snaps and is_reset(self._snaps[-1][1], buckets):
            self._snaps.clear()
        self._snaps.append((t, buckets))
        while len(self._snaps) > 2 and self._snaps[1][0] <= t - self.window_seconds:
            self._snaps.popleft()

    def delta(self) -> tuple[tuple[float, float], ...]:
        """Bucket counts observed within the window (the newest snapshot alone when only one)."""
        if not self._snaps:
            return ()
        new = self._snaps[-1][1]
        if len(self._snaps) == 1:
            return new
        return buckets_delta(self._snaps[0][1], new)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (seconds) over the window; None with no observation in it."""
        return histogram_quantile(q, self.delta())


def is_reset(old, new) -> bool:
    o = dict(old)
    return any(c < o.get(le, 0.0) for le, c in new)


class Signals:
    """The derived signals (see the module doc) over the last ``window_seconds``."""

    def __init__(self, window_seconds: float = 300.0) -> None:
        self.window_seconds = window_seconds
        self._ttft = HistogramWindow(window_seconds)
        self._prefix: deque[tuple[float, float, float]] = deque(maxlen=SNAPSHOTS_KEPT)  # (t, queries, hits)
        #: TTFT p50 / p99 (seconds) over the window, by quantile label ("0.5", "0.99")
        self.ttft_quantiles: dict[str, float] = {}
        #: prefix cache hits / queries over the window (None: no query, or no such series)
        self.prefix_cache_hit_ratio: float | None = None

    def add(self, sample: Any) -> None:
        """A /metrics sample (events.VllmMetricsSample) applied to the state."""
        t = sample.meta.ts or 0.0
        self._ttft.add(t, sample.ttft_buckets)
        q = {}
        for label, qq in (("0.5", 0.5), ("0.99", 0.99)):
            v = self._ttft.quantile(qq)
            if v is not None:
                q[label] = v
        self.ttft_quantiles = q
        queries, hits = sample.prefix_cache_queries_total, sample.prefix_cache_hits_total
        if queries is not None and hits is not None:
            pw = self._prefix
            if pw and queries < pw[-1][1]:
                pw.clear()  # counter reset
            pw.append((t, queries, hits))
            while len(pw) > 2 and pw[1][0] <= t - self.window_seconds:
                pw.popleft()
            base = pw[0] if len(pw) > 1 else (t, 0.0, 0.0)
            self.prefix_cache_hit_ratio = hit_ratio_between(base[1], base[2], pw[-1][1], pw[-1][2])
