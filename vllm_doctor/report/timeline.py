"""The time series behind the charts: KV cache usage, running, waiting, prompt and generation
throughput and preemptions over time, per engine, bounded and downsampled.

:class:`Timeline` is fed by :meth:`vllm_doctor.state.core.State.apply` with every event (it keeps only
what the charts need) and holds at most ``capacity`` points per series whatever the log's length:
when a series is full, neighbouring points are merged pairwise (peaks of KV cache usage, running
and waiting are kept, throughput averaged, preemptions summed) and each later point covers twice as
many stats lines. A log with fewer stats lines than ``capacity`` has one point per stats line.

:func:`charts` turns a snapshot and the findings' spans into what ``templates/_charts.html.j2``
draws as inline SVG (no script, nothing loaded from the network).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from datetime import datetime, timezone
from typing import Any

#: One point: (ts, kv_cache_usage_ratio, num_running, num_waiting, prompt_tps, generation_tps,
#: preemptions in the interval). None where the source does not tell.
FIELDS = ("ts", "kv_cache_usage_ratio", "num_running", "num_waiting", "prompt_tps",
          "generation_tps", "preemptions")
MAX_SERIES = 16  # engines (data parallel ranks) charted; more are folded into the last one
METRICS_SERIES = "metrics"  # the series built from /metrics samples (used when the log has no stats)


def _merge(a: list, b: list) -> list:
    """Two neighbouring points as one: peaks kept, rates averaged, counts summed."""
    def mx(x, y):
        return y if x is None else (x if y is None else max(x, y))

    def avg(x, y):
        return y if x is None else (x if y is None else (x + y) / 2)

    def add(x, y):
        return y if x is None else (x if y is None else x + y)

    return [a[0] if a[0] is not None else b[0], mx(a[1], b[1]), mx(a[2], b[2]), mx(a[3], b[3]),
            avg(a[4], b[4]), avg(a[5], b[5]), add(a[6], b[6])]


class Series:
    """A capped, downsampled list of points (see the module doc)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(4, capacity)
        self.points: list[list] = []
        self.stride = 1  # samples per point
        self._pending: list | None = None
        self._pending_n = 0
        self.samples = 0

    def add(self, point: list) -> None:
        self.samples += 1
        p = self._pending
        if p is None:
            self._pending = point
        else:  # _merge(p, point), in place (a stats flood merges every line into the pending point)
            if p[0] is None:
                p[0] = point[0]
            for i in (1, 2, 3):
                x, y = p[i], point[i]
                if x is None or (y is not None and y > x):
                    p[i] = y
            for i in (4, 5):
                x, y = p[i], point[i]
                if x is None:
                    p[i] = y
                elif y is not None:
                    p[i] = (x + y) / 2
            x, y = p[6], point[6]
            if x is None:
                p[6] = y
            elif y is not None:
                p[6] = x + y
        self._pending_n += 1
        if self._pending_n >= self.stride:
            self.points.append(self._pending)
            self._pending, self._pending_n = None, 0
            if len(self.points) >= self.capacity:
                pts = self.points
                self.points = [_merge(pts[i], pts[i + 1]) if i + 1 < len(pts) else pts[i]
                               for i in range(0, len(pts), 2)]
                self.stride *= 2

    def snapshot(self) -> list[list]:
        return [list(p) for p in self.points] + ([list(self._pending)] if self._pending is not None else [])


