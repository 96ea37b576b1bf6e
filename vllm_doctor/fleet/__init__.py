"""Fleet diagnosis through Prometheus: ``vllm-doctor diagnose --prometheus URL``.

One sidecar sees one pod; Prometheus (or Thanos / Mimir behind the same API) already holds every
replica's history. This module range-queries it and runs the *same* pipeline as ``diagnose``:

1. **Series** (:mod:`.prometheus`): vLLM's own ``vllm:num_requests_running|waiting``,
   ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before 0.9.2),
   ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``
   (names and priorities from :data:`vllm_doctor.ingest.scrape.SAMPLE_FIELDS`, the /metrics
   scraper's table), ``vllm:cache_config_info``, the latency histograms; and the sidecars'
   ``vllm_max_num_seqs``, ``vllm_max_model_len``, ``vllm_kv_cache_tokens``,
   ``vllm_max_concurrency``, ``gpu_memory_used_bytes`` / ``gpu_memory_total_bytes`` and
   ``vllm_doctor_finding_active`` (what each sidecar found in its pod's log).
2. **Typed events per replica**: each step of each engine becomes a
   :class:`~vllm_doctor.events.SchedulerStats`, the same values vLLM's periodic stats line prints
   (vLLM computes both from its ``SchedulerStats``): running, waiting, KV cache usage, prompt and
   generation throughput (counter deltas over the step) and the preemptions of the step. The
   cache_config_info labels arrive as a :class:`~vllm_doctor.events.VllmMetricsSample`, the
   sidecars' configuration gauges as ``EngineConfigObserved`` / ``KvCacheCapacity``, GPU memory
   as ``GpuSample``.
3. **The same rules**: one :class:`~vllm_doctor.pipeline.Pipeline` per replica (a replica's
   engines are fed into it as a data-parallel vLLM log would be: one stats line per engine),
   its rules run on the series' clock exactly as ``diagnose`` runs them on log time.
4. **Fleet rules** (``rules/fleet/VD020+``, :mod:`.rules`): replica and engine imbalance, a
   fleet-wide preemption or KV saturation, latency objectives missed. They are YAML rules of the
   same schema, run by the same rule engine over a fleet namespace.

A replica is a ``(namespace, pod)`` when the series carry a ``pod`` label (kube-prometheus), else
the scrape ``instance``; a sidecar's series join its replica by the same labels (under
Kubernetes the sidecar shares the pod). The report is the ``diagnose`` report (every format) with
a per-replica table; findings of a replica are titled with the replica's name.
"""

from __future__ import annotations

import math
import re
import time
from array import array
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_doctor.catalogue import V, either
from vllm_doctor.diagnosis import load_rules
from vllm_doctor.diagnosis.advice import BalanceCriteria
from vllm_doctor.errors import InputError
from vllm_doctor.events import (QUERIED_SOURCE_PREFIX, EngineConfigObserved, GpuSample, KvCacheCapacity, Meta,
                                 SchedulerStats, VllmMetricsSample)
from vllm_doctor.findings import SEVERITY_ORDER, Finding, by_severity
from vllm_doctor.diagnosis.schedule import Schedule
from vllm_doctor.pipeline import LogTime, Pipeline, Report
from vllm_doctor.ingest.scrape import SAMPLE_FIELDS
from vllm_doctor.state.signals import histogram_quantile
from vllm_doctor.state.core import FACT_NAMES
from vllm_doctor.fleet.prometheus import PrometheusClient, Series

#: vLLM series read per step -> the field of the /metrics scraper's table (SAMPLE_FIELDS).
LOAD_FIELDS = ("num_running", "num_waiting", "num_swapped", "kv_cache_usage_ratio", "num_preemptions_total",
               "prompt_tokens_total", "generation_tokens_total")
VLLM_NAMES = {name: spec for name, spec in SAMPLE_FIELDS.items() if spec[0] in LOAD_FIELDS}
#: The sidecar's gauges of the same values, used for a replica whose vLLM /metrics is not scraped
#: (a V0 engine before 0.3.3, or only the sidecar in the scrape config): priority 9, vLLM's win.
SIDECAR_LOAD = {
    "vllm_running_sequences": ("num_running", 9), "vllm_pending_sequences": ("num_waiting", 9),
    "vllm_swapped_sequences": ("num_swapped", 9), "vllm_kv_cache_usage_ratio": ("kv_cache_usage_ratio", 9),
    "vllm_preemptions_total": ("num_preemptions_total", 9),
}
SIDECAR_CONFIG = ("vllm_max_num_seqs", "vllm_max_model_len", "vllm_kv_cache_tokens", "vllm_max_concurrency")
SIDECAR_GPU = ("gpu_memory_used_bytes", "gpu_memory_total_bytes")
FINDING_ACTIVE = "vllm_doctor_finding_active"

#: Latency histograms: signal -> (vLLM's histogram, threshold key of its p99 target). Each is queried
#: under every name it had (catalogue.either: its old and new names combined per series, then summed).
LATENCY = {
    "ttft": (V.time_to_first_token_seconds, "ttft_p99_target_seconds"),
    "itl": (V.inter_token_latency_seconds, "itl_p99_target_seconds"),
    "tpot": (V.request_time_per_output_token_seconds, "tpot_p99_target_seconds"),
    "e2e": (V.e2e_request_latency_seconds, "e2e_p99_target_seconds"),
    "queue": (V.request_queue_time_seconds, "queue_time_p99_target_seconds"),
}
LATENCY_QUANTILE = 0.99


def parse_duration(text: str) -> float:
    """``15s``, ``5m``, ``6h``, ``1d``, ``4h30m``, ``90`` -> seconds (PromQL's units). Raises InputError."""
    import re

    s = (text or "").strip()
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", s)
    if not s or "".join(a + b for a, b in parts) != s:
        raise InputError(f"bad duration {text!r} (e.g. 15s, 5m, 6h, 1d, 4h30m)")
    return sum(float(a) * units[b] for a, b in parts)


