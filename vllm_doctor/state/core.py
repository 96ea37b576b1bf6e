"""Stage 4 of the pipeline: what is known about one vLLM deployment, built from events.

Sticky facts (version, engine, configuration, KV cache capacity) plus time-bounded windows of
the periodic stats, collector samples and incident events, which the rules read. The clock is
the events' own timestamps: log time in ``diagnose``, wall time for collector samples in
``serve``. Memory is bounded by design, whatever the log size or the rate of lines:

* every event kind is a **counter** (``totals``), a windowed counter (per-second buckets, at most
  one per second of the longest window: :class:`WindowCounter`) and a **capped ring** of the
  last :data:`EVENTS_KEPT` events plus the first one (evidence and the rules' ``last_event`` /
  ``first_event`` read them); an OOM flood grows nothing;
* the periodic series (stats lines, /metrics samples, GPU samples) keep at most
  ``max_window_seconds`` of history and at most ``max_items`` entries each;
* peaks (``peak_running``, ``peak_waiting``, ``peak_kv``) are running maxima;
* the rules' window aggregates (``windows``, :mod:`vllm_doctor.state.windows`) are updated with
  each stats line, /metrics sample and GPU poll: per-second buckets of counts, sums, extrema,
  fit sums and quantile sketches, at most one bucket per second of the window.

:meth:`State.snapshot` / :meth:`State.restore` give the part a checkpoint saves (the sticky facts,
the exported counters and what they are computed from) as a typed
:class:`~vllm_doctor.state.snapshot.StateSnapshot`; every other attribute is declared in
:data:`VOLATILE`.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left

from collections import defaultdict, deque
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from vllm_doctor import events as ev
from vllm_doctor.state.windows import GpuMemory, WindowAggregate
from vllm_doctor.report.timeline import Timeline
from vllm_doctor.state.signals import Signals
from vllm_doctor.state.snapshot import Scalar, StateSnapshot
from vllm_doctor.state.startup import Startups
from vllm_doctor.versions import STATS_FINGERPRINTS, defaults as version_defaults, parse_version

CONFIG_FACTS = (
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype", "enable_chunked_prefill",
    "enable_prefix_caching", "block_size", "swap_space", "kv_cache_memory_bytes",
    "num_gpu_blocks_override", "cpu_offload_gb", "quantization", "enforce_eager", "model",
    "preemption_mode", "long_prefill_token_threshold", "max_num_partial_prefills",
)
FACT_NAMES = (
    "kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "tensor_parallel_size", "kv_cache_dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "preemptions_total", "peak_num_running", "peak_num_waiting", "peak_kv_cache_usage_ratio",
    "kv_cache_memory_bytes", "available_kv_cache_bytes", "device_total_memory_bytes", "kv_device",
    "model_weights_bytes", "cpu_offload_kv_tokens", "preemptions_inferred", "oom_events_total",
    "quantization", "swap_space", "workers_seen", "parallel_size_seen", "model",
)
#: Kinds that are series (kept in ``stats`` / ``metrics`` / ``gpus``) or sticky, not event rings.
SERIES_KINDS = frozenset({"SchedulerStats", "VllmMetricsSample", "GpuSample", "EngineConfigObserved", "VersionSeen",
                          "HostMemorySample"})
#: Events that end a start-up that had not served yet (state/startup.py).
FAILED_START_KINDS = frozenset({"EngineFailure", "OutOfMemory", "GpuUnsupported", "NcclError", "KvCacheTooSmall",
                                "NoCacheMemory", "InsufficientFreeMemory", "ConfigRejected"})
#: State attributes a checkpoint saves (:meth:`State.snapshot`, the fields of StateSnapshot).
SAVED = frozenset(("config", "capacity", "memory", "vllm_version", "version_source", "engine", "unknown_flags",
                   "served", "oom_events_total", "_last_oom", "_log_preempt_base", "_log_preempt_cum",
                   "_v1_interval_sum", "_metrics_base", "_metrics_last", "preemptions_total",
                   "preemptions_reported", "peak_running", "peak_waiting", "peak_kv", "lines_total"))
#: State attributes a checkpoint does not save, and why: a resumed sidecar rebuilds them from the
#: data that follows (series, windows and kept events of the minutes after the restart), they are
#: settings or caches, or they belong to the engine run the restart interrupted.
VOLATILE = {
    "max_window": "a setting (the constructor's)",
    "max_items": "a setting (the constructor's)",
    "stats": "series: refilled by the stats lines that follow",
    "_stats_seq": "follows stats (the sequence number of its lines): restarts with it",
    "_stats_last": "follows stats (each engine's newest line, for the preemption signature)",
    "_preempt_sign_seq": "follows stats (where the preemption signature was last seen in it)",
    "_stats_unordered_seq": "follows stats (where its lines were last out of time order)",
    "_stats_stuck_seq": "follows stats (where a line last showed an engine making no progress)",
    "_hang_waits": "follows stats (the engine's broadcast waits since its last stats line with progress)",
    "metrics": "series: refilled by the next scrapes",
    "gpu_series": "series: refilled by the next NVML polls",
    "host_memory": "series: refilled by the next host-memory samples",
    "events": "kept events: evidence of what happens after the restart",
    "first_events": "kept events: evidence of what happens after the restart",
    "counts": "windowed counts: refilled by the events that follow",
    "totals": "per-kind event counts of this process (not exported as counters)",
    "last_stats": "the newest stats line: the next one replaces it",
    "last_stats_by_engine": "the newest stats line per engine: the next ones replace them",
    "last_metrics": "the newest scrape: the next one replaces it",
    "gpus": "the newest NVML sample per GPU: the next poll replaces them",
    "run_index": "engine runs are counted from the sidecar's start",
    "run_started": "engine runs are counted from the sidecar's start",
    "_run_active": "engine runs are counted from the sidecar's start",
    "_run_base": "engine runs are counted from the sidecar's start",
    "now": "the clock: the next event or evaluation sets it",
    "defaulted": "a cache of facts(), recomputed on each call",
    "preemption_timeline": "the preemption window's history; restore() puts the saved total in as its base",
    "shutting_down": "follows the ServerShutdown / engine start lines that follow",
    "preemptions_trimmed": "follows preemption_timeline",
    "worker_pids": "processes seen; they print again after a restart",
    "timeline": "the charts' series: refilled by the data that follows",
    "signals": "TTFT quantiles and prefix hit ratio of the recent window: refilled by the next scrapes",
    "startups": "start-ups seen by this process (their phases are not re-read)",
    "windows": "the rules' window aggregates: registered by RuleEngine.attach, refilled by the data",
    "_stats_pending": "stats lines not yet folded into windows (flushed before a checkpoint reads)",
    "_stats_batched": "the window aggregates split by how they are fed (add_window)",
    "_stats_per_line": "the window aggregates split by how they are fed (add_window)",
    "_trimmed_at": "a cache of the last trim",
    "serial": "a change counter for the rule engine's caches",
    "_handlers": "a cache of the event handlers",
}
# Events a starting engine writes before it serves or fails: they do not make a run "active"
# (a version banner or engine start after an active run is a restart).
QUIET_KINDS = frozenset(("VersionSeen", "EngineConfigObserved", "KvCacheCapacity", "MemoryProfile", "UnknownFlag",
                         "GpuSample", "VllmMetricsSample", "StartupPhase", "HostMemorySample"))
# Higher wins when two sources give the same config value.
#: Events kept per kind (the newest; the first is kept apart). Counts come from counters.
EVENTS_KEPT = 64
# The wordings of a request rejected for length whose limit is max_model_len (V0's "exceeds limit
# of L" may be max_num_batched_tokens): the OpenAI server's, V1's processor's, V0 multimodal's
MODEL_LENGTH_WORDS = ("maximum context length is ", "maximum model length of ", "(context length ")
#: Most stats lines of one second held before they are folded into the window aggregates.
STATS_BATCH_MAX = 512
KIND_PRIORITY = {"non-default-args": 5, "namespace": 5, "namespace-continued": 5, "scheduler": 4, "model-len": 4, "engine-init": 3}


class WindowCounter:
    """How many events of one kind happened since a time, in bounded memory: per-second
    buckets ``[second, count]``, trimmed to the longest window (so at most one bucket per
    second of it, however many events each second brings). Events without a timestamp are
    always inside the window (as :meth:`Window._in` treats them)."""

    __slots__ = ("buckets", "untimed")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.untimed = 0

    def add(self, ts: float | None) -> None:
        if ts is None:
            self.untimed += 1
            return
        sec = int(ts)
        if self.buckets and self.buckets[-1][0] >= sec:
            self.buckets[-1][1] += 1  # same second (or a clock step back): the newest bucket
        else:
            self.buckets.append([sec, 1])

    def trim(self, cutoff: float, max_buckets: int) -> None:
        while self.buckets and (self.buckets[0][0] < int(cutoff) or len(self.buckets) > max_buckets):
            self.buckets.popleft()

    def since(self, start: float | None) -> int:
        """Events at or after ``start`` (None: every one kept)."""
        n = self.untimed
        for sec, c in reversed(self.buckets):
            if start is not None and sec < int(start):
                break
            n += c
        return n


class State:
    """Everything known about one deployment.

    Attributes used by sinks (see docs/CONTRACTS.md): ``facts()``, ``last_stats``,
    ``last_metrics``, ``gpus``, ``preemptions_total``, ``oom_events_total``, ``lines_total``,
    ``vllm_version``, ``engine``, ``now`` (the lines that gave no event are the pipeline's:
    ``Pipeline.unparsed(source)``).
    """

    def __init__(self, max_window_seconds: float = 7200.0, max_items: int = 20000) -> None:
        self.max_window = max_window_seconds
        self.max_items = max_items
        self.vllm_version: str | None = None
        self.version_source: str | None = None  # "banner" | "fingerprint"
        self.engine: str | None = None
        self.config: dict[str, tuple[int, Scalar]] = {}  # name -> (priority, value)
        self.capacity: dict[str, Scalar] = {}
        self.memory: dict[str, Scalar] = {}
        self.served = False
        self.stats: deque[ev.SchedulerStats] = deque()
        # preemptions_inferred, kept as the stats arrive (was a pass over every kept line at each
        # evaluation): stats lines appended so far, per engine its newest one and when it came,
        # and when the first line of the newest signature pair came (None: no pair yet)
        self._stats_seq = 0
        self._stats_last: dict[int | None, tuple[int, ev.SchedulerStats]] = {}
        self._preempt_sign_seq: int | None = None
        # the newest stats line out of time order (no timestamp, or older than the line before
        # it; -1: none): once it has left the deque, the kept lines are in time order and a
        # window's lines are found by bisection (Window.stats), not by reading them all
        self._stats_unordered_seq = -1
        # the newest stats line that shows no progress (_stuck; -1: none): while none is kept and
        # no scrape either, stalls() has nothing to find (may_stall)
        self._stats_stuck_seq = -1
        # the engine core's (or V0 driver's) shared-memory broadcast waits after it served, since the
        # last stats line that showed a token processed (bounded: the newest EVENTS_KEPT; hang_waits)
        self._hang_waits: deque[ev.BroadcastWait] = deque(maxlen=EVENTS_KEPT)
        self.metrics: deque[ev.VllmMetricsSample] = deque()
        self.gpu_series: deque[tuple[float, int, int | None]] = deque()  # (ts, used_bytes_sum, total)
        self.events: dict[str, deque] = defaultdict(lambda: deque(maxlen=EVENTS_KEPT))  # newest per kind
        self.first_events: dict[str, Any] = {}  # the first event of each kind
        self.counts: dict[str, WindowCounter] = defaultdict(WindowCounter)  # per kind, for windows
        self.totals: dict[str, int] = defaultdict(int)
        self.last_stats: ev.SchedulerStats | None = None
        # data parallel: the newest stats line of each engine ("Engine 000", "Engine 001"; None: unnumbered)
        self.last_stats_by_engine: dict[int | None, ev.SchedulerStats] = {}
        # engine runs: a new version banner or engine start after activity begins a new run
        self.run_index = 0
        self.run_started: float | None = None
        self._run_active = False
        self._run_base: dict[str, int] = {}  # totals when the current run began
        self.last_metrics: ev.VllmMetricsSample | None = None
        self.gpus: dict[int, ev.GpuSample] = {}
        self.peak_running: int | None = None
        self.peak_waiting: int | None = None
        self.peak_kv: float | None = None
        self.lines_total: dict[str, int] = defaultdict(int)
        self.oom_events_total = 0
        self._last_oom: tuple[float | None, int] | None = None  # (ts, lineno) of the last OOM line
        self.now: float | None = None
        self.unknown_flags: dict[str, str | None] = {}
        self.defaulted: list[str] = []  # facts that facts() last filled from version defaults
        # preemptions: one monotonic counter whichever source saw them
        self._log_preempt_base = 0  # totals of engines that restarted
        self._log_preempt_cum = 0  # V0 cumulative of the current engine run
        self._v1_interval_sum = 0
        self._metrics_base = 0.0
        self._metrics_last: float | None = None
        self.preemptions_total = 0
        self.preemption_timeline: deque[tuple[float | None, int]] = deque(maxlen=max_items)
        self.preemptions_reported = False
        self.shutting_down = False
        self.preemptions_trimmed = False
        self.worker_pids: set[tuple[str, int | None]] = set()
        self.timeline = Timeline()  # the charts' bounded series (vllm_doctor/report/timeline.py)
        self.startups = Startups()  # engine starts and their timed phases (state/startup.py)
        self.signals = Signals()  # derived signals of the /metrics samples (TTFT quantiles, prefix hit ratio)
        self.host_memory: deque[ev.HostMemorySample] = deque()  # the sidecar's host-memory samples (bounded by the window)
        # the rules' window aggregates, fed line by line: series -> aggregates (state_windows.py)
        self.windows: dict[str, list[WindowAggregate]] = {"stats": [], "engine_metrics": [], "gpu": []}
        # stats lines of the current second not yet folded into the aggregates (flush_windows)
        self._stats_pending: list[ev.SchedulerStats] = []
        # the stats aggregates folded in batches, and those whose condition reads a fact the stats
        # lines move (judged line by line, after the line is taken in): split once, in add_window
        self._stats_batched: list[WindowAggregate] = []
        self._stats_per_line: list[WindowAggregate] = []
        self._trimmed_at: float | None = None  # the clock at the last _trim
        # events other than stats lines applied (and restores): what the configuration, capacity
        # and memory facts are made of can only change when this moves (RuleEngine caches facts)
        self.serial = 0
        self._handlers: dict[str, Any] = {}  # event kind -> its _on_ method (None: none)

    def add_window(self, series: str, agg: WindowAggregate) -> WindowAggregate:
        """Keep ``agg`` up to date with every new line of ``series`` ("stats", "engine_metrics", "gpu")."""
        self.windows[series].append(agg)
        if series == "stats":
            (self._stats_per_line if getattr(agg.where, "per_line", False) else self._stats_batched).append(agg)
        return agg

    def flush_windows(self) -> None:
        """Fold the pending stats lines into the window aggregates, in order (before anything
        reads an aggregate or anything but a stats line of the same second is applied). Every
        ``where`` that reads ``peak(f)`` learns first what the peak is at each pending line."""
        items = self._stats_pending
        if not items:
            return
        self._stats_pending = []
        aggs = self._stats_batched
        ends = []
        for agg in aggs:
            begin = getattr(agg.where, "begin", None)
            if begin is not None:
                begin(items)
                ends.append(agg.where.end)
        try:
            for agg in aggs:
                agg.add_batch(items)
        finally:
            for end in ends:
                end()

    # ---- intake --------------------------------------------------------------------------
    def apply(self, e: Any) -> None:
        """Fold one event into the state."""
        kind = type(e).__name__
        if kind == "EngineFailure" and self.shutting_down:
            kind = "EngineFailure:after-shutdown"  # the engine stopping because it was asked to
        ts = e.meta.ts
        pending = self._stats_pending
        if pending and (kind != "SchedulerStats" or ts is None or int(ts) != int(pending[-1].meta.ts)):
            self.flush_windows()
        if kind != "SchedulerStats":
            self.serial += 1
        if ts is not None and (self.now is None or ts > self.now):
            self.now = ts
        if kind not in QUIET_KINDS:
            self._run_active = True
        if ts is not None:
            self.startups.seen(ts)
        if kind in FAILED_START_KINDS:
            self.startups.failed()
        if kind == "OutOfMemory" and e.phase is None:
            e = self.resolve_phase(e)
        handler = self._handlers.get(kind, self)
        if handler is self:  # first event of this kind: look its handler up once
            handler = self._handlers[kind] = getattr(self, "_on_" + kind, None)
        if handler is not None:
            handler(e)
        self.timeline.note(e, kind, self)
        if kind not in SERIES_KINDS:
            self.keep(kind, e)
        else:
            self.totals[kind] += 1
        if self.now != self._trimmed_at:
            self._trim()

    def resolve_phase(self, e: ev.OutOfMemory) -> ev.OutOfMemory:
        """``e`` with its ``phase`` set when its traceback did not tell it: "runtime" once the
        engine served (requests or stats lines seen), else "startup". Every OOM the state keeps,
        the timeline notes and a rule reads has its phase in its own field."""
        return replace(e, phase="runtime" if self.served else "startup")

    def keep(self, kind: str, e: Any) -> None:
        """Count one event of ``kind`` and keep it in the kind's capped ring."""
        self.totals[kind] += 1
        self.counts[kind].add(e.meta.ts)
        if kind not in self.first_events:
            self.first_events[kind] = e
        self.events[kind].append(e)  # a deque(maxlen=EVENTS_KEPT): the oldest falls out

    def _trim(self) -> None:
        if self.now is None or self.now == self._trimmed_at:
            return  # the cutoff has not moved: nothing new fell out of the window
        self._trimmed_at = self.now
        cutoff = self.now - self.max_window
        for dq in (self.stats, self.metrics):
            while len(dq) > 1 and dq[0].meta.ts is not None and dq[0].meta.ts < cutoff:
                dq.popleft()
        while len(self.gpu_series) > 1 and self.gpu_series[0][0] < cutoff:
            self.gpu_series.popleft()
        for wc in self.counts.values():
            wc.trim(cutoff, int(self.max_window) + 2)
        while len(self.preemption_timeline) > 2 and (self.preemption_timeline[1][0] or cutoff) < cutoff:
            self.preemption_timeline.popleft()
            self.preemptions_trimmed = True

    def starts_run(self, e: Any) -> bool:
        """True when ``e`` (not yet applied) begins a new engine run: a version banner or an
        engine start after the current run served or failed."""
        if not self._run_active:
            return False
        if isinstance(e, ev.VersionSeen):
            return bool(e.version)
        return isinstance(e, ev.EngineConfigObserved) and e.kind in ("namespace", "non-default-args")

    def _new_run(self, e: Any) -> None:
        """A version banner or engine start: after any activity of the current run, the engine
        restarted. Findings split there (see RuleEngine): a restart ends every incident."""
        if self._run_active or self.run_started is None:
            if self._run_active:
                self.run_index += 1
                self.last_stats_by_engine.clear()
                self._hang_waits.clear()
                self._run_base = dict(self.totals)
            self._run_active = False
            self.run_started = e.meta.ts if e.meta.ts is not None else self.now

    def _on_VersionSeen(self, e: ev.VersionSeen) -> None:
        if e.version:
            self._new_run(e)
            text = e.meta.text
            self.startups.mark(e.meta, "banner" if "\u2588" in text else "init" if "LLM engine" in text else "api")
        if e.version:
            self.vllm_version = e.version
            self.version_source = "banner"
        if e.engine:
            self.engine = e.engine
        elif e.version:
            pv = parse_version(e.version)
            if pv is not None and pv.release >= (0, 11):
                self.engine = "v1"

    def _on_EngineConfigObserved(self, e: ev.EngineConfigObserved) -> None:
        prio = KIND_PRIORITY.get(e.kind, 1)
        if e.kind in ("namespace", "non-default-args"):
            self._new_run(e)
            self.startups.mark(e.meta, "args")
            if self.served:
                self._restart()
            self.shutting_down = False
        for k, v in e.values:
            if k == "max_seq_len":
                k = "max_model_len"
            if k in CONFIG_FACTS and v is not None and v != "None":
                cur = self.config.get(k)
                if cur is None or prio >= cur[0]:
                    self.config[k] = (prio, v)

    # ---- the checkpoint's part (state/snapshot.py) ---------------------------------------
    def snapshot(self) -> StateSnapshot:
        """The sticky facts and the monotonic counters (and what they are computed from): what a
        sidecar checkpoints together with the log offsets they correspond to."""
        return StateSnapshot(
            config=dict(self.config), capacity=dict(self.capacity), memory=dict(self.memory),
            vllm_version=self.vllm_version, version_source=self.version_source, engine=self.engine,
            unknown_flags=dict(self.unknown_flags), served=self.served,
            oom_events_total=self.oom_events_total, last_oom=self._last_oom,
            log_preempt_base=self._log_preempt_base, log_preempt_cum=self._log_preempt_cum,
            v1_interval_sum=self._v1_interval_sum, metrics_base=self._metrics_base,
            metrics_last=self._metrics_last, preemptions_total=self.preemptions_total,
            preemptions_reported=self.preemptions_reported, peak_running=self.peak_running,
            peak_waiting=self.peak_waiting, peak_kv=self.peak_kv,
            lines_total=dict(self.lines_total))

    def restore(self, snap: StateSnapshot) -> None:
        """Put a :meth:`snapshot` back into a fresh State (a resumed sidecar continues its counters
        exactly; what the new run logs wins over the sticky facts later)."""
        self.serial += 1
        self.config.update(snap.config)
        self.capacity.update(snap.capacity)
        self.memory.update(snap.memory)
        self.unknown_flags.update(snap.unknown_flags)
        self.vllm_version = snap.vllm_version or self.vllm_version
        self.version_source = snap.version_source or self.version_source
        self.engine = snap.engine or self.engine
        self.served = snap.served
        self.oom_events_total = snap.oom_events_total
        self._last_oom = snap.last_oom
        self._log_preempt_base = snap.log_preempt_base
        self._log_preempt_cum = snap.log_preempt_cum
        self._v1_interval_sum = snap.v1_interval_sum
        self._metrics_base = snap.metrics_base
        self._metrics_last = snap.metrics_last
        self.preemptions_total = snap.preemptions_total
        self.preemptions_reported = snap.preemptions_reported
        self.peak_running, self.peak_waiting, self.peak_kv = snap.peak_running, snap.peak_waiting, snap.peak_kv
        self.lines_total.update(snap.lines_total)
        if self.preemptions_reported:  # the window's base: preemptions before now are not "recent"
            self.preemption_timeline.append((None, self.preemptions_total))

    def _restart(self) -> None:
        """A new engine run in the same log: counters of the old run are kept, the run's state reset."""
        self._log_preempt_base += self._log_preempt_cum
        self._log_preempt_cum = 0
        self.served = False

    def _on_KvCacheCapacity(self, e: ev.KvCacheCapacity) -> None:
        for f in ("num_gpu_blocks", "num_cpu_blocks", "kv_cache_tokens", "max_concurrency", "device", "cpu_offload_tokens"):
            v = getattr(e, f)
            if v is not None:
                self.capacity[f] = v
        if e.concurrency_tokens is not None:
            self.capacity["concurrency_tokens"] = e.concurrency_tokens
        if self.engine is None:
            if e.kv_cache_tokens is not None:
                self.engine = "v1"
            elif e.num_cpu_blocks is not None:
                self.engine = "v0"

    def _on_MemoryProfile(self, e: ev.MemoryProfile) -> None:
        for f in ("available_kv_cache_bytes", "total_memory_bytes", "gpu_memory_utilization", "model_weights_bytes"):
            v = getattr(e, f)
            if v is not None:
                self.memory[f] = v

    def _on_InsufficientFreeMemory(self, e: ev.InsufficientFreeMemory) -> None:
        # the error states the gpu_memory_utilization vLLM ran with: a fact of the log, not a default
        if e.gpu_memory_utilization is not None:
            self.memory["gpu_memory_utilization"] = e.gpu_memory_utilization

    def _on_SchedulerStats(self, e: ev.SchedulerStats) -> None:
        last = self._stats_last.get(e.engine_index)
        if last is not None and _preemption_signature(last[1], e) and (self._preempt_sign_seq or 0) <= last[0]:
            self._preempt_sign_seq = last[0]  # (another engine's newer pair may have come since)
        self._stats_last[e.engine_index] = (self._stats_seq, e)
        ts = e.meta.ts
        if ts is None or (self.stats and (prev_ts := self.stats[-1].meta.ts) is not None and ts < prev_ts):
            self._stats_unordered_seq = self._stats_seq
        if _stuck(e):
            self._stats_stuck_seq = self._stats_seq
        self._stats_seq += 1
        self.stats.append(e)
        if len(self.stats) > self.max_items:
            self.stats.popleft()
        self.last_stats = e
        if self._stats_batched:
            if e.meta.ts is None:
                for agg in self._stats_batched:
                    agg.add(e, None)
            else:  # folded with the other lines of its second (flush_windows): a batch is cheaper
                self._stats_pending.append(e)
                if self.engine is None or len(self._stats_pending) >= STATS_BATCH_MAX:
                    self.flush_windows()  # the facts a condition reads change after this line
        if e.engine_index in self.last_stats_by_engine or len(self.last_stats_by_engine) < 256:
            self.last_stats_by_engine[e.engine_index] = e
        if e.num_running > 0 or (e.generation_tps or 0) > 0:
            self.served = True
        if self._hang_waits and ((e.prompt_tps or 0) > 0 or (e.generation_tps or 0) > 0):
            self._hang_waits.clear()  # tokens processed since: the engine was busy, not hung
        self.peak_running = max(self.peak_running or 0, e.num_running)
        self.peak_waiting = max(self.peak_waiting or 0, e.num_waiting)
        if e.kv_cache_usage_ratio is not None:
            self.peak_kv = max(self.peak_kv or 0.0, e.kv_cache_usage_ratio)
        if self.engine is None:
            self.engine = "v0" if e.num_swapped is not None else ("v1" if e.engine_index is not None or e.kv_device else None)
        if e.preemptions is not None:
            self.preemptions_reported = True
            self._v1_interval_sum += e.preemptions
            self._update_preemptions(e.meta.ts)
        for agg in self._stats_per_line:  # conditions on the facts this line moved: judged on its state
            agg.add(e, e.meta.ts)

    def note_process(self, process: str | None, pid: int | None) -> None:
        """A record's process prefix: counts distinct worker processes (a lower bound on the
        parallel size when the log shows no configuration) and tells the engine: ``EngineCore``
        processes exist only in V1 (0.7+)."""
        if not process:
            return
        if "orker" in process and len(self.worker_pids) < 1024:
            self.worker_pids.add((process, pid))
        elif self.engine is None and process.startswith("EngineCore"):
            self.engine = "v1"

    def note_src(self, src: str | None) -> None:
        """Version fingerprint from the stats line's ``file:line`` when no banner was seen."""
        if src and self.version_source is None and src in STATS_FINGERPRINTS:
            self.vllm_version = STATS_FINGERPRINTS[src]
            self.version_source = "fingerprint"

    def _on_Preemption(self, e: ev.Preemption) -> None:
        self.preemptions_reported = True
        if e.cumulative is not None:
            self._log_preempt_cum = max(self._log_preempt_cum, e.cumulative)
        else:
            self._log_preempt_cum += 1
        if self.engine is None and e.mode is not None:
            self.engine = "v0"
        self._update_preemptions(e.meta.ts)

    def _on_PreemptionCount(self, e: ev.PreemptionCount) -> None:
        self.preemptions_reported = True

    def _on_VllmMetricsSample(self, e: ev.VllmMetricsSample) -> None:
        if e.cache_config:
            self._cache_config(dict(e.cache_config))
        self.metrics.append(e)
        if len(self.metrics) > self.max_items:
            self.metrics.popleft()
        self.last_metrics = e
        self.signals.add(e)
        if self.windows["engine_metrics"]:
            for m in e.engines or (e,):
                for agg in self.windows["engine_metrics"]:
                    agg.add(m, m.meta.ts)
        if e.num_preemptions_total is not None:
            v = e.num_preemptions_total
            if self._metrics_last is not None and v < self._metrics_last:  # vLLM restarted
                self._metrics_base += self._metrics_last
            self._metrics_last = v
            self.preemptions_reported = True
            self._update_preemptions(e.meta.ts)
        if (e.num_running or 0) > 0:
            self.served = True

    def _cache_config(self, cc: dict[str, str]) -> None:
        """``vllm:cache_config_info`` labels (v1/metrics/loggers.py, 0.8+; V0 engine/metrics.py
        0.6+): the values vLLM resolved at start-up, authoritative over flags and defaults."""

        def num(v: str | None) -> float | None:
            try:
                return float(v) if v not in (None, "None", "") else None
            except ValueError:
                return None

        for key, fact in (("block_size", "block_size"), ("gpu_memory_utilization", "gpu_memory_utilization"),
                          ("kv_cache_memory_bytes", "kv_cache_memory_bytes")):
            v = num(cc.get(key))
            if v is not None:
                self.config[fact] = (6, v if fact == "gpu_memory_utilization" else int(v))
        if cc.get("cache_dtype") not in (None, "None") and re.fullmatch(r"[\w.-]{1,32}", cc["cache_dtype"]):
            self.config["kv_cache_dtype"] = (6, cc["cache_dtype"])  # (a label: a dtype's name, never a command)
        if cc.get("enable_prefix_caching") in ("True", "False"):
            self.config["enable_prefix_caching"] = (6, cc["enable_prefix_caching"] == "True")
        for key, cap in (("num_gpu_blocks", "num_gpu_blocks"), ("num_cpu_blocks", "num_cpu_blocks"),
                         ("kv_cache_size_tokens", "kv_cache_tokens"), ("kv_cache_max_concurrency", "max_concurrency")):
            v = num(cc.get(key))
            if v is not None:
                self.capacity[cap] = v if cap == "max_concurrency" else int(v)
        # vLLM 0.24+ sets kv_cache_size_tokens = int(kv_cache_max_concurrency * max_model_len)
        # (v1/core/kv_cache_utils.py get_kv_cache_capacity): the max_model_len of its "Maximum
        # concurrency for N tokens per request" line, where /metrics is all there is (the fleet)
        tokens, conc = num(cc.get("kv_cache_size_tokens")), num(cc.get("kv_cache_max_concurrency"))
        if tokens and conc and conc > 0 and "concurrency_tokens" not in self.capacity:
            n = math.ceil(tokens / conc - 1e-6)
            if int(conc * n) == int(tokens):
                self.capacity["concurrency_tokens"] = n

    def _on_GpuSample(self, e: ev.GpuSample) -> None:
        self.gpus[e.index] = e
        if e.meta.ts is not None:
            used = sum(g.memory_used_bytes or 0 for g in self.gpus.values())
            total = sum(g.memory_total_bytes or 0 for g in self.gpus.values()) or None
            self.gpu_series.append((e.meta.ts, used, total))
            if self.windows["gpu"]:
                point = GpuMemory(e.meta.ts, used, total)
                for agg in self.windows["gpu"]:
                    agg.add(point, e.meta.ts)
            if len(self.gpu_series) > self.max_items:
                self.gpu_series.popleft()

    def _on_OutOfMemory(self, e: ev.OutOfMemory) -> None:
        # The same OOM is echoed by every process that re-raises it: count distinct seconds.
        last = self._last_oom
        if last is None or last[0] != e.meta.ts or e.meta.ts is None and last[1] + 50 < e.meta.lineno:
            self.oom_events_total += 1
        self._last_oom = (e.meta.ts, e.meta.lineno)
        self.keep(f"OutOfMemory:{e.phase}", e)  # a phase selector (events.PHASE_SELECTORS); apply set the phase

    def _on_ExceptionRaised(self, e: ev.ExceptionRaised) -> None:
        if self.engine is None and e.exc_type.startswith("vllm.v1."):
            self.engine = "v1"

    def _on_ServerReady(self, e: ev.ServerReady) -> None:
        self.served = True
        self.startups.ready(e.meta, e.inferred)
        self.shutting_down = False

    def _on_BroadcastWait(self, e: ev.BroadcastWait) -> None:
        """A wait on the shared-memory broadcast queue. At start-up (the engine had not served, nor
        logged its init-engine time) it is start-up work (compilation, profiling, warm-up) that
        slow-startup judges; a worker's (its process prefix) is a reader waiting for the engine's
        next step, which tells nothing of the engine (its own wait does). The engine core's or V0
        driver's after it served is kept in :meth:`hang_waits` until a stats line shows progress."""
        if "Worker" in (e.meta.process or ""):
            return
        cur = self.startups.current
        if self.served or (cur is not None and "init_engine" in cur.phases):
            self._hang_waits.append(e)

    def hang_waits(self) -> list:
        """The engine's broadcast waits after it served with no stats line showing a token processed
        since the first of them (oldest first; the newest EVENTS_KEPT): its workers never answered."""
        return list(self._hang_waits)

    def _on_StartupPhase(self, e: ev.StartupPhase) -> None:
        self.startups.phase(e)

    def _on_HostMemorySample(self, e: ev.HostMemorySample) -> None:
        self.host_memory.append(e)
        cutoff = (e.meta.ts or 0.0) - self.max_window
        while len(self.host_memory) > 2 and (self.host_memory[0].meta.ts or 0.0) < cutoff:
            self.host_memory.popleft()
        while len(self.host_memory) > self.max_items:
            self.host_memory.popleft()

    def _on_ServerShutdown(self, e: ev.ServerShutdown) -> None:
        self.shutting_down = True

    def _on_UnknownFlag(self, e: ev.UnknownFlag) -> None:
        self.unknown_flags[e.flag] = e.real_flag

    def _update_preemptions(self, ts: float | None) -> None:
        log_total = self._log_preempt_base + self._log_preempt_cum + self._v1_interval_sum
        metrics_total = int(self._metrics_base + (self._metrics_last or 0))
        total = max(self.preemptions_total, log_total, metrics_total)
        if total != self.preemptions_total or not self.preemption_timeline:
            self.preemptions_total = total
            self.preemption_timeline.append((ts, total))

    # ---- reading -------------------------------------------------------------------------
    def config_value(self, name: str) -> object:
        """A configuration value as logged, or None."""
        v = self.config.get(name)
        return None if v is None else v[1]

    def facts(self) -> dict[str, object]:
        """The JSON report's ``facts``: vLLM's names, None when the log does not show them."""
        f: dict[str, object] = {n: None for n in FACT_NAMES}
        for k in CONFIG_FACTS:
            if k in f and k in self.config:
                f[k] = self.config[k][1]
        defaulted: list[str] = []
        tp = self.config.get("tensor_parallel_size", (0, 1))[1]
        pp = self.config.get("pipeline_parallel_size", (0, 1))[1]
        try:
            world = int(tp or 1) * int(pp or 1)
        except (TypeError, ValueError):
            world = 1
        dflt = version_defaults(self.vllm_version, self.engine, self.memory.get("total_memory_bytes"),
                                self.capacity.get("device"), world)
        for k, v in dflt.items():
            if k in f and f[k] is None:
                f[k] = v
                defaulted.append(k)
        cap = self.capacity
        f["num_gpu_blocks"] = cap.get("num_gpu_blocks")
        f["num_cpu_blocks"] = cap.get("num_cpu_blocks")
        f["max_concurrency"] = cap.get("max_concurrency")
        f["kv_device"] = cap.get("device")
        f["cpu_offload_kv_tokens"] = cap.get("cpu_offload_tokens")
        if f["max_model_len"] is None and cap.get("concurrency_tokens") is not None:
            f["max_model_len"] = cap["concurrency_tokens"]
        if f["max_model_len"] is None:
            for e in self.kept("KvCacheTooSmall"):
                if e.max_model_len:
                    f["max_model_len"] = e.max_model_len
        if f["max_model_len"] is None:  # a rejection that states the model's length (not V0's batch limit)
            for e in self.kept("RequestTooLong"):
                if e.limit_tokens and any(w in e.meta.text for w in MODEL_LENGTH_WORDS):
                    f["max_model_len"] = e.limit_tokens
                    break
        kv = cap.get("kv_cache_tokens")
        if kv is None and cap.get("num_gpu_blocks") is not None and f["block_size"]:
            kv = int(cap["num_gpu_blocks"]) * int(f["block_size"])
        if kv is None:
            for e in self.kept("KvCacheTooSmall"):
                if e.kv_cache_tokens:
                    kv = e.kv_cache_tokens
        f["kv_cache_tokens"] = kv
        if f["max_concurrency"] is None and kv and f["max_model_len"] and cap.get("num_gpu_blocks") is not None:
            f["max_concurrency"] = round(kv / int(f["max_model_len"]), 2)
        # vLLM prints this memory in GiB at one or two decimals: a printed 0.0 is a size below that
        # precision (4 MiB reads "0.0 GiB"), not an exact 0 bytes: left out, never shown as 0
        f["available_kv_cache_bytes"] = self.memory.get("available_kv_cache_bytes") or None
        if f["available_kv_cache_bytes"] is None:  # V1's refusal to start names the memory it had
            for e in self.kept("KvCacheTooSmall"):
                if e.available_bytes:
                    f["available_kv_cache_bytes"] = e.available_bytes
        f["device_total_memory_bytes"] = self.memory.get("total_memory_bytes")
        f["model_weights_bytes"] = self.memory.get("model_weights_bytes")
        if self.memory.get("gpu_memory_utilization") is not None and "gpu_memory_utilization" not in self.config:
            f["gpu_memory_utilization"] = self.memory["gpu_memory_utilization"]
            if "gpu_memory_utilization" in defaulted:
                defaulted.remove("gpu_memory_utilization")
        f["preemptions_total"] = self.preemptions_total if self.preemptions_reported else None
        f["peak_num_running"] = self.peak_running
        f["peak_num_waiting"] = self.peak_waiting
        f["peak_kv_cache_usage_ratio"] = self.peak_kv
        f["oom_events_total"] = self.oom_events_total
        self.defaulted = defaulted
        f["preemptions_inferred"] = self.preemptions_inferred()
        f["workers_seen"] = len(self.worker_pids)
        f["parallel_size_seen"] = self.parallel_size_seen()
        return f

    def parallel_size_seen(self) -> int | None:
        """The fewest GPU workers (tensor x pipeline parallel) the worker processes prove: V1's
        ``VllmWorker rank=N`` / ``VllmWorker-N`` / ``Worker_TPN`` count from rank 0, so the highest rank + 1 and the
        distinct processes both bound it; V0's ``VllmWorkerProcess`` are the ranks beside the
        driver, which runs rank 0 in the engine's own process (one more). None: no worker seen."""
        if not self.worker_pids:
            return None
        ranks = [int(m.group(1)) for name, _ in self.worker_pids
                 if (m := re.search(r"(?:rank=|[-_]|TP)(\d+)$", name))]
        v0 = any(name == "VllmWorkerProcess" for name, _ in self.worker_pids)
        return max(len(self.worker_pids) + (1 if v0 else 0), max(ranks) + 1 if ranks else 0)

    def preemptions_inferred(self) -> bool:
        """True when no source reports preemptions but the stats show their signature: KV cache
        full, requests waiting, and running requests dropping between intervals (V1 logs print
        no preemption line)."""
        if self.preemptions_reported or self._preempt_sign_seq is None:
            return False
        # a pair of one engine's consecutive lines (data parallel: each its own cache) both still
        # kept: the stats deque only grows at its end and drops at its start
        return self._preempt_sign_seq >= self._stats_seq - len(self.stats)

    def may_stall(self) -> bool:
        """False when :func:`stalls` over the kept series can find none: no kept stats line shows
        an engine making no progress, and no /metrics sample is kept."""
        return bool(self.metrics) or self._stats_stuck_seq >= self._stats_seq - len(self.stats)

    def kept(self, kind: str) -> list:
        """The kept events of ``kind``: the first one, then the newest EVENTS_KEPT."""
        ring = self.events.get(kind)
        if not ring:
            return []
        first = self.first_events.get(kind)
        fell_out = first is not None and self.totals.get(kind, 0) > len(ring)
        return ([first] if fell_out else []) + list(ring)

    def run_total(self, kind: str) -> int:
        """Events of ``kind`` in the current engine run (since the last restart)."""
        return self.totals.get(kind, 0) - self._run_base.get(kind, 0)

    def run_events(self, kind: str) -> list:
        """The kept events of ``kind`` in the current engine run, oldest first."""
        n = self.run_total(kind)
        dq = self.events.get(kind)
        if n <= 0 or not dq:
            return []
        return list(dq)[-n:] if n < len(dq) else list(dq)

    def window(self, seconds: float | None) -> Window:
        """A view of the last ``seconds`` (None: all that is kept)."""
        return Window(self, seconds)