class Timeline:
    """Per-engine series of the stats lines (and of /metrics samples), plus the newest log time."""

    def __init__(self, capacity: int = 600) -> None:
        self.capacity = capacity
        self.series: dict[str, Series] = {}
        self.log_ts: float | None = None  # newest timestamp of a log line (not of a collector sample)
        self._preempt_seen = 0
        self._last_metrics: Any = None

    def _series(self, key: str) -> Series:
        s = self.series.get(key)
        if s is None:
            if len(self.series) >= MAX_SERIES:
                key = sorted(self.series)[-1]
                return self.series[key]
            s = self.series[key] = Series(self.capacity)
        return s

    def note(self, e: Any, kind: str, state: Any) -> None:
        """One event folded into the state (called after the state's own handler)."""
        ts = e.meta.ts
        if kind == "SchedulerStats":
            pre = None
            if state.preemptions_reported:
                pre = max(0, state.preemptions_total - self._preempt_seen)
                self._preempt_seen = state.preemptions_total
            key = "" if e.engine_index is None else str(e.engine_index)
            self._series(key).add([ts, e.kv_cache_usage_ratio, e.num_running, e.num_waiting,
                                   e.prompt_tps, e.generation_tps, pre])
        elif kind == "VllmMetricsSample":
            prev, self._last_metrics = self._last_metrics, e
            ptps = gtps = pre = None
            if prev is not None and ts is not None and prev.meta.ts is not None and ts > prev.meta.ts:
                dt = ts - prev.meta.ts

                def rate(a, b):
                    return None if a is None or b is None or b < a else (b - a) / dt

                ptps = rate(prev.prompt_tokens_total, e.prompt_tokens_total)
                gtps = rate(prev.generation_tokens_total, e.generation_tokens_total)
                if prev.num_preemptions_total is not None and e.num_preemptions_total is not None:
                    pre = max(0, int(e.num_preemptions_total - prev.num_preemptions_total))
            if e.num_running is not None or e.kv_cache_usage_ratio is not None:
                self._series(METRICS_SERIES).add([ts, e.kv_cache_usage_ratio, e.num_running, e.num_waiting,
                                                  ptps, gtps, pre])
        if kind not in ("VllmMetricsSample", "GpuSample", "HostMemorySample") and ts is not None and (
                self.log_ts is None or ts > self.log_ts):
            self.log_ts = ts

    def snapshot(self) -> dict:
        """Plain data: ``{"fields": [...], "series": {engine: [[ts, kv, running, ...], ...]},
        "stride": {engine: stats lines per point}}``. The /metrics series is left out when the log
        has stats lines (they chart the same numbers)."""
        keys = [k for k in self.series if k != METRICS_SERIES] or [k for k in self.series]
        return {"fields": list(FIELDS),
                "series": {k: self.series[k].snapshot() for k in sorted(keys)},
                "stride": {k: self.series[k].stride for k in sorted(keys)}}


# ---- charts (inline SVG, drawn by templates/_charts.html.j2) -------------------------------------

W, H = 600, 190  # the SVG's viewBox
ML, MR, MT, MB = 56, 12, 10, 22  # margins: axis labels left and below
PALETTE = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457")
MARKERS_UP_TO = 60  # a dot on every point of a series this short (a single point draws no line)
SEV_FILL = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}


@dataclass
class Line:
    name: str  # the series (kv, running, waiting, prompt, generation, preemptions)
    label: str
    engine: str
    color: str
    points: str  # "x,y x,y ..." for <polyline points>
    n: int
    markers: list[tuple[str, str]] = field(default_factory=list)  # (x, y) dots when points are few


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    lines: list[Line] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list)  # x, w, color, label
    yticks: list[tuple[float, str]] = field(default_factory=list)
    xticks: list[tuple[float, str]] = field(default_factory=list)
    empty: str | None = None  # why nothing is drawn
    width: int = W
    height: int = H


