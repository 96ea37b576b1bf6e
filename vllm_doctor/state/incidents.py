"""Window summaries for the rules of issue 25 (overload, prefix-cache-collapse, host memory):
plain functions over the window's stats lines, /metrics samples and host-memory samples, bound
into the rules' expressions by vllm_doctor/diagnosis/evaluate.py (``queue_growth()``,
``prefix_collapse()``, ``host_trend()``). Each returns None when the window holds too little."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_doctor.state.signals import hit_ratio_between


@dataclass(frozen=True)
class QueueGrowth:
    """The waiting queue over the window, for one engine: its first, lowest, highest and last
    level, the intervals seen, and what ran at the end. source: "log" or "metrics";
    rejections: /metrics admission rejections counted in the window (None when not exported)."""

    engine: int | None
    source: str
    intervals: int
    first: float
    low: float
    peak: float
    last: float
    running: float | None
    kv: float | None
    seconds: float
    rejections: float | None
    samples: tuple


def _counter_delta(vals: list[float | None]) -> float | None:
    """A counter's increase over samples, restarts (a drop) counted from zero."""
    got = [v for v in vals if v is not None]
    if len(got) < 2:
        return None
    inc = 0.0
    for a, b in zip(got, got[1:]):
        inc += b - a if b >= a else b
    return inc


def queue_growth(stats: list, metrics: list) -> QueueGrowth | None:
    """The engine whose queue ends highest in the window (stats lines per engine; else /metrics)."""
    by_engine: dict = {}
    for s in stats:
        by_engine.setdefault(s.engine_index, []).append(s)
    best = None
    rej = _counter_delta([m.admission_rejections_total for m in metrics])
    for eng, items in by_engine.items():
        w = [float(x.num_waiting) for x in items]
        g = QueueGrowth(eng, "log", len(items), w[0], min(w), max(w), w[-1], items[-1].num_running,
                        items[-1].kv_cache_usage_ratio, _span(items), rej, tuple(items[-3:]))
        if best is None or g.last > best.last:
            best = g
    if best is None:
        ms = [m for m in metrics if m.num_waiting is not None]
        if ms:
            w = [float(m.num_waiting) for m in ms]
            best = QueueGrowth(None, "metrics", len(ms), w[0], min(w), max(w), w[-1], ms[-1].num_running,
                               ms[-1].kv_cache_usage_ratio, _span(ms), rej, ())
        elif rej:
            best = QueueGrowth(None, "metrics", 0, 0.0, 0.0, 0.0, 0.0, None, None, 0.0, rej, ())
    return best


def _span(items: list) -> float:
    a, b = items[0].meta.ts, items[-1].meta.ts
    return 0.0 if a is None or b is None else max(0.0, b - a)


@dataclass(frozen=True)
class PrefixCollapse:
    """The prefix cache hit rate over the window: its peak, the rate of the newest run of low
    intervals (with requests running or prompts processed) and how many there were; kv: KV cache
    usage during that run (its highest); source "log" (stats line) or "metrics" (counter deltas)."""

    source: str
    peak: float
    low: float
    low_intervals: int
    kv: float | None
    samples: tuple


def prefix_collapse(stats: list, metrics: list, collapse_ratio: float) -> PrefixCollapse | None:
    """The hit-rate series (the stats line's "Prefix cache hit rate", else the /metrics counters'
    interval ratio) with its peak and its trailing run below ``collapse_ratio`` x the peak."""
    series: list[tuple[float, float | None, object]] = []  # (rate, kv, sample)
    busy = [s for s in stats if s.prefix_cache_hit_ratio is not None and (s.num_running or s.prompt_tps)]
    source = "log"
    if busy:
        series = [(s.prefix_cache_hit_ratio, s.kv_cache_usage_ratio, s) for s in busy]
    else:
        source = "metrics"
        ms = [m for m in metrics if m.prefix_cache_queries_total is not None and m.prefix_cache_hits_total is not None]
        for a, b in zip(ms, ms[1:]):
            ratio = hit_ratio_between(a.prefix_cache_queries_total, a.prefix_cache_hits_total,
                                      b.prefix_cache_queries_total, b.prefix_cache_hits_total)
            if ratio is not None:
                series.append((ratio, b.kv_cache_usage_ratio, b))
    if len(series) < 2:
        return None
    peak = max(r for r, _, _ in series)
    cut = peak * collapse_ratio
    run = []
    for item in reversed(series):
        if item[0] > cut:
            break
        run.append(item)
    run.reverse()
    if not run:
        return PrefixCollapse(source, peak, series[-1][0], 0, series[-1][1], ())
    kvs = [k for _, k, _ in run if k is not None]
    return PrefixCollapse(source, peak, max(r for r, _, _ in run), len(run), max(kvs) if kvs else None,
                          tuple(s for _, _, s in run[-3:] if source == "log"))


@dataclass(frozen=True)
class HostTrend:
    """Host memory over the window: samples, first/last used bytes, the limit, the least-squares
    growth (bytes per hour) and the hours left to the limit at that rate (None: not growing)."""

    samples: int
    first_bytes: int
    last_bytes: int
    limit_bytes: int | None
    rss_bytes: int | None
    growth_bytes_per_hour: float | None
    hours_to_limit: float | None
    source: str


def host_trend(samples: list) -> HostTrend | None:
    if not samples:
        return None
    pts = [(s.meta.ts, s.used_bytes) for s in samples if s.meta.ts is not None]
    slope = None
    if len(pts) >= 2:
        n = len(pts)
        mx = sum(t for t, _ in pts) / n
        my = sum(v for _, v in pts) / n
        den = sum((t - mx) ** 2 for t, _ in pts)
        if den > 0:
            slope = sum((t - mx) * (v - my) for t, v in pts) / den * 3600.0
    last = samples[-1]
    hours = None
    if slope and slope > 0 and last.limit_bytes:
        hours = max(0.0, (last.limit_bytes - last.used_bytes) / slope)
    return HostTrend(len(samples), samples[0].used_bytes, last.used_bytes, last.limit_bytes, last.rss_bytes,
                     slope, hours, last.source)