def _preemption_signature(prev: ev.SchedulerStats, s: ev.SchedulerStats) -> bool:
    """Two consecutive stats lines of one engine that show a preemption: the KV cache (nearly)
    full, requests waiting at both, and fewer running at the second."""
    return (s.kv_cache_usage_ratio is not None and prev.kv_cache_usage_ratio is not None
            and prev.kv_cache_usage_ratio >= 0.9 and s.num_waiting > 0 and prev.num_waiting > 0
            and s.num_running < prev.num_running)


def _ts(e: Any) -> float | None:
    return e.meta.ts


class Window:
    """Series and events of one state over the last ``seconds`` before ``state.now``."""

    def __init__(self, state: State, seconds: float | None) -> None:
        self.state = state
        self.seconds = seconds
        self.start = None if (seconds is None or state.now is None) else state.now - seconds
        if state.run_index and state.run_started is not None:  # a restart ends what came before it
            self.start = state.run_started if self.start is None else max(self.start, state.run_started)

    def _in(self, ts: float | None) -> bool:
        return self.start is None or ts is None or ts >= self.start

    def stats(self) -> list[ev.SchedulerStats]:
        st = self.state
        dq = st.stats
        if self.start is None:
            return list(dq)
        if st._stats_unordered_seq < st._stats_seq - len(dq):  # every kept line timed, in order
            return list(islice(dq, bisect_left(dq, self.start, key=_ts), None))  # type: ignore[arg-type]  # every ts is set here
        return [s for s in dq if self._in(s.meta.ts)]

    def metrics(self) -> list[ev.VllmMetricsSample]:
        return [s for s in self.state.metrics if self._in(s.meta.ts)]

    def events(self, kind: str) -> list:
        """The kept events of ``kind`` in the window (at most EVENTS_KEPT + 1, oldest first)."""
        return [e for e in self.state.kept(kind) if self._in(e.meta.ts)]

    def count(self, kind: str) -> int:
        """How many events of ``kind`` happened in the window (a counter, not the kept ones)."""
        wc = self.state.counts.get(kind)
        return 0 if wc is None else wc.since(self.start)

    def preemptions(self) -> int:
        """Preemptions within the window, from the unified counter's timeline."""
        tl = self.state.preemption_timeline
        if not tl:
            return 0
        base = 0
        for ts, total in tl:
            if self.start is not None and ts is not None and ts < self.start:
                base = total
        return self.state.preemptions_total - base

    def preemptions_counted(self) -> bool:
        """True when :meth:`preemptions` is an exact count for the window: the counter was seen
        before the window began, or its first value was the first preemption. False when the
        counter was first seen inside the window already high (those preemptions may be older)."""
        tl = self.state.preemption_timeline
        if not tl:
            return True
        if self.start is not None and tl[0][0] is not None and tl[0][0] < self.start:
            return True
        return tl[0][1] <= 1 and not self.state.preemptions_trimmed

    def gpu_series(self) -> list[tuple[float, int, int | None]]:
        return [g for g in self.state.gpu_series if self._in(g[0])]

    def engine_metrics(self) -> list:
        """/metrics samples of the window per engine: a scrape with several ``engine`` labels gives
        one :class:`~vllm_doctor.events.EngineMetrics` per engine, others stand for themselves."""
        out: list = []
        for m in self.metrics():
            out.extend(m.engines or (m,))
        return out