def parse_time(text: str | None, now: float) -> float | None:
    """An absolute time (epoch seconds, RFC 3339 / ISO 8601) or a duration before now (``6h``)."""
    from datetime import datetime, timezone

    if text is None:
        return None
    s = text.strip()
    try:
        return float(s) if float(s) > 1e9 else now - parse_duration(s)
    except ValueError:
        pass
    try:
        return now - parse_duration(s)
    except InputError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"bad time {text!r}: a duration before now (6h), epoch seconds or ISO 8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def selector_body(selector: str | None) -> str:
    """``{a="b", c=~"d"}`` or ``a="b", c=~"d"`` -> ``a="b", c=~"d"`` (checked by Prometheus)."""
    s = (selector or "").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if "{" in s or "}" in s:
        raise InputError(f"--selector {selector!r}: give label matchers only, e.g. 'namespace=\"prod\"'")
    return s


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def replica_key(labels: dict[str, str]) -> tuple[str, ...]:
    """The replica a series belongs to: (namespace, pod) under Kubernetes, else (instance,)."""
    if labels.get("pod"):
        return (labels.get("namespace", ""), labels["pod"])
    return (labels.get("instance", ""),)


def replica_name(key: tuple[str, ...]) -> str:
    return "/".join(k for k in key if k) or "(no instance label)"


# ---------------------------------------------------------------------------------------------
# per replica
# ---------------------------------------------------------------------------------------------

class Column(Mapping):
    """One field of one engine on its query's step grid, as a column: the values in an
    ``array('d')`` (8 bytes a step, NaN where there was no sample), read as a mapping
    ``{ts: value}`` of the steps with a sample. A fleet's 6 h of 15 s steps is a few MB, where
    a dict of per-sample floats took a hundred."""

    __slots__ = ("t0", "step", "a", "_n")

    def __init__(self, t0: float, step: float, n: int) -> None:
        self.t0, self.step = t0, step
        self.a = array("d", [math.nan]) * n
        self._n = 0

    def _index(self, ts: float) -> int | None:
        i = int(round((ts - self.t0) / self.step))
        return i if 0 <= i < len(self.a) and abs(self.t0 + i * self.step - ts) < 1e-3 else None

    def fold(self, points: list[tuple[float, float]], fld: str) -> None:
        """Add a series' points (several series of one field and engine sum; KV usage: the max).
        An impossible value (vllm-ascend's negative usage, a ratio above 1) is never trusted."""
        a = self.a
        for ts, v in points:
            if math.isnan(v) or v < 0 or (fld == "kv_cache_usage_ratio" and v > 1.0 + 1e-9):
                continue
            i = self._index(ts)
            if i is None:
                continue
            old = a[i]
            if old != old:
                a[i] = v
                self._n += 1
            else:
                a[i] = max(old, v) if fld == "kv_cache_usage_ratio" else old + v

    def get(self, ts: float, default=None):  # the hot path of the events and summaries: no exception
        i = int((ts - self.t0) / self.step + 0.5)
        if 0 <= i < len(self.a):
            v = self.a[i]
            if v == v and abs(self.t0 + i * self.step - ts) < 1e-3:
                return v
        return default

    def __contains__(self, ts: object) -> bool:
        return isinstance(ts, (int, float)) and self.get(ts) is not None

    def __getitem__(self, ts: float) -> float:
        v = self.get(ts)
        if v is None:
            raise KeyError(ts)
        return v

    def __iter__(self):
        t0, step = self.t0, self.step
        return (t0 + i * step for i, v in enumerate(self.a) if v == v)

    def __len__(self) -> int:
        return self._n


@dataclass
class EngineSeries:
    """The series of one engine of one replica: field -> its Column (or any mapping {ts: value};
    priority kept per field)."""

    values: dict[str, Mapping[float, float]] = field(default_factory=lambda: defaultdict(dict))
    prio: dict[str, int] = field(default_factory=dict)


@dataclass
class Replica:
    key: tuple[str, ...]
    engines: dict[str, EngineSeries] = field(default_factory=lambda: defaultdict(EngineSeries))
    config: dict[str, float] = field(default_factory=dict)  # sidecar gauges (last value)
    cache_config: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, dict[str, dict[float, float]]] = field(default_factory=dict)  # gpu -> name -> {ts: v}
    sidecar_findings: dict[str, tuple[dict, float, float]] = field(default_factory=dict)  # rule_id -> (labels, first, last)
    latency_p99: dict[str, float | None] = field(default_factory=dict)
    slo_good_ratio: dict[str, float | None] = field(default_factory=dict)
    model_name: str | None = None
    #: from Prometheus' ``up`` of the replica's vLLM target: the last moment it answered a scrape
    #: (None: never in the range), and whether it was down (up == 0) at the end of the range
    up_last_ok: float | None = None
    up_down_at_end: bool = False
    #: signal -> (first, last) moment its p99 over LATENCY_SPAN_SECONDS was above the target
    latency_span: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = replica_name(self.key)


@dataclass
class Summary:
    """What the per-replica table and the fleet rules read about one replica or engine.

    Ratios are of the steps with data; ``meta`` makes a summary citeable as evidence."""

    replica: str
    engine: str | None
    steps: int
    running_peak: float | None
    waiting_peak: float | None
    kv_peak: float | None
    kv_mean: float | None
    preemptions: int | None
    saturated_ratio: float
    idle_ratio: float
    generation_tps_mean: float | None
    meta: Meta
    latency_p99: dict[str, float | None] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    status: dict[float, str] = field(default_factory=dict, repr=False)  # ts -> "saturated" | "idle" | "room" | "busy"
    load: dict[float, tuple[float, float | None]] = field(default_factory=dict, repr=False)  # ts -> (waiting, fullest KV)
    key: tuple[str, ...] = ()  # the replica's (namespace, pod) or (instance,)


def _delta(prev: float | None, cur: float) -> float:
    """Counter increase between two samples; a drop is a restart (the new value is the increase)."""
    if prev is None:
        return 0.0
    return cur - prev if cur >= prev else cur


