"""The sidecar's Prometheus collector: ``Pipeline.state`` and the sources' health as metrics.

A prometheus-client custom collector (``collect()`` yields metric families, registered on a
registry the caller injects). ``collect()`` never raises: each family is built on its own, and a
family that fails is left out of that scrape and counted in
``vllm_doctor_collector_errors_total``. It reads only what the sources and the pipeline already
hold: no I/O, no NVML call, on the scrape path.

Names (issue 3). About vLLM, the names operators already query: ``vllm_kv_cache_tokens``,
``vllm_preemptions_total``, ``vllm_running_sequences``, ``vllm_pending_sequences`` (vLLM's
"waiting"), ``vllm_swapped_sequences`` (V0), ``vllm_kv_cache_usage_ratio``,
``vllm_max_concurrency``, ``vllm_max_num_seqs``, ``vllm_max_model_len``,
``vllm_oom_events_total``, ``vllm_prompt_throughput_tokens_per_second``,
``vllm_generation_throughput_tokens_per_second``, ``vllm_prefix_cache_hit_ratio``,
``vllm_time_to_first_token_seconds{quantile}`` (over the scraper's window). Running, pending,
swapped, KV cache usage and the throughputs carry an ``engine`` label: vLLM's data-parallel engine
index ("Engine 001" in the log, ``engine`` in its /metrics; "0" with one engine). About the GPU:
``gpu_memory_used_bytes``, ``gpu_memory_total_bytes``, ``gpu_utilization_ratio``,
``gpu_power_watts``, ``gpu_temperature_celsius`` (labels ``gpu``, ``uuid``, ``model``) and
``gpu_process_memory_used_bytes{gpu,uuid,pid,process}``. Findings:
``vllm_doctor_finding_active{rule_id,name,severity}`` (every loaded rule, 1 while active). The
sidecar's health: ``vllm_doctor_log_lines_total{source}``,
``vllm_doctor_unparsed_lines_total{source}``, ``vllm_doctor_log_rotations_total{source}``,
``vllm_doctor_log_truncations_total{source}``, ``vllm_doctor_source_up{source}``,
``vllm_doctor_scrape_errors_total``, ``vllm_doctor_rejected_values_total``,
``vllm_doctor_pipeline_errors_total``, ``vllm_doctor_evaluations_total``,
``vllm_doctor_evaluation_seconds_total``, ``vllm_doctor_rule_errors_total{rule_id}``, ``vllm_doctor_last_evaluation_duration_seconds``,
``vllm_doctor_build_info{version}``. The start-up timeline and the host (issue 25):
``vllm_doctor_startup_phase_seconds{phase}``, ``vllm_doctor_startup_seconds``,
``vllm_doctor_startup_ready``, ``vllm_doctor_engine_starts_total``, ``host_memory_used_bytes``,
``host_memory_limit_bytes``, ``vllm_process_resident_memory_bytes``.

Labels are bounded: configured sources, GPU indexes, rule ids, NVML's compute processes. No
prompt text, request id or other value from a log line becomes a label.

Where a value has two sources, vLLM's /metrics wins over the log's stats line while the scrape
is up (it is fresher: sampled at each scrape, the log line only every ~10 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from vllm_doctor import catalogue
from vllm_doctor.about import __version__


class SidecarView(Protocol):
    """What the collector reads of a running sidecar (:class:`vllm_doctor.export.serve.Sidecar`
    is one): a sink depends on this view, not on serve.py."""

    pipeline: Any  # vllm_doctor.pipeline.Pipeline: its state, findings and rule engine
    scraper: Any  # vllm_doctor.ingest.scrape.MetricsScraper or None: vLLM's /metrics scrapes
    pipeline_errors: int
    evaluations: int
    eval_seconds_total: float
    last_eval_seconds: float | None

    def metrics_live(self) -> bool: ...

    def log_sources(self) -> list: ...

    def source_status(self) -> list[dict[str, Any]]: ...

log = logging.getLogger(__name__)

_CLASSES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "info": InfoMetricFamily}


def family(name: str):
    """An empty family of the sidecar's series ``name`` (the name a query uses), its type,
    documentation and label names from the catalogue (vllm_doctor/data/vllm_metrics.json)."""
    f = catalogue.sidecar_families()[name]
    if f.type == "info":  # an info's labels are given with its value
        return InfoMetricFamily(f.defined_as, f.documentation)
    return _CLASSES[f.type](f.defined_as, f.documentation, labels=list(f.labels))


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class SidecarCollector(Collector):
    """Export a running sidecar (:class:`SidecarView`: its pipeline state, sources and findings).
    Register it on the registry served at /metrics."""

    def __init__(self, sidecar: SidecarView) -> None:
        self.sidecar = sidecar
        self.errors = 0

    def describe(self) -> list:
        """Every family the sidecar may export (the catalogue's sidecar series), without samples."""
        return [family(n) for n in catalogue.sidecar_families()]

    def collect(self) -> Iterator:
        """Yield every family that can be built now; never raises."""
        parts: list[Callable[[], list]] = [self._vllm, self._gpus, self._startup, self._host, self._findings, self._health]
        out: list = []
        lock = getattr(self.sidecar, "lock", None)
        try:
            if lock is not None:
                lock.acquire()
            for part in parts:
                try:
                    out.extend(part())
                except Exception:  # noqa: BLE001 - a scrape must answer whatever breaks
                    self.errors += 1
                    log.exception("collector part %s failed", part.__name__)
        finally:
            if lock is not None:
                lock.release()
        err = family("vllm_doctor_collector_errors_total")
        err.add_metric([], self.errors)
        out.append(err)
        yield from out

    # -- start-up timeline and host memory (issue 25) ---------------------------------------------

    def _startup(self) -> list:
        """The newest engine start's phases (``vllm_doctor_startup_phase_seconds{phase}``, the
        phases of state/startup.py), its duration to ready, and the starts seen."""
        sus = self.sidecar.pipeline.state.startups
        cur = sus.current
        fams = []
        starts = CounterMetricFamily("vllm_doctor_engine_starts", "Engine starts seen in the logs (a version "
                                     "banner or args echo each; several within an hour: restart-loop).")
        starts.add_metric([], sus.total)
        fams.append(starts)
        if cur is None:
            return fams
        g = GaugeMetricFamily("vllm_doctor_startup_phase_seconds", "Duration of each phase of the newest engine "
                              "start, as vLLM logged it (download, weights, model_load, dynamo, compile, profile, "
                              "graph_capture, init_engine).", labels=["phase"])
        for phase, secs in cur.phases.items():
            g.add_metric([phase], secs)
        fams.append(g)
        total = GaugeMetricFamily("vllm_doctor_startup_seconds", "The newest engine start's duration: first "
                                  "start line to the server ready, else vLLM's phase timings.")
        total.add_metric([], cur.seconds)
        fams.append(total)
        ready = GaugeMetricFamily("vllm_doctor_startup_ready", "1 once the newest engine start serves.")
        ready.add_metric([], 1.0 if cur.ready is not None else 0.0)
        fams.append(ready)
        return fams

    def _host(self) -> list:
        """The host (container) memory the sidecar samples (cgroup v2, else /proc/meminfo)."""
        hm = getattr(self.sidecar, "hostmem", None)
        s = hm.last if hm is not None else None
        if s is None:
            return []
        fams = []
        for name, doc, v in (
            ("host_memory_used_bytes", "Host memory in use: the cgroup's memory.current, else MemTotal - MemAvailable.", s.used_bytes),
            ("host_memory_limit_bytes", "Host memory limit: the cgroup's memory.max (absent when unlimited), else MemTotal.", s.limit_bytes),
            ("vllm_process_resident_memory_bytes", "Summed resident memory (VmRSS) of the vLLM processes.", s.rss_bytes),
        ):
            if v is not None:
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], float(v))
                fams.append(g)
        return fams

    # -- vLLM ---------------------------------------------------------------------------------

    def _vllm(self) -> list:
        sc = self.sidecar
        st = sc.pipeline.state
        facts = st.facts()
        stats = st.last_stats
        m = st.last_metrics if sc.metrics_live() else None
        fams = []

        def gauge(name: str, value: Any) -> None:
            v = _num(value)
            if v is not None:
                g = family(name)
                g.add_metric([], v)
                fams.append(g)

        # per engine (data parallel: "Engine 000", "Engine 001" in the log, the `engine` label in
        # /metrics): the newest stats line of each engine, and the scrape's own per-engine values
        by_stats = {("0" if k is None else str(k)): v for k, v in st.last_stats_by_engine.items()}
        by_metrics: dict[str, Any] = {}
        if m is not None:
            if m.engines:
                by_metrics = {("0" if e.engine_index is None else str(e.engine_index)): e for e in m.engines}
            else:  # one engine: the scrape's values stand for it
                by_metrics = {next(iter(by_stats)) if len(by_stats) == 1 else "0": m}
        engines = sorted(set(by_stats) | set(by_metrics), key=lambda x: (len(x), x))

        def per_engine(name: str, metric_field: str | None, stats_field: str) -> None:
            g = family(name)
            for eng in engines:
                v = getattr(by_metrics.get(eng), metric_field, None) if metric_field else None
                if v is None:
                    v = getattr(by_stats.get(eng), stats_field, None)
                v = _num(v)
                if v is not None:
                    g.add_metric([eng], v)
            if g.samples:
                fams.append(g)

        gauge("vllm_kv_cache_tokens", facts.get("kv_cache_tokens"))
        gauge("vllm_max_concurrency", facts.get("max_concurrency"))
        gauge("vllm_max_num_seqs", facts.get("max_num_seqs"))
        gauge("vllm_max_model_len", facts.get("max_model_len"))
        per_engine("vllm_running_sequences", "num_running", "num_running")
        per_engine("vllm_pending_sequences", "num_waiting", "num_waiting")
        per_engine("vllm_swapped_sequences", "num_swapped", "num_swapped")
        per_engine("vllm_kv_cache_usage_ratio", "kv_cache_usage_ratio", "kv_cache_usage_ratio")
        per_engine("vllm_prompt_throughput_tokens_per_second", None, "prompt_tps")
        per_engine("vllm_generation_throughput_tokens_per_second", None, "generation_tps")
        hit = stats.prefix_cache_hit_ratio if stats is not None else None
        if hit is None:
            hit = st.signals.prefix_cache_hit_ratio
        gauge("vllm_prefix_cache_hit_ratio", hit)
        c = family("vllm_preemptions_total")
        if st.preemptions_reported:  # unknown (a V1 log without /metrics) is not zero
            c.add_metric([], st.preemptions_total)
        fams.append(c)
        c = family("vllm_oom_events_total")
        c.add_metric([], st.oom_events_total)
        fams.append(c)
        if st.signals.ttft_quantiles:
            g = family("vllm_time_to_first_token_seconds")
            for q, v in sorted(st.signals.ttft_quantiles.items()):
                g.add_metric([q], v)
            fams.append(g)
        return fams

    # -- GPUs -----------------------------------------------------------------------------------

    def _gpus(self) -> list:
        gpus = dict(self.sidecar.pipeline.state.gpus)
        if not gpus:
            return []
        spec = [("gpu_memory_used_bytes", "memory_used_bytes"), ("gpu_memory_total_bytes", "memory_total_bytes"),
                ("gpu_utilization_ratio", "utilization_ratio"), ("gpu_power_watts", "power_watts"),
                ("gpu_temperature_celsius", "temperature_celsius")]
        fams = []
        for name, attr in spec:
            g = family(name)
            for idx, s in sorted(gpus.items()):
                v = _num(getattr(s, attr, None))
                if v is not None:
                    g.add_metric([str(idx), s.uuid, s.model], v)
            fams.append(g)
        g = family("gpu_process_memory_used_bytes")
        for idx, s in sorted(gpus.items()):
            for pid, name, used in s.processes:
                g.add_metric([str(idx), s.uuid, str(pid), name], float(used))
        fams.append(g)
        return fams

    # -- findings and health --------------------------------------------------------------------

    def _findings(self) -> list:
        p = self.sidecar.pipeline
        active = {f.rule_id for f in p.engine.findings.values() if f.active}
        g = family("vllm_doctor_finding_active")
        for r in p.ruleset.rules:
            g.add_metric([r.id, r.name, r.severity], 1.0 if r.id in active else 0.0)
        return [g]

    def _health(self) -> list:
        sc = self.sidecar
        st = sc.pipeline.state
        lines = family("vllm_doctor_log_lines_total")
        unparsed = family("vllm_doctor_unparsed_lines_total")
        rot = family("vllm_doctor_log_rotations_total")
        trunc = family("vllm_doctor_log_truncations_total")
        for f in sc.log_sources():
            lines.add_metric([f.name], st.lines_total.get(f.name, 0))
            unparsed.add_metric([f.name], max(0, sc.pipeline.unparsed(f.name)))
            rot.add_metric([f.name], f.stats.rotations)
            trunc.add_metric([f.name], f.stats.truncations)
        up = family("vllm_doctor_source_up")
        for s in sc.source_status():
            up.add_metric([s["source"]], 1.0 if s["up"] else 0.0)
        scrape_err = family("vllm_doctor_scrape_errors_total")
        scrape_err.add_metric([], sc.scraper.stats.errors if sc.scraper is not None else 0)
        rejected = family("vllm_doctor_rejected_values_total")
        rejected.add_metric([], sc.scraper.stats.rejected_values if sc.scraper is not None else 0)
        perr = family("vllm_doctor_pipeline_errors_total")
        perr.add_metric([], sc.pipeline_errors)
        evals = family("vllm_doctor_evaluations_total")
        evals.add_metric([], sc.evaluations)
        eval_s = family("vllm_doctor_evaluation_seconds_total")
        eval_s.add_metric([], sc.eval_seconds_total)
        rerr = family("vllm_doctor_rule_errors_total")
        errs_total = sc.pipeline.engine.rule_errors_total
        for r in sc.pipeline.ruleset.rules:
            rerr.add_metric([r.id], errs_total.get(r.id, 0))
        fams = [lines, unparsed, rot, trunc, up, scrape_err, rejected, perr, evals, eval_s, rerr]
        if sc.last_eval_seconds is not None:
            last = family("vllm_doctor_last_evaluation_duration_seconds")
            last.add_metric([], sc.last_eval_seconds)
            fams.append(last)
        info = family("vllm_doctor_build_info")
        info.add_metric([], {"version": __version__})
        return fams + [info]