STALL_SAMPLES_KEPT = 4


@dataclass(frozen=True)
class Stall:
    """A stretch in which one engine had requests waiting or running and processed no token.

    engine: engine index (None: unnumbered); samples: the stats lines / scrapes that show it
    (cited as evidence: the first and last STALL_SAMPLES_KEPT of a long one; ``intervals`` counts them all); seconds: from the first of them to the first sample that shows
    progress, or to the state's clock when none did (``ongoing``); source: "log" | "metrics"."""

    engine: int | None
    samples: tuple
    seconds: float
    intervals: int
    waiting: int
    running: int
    ongoing: bool
    source: str


def _stuck(x: ev.SchedulerStats) -> bool:
    """A stats line of an engine making no progress: requests waiting or running (a running
    request that makes no progress is stalled too), and prompt and generation throughput 0.0 (a
    throughput no source gave (None) is unknown, not zero). An idle engine (none waiting, none
    running) is not stuck."""
    known = [r for r in (x.prompt_tps, x.generation_tps) if r is not None]
    # stats made from Prometheus' range queries: a replica whose series stopped (or a range past
    # the last sample) repeats its last sample for 5 min, requests running and counters flat; only
    # a queue that stays while nothing is processed tells a stall there
    queried = x.meta.source.startswith(ev.QUERIED_SOURCE_PREFIX)
    busy = (x.num_waiting or 0) >= 1 if queried else _busy(x)
    return busy and bool(known) and not any(known)