def replica_events(rep: Replica, since: float, step: float):
    """The typed events of one replica, in time order: configuration first, then one
    SchedulerStats per engine per step, GPU samples interleaved."""
    src = f"{QUERIED_SOURCE_PREFIX}{rep.name}"
    evs: list[tuple[float, int, object]] = []
    cfg = rep.config
    values = tuple((k, int(cfg[g])) for k, g in (("max_num_seqs", "vllm_max_num_seqs"), ("max_model_len", "vllm_max_model_len"))
                   if cfg.get(g) is not None)
    if values:
        evs.append((since, 0, EngineConfigObserved(Meta(source=src, ts=since, text="vllm-doctor sidecar: " + ", ".join(
            f"{k}={v}" for k, v in values)), kind="scheduler", values=values)))
    if cfg.get("vllm_kv_cache_tokens") is not None or cfg.get("vllm_max_concurrency") is not None:
        kv = cfg.get("vllm_kv_cache_tokens")
        evs.append((since, 0, KvCacheCapacity(Meta(source=src, ts=since, text="vllm-doctor sidecar: KV cache capacity"),
                                              kv_cache_tokens=int(kv) if kv is not None else None,
                                              max_concurrency=cfg.get("vllm_max_concurrency"))))
    if rep.cache_config:
        evs.append((since, 0, VllmMetricsSample(Meta(source=src, ts=since, text=V.cache_config_info),
                                                cache_config=tuple(sorted(rep.cache_config.items())))))
    for eng_name, es in sorted(rep.engines.items()):
        v = es.values
        times = sorted(set().union(*(v[f].keys() for f in ("num_running", "num_waiting", "kv_cache_usage_ratio") if f in v)))
        prev: dict[str, float | None] = {"num_preemptions_total": None, "prompt_tokens_total": None,
                                         "generation_tokens_total": None}
        last_t: float | None = None
        eng_index = int(eng_name) if eng_name.isdigit() else None
        for t in times:
            running = v["num_running"].get(t) if "num_running" in v else None
            waiting = v["num_waiting"].get(t) if "num_waiting" in v else None
            kv = v["kv_cache_usage_ratio"].get(t) if "kv_cache_usage_ratio" in v else None
            dt = (t - last_t) if last_t is not None else step
            rates: dict[str, float | None] = {}
            for f in prev:
                cur = v[f].get(t) if f in v else None
                if cur is None:
                    rates[f] = None
                    continue
                rates[f] = _delta(prev[f], cur)
                prev[f] = cur
            last_t = t
            if running is None and waiting is None:
                continue
            pre = rates["num_preemptions_total"]
            ptps = rates["prompt_tokens_total"] / dt if rates["prompt_tokens_total"] is not None and dt > 0 else None
            gtps = rates["generation_tokens_total"] / dt if rates["generation_tokens_total"] is not None and dt > 0 else None
            text = (f"{rep.name} engine {eng_name}: Running: {running or 0:.0f} reqs, Waiting: {waiting or 0:.0f} reqs, "
                    f"KV cache usage: {'-' if kv is None else f'{kv:.1%}'}"
                    + (f", Preemptions: {pre:.0f}" if pre else "")
                    + (f", prompt {ptps:.1f} tokens/s, generation {gtps:.1f} tokens/s" if ptps is not None and gtps is not None else ""))
            evs.append((t, 1, SchedulerStats(
                Meta(source=src, ts=t, text=text), prompt_tps=ptps, generation_tps=gtps,
                num_running=int(running or 0), num_waiting=int(waiting or 0),
                num_swapped=int(v["num_swapped"][t]) if "num_swapped" in v and t in v["num_swapped"] else None,
                kv_cache_usage_ratio=kv, preemptions=int(pre) if pre is not None else None, engine_index=eng_index)))
    for gpu, series in sorted(rep.gpus.items()):
        used, total = series.get("gpu_memory_used_bytes", {}), series.get("gpu_memory_total_bytes", {})
        idx = int(gpu) if str(gpu).isdigit() else 0
        for t in sorted(used):
            evs.append((t, 2, GpuSample(Meta(source=src, ts=t, text=f"{rep.name} GPU {gpu}: {used[t] / 2**30:.2f} GiB used"),
                                        index=idx, uuid="", model="", memory_used_bytes=int(used[t]),
                                        memory_total_bytes=int(total[t]) if t in total else None)))
    evs.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in evs]


#: Rules with a window at least this long (or none) are judged at their own cadence on every
#: replica; shorter ones only around steps with pressure (see :func:`run_replica`).
LONG_WINDOW_SECONDS = 1800.0


def _pressure(e, t: dict[str, float]) -> bool:
    """A step with requests waiting or preempted: what a short-window rule needs in its window
    to have anything to judge (preemption-storm counts preemptions; prefill-blocking and
    kv-capacity-bound need requests waiting)."""
    return e.num_waiting >= t["waiting_min"] or bool(e.preemptions) or (e.num_swapped or 0) > 0


def run_replica(rep: Replica, ruleset, since: float, step: float, prefilter: bool = True) -> Pipeline:
    """The replica's events through one Pipeline on the series' clock (:class:`LogTime`), its
    rules run by the pipeline's :class:`Schedule` at the step (``eval_interval`` = ``step``),
    exactly as ``diagnose`` runs them on log time (:meth:`Pipeline.tick`).

    prefilter: like the keyword prefilter of the log pipeline (lines no parser can match are not
    parsed), steps far from any pressure (:func:`_pressure`) do not run the short-window rules: a
    quiet stretch is judged by the long-window rules (memory growth) when the same schedule has
    them due, and by every rule at the end. ``prefilter=False`` ticks every step (the tests check
    both agree)."""
    schedule = Schedule(ruleset, step)
    pipe = Pipeline(ruleset, clock=LogTime(), schedule=schedule)
    t = ruleset.thresholds
    windows = {r.id: ruleset.window_seconds(r) for r in ruleset.rules}
    short_max = max([w for w in windows.values() if w is not None and w < LONG_WINDOW_SECONDS] + [0.0])
    long_ids = frozenset(rid for rid, w in windows.items() if w is not None and w >= LONG_WINDOW_SECONDS)
    last_pressure: float | None = None
    for e in replica_events(rep, since, step):
        pipe.observe(e)
        ts = e.meta.ts
        if ts is None or not isinstance(e, SchedulerStats):
            continue
        if not prefilter:
            pipe.tick(ts)
            continue
        if _pressure(e, t):
            last_pressure = ts
        if last_pressure is not None and ts - last_pressure <= short_max:
            pipe.tick(ts)
            continue
        # quiet: only the long-window rules, when the schedule has them due
        due = schedule.due(ts, long_ids)
        if due:
            pipe.active = pipe.engine.evaluate(pipe.state, due)
    pipe.active = pipe.engine.evaluate(pipe.state)
    return pipe