def _fmt_num(v: float) -> str:
    if v >= 10000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def nice_top(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above ``v`` (a round top for a y axis)."""
    if v <= 0:
        return 1.0
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * k >= v:
            return m * k
    return 10 * k


def _hms(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S")


CHARTS = (
    ("kv", "KV cache usage", "%", (("kv", 1, "KV cache usage", 100.0),)),
    ("requests", "Requests running / waiting", "requests",
     (("running", 2, "running", 1.0), ("waiting", 3, "waiting", 1.0))),
    ("throughput", "Throughput", "tokens/s",
     (("prompt", 4, "prompt", 1.0), ("generation", 5, "generation", 1.0))),
    ("preemptions", "Preemptions per interval", "preemptions", (("preemptions", 6, "preemptions", 1.0),)),
)


#: A pause between two samples longer than this many times their usual spacing (and than
#: GAP_MIN_SECONDS) is a gap in the data: the chart's line breaks there.
GAP_FACTOR = 5.0
GAP_MIN_SECONDS = 60.0


def gap_seconds(pts: list[list]) -> float | None:
    """The pause between two points of a series that counts as a gap (no data): GAP_FACTOR times
    the median spacing of its points, at least GAP_MIN_SECONDS; None with fewer than 3 points."""
    ts = [p[0] for p in pts if p[0] is not None]
    steps = sorted(b - a for a, b in zip(ts, ts[1:]) if b >= a)
    if len(steps) < 2:
        return None
    return max(GAP_FACTOR * steps[len(steps) // 2], GAP_MIN_SECONDS)


def charts(snapshot: dict | None, spans: list[dict] | None = None,
           preemptions_total: int | None = None, live: bool = False,
           names: dict[str, str] | None = None) -> list[Chart]:
    """The four charts of a :meth:`Timeline.snapshot`; ``spans``: ``{"first_seen", "last_seen",
    "severity", "label"}`` of each finding, shaded where they fall in the charted time;
    ``preemptions_total``: the total, said when no interval count can be charted; ``live``: the
    sidecar's page (data may still come), not a report of inputs read to their end; ``names``: a
    legend name per series key (the fleet report's replicas), instead of ``engine N``."""
    series = (snapshot or {}).get("series") or {}
    series = {k: v for k, v in series.items() if v}
    allpts = [p for pts in series.values() for p in pts]
    by_time = bool(allpts) and all(p[0] is not None for p in allpts)
    if by_time:
        x0 = min(p[0] for p in allpts)
        x1 = max(p[0] for p in allpts)
    else:
        x0, x1 = 0.0, float(max((len(v) for v in series.values()), default=1) - 1)
    pw, ph = W - ML - MR, H - MT - MB
    if x1 == x0:  # one instant: drawn in the middle
        x0, x1 = x0 - 1.0, x1 + 1.0
    span = x1 - x0

    def xof(i: int, p: list) -> float:
        v = p[0] if by_time else float(i)
        return ML + (v - x0) / span * pw

    xticks = []
    if by_time and allpts:
        ticks = (0.5,) if span <= 2.0 else (0.0, 0.5, 1.0)
        for frac in ticks:
            xticks.append((ML + frac * pw, _hms(x0 + frac * span)))
    shade = []
    if by_time and allpts:
        for s in spans or []:
            a, b = s.get("first_seen"), s.get("last_seen")
            if a is None:
                continue
            b = a if b is None else b
            if b < x0 or a > x1:
                continue
            xa = ML + (max(a, x0) - x0) / span * pw
            xb = ML + (min(b, x1) - x0) / span * pw
            shade.append({"x": round(xa, 1), "w": round(max(xb - xa, 3.0), 1),
                          "color": SEV_FILL.get(s.get("severity", ""), "#888"),
                          "label": s.get("label", "")})
    out = []
    multi = len(series) > 1
    for cid, title, unit, defs in CHARTS:
        ch = Chart(id=cid, title=title, unit=unit, xticks=xticks, spans=shade)
        vals = [p[idx] * scale for _, idx, _, scale in defs for pts in series.values() for p in pts
                if p[idx] is not None]
        if not vals:
            if not series:
                ch.empty = "no stats line or /metrics sample yet" if live else "no stats line or /metrics sample in these inputs"
            elif cid == "preemptions":
                ch.empty = ("no preemption count over time in these inputs" + (
                    f" ({preemptions_total:,} in total, from a counter read once)" if preemptions_total else ""))
            else:
                ch.empty = "not in the inputs"
            out.append(ch)
            continue
        top = 100.0 if cid == "kv" else nice_top(max(vals))
        ch.yticks = [(MT + ph, "0"), (MT + ph / 2, _fmt_num(top / 2)), (MT, _fmt_num(top))]
        ci = 0
        for eng, pts in series.items():
            gap = gap_seconds(pts) if by_time else None
            for name, idx, label, scale in defs:
                kept = [(i, p) for i, p in enumerate(pts) if p[idx] is not None]
                if not kept:
                    continue
                elabel = "" if not multi else (" (/metrics)" if eng == METRICS_SERIES else
                                                f" ({(names or {}).get(eng) or 'engine ' + (eng or '?')})")
                color = PALETTE[ci % len(PALETTE)]
                # one polyline per stretch of data: no straight line across a gap with no sample
                segments: list[list[str]] = []
                last_ts = None
                for i, p in kept:
                    if not segments or (gap is not None and last_ts is not None and p[0] - last_ts > gap):
                        segments.append([])
                    segments[-1].append(f"{xof(i, p):.1f},{MT + ph - (p[idx] * scale) / top * ph:.1f}")
                    last_ts = p[0]
                n_all = len(kept)
                for seg in segments:
                    ch.lines.append(Line(name=name, label=label + elabel, engine=eng, color=color,
                                         points=" ".join(seg), n=len(seg),
                                         markers=[tuple(c.split(",")) for c in seg]
                                         if n_all <= MARKERS_UP_TO or len(seg) == 1 else []))
                ci += 1
        out.append(ch)
    return out


def finding_spans(findings: list) -> list[dict]:
    """``spans`` for :func:`charts` from Finding objects or their dicts: from the earliest to the
    latest of first seen, last seen and the times of the finding's evidence lines (in ``serve``
    first/last seen are evaluation times; the evidence says when the data showed it)."""
    out = []
    for f in findings:
        def g(k, f=f):
            return f.get(k) if isinstance(f, dict) else getattr(f, k, None)

        def ets(e):
            return e.get("ts") if isinstance(e, dict) else getattr(e, "ts", None)

        times = [t for t in [g("first_seen"), g("last_seen")] + [ets(e) for e in g("evidence") or []]
                 if t is not None]
        if times:
            out.append({"first_seen": min(times), "last_seen": max(times), "severity": g("severity"),
                        "label": f"{g('rule_id')} {g('name')}"})
    return out