def _busy(x) -> bool:
    """Requests waiting or running (a stats line or a scrape)."""
    return (x.num_waiting or 0) >= 1 or (x.num_running or 0) >= 1


def stalls(stats: list, metrics: list, now: float | None, min_intervals: int) -> list[Stall]:
    """Stalls (see :class:`Stall`) of at least ``min_intervals`` intervals, per engine: from the
    stats lines (prompt and generation throughput both 0.0 with requests waiting or running) and
    from /metrics (prompt and generation token counters unchanged between scrapes with requests
    waiting or running). A stretch counts by its lines, or by its length in time over the engine's usual
    stats interval (V1 prints an unchanged all-zero line once, then stays silent)."""
    out: list[Stall] = []
    by_engine: dict[tuple[str, int | None], list] = defaultdict(list)
    for s in stats:
        by_engine[("log", s.engine_index)].append(s)
    for m in metrics:
        by_engine[("metrics", getattr(m, "engine_index", None))].append(m)
    for (source, eng), xs in by_engine.items():
        xs = [x for x in xs if x.meta.ts is not None]
        if len(xs) < 1:
            continue
        gaps = sorted(b.meta.ts - a.meta.ts for a, b in zip(xs, xs[1:]) if b.meta.ts > a.meta.ts)
        interval = max(gaps[len(gaps) // 2], 1.0) if gaps else 10.0
        run: list = []
        prev = None

        def close(end: float | None, ongoing: bool) -> None:
            if not run:
                return
            t0 = run[0].meta.ts
            secs = (end if end is not None else run[-1].meta.ts) - t0
            if len(run) >= min_intervals or secs >= min_intervals * interval:
                cited = run if len(run) <= 2 * STALL_SAMPLES_KEPT else run[:STALL_SAMPLES_KEPT] + run[-STALL_SAMPLES_KEPT:]
                out.append(Stall(eng, tuple(cited), secs, len(run), int(max(x.num_waiting or 0 for x in run)),
                                 int(max(x.num_running or 0 for x in run)), ongoing, source))

        for x in xs:
            if source == "log":
                stuck = _stuck(x)
            else:
                stuck = (prev is not None and _busy(x) and _busy(prev)
                         and x.generation_tokens_total is not None
                         and x.generation_tokens_total == prev.generation_tokens_total
                         and x.prompt_tokens_total == prev.prompt_tokens_total)
                if stuck and not run:
                    run.append(prev)
            if stuck:
                run.append(x)
            else:
                close(x.meta.ts, False)
                run = []
            prev = x
        close(now, True)
    out.sort(key=lambda s: -s.seconds)
    return out