def summarize(rep: Replica, engine: str | None, t: dict[str, float], pipe: Pipeline | None) -> Summary:
    """Peaks, means and the saturated / idle share of the steps of a replica (all engines) or of
    one engine."""
    engines = [rep.engines[engine]] if engine is not None else list(rep.engines.values())
    per_t: dict[float, list[tuple[float | None, float | None, float | None]]] = defaultdict(list)
    pre = 0.0
    have_pre = False
    gen_rates = []
    for es in engines:
        v = es.values
        for ts in set().union(*(v[f].keys() for f in ("num_running", "num_waiting") if f in v)):
            per_t[ts].append((v["num_running"].get(ts) if "num_running" in v else None,
                              v["num_waiting"].get(ts) if "num_waiting" in v else None,
                              v["kv_cache_usage_ratio"].get(ts) if "kv_cache_usage_ratio" in v else None))
        if "num_preemptions_total" in v:
            have_pre = True
            prev = None
            for ts in sorted(v["num_preemptions_total"]):
                cur = v["num_preemptions_total"][ts]
                pre += _delta(prev, cur)
                prev = cur
        if "generation_tokens_total" in v and len(v["generation_tokens_total"]) > 1:
            g = v["generation_tokens_total"]
            gts = sorted(g)
            inc = sum(_delta(g[a], g[b]) for a, b in zip(gts, gts[1:]))
            gen_rates.append(inc / (gts[-1] - gts[0]) if gts[-1] > gts[0] else 0.0)
    c = BalanceCriteria.from_thresholds(t)
    sat = idle = 0
    status: dict[float, str] = {}
    load: dict[float, tuple[float, float | None]] = {}
    kvs, kv_tops, running, waiting = [], [], [], []  # KV usage: mean of the engines, and the fullest engine
    for ts, rows in per_t.items():
        r = sum(x[0] or 0 for x in rows)
        w = sum(x[1] or 0 for x in rows)
        ks = [x[2] for x in rows if x[2] is not None]
        running.append(r)
        waiting.append(w)
        if ks:
            kvs.append(sum(ks) / len(ks))
            kv_tops.append(max(ks))
        # a replica is saturated when every engine is (no room anywhere in it), idle when every
        # engine idles, has room when every engine's KV cache is clearly below full (whether its
        # queue is short enough is judged beside a saturated one: rules.episodes): one full engine
        # beside one with room is the replica's own engine imbalance
        load[ts] = (w, max(ks) if ks else None)
        if all(c.saturated(x[2], x[1]) for x in rows):
            sat += 1
            status[ts] = "saturated"
        elif all(c.idle(x[2], x[1]) for x in rows):
            idle += 1
            status[ts] = "idle"
        elif all(c.spare_kv(x[2]) for x in rows):
            status[ts] = "room"
        else:
            status[ts] = "busy"
    n = len(per_t)
    name = rep.name if engine is None else f"{rep.name} engine {engine}"
    s = Summary(
        replica=rep.name, engine=engine, steps=n,
        running_peak=max(running, default=None), waiting_peak=max(waiting, default=None),
        kv_peak=max(kv_tops, default=None), kv_mean=(sum(kvs) / len(kvs)) if kvs else None,
        preemptions=int(pre) if have_pre else None,
        saturated_ratio=sat / n if n else 0.0, idle_ratio=idle / n if n else 0.0,
        generation_tps_mean=sum(gen_rates) if gen_rates else None,
        meta=Meta(source=f"{QUERIED_SOURCE_PREFIX}{rep.name}", text=""),
        latency_p99=dict(rep.latency_p99) if engine is None else {},
        findings=sorted(f.name for f in pipe.engine.findings.values()) if pipe is not None else [],
        status=status, load=load, key=rep.key,
    )
    kv_txt = "-" if s.kv_peak is None else f"{s.kv_peak:.0%}"
    s.meta = Meta(source=f"{QUERIED_SOURCE_PREFIX}{name}", text=(
        f"{name}: saturated {s.saturated_ratio:.0%} of the time, idle {s.idle_ratio:.0%}; running peak "
        f"{s.running_peak or 0:.0f}, waiting peak {s.waiting_peak or 0:.0f}, KV cache peak {kv_txt}, "
        f"preemptions {'-' if s.preemptions is None else s.preemptions}"))
    return s


# ---------------------------------------------------------------------------------------------
# querying
# ---------------------------------------------------------------------------------------------

def latency_queries(sel: str, rng: str) -> list[tuple[str, str]]:
    """(signal, PromQL) of the latency layer over ``rng``: each histogram's bucket increases per
    replica and ``le`` (its old and new names combined per series first). One query per signal
    gives every replica's p99, the fleet's p99 (the replicas' buckets summed, here) and the share
    of requests within the SLO bound (the bound's bucket over ``+Inf``): 5 queries where one per
    quantity and level took 18, and each reads the fleet's histograms once."""
    return [(sig, f"sum by ({REPLICA_LABELS}, le) ({either(name, sel, suffix='_bucket', fn='increase', window=rng)})")
            for sig, (name, _) in LATENCY.items()]


REPLICA_LABELS = "namespace, pod, instance"
#: a quiet replica (no request waiting, swapped or preempted over the range) is read at this step
#: or the query's, whichever is longer: nothing its rules judge needs more (see fetch)
QUIET_STEP_SECONDS = 60.0
#: replicas per range query (a pressured one at the query step, a quiet one at the quiet step):
#: bounds each answer (about 1 MB per pressured replica over 6 h) and so the memory in flight
BATCH_PRESSURED, BATCH_QUIET = 8, 32


def _good_ratio(buckets: dict[float, float], bound: float | None) -> float | None:
    total = buckets.get(math.inf)
    if bound is None or not total:
        return None
    le = next((le for le in buckets if math.isclose(le, bound, rel_tol=1e-9)), None)
    return None if le is None else buckets[le] / total


def _re2(value: str) -> str:
    """A label value as an exact RE2 alternative inside a PromQL double-quoted string."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value).replace("\\", "\\\\").replace('"', '\\"')


def _batch_selector(keys: list[tuple[str, ...]]) -> str:
    """Label matchers selecting the replicas ``keys`` (a superset where namespaces differ: the
    fold keeps the batch's own)."""
    if all(len(k) == 2 for k in keys):
        ns = sorted({k[0] for k in keys})
        return _join(f'namespace=~"{"|".join(_re2(n) for n in ns)}"' if ns != [""] else "",
                     f'pod=~"{"|".join(sorted(_re2(k[1]) for k in keys))}"')
    return f'instance=~"{"|".join(sorted(_re2(k[-1]) for k in keys))}"'


#: a replica over a latency target over the range: when, read from its p99 over windows this long
LATENCY_SPAN_SECONDS = 300.0


def latency_spans(client: PrometheusClient, sel: str, reps: dict[tuple, Replica], since: float, until: float,
                  t: dict[str, float]) -> None:
    """When each replica over a latency target was over it: its histogram's p99 per
    LATENCY_SPAN_SECONDS window, range-queried for those replicas only (a few series each)."""
    w = LATENCY_SPAN_SECONDS
    if until - since < 2 * w:
        return
    calls, what = [], []
    for sig, (name, target_key) in LATENCY.items():
        over = sorted(k for k, r in reps.items() if (r.latency_p99.get(sig) or 0) > t.get(target_key, math.inf))
        for i in range(0, len(over), BATCH_QUIET):
            keys = over[i:i + BATCH_QUIET]
            expr = (f"sum by ({REPLICA_LABELS}, le) "
                    f"({either(name, _join(sel, _batch_selector(keys)), suffix='_bucket', fn='increase', window=f'{w:g}s')})")
            calls.append(("range", expr, since + w, until, w))
            what.append((sig, set(keys), t[target_key]))
    for i, res in client.each(calls):
        sig, keys, target = what[i]
        per: dict[tuple, dict[float, list]] = defaultdict(lambda: defaultdict(list))
        for s in res:
            key = replica_key(s.labels)
            try:
                le = float(s.labels.get("le", ""))
            except ValueError:
                continue
            if key in keys:
                for ts, v in s.points:
                    per[key][ts].append((le, v))
        for key, by_ts in per.items():
            over_t = [ts for ts, b in sorted(by_ts.items()) if (histogram_quantile(LATENCY_QUANTILE, b) or 0) > target]
            if over_t:
                reps[key].latency_span[sig] = (over_t[0] - w, over_t[-1])


def fetch(client: PrometheusClient, sel: str, since: float, until: float, step: float,
          t: dict[str, float]) -> tuple[dict[tuple, Replica], dict[tuple[str, str], float | None]]:
    """Every replica's series over [since, until], and the fleet's latency: (signal, "p99" |
    "good") -> value.

    The query plan (docs/fleet.md): (1) instant queries over the range, evaluated by Prometheus:
    the replicas, which of them ever had a request waiting, swapped or preempted (pressured), and
    the latency histograms' bucket increases per replica; (2) the load series, range-queried in
    batches of replicas with bounded concurrency: a pressured replica at ``step``, a quiet one at
    QUIET_STEP_SECONDS (a multiple of ``step`` on the same grid); each answer folded into columns
    as it arrives."""
    reps: dict[tuple, Replica] = {}

    def rep(labels: dict[str, str]) -> Replica:
        key = replica_key(labels)
        r = reps.get(key)
        if r is None:
            r = reps[key] = Replica(key)
        if labels.get("model_name") and r.model_name is None:
            r.model_name = labels["model_name"]
        return r

    def fold(series: list[Series], table: dict[str, tuple[str, int]], grid: tuple[float, float, int],
             keep: set | None = None) -> None:
        for s in series:
            spec = table.get(s.labels.get("__name__", ""))
            if spec is None:  # a series the query did not ask for: left out, never the whole report
                client.skipped.append(f"{s.labels.get('__name__', '?')[:60]}: a series not asked for")
                continue
            if keep is not None and replica_key(s.labels) not in keep:
                continue  # another batch's (a namespace matcher wider than the batch)
            fld, prio = spec
            es = rep(s.labels).engines[s.labels.get("engine", "0")]
            have = es.prio.get(fld)
            if have is not None and have < prio:
                continue
            col = es.values.get(fld)
            if have is None or have > prio or not isinstance(col, Column):
                col = es.values[fld] = Column(*grid)
            es.prio[fld] = prio
            col.fold(s.points, fld)

    rng = f"{max(1, int(round(until - since)))}s"
    names = "|".join(sorted(VLLM_NAMES))
    by = REPLICA_LABELS

    def of(*fields: str) -> str:
        return "|".join(sorted(n for n, (f, _) in VLLM_NAMES.items() if f in fields))

    def named(regex: str, extra: str = "") -> str:
        return "{" + _join(f'__name__=~"{regex}"', sel, extra) + "}"

    lat = latency_queries(sel, rng)
    calls: list[tuple] = [
        ("instant", f"last_over_time({V.cache_config_info}{{{sel}}}[{rng}])", until),
        ("instant", f"count by ({by}, job) "
                    f"(last_over_time({named(of('num_running', 'num_waiting', 'kv_cache_usage_ratio'))}[{rng}]))", until),
        ("instant", f"max by ({by}) (max_over_time({named(of('num_waiting', 'num_swapped'))}[{rng}]))", until),
        ("instant", f"sum by ({by}) (increase({named(of('num_preemptions_total'))}[{rng}]))", until),
    ] + [("instant", q, until) for _, q in lat]
    results = client.many(calls)
    present = {replica_key(s.labels) for s in results[1]}
    pressured = {replica_key(s.labels) for s in results[2] if s.points and s.points[-1][1] >= t["waiting_min"]}
    pressured |= {replica_key(s.labels) for s in results[3] if s.points and s.points[-1][1] > 0}
    n = int(round((until - since) / step)) + 1
    k = max(1, int(round(QUIET_STEP_SECONDS / step)))
    quiet_grid = (since, step * k, (n - 1) // k + 1)
    if present:
        batches: list[tuple[list[tuple[str, ...]] | None, tuple[float, float, int]]] = []
        for group, size, grid in ((sorted(present & pressured), BATCH_PRESSURED, (since, step, n)),
                                  (sorted(present - pressured), BATCH_QUIET, quiet_grid)):
            for i in range(0, len(group), size):
                batches.append((group[i:i + size], grid))
        range_calls = [("range", named(names, _batch_selector(keys)), since, until, grid[1]) for keys, grid in batches]
    else:  # a store that answers no instant query over the range: one query of everything at the step
        batches = [(None, (since, step, n))]
        range_calls = [("range", named(names), since, until, step)]
    jobs = sorted({s.labels["job"] for s in results[1] if s.labels.get("job")})
    if jobs:  # vLLM's own scrape targets: a replica that stopped answering, or never did in the range
        range_calls.append(("range", "up{" + _join(sel, f'job=~"{"|".join(_re2(j) for j in jobs)}"') + "}",
                            since, until, quiet_grid[1]))
    for i, res in client.each(range_calls):
        if i == len(batches):
            for s in res:
                ok = [ts for ts, v in s.points if v >= 1]
                down = bool(s.points) and s.points[-1][1] < 1 and s.points[-1][0] >= until - quiet_grid[1]
                if not down and replica_key(s.labels) not in present:
                    continue  # a target up and answering, whose series the selector leaves out: no row
                r = rep(s.labels)
                r.up_last_ok = max(ok[-1], r.up_last_ok or ok[-1]) if ok else r.up_last_ok
                r.up_down_at_end = r.up_down_at_end or down
            continue
        keys, grid = batches[i]
        fold(res, VLLM_NAMES, grid, set(keys) if keys is not None else None)
    for s in results[0]:
        if replica_key(s.labels) in reps:
            r = reps[replica_key(s.labels)]
            for label, value in sorted(s.labels.items()):
                if label not in ("__name__", "engine", "model_name", "job", "instance", "namespace", "pod",
                                 "container", "endpoint", "service"):
                    r.cache_config.setdefault(label, value)
    fleet_lat: dict[tuple[str, str], float | None] = {}
    for (sig, _), res in zip(lat, results[4:]):
        per: dict[tuple, dict[float, float]] = defaultdict(dict)
        fleet: dict[float, float] = defaultdict(float)
        for s in res:
            try:
                le = float(s.labels.get("le", ""))
            except ValueError:
                continue
            if not s.points:
                continue
            v = s.points[-1][1]
            counts = per[replica_key(s.labels)]
            counts[le] = counts.get(le, 0.0) + v
            fleet[le] += v
        bound = t.get(f"slo_{sig}_seconds")
        for key, buckets in per.items():
            r = reps.get(key)
            if r is None:
                continue
            r.latency_p99[sig] = histogram_quantile(LATENCY_QUANTILE, list(buckets.items()))
            r.slo_good_ratio[sig] = _good_ratio(buckets, bound)
        fleet_lat[(sig, "p99")] = histogram_quantile(LATENCY_QUANTILE, list(fleet.items())) if fleet else None
        fleet_lat[(sig, "good")] = _good_ratio(fleet, bound)
    latency_spans(client, sel, reps, since, until, t)
    # The sidecars: the replicas found above, plus those only a sidecar reports.
    side_names = "|".join(sorted({*SIDECAR_LOAD, *SIDECAR_CONFIG, *SIDECAR_GPU, FINDING_ACTIVE}))
    side = client.query_range(f'{{__name__=~"{side_names}", {sel}}}' if sel else f'{{__name__=~"{side_names}"}}',
                              since, until, step)
    fold([s for s in side if s.labels.get("__name__") in SIDECAR_LOAD], SIDECAR_LOAD, (since, step, n))
    for s in side:
        name = s.labels.get("__name__", "")
        if name in SIDECAR_LOAD or not s.points:
            continue
        r = rep(s.labels)  # a replica only its sidecar reports (its vLLM /metrics not scraped)
        if name in SIDECAR_CONFIG:
            r.config[name] = s.points[-1][1]
        elif name in SIDECAR_GPU:
            r.gpus.setdefault(s.labels.get("gpu", "0"), {})[name] = dict(s.points)
        elif name == FINDING_ACTIVE:
            on = [ts for ts, v in s.points if v >= 1]
            if on and s.labels.get("rule_id"):
                r.sidecar_findings[s.labels["rule_id"]] = (s.labels, on[0], on[-1])
    return reps, fleet_lat


# ---------------------------------------------------------------------------------------------
# the diagnosis
# ---------------------------------------------------------------------------------------------

@dataclass
class FleetResult:
    report: Report
    replicas: list[Summary]
    engines: list[Summary]
    fleet_findings: list[Finding]
    seconds: float = 0.0


def _scoped(f: Finding, replica: str) -> Finding:
    from dataclasses import replace

    return replace(f, title=f"{replica}: {f.title}", values={**f.values, "replica": replica})


def _routing_not_capacity(findings: list[Finding], fleet_findings: list[Finding]) -> list[Finding]:
    """A replica that a replica-imbalance finding names as saturated while others had room, or whose
    data-parallel engines were unbalanced (engine-imbalance, its own data-parallel-imbalance), is
    short of routing, not of KV cache: its kv-capacity-bound finding keeps its facts but gives no
    capacity fix (no flag, and its message's "To add capacity" offer is cut for where the fix
    is), and is info: a consequence of the imbalance, so that the verdict leads with the
    imbalance and its routing step (its first check), not with this replica's KV cache."""
    from dataclasses import replace

    def named(rule: str) -> set[str]:  # the replicas of a fleet finding's evidence (the hot side)
        return {e.source.removeprefix(QUERIED_SOURCE_PREFIX).split(" engine ")[0] for f in fleet_findings
                if f.name == rule for e in f.evidence}

    why = {**{r: ("Other data-parallel engines of this replica had room at the same moments (engine-imbalance): how "
                  "requests reach the engines, not this replica's KV cache, is the fix; see that finding.")
              for r in named("engine-imbalance") | {str(f.values.get("replica")) for f in findings
                                                    if f.name == "data-parallel-imbalance"}},
           **{r: ("Other replicas had room at the same moments (replica-imbalance): the router, not this replica's "
                  "KV cache, is the fix; see that finding.") for r in named("replica-imbalance")}}
    out = []
    for f in findings:
        note = why.get(str(f.values.get("replica"))) if f.name == "kv-capacity-bound" else None
        if note:
            # in the message, not a note: a card of several replicas shows each one's message
            message = f.message.split(" The server is at its KV cache capacity")[0] + " " + note
            f = replace(f, severity="info", fixes=[], message=message)
        out.append(f)
    return out


def _sidecar_finding(ruleset, rid: str, labels: dict, first: float, last: float) -> Finding:
    rule = ruleset.by_key(rid)
    title = rule.title if rule is not None else labels.get("name", rid)
    return Finding(
        rule_id=rid, name=labels.get("name", rule.name if rule else rid),
        severity=labels.get("severity") if labels.get("severity") in SEVERITY_ORDER else "warning",
        title=title,
        message=("The vllm-doctor sidecar of this replica reported this finding active "
                 "(vllm_doctor_finding_active) from the vLLM log it follows; its evidence and fix are on the "
                 "sidecar's page and at /api/findings."),
        first_seen=first, last_seen=last, values={"source": "sidecar"})


def diagnose_prometheus(url: str, *, selector: str | None = None, since: str | None = None, until: str | None = None,
                        step: str | None = None, rules_dirs=(), headers: dict[str, str] | None = None,
                        bearer_token: str | None = None, now: float | None = None,
                        prefilter: bool = True) -> FleetResult:
    """Diagnose every replica that ``selector`` matches over [since, until] (default: the last
    6 hours at a 15 s step). Raises InputError (one line) on a bad URL, an unreachable or
    non-Prometheus endpoint, a bad selector or time range, RuleLoadError on bad rules."""
    from vllm_doctor.fleet.rules import FleetRuleEngine, fleet_namespace, load_fleet_rules

    started = time.monotonic()
    now = time.time() if now is None else now
    t_until = parse_time(until, now) if until else now
    t_since = parse_time(since, now) if since else t_until - 6 * 3600
    step_s = parse_duration(step) if step else 15.0
    if t_since >= t_until:
        raise InputError(f"--since must be before --until ({since!r} .. {until or 'now'!r})")
    if step_s <= 0:
        raise InputError(f"--step must be positive, got {step!r}")
    if (t_until - t_since) / step_s > 11000:
        raise InputError(f"--step {step} over {(t_until - t_since) / 3600:.1f} h gives more than 11,000 points per "
                         "series (Prometheus' limit): use a larger --step")
    t_since = t_until - math.floor((t_until - t_since) / step_s) * step_s  # the last step is --until
    sel = selector_body(selector)
    ruleset = load_rules(list(rules_dirs))
    fleet_rules = load_fleet_rules(ruleset.thresholds)
    t = ruleset.thresholds
    with PrometheusClient(url, headers=headers, bearer_token=bearer_token) as client:
        reps, fleet_lat = fetch(client, sel, t_since, t_until, step_s, t)
        warnings = list(client.warnings)
    skipped = client.skipped
    if skipped:  # one bad series is left out and said, never the whole report
        import sys

        print(f"vllm-doctor: {len(skipped)} series from Prometheus left out ({skipped[0]})", file=sys.stderr)
    if not reps:
        raise InputError(f"no vLLM series ({V.num_requests_running}, ...) nor sidecar series match "
                         f"{{{sel}}} between {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t_since))} and "
                         f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(t_until))} UTC"
                         + (f" (the query API warned: {warnings[0]})" if warnings else ""))
    global _JOB
    _JOB = (reps, ruleset, t_since, step_s, prefilter)
    keys = sorted(reps)
    workers = _workers(len(keys))
    if workers > 1:
        import multiprocessing

        # fork: the workers share the fetched series (no copy); each judges whole replicas
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            judged = pool.map(_judge, keys, chunksize=max(1, len(keys) // (workers * 4)))
    else:
        judged = [_judge(k) for k in keys]
    _JOB = None
    replicas = [j[0] for j in judged]
    engines = [e for j in judged for e in j[1]]
    findings = [f for j in judged for f in j[2]]
    timeline = fleet_timeline([(s.replica, j[3]) for s, j in zip(replicas, judged)],
                              {s.replica for s in replicas if s.findings})
    grid = step_s * max(1, int(round(QUIET_STEP_SECONDS / step_s)))
    fleet = FleetRuleEngine(fleet_rules, fleet_namespace(replicas, engines, reps, t, t_since, t_until,
                                                         fleet_lat, step_s, grid))
    fleet_findings = fleet.run(t_until)
    findings = _routing_not_capacity(findings, fleet_findings)
    all_findings = sorted(fleet_findings + findings, key=lambda f: (*by_severity(f), f.title))
    report = Report(
        vllm_version=None, vllm_version_source=None, engine="v1" if any(len(r.engines) for r in reps.values()) else None,
        facts={n: None for n in FACT_NAMES}, facts_defaulted=[], findings=all_findings,
        sources=[{"name": f"{url}{f' {{{sel}}}' if sel else ''} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t_since))}.."
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t_until))} step {step_s:g}s"
                          + (f" (partial response, {len(warnings)} warning(s): {warnings[0]})" if warnings else ""),
                  "lines_total": sum(s.steps for s in replicas), "unparsed_lines": 0, "vllm_lines": len(replicas),
                  **({"warnings": warnings} if warnings else {}), **({"series_skipped": len(skipped)} if skipped else {})}],
        rule_errors=dict(fleet.rule_errors), generated_at=time.time(),
        # each data-parallel replica's engines right under it (engine 0 at 100 % beside the replica's row)
        replicas=[row for s in replicas for row in [replica_row(s)] + [replica_row(e) for e in engines
                                                                        if e.replica == s.replica]],
        timeline=timeline,
    )
    return FleetResult(report, replicas, engines, fleet_findings, time.monotonic() - started)


_JOB = None  # (replicas, ruleset, since, step, prefilter) of the diagnosis under way, for _judge


def _workers(n: int) -> int:
    """Processes judging replicas: one per core (at most 4) for 16 replicas or more;
    ``VLLM_DOCTOR_WORKERS=1`` keeps one process (as for diagnose of a large log)."""
    import os

    env = os.environ.get("VLLM_DOCTOR_WORKERS")
    if env and env.isdigit():
        return max(1, int(env))
    return min(os.cpu_count() or 1, 4) if n >= 16 else 1


#: A fleet of at most this many replicas is charted replica by replica; a larger one as the fleet's
#: sum (KV cache usage: the mean) with its replicas that have a finding, at most FLEET_CHART_TROUBLED.
FLEET_CHART_EACH = 6
FLEET_CHART_TROUBLED = 5


def fleet_timeline(snaps: list[tuple[str, dict]], troubled: set[str]) -> dict:
    """The charts' series of a fleet (:func:`vllm_doctor.report.timeline.charts`), from each replica's
    timeline (its SchedulerStats from the Prometheus series): keyed by replica name (``name engine
    N`` for a data-parallel one's engines), or ``fleet`` for the sum of a large fleet."""
    def each(name: str, snap: dict) -> dict[str, list]:
        ser = {k: v for k, v in (snap.get("series") or {}).items() if v}
        return {name if len(ser) == 1 else f"{name} engine {k}": v for k, v in ser.items()}

    series: dict[str, list] = {}
    if len(snaps) <= FLEET_CHART_EACH:
        for name, snap in snaps:
            series.update(each(name, snap))
    else:
        acc: dict[float, list] = {}
        for _, snap in snaps:
            for pts in (snap.get("series") or {}).values():
                for p in pts:
                    if p[0] is None:
                        continue
                    a = acc.setdefault(p[0], [0.0, 0, None, None, None, None, None])
                    if p[1] is not None:
                        a[0] += p[1]
                        a[1] += 1
                    for i in range(2, 7):
                        if p[i] is not None:
                            a[i] = (a[i] or 0) + p[i]
        series[f"fleet ({len(snaps)} replicas)"] = [
            [ts, (a[0] / a[1]) if a[1] else None, *a[2:]] for ts, a in sorted(acc.items())]
        for name, snap in snaps:
            if name in troubled and len(series) <= FLEET_CHART_TROUBLED:
                series.update(each(name, snap))
    from vllm_doctor.report.timeline import FIELDS

    return {"fields": list(FIELDS), "series": series, "stride": {k: 1 for k in series}}


def _judge(key: tuple) -> tuple[Summary, list[Summary], list[Finding], dict]:
    """One replica through its pipeline: its summary, its engines' summaries, its findings, its
    timeline (the charts' series)."""
    reps, ruleset, since, step, prefilter = _JOB
    rep = reps[key]
    t = ruleset.thresholds
    pipe = run_replica(rep, ruleset, since, step, prefilter=prefilter)
    for rid, (labels, first, last) in sorted(rep.sidecar_findings.items()):
        if rid not in pipe.engine.findings:
            pipe.engine.findings[rid] = _sidecar_finding(ruleset, rid, labels, first, last)
    engines = [summarize(rep, e, t, None) for e in sorted(rep.engines)] if len(rep.engines) > 1 else []
    return (summarize(rep, None, t, pipe), engines, [_scoped(f, rep.name) for f in pipe.engine.findings.values()],
            pipe.state.timeline.snapshot())


def replica_row(s: Summary) -> dict:
    """One row of the report's per-replica table (JSON scalars)."""
    def r(v, nd=4):
        return None if v is None else round(v, nd)

    return {
        "replica": s.replica, "engine": s.engine, "steps": s.steps,
        "running_peak": r(s.running_peak), "waiting_peak": r(s.waiting_peak),
        "kv_cache_usage_peak_ratio": r(s.kv_peak), "kv_cache_usage_mean_ratio": r(s.kv_mean),
        "preemptions": s.preemptions, "saturated_ratio": r(s.saturated_ratio), "idle_ratio": r(s.idle_ratio),
        "generation_tokens_per_second": r(s.generation_tps_mean, 2),
        **{f"{sig}_p99_seconds": r(v) for sig, v in sorted(s.latency_p99.items())},
        "findings": s.findings,
    }


def diagnose_from_env(url: str, **kw) -> FleetResult:
    """:func:`diagnose_prometheus` with the credentials of the environment:
    ``VLLM_DOCTOR_PROMETHEUS_HEADERS`` (``Name: value; Name2: value2``, e.g. Mimir's
    ``X-Scope-OrgID: tenant``) and ``VLLM_DOCTOR_PROMETHEUS_TOKEN`` (a bearer token). Basic auth
    goes in the URL (``https://user:password@host``). Secrets stay out of the command line."""
    import os

    headers = {}
    for part in os.environ.get("VLLM_DOCTOR_PROMETHEUS_HEADERS", "").split(";"):
        if ":" in part:
            k, v = part.split(":", 1)
            headers[k.strip()] = v.strip()
        elif part.strip():
            raise InputError("VLLM_DOCTOR_PROMETHEUS_HEADERS: give 'Name: value; Name2: value2'")
    return diagnose_prometheus(url, headers=headers, bearer_token=os.environ.get("VLLM_DOCTOR_PROMETHEUS_TOKEN"), **kw)
