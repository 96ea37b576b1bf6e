"""The monitoring bundle: Prometheus alerting rules, the PrometheusRule object and the Grafana
dashboard, generated from one source so an installed package can print them
(``vllm-doctor export alerts|dashboards|prometheus-rule`` calls :func:`export`).

Why the definitions live here and not in ``alerts/`` or ``dashboards/``: a user who only
``pip install``-ed vllm-doctor has no checkout, yet must get the same rules and dashboards.
The repository files are the generated output, committed so they can be reviewed and mounted
as they are (``alerts/vllm-doctor.rules.yaml``, ``dashboards/out/*.json``,
``deploy/kubernetes/base/generated/*``); ``python -m vllm_doctor.monitoring.bundle --write`` regenerates
them, and the tests fail when a committed file differs from what this module generates.
``dashboards/vllm-doctor.dashboard.py`` is the grafanalib entry point
(``generate-dashboard``) and builds the dashboard through this module.

Every threshold comes from ``rules/thresholds.yaml`` (the file the rules of ``diagnose`` read), so
the alerts and the rules cannot drift apart. The few alert-only knobs (``for:`` durations, the
GPU-full horizon) are constants below, each with the reason for its value.

Units, because the alerts in circulation get them wrong:

* ``increase(counter[5m]) >= 5`` is 5 preemptions per five minutes; ``rate(counter[5m]) > 5``
  would be 5 per *second* (1,500 per five minutes).
* ``deriv(gauge[1h]) * 3600`` is bytes per hour; ``derivative()`` is not a PromQL function.
* KV cache usage is ``vllm_kv_cache_usage_ratio`` (0..1); running sequences divided by KV cache
  tokens is sequences per token, not a usage.
* vLLM's counter is ``vllm:num_preemptions_total``; ``vllm:num_preemptions`` does not exist.
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_doctor.catalogue import V, either

RUNBOOK_BASE_URL = "https://github.com/vllm-doctor/vllm-doctor/blob/main/docs/runbooks"
"""Where ``runbook_url`` points; the runbooks are ``docs/runbooks/<name>.md`` in the repository."""

DOCTOR_JOB = "vllm-doctor"
VLLM_JOB = "vllm"  # the job label of vLLM's own /metrics target (deploy/kubernetes/base/podmonitor.yaml)
"""The Prometheus ``job`` label of the sidecar's scrape (compose, the PodMonitor, the e2e test)."""

# Alert-only knobs (not thresholds of a diagnosis, so not in rules/thresholds.yaml).
FOR_SATURATION = "2m"  # KV cache full with a queue: ignore one busy burst, page within minutes.
FOR_SIDECAR = "2m"  # sidecar or one of its sources down: two scrape failures in a row are noise.
GPU_FULL_HORIZON_SECONDS = 4 * 3600  # page when GPU memory will be full within four hours
LEAK_SUSTAIN_FRACTION = 4  # the slope must hold over window/4 too: a start-up step is not a leak
FOR_LEAK = "20m"  # longer than window/4 so a step (which leaves the short window) never fires
OOM_LOOKBACK = "10m"  # an OOM stays an alert this long (the pod restarts in between)

THRESHOLDS_FILENAME = "thresholds.yaml"

KINDS = ("alerts", "dashboards", "prometheus-rule", "fleet-dashboard", "replicas-dashboard")


# --------------------------------------------------------------------------------------------
# thresholds
# --------------------------------------------------------------------------------------------

def thresholds_path() -> Path:
    """``rules/thresholds.yaml``: in a checkout beside the package, else the package data copy."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "rules" / THRESHOLDS_FILENAME,
                      here / "data" / "rules" / THRESHOLDS_FILENAME):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{THRESHOLDS_FILENAME} not found beside {here}")


def load_thresholds(path: Path | None = None) -> dict[str, float]:
    """The ``value`` of every key of rules/thresholds.yaml."""
    raw = yaml.safe_load((path or thresholds_path()).read_text())
    return {key: entry["value"] for key, entry in raw.items()}


def duration(seconds: float) -> str:
    """A PromQL duration for a number of seconds: 300 -> ``5m``, 3600 -> ``1h``, 90 -> ``90s``."""
    seconds = int(seconds)
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {seconds}")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _num(value: float) -> str:
    """A threshold as PromQL writes it: 5 -> ``5``, 0.95 -> ``0.95``."""
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


# --------------------------------------------------------------------------------------------
# alerts
# --------------------------------------------------------------------------------------------

# Where an alert happened: the pod under Kubernetes, else the scrape target.
WHERE = "{{ with $labels.pod }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"

# Alerts that are symptoms: silenced (Alertmanager inhibition) while VllmEngineDead fires.
SYMPTOM_ALERTS = (
    "VllmPreemptionStorm",
    "VllmKvCacheSaturated",
    "VllmKvCapacityBound",
    "VllmTtftP99High",
    "VllmDoctorFinding",
    "VllmDoctorSourceDown",
    "VllmDoctorLogStale",
)


@dataclass(frozen=True)
class Alert:
    name: str  # CamelCase alertname (kubernetes-mixin convention)
    runbook: str  # docs/runbooks/<runbook>.md
    rule: str  # the vllm-doctor rule (or "vllm-doctor" for the sidecar) it belongs to
    severity: str  # critical | warning | info, or a template taken from the series
    expr: str
    summary: str
    description: str
    for_: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)

    def to_rule(self, runbook_base: str) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity, "rule": self.rule, **self.extra_labels}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{runbook_base}/{self.runbook}.md",
        }
        return rule


def alert_definitions(t: dict[str, float] | None = None) -> dict[str, list[Alert]]:
    """The alerts by group name, every threshold taken from ``t`` (rules/thresholds.yaml)."""
    t = t or load_thresholds()
    pre_w = duration(t["preemption_window_seconds"])
    cap_w = duration(t["kv_capacity_window_seconds"])
    leak_w = duration(t["memory_leak_window_seconds"])
    leak_short = duration(t["memory_leak_window_seconds"] / LEAK_SUSTAIN_FRACTION)
    stale_w = duration(t["log_stale_seconds"])
    full = _num(t["kv_cache_full_ratio"])
    waiting = _num(t["waiting_min"])
    growth = _num(t["memory_leak_min_growth_bytes_per_hour"])
    target = _num(t["ttft_p99_target_seconds"])
    far_below = _num(t["kv_capacity_far_below_ratio"])
    storm = _num(t["preemption_storm_min"])
    target_on = "on(job, instance)"

    vllm = [
        Alert(
            name="VllmPreemptionStorm",
            runbook="vllm-preemption-storm",
            rule="preemption-storm",
            severity="warning",
            # increase() over the window: a count per window, robust to counter resets.
            # vllm-doctor's counter, else vLLM's own (vllm:num_preemptions_total: the examples of vLLM
            # and llm-d query vllm:num_preemptions, which does not exist, so they never fire).
            expr=(
                f"increase(vllm_preemptions_total[{pre_w}]) >= {storm}\n"
                f"or (sum by (job, instance, namespace, pod) (increase({V.num_preemptions_total}[{pre_w}])) >= {storm}\n"
                f"    unless on(namespace, pod) vllm_preemptions_total)"
            ),
            summary=f"vLLM on {WHERE} preempted {{{{ $value | printf \"%.0f\" }}}} requests in {pre_w}",
            description=(
                f"{{{{ $value | printf \"%.0f\" }}}} preemptions in the last {pre_w} on {WHERE} "
                f"(storm: {storm} or more per {pre_w}). The KV cache runs out of blocks, so "
                "running requests are evicted and recomputed: throughput drops and latency "
                "spikes. Give the KV cache more memory (--gpu-memory-utilization) or admit "
                "fewer sequences (--max-num-seqs, --max-num-batched-tokens)."
            ),
        ),
        Alert(
            name="VllmKvCacheSaturated",
            runbook="vllm-kv-cache-saturated",
            rule="kv-capacity-bound",  # VD004 fires on the same samples (KV cache full, requests waiting)
            severity="warning",
            expr=(
                f"vllm_kv_cache_usage_ratio >= {full}\n"
                f"and {target_on} sum by (job, instance) (vllm_pending_sequences) >= {waiting}"
            ),
            for_=FOR_SATURATION,
            summary=f"vLLM KV cache on {WHERE} is {{{{ $value | humanizePercentage }}}} full with requests waiting",
            description=(
                f"GPU KV cache usage is {{{{ $value | humanizePercentage }}}} on {WHERE} "
                f"(full at {full}) while requests wait in the queue, for {FOR_SATURATION}. "
                "New requests cannot be admitted until blocks free up; time to first token "
                "grows with the queue."
            ),
        ),
        Alert(
            name="VllmKvCapacityBound",
            runbook="vllm-kv-capacity-bound",
            rule="kv-capacity-bound",
            severity="warning",
            expr=(
                f"max_over_time(vllm_running_sequences[{cap_w}])\n"
                f"  < {target_on} group_left() ({far_below} * max by (job, instance) (vllm_max_num_seqs))\n"
                f"and {target_on} min by (job, instance) (min_over_time(vllm_pending_sequences[{cap_w}])) >= {waiting}\n"
                f"and {target_on} max by (job, instance) (max_over_time(vllm_kv_cache_usage_ratio[{cap_w}])) >= {full}"
            ),
            summary=f"vLLM on {WHERE} runs at most {{{{ $value | printf \"%.0f\" }}}} sequences: bound by KV cache capacity",
            description=(
                f"Over {cap_w} on {WHERE}, running sequences peaked at {{{{ $value | printf \"%.0f\" }}}}, "
                f"below {far_below} x --max-num-seqs, while requests waited the whole time and the "
                "KV cache was full. Concurrency is limited by KV cache blocks, not by "
                "--max-num-seqs: raise --gpu-memory-utilization, lower --max-model-len, use "
                "--kv-cache-dtype fp8 or add tensor parallelism."
            ),
        ),
        Alert(
            name="VllmGpuMemoryGrowth",
            runbook="vllm-gpu-memory-growth",
            rule="gpu-memory-leak",
            severity="warning",
            # deriv() is per second; * 3600 gives bytes per hour, the unit of the threshold.
            # The short window keeps a start-up allocation step (flat afterwards) from firing.
            expr=(
                f"deriv(gpu_memory_used_bytes[{leak_w}]) * 3600 > {growth}\n"
                f"and deriv(gpu_memory_used_bytes[{leak_short}]) * 3600 > {growth}"
            ),
            for_=FOR_LEAK,
            summary=f"GPU {{{{ $labels.gpu }}}} memory on {WHERE} grows {{{{ $value | humanize1024 }}}}B per hour",
            description=(
                f"GPU {{{{ $labels.gpu }}}} memory used on {WHERE} has grown "
                f"{{{{ $value | humanize1024 }}}}B per hour over the last {leak_w} (leak threshold "
                f"{int(t['memory_leak_min_growth_bytes_per_hour']) // 2**20} MiB/h). vLLM allocates "
                "its memory at start-up; steady growth afterwards is a leak (often CUDA graphs, "
                "a LoRA or multimodal cache, or another process on the GPU)."
            ),
        ),
        Alert(
            name="VllmGpuMemoryFullSoon",
            runbook="vllm-gpu-memory-full-soon",
            rule="gpu-memory-leak",
            severity="critical",
            # Value: seconds until full at the current slope; predict_linear() decides.
            expr=(
                f"(gpu_memory_total_bytes - gpu_memory_used_bytes) / deriv(gpu_memory_used_bytes[{leak_w}])\n"
                f"and predict_linear(gpu_memory_used_bytes[{leak_w}], {GPU_FULL_HORIZON_SECONDS}) > gpu_memory_total_bytes\n"
                f"and deriv(gpu_memory_used_bytes[{leak_short}]) > 0"
            ),
            for_="10m",
            summary=f"GPU {{{{ $labels.gpu }}}} memory on {WHERE} will be full in {{{{ $value | humanizeDuration }}}}",
            description=(
                f"At the growth of the last {leak_w}, GPU {{{{ $labels.gpu }}}} on {WHERE} runs out "
                f"of memory in {{{{ $value | humanizeDuration }}}} (predict_linear over {leak_w}, "
                f"horizon {duration(GPU_FULL_HORIZON_SECONDS)}). vLLM will fail with CUDA out of "
                "memory; plan a restart and find the leak."
            ),
        ),
        Alert(
            name="VllmOutOfMemory",
            runbook="vllm-out-of-memory",
            # The rule of the catalogue, set per branch by the expression: an increase is a runtime
            # OOM (runtime-oom, VD007); a counter first seen already above zero is an OOM at
            # start-up, before the first scrape (startup-oom, VD002), which increase() cannot see.
            rule="{{ $labels.rule }}",
            severity="critical",
            expr=(
                f'label_replace(increase(vllm_oom_events_total[{OOM_LOOKBACK}]) > 0, "rule", "runtime-oom", "", "")\n'
                f'or label_replace(vllm_oom_events_total > 0 unless vllm_oom_events_total offset {OOM_LOOKBACK}\n'
                f'  unless increase(vllm_oom_events_total[{OOM_LOOKBACK}]) > 0, "rule", "startup-oom", "", "")'
            ),
            summary=f"vLLM on {WHERE} ran out of GPU memory",
            description=(
                f"vLLM on {WHERE} logged CUDA out of memory ({{{{ $value | printf \"%.0f\" }}}} in "
                f"the last {OOM_LOOKBACK}). At start-up: the weights, activations and KV cache do "
                "not fit (--gpu-memory-utilization, --max-model-len, --max-num-seqs, "
                "--tensor-parallel-size). At run time: another process took memory, or "
                "--gpu-memory-utilization leaves too little headroom."
            ),
        ),
        Alert(
            name="VllmEngineDead",
            runbook="vllm-engine-dead",
            rule="engine-dead",
            severity="critical",
            expr='vllm_doctor_finding_active{name="engine-dead"} == 1',
            summary=f"vLLM engine on {WHERE} is dead",
            description=(
                f"vllm-doctor saw the vLLM engine die on {WHERE} (EngineDeadError or the engine "
                "process's traceback; vllm_doctor_finding_active = {{ $value }}). Every request "
                "fails until vLLM restarts. Symptom alerts of this pod are inhibited while this fires."
            ),
        ),
        Alert(
            name="VllmDoctorFinding",
            runbook="vllm-doctor-finding",
            rule="{{ $labels.name }}",
            severity="{{ $labels.severity }}",
            # engine-dead has its own alert above.
            expr='vllm_doctor_finding_active{name!="engine-dead"} == 1',
            summary=f"vllm-doctor: {{{{ $labels.rule_id }}}} {{{{ $labels.name }}}} on {WHERE}",
            description=(
                f"vllm-doctor's rule {{{{ $labels.rule_id }}}} ({{{{ $labels.name }}}}) is active on "
                f"{WHERE} (vllm_doctor_finding_active = {{{{ $value }}}}). The finding, its evidence and the vLLM flags to change are on the "
                "sidecar's page (/) and at /api/findings; `vllm-doctor explain "
                "{{ $labels.rule_id }}` describes the rule."
            ),
        ),
    ]

    vllm.append(Alert(
        name="VllmTargetDown",
        runbook="vllm-target-down",
        rule="engine-dead",  # the metrics side of VD008: the log says why (the sidecar's finding)
        severity="critical",
        # vLLM's own target: a replica whose server died, hangs or restarts in a loop (its sidecar,
        # another container, may still be up and see nothing new in the log)
        expr=f'up{{job="{VLLM_JOB}"}} == 0',
        for_=FOR_SIDECAR,
        summary=f"vLLM on {WHERE} does not answer /metrics",
        description=(
            f"Prometheus cannot scrape vLLM's /metrics on {WHERE} (up == {{{{ $value }}}}) for {FOR_SIDECAR}: the "
            "server is dead, hung or restarting, and the requests routed to it fail. The replica's vllm-doctor "
            "sidecar (engine-dead, startup-oom) or `kubectl logs` names the cause."
        ),
    ))

    sidecar = [
        Alert(
            name="VllmDoctorDown",
            runbook="vllm-doctor-down",
            rule="vllm-doctor",
            severity="warning",
            expr=f'up{{job="{DOCTOR_JOB}"}} == 0',
            for_=FOR_SIDECAR,
            summary=f"vllm-doctor sidecar on {WHERE} is down",
            description=(
                f"Prometheus cannot scrape vllm-doctor on {WHERE} (up == {{{{ $value }}}}) for "
                f"{FOR_SIDECAR}: the vLLM alerts of this pod are blind."
            ),
        ),
        Alert(
            name="VllmDoctorSourceDown",
            runbook="vllm-doctor-source-down",
            rule="vllm-doctor",
            severity="warning",
            expr="vllm_doctor_source_up == 0",
            for_=FOR_SIDECAR,
            summary=f"vllm-doctor on {WHERE} lost its {{{{ $labels.source }}}} source",
            description=(
                f"vllm-doctor on {WHERE} reports its {{{{ $labels.source }}}} source down "
                f"(vllm_doctor_source_up == {{{{ $value }}}}) for {FOR_SIDECAR}: vLLM's /metrics "
                "unreachable, the log file missing, or NVML unavailable."
            ),
        ),
        Alert(
            name="VllmDoctorLogStale",
            runbook="vllm-doctor-log-stale",
            rule="vllm-doctor",
            severity="warning",
            # vLLM prints a stats line every 5-10 s while it has requests; silence while busy
            # means the log no longer reaches the sidecar.
            expr=(
                "sum by (job, instance, namespace, pod) (vllm_running_sequences) > 0\n"
                f"and {target_on} sum by (job, instance) (increase(vllm_doctor_log_lines_total[{stale_w}])) == 0"
            ),
            summary=f"vllm-doctor on {WHERE} reads no vLLM log line while vLLM is busy",
            description=(
                f"No new vLLM log line reached vllm-doctor on {WHERE} in {stale_w} while vLLM "
                "runs {{ $value }} requests (it logs stats every few seconds then). Check "
                "VLLM_LOGGING_CONFIG_PATH, the shared log volume and --log."
            ),
        ),
    ]
    return {"vllm-doctor.vllm": vllm, "vllm-doctor.incidents": incident_alerts(t), **fleet_alerts(t),
            "vllm-doctor.sidecar": sidecar}


def _finding_alert(name: str, rule: str, severity: str, summary: str, what: str, match: str = "") -> Alert:
    """An alert on one rule's finding (``vllm_doctor_finding_active{name=rule}``, ``match``: more
    label matchers): for the incidents only the sidecar's reading of the log shows (no vLLM series
    carries them)."""
    return Alert(
        name=name, runbook="vllm-" + rule, rule=rule, severity=severity,
        expr=f'vllm_doctor_finding_active{{name="{rule}"{match}}} == 1',
        summary=summary,
        description=(f"vllm-doctor reports {rule} on {WHERE} (vllm_doctor_finding_active = {{{{ $value }}}}): "
                     f"{what} The sidecar's /api/findings has the evidence lines and the fix."),
    )


COUNT = "{{ $value | printf \"%.0f\" }}"


def _increase_alert(name: str, rule: str, runbook: str, severity: str, counter: str, window: str,
                    summary: str, description: str) -> Alert:
    """An alert on a vLLM counter that moved within ``window`` (per pod, over engines and labels)."""
    return Alert(name=name, runbook=runbook, rule=rule, severity=severity,
                 expr=f"sum by (job, instance, namespace, pod) (increase({counter}[{window}])) > 0",
                 summary=summary, description=description)


def incident_alerts(t: dict[str, float]) -> list[Alert]:
    """The incident classes of 2025-2026 (issue 25): start-up, restarts, overload, length, KV
    transfer, GPU support, prefix cache, host memory."""
    slow = _num(t["startup_slow_seconds"])
    starts_w = duration(t["restart_loop_window_seconds"])
    restarts = _num(t["restart_loop_min_starts"] - 1)
    over_w = duration(t["overload_window_seconds"])
    host_full = _num(t["host_memory_full_ratio"])
    return [
        Alert(
            name="VllmSlowStartup", runbook="vllm-slow-startup", rule="slow-startup", severity="warning",
            expr=f"vllm_doctor_startup_seconds >= {slow}",
            summary=f"vLLM on {WHERE} took {{{{ $value | printf \"%.0f\" }}}} s to start",
            description=(f"The newest vLLM start on {WHERE} took {{{{ $value | printf \"%.0f\" }}}} s "
                         f"(slow from {slow} s): a startup or liveness probe shorter than that kills the pod "
                         "while it loads. vllm_doctor_startup_phase_seconds{phase} names the slow step."),
        ),
        Alert(
            name="VllmRestartLoop", runbook="vllm-restart-loop", rule="restart-loop", severity="critical",
            expr=f"increase(vllm_doctor_engine_starts_total[{starts_w}]) >= {restarts}",
            summary=f"vLLM on {WHERE} restarted {{{{ $value | printf \"%.0f\" }}}} times in {starts_w}",
            description=(f"vLLM on {WHERE} started again {{{{ $value | printf \"%.0f\" }}}} times in the last "
                         f"{starts_w}: a probe kills it while it loads, or it crashes the same way at each start."),
        ),
        _increase_alert("VllmAdmissionRejections", "overload", "vllm-overload", "warning",
                        V.admission_rejections_total, over_w,
                        f"vLLM on {WHERE} refused {COUNT} requests in {over_w}",
                        f"vLLM on {WHERE} refused {COUNT} requests at admission in {over_w} (its "
                        "--max-num-queued-reqs / --max-num-queued-tokens limit, HTTP 503): more requests arrive "
                        "than it serves."),
        _finding_alert("VllmRequestsTooLong", "request-too-long", "warning",
                       f"vLLM on {WHERE} rejects requests longer than max_model_len",
                       "requests whose prompt plus max_tokens exceed max_model_len get HTTP 400."),
        _increase_alert("VllmKvTransferFailures", "kv-transfer-failure", "vllm-kv-transfer-failure", "critical",
                        V.nixl_num_failed_transfers_total, over_w,
                        f"vLLM on {WHERE} failed {COUNT} KV transfers in {over_w}",
                        f"{COUNT} NIXL KV cache transfers failed on {WHERE} in {over_w} (handshake, transfer or "
                        "notification): disaggregated requests are prefilled again or fail."),
        _finding_alert("VllmGpuUnsupported", "gpu-unsupported", "critical",
                       f"vLLM on {WHERE} does not support its GPU",
                       "the build has no kernels for this GPU's architecture (no kernel image, sm_120 with an "
                       "older torch, a FlashInfer JIT failure) and cannot start."),
        _finding_alert("VllmPrefixCacheCollapse", "prefix-cache-collapse", "warning",
                       f"vLLM on {WHERE}: the prefix cache hit rate collapsed",
                       "prompts that reused cached blocks are prefilled again."),
        # the fallbacks of issue 25: an error no rule names (at warning: it ended its process or came
        # from the engine or a worker, not a request's error), and vLLM lines the sidecar cannot read
        _finding_alert("VllmUnexplainedError", "unexplained-error", "warning",
                       f"vLLM on {WHERE} raised an error that no vllm-doctor rule explains",
                       "an exception ended a vLLM process or was raised in its engine or a worker, or a process "
                       "ended abnormally, and no rule names the incident.", match=', severity!="info"'),
        _finding_alert("VllmLogUnread", "log-unread", "warning",
                       f"vllm-doctor on {WHERE} cannot read vLLM's log lines",
                       "vLLM's messages reach the sidecar behind a prefix (a wrapper or a host program's logging "
                       "format) it does not know, so the rules that read them are blind."),
        Alert(
            name="VllmHostMemoryNearLimit", runbook="vllm-host-memory-growth", rule="host-memory-growth",
            severity="warning",
            expr=f"host_memory_used_bytes / host_memory_limit_bytes >= {host_full}",
            for_="5m",
            summary=f"Host memory of vLLM on {WHERE} is {{{{ $value | humanizePercentage }}}} of its limit",
            description=(f"The container of vLLM on {WHERE} uses {{{{ $value | humanizePercentage }}}} of its memory "
                         f"limit (near-full at {host_full}): at the limit it is OOM-killed and every request is lost."),
        ),
    ]



# --------------------------------------------------------------------------------------------
# the latency layer and the fleet (issue 13): recording rules, SLO burn-rate and fleet alerts
# --------------------------------------------------------------------------------------------

FLEET_BY = "namespace, model_name"
"""The fleet level: vLLM's series summed over replicas (pods) and engines of one model."""
REPLICA_BY = "namespace, model_name, pod, instance"
RECORD_PREFIX = "namespace_model_name:"
REPLICA_RECORD_PREFIX = "namespace_model_name_pod:"
"""Per-replica records (REPLICA_BY): one replica's SLO burn, which the fleet's (all replicas'
requests together) cannot show in a fleet of many."""
FOR_LATENCY = "5m"  # a p99 over the target for 5 minutes: not one slow burst
FOR_FLEET = "10m"  # an imbalance or a fleet-wide saturation must last (t.fleet_imbalance_min_seconds)

#: signal -> (vLLM's histogram, the SLO bound key or None, the p99 target key or None). Each is
#: queried under every name it had (catalogue.either: ITL was vllm:time_per_output_token_seconds).
LATENCY_SIGNALS = {
    "ttft": (V.time_to_first_token_seconds, "slo_ttft_seconds", "ttft_p99_target_seconds"),
    "itl": (V.inter_token_latency_seconds, "slo_itl_seconds", "itl_p99_target_seconds"),
    "tpot": (V.request_time_per_output_token_seconds, None, None),
    "e2e": (V.e2e_request_latency_seconds, "slo_e2e_seconds", "e2e_p99_target_seconds"),
    "queue": (V.request_queue_time_seconds, "slo_queue_seconds", "queue_time_p99_target_seconds"),
}
LATENCY_TITLES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "end-to-end latency", "queue": "queue time"}
#: The SRE workbook's multiwindow, multi-burn-rate alerts for a 30-day budget:
#: (long window, short window, burn rate) per alert; the fast one pages, the slow one tickets.
SLO_BURN = {
    "fast": ("critical", (("1h", "5m", 14.4), ("6h", "30m", 6.0))),
    "slow": ("warning", (("1d", "2h", 3.0), ("3d", "6h", 1.0))),
}
SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
KV = f"({either(V.kv_cache_usage_perc)})"  # with vllm:gpu_cache_usage_perc, its name before vLLM 0.9.2


def le_matcher(bound: float) -> str:
    """A ``le`` regex for a bucket bound whatever the exposition wrote (``1``, ``1.0``, ``2.5``)."""
    text = repr(float(bound))
    return f"{text[:-2]}|{text}" if text.endswith(".0") else text


def _hist(name: str, suffix: str, by: str, window: str, matcher: str = "") -> str:
    """The rate of a histogram's series summed ``by``, its old and new names combined per series first."""
    return f"sum by ({by}) ({either(name, matcher, suffix='_' + suffix, fn='rate', window=window)})"


def record(name: str) -> str:
    return RECORD_PREFIX + name


def replica_record(name: str) -> str:
    return REPLICA_RECORD_PREFIX + name


def _fast_windows() -> tuple[str, ...]:
    """The windows of the fast-burn alert (the page), the ones recorded per replica."""
    return tuple(w for lw, sw, _ in SLO_BURN["fast"][1] for w in (lw, sw))


def _saturated(t: dict[str, float]) -> str:
    """An engine with a full KV cache and requests waiting (the fleet rules' "saturated")."""
    return f"{KV} >= {_num(t['kv_cache_full_ratio'])} and {V.num_requests_waiting} >= {_num(t['waiting_min'])}"


def _saturated_replica(t: dict[str, float]) -> str:
    """A replica (REPLICA_BY) every engine of which is saturated: a data-parallel replica with one
    full engine beside one with room is no hot replica (its engine imbalance, VllmEngineImbalance)."""
    return f"count by ({REPLICA_BY}) ({_saturated(t)}) == count by ({REPLICA_BY}) {KV}"


def _room(t: dict[str, float], kv: str, queue: str, none: str, hot: str, group: str, on: str = "") -> str:
    """Members (engines, or replicas with ``on``) with room beside the saturated members of their
    ``group``: the test of BalanceCriteria.room that the fleet rules apply. The KV cache (``kv``,
    a replica's fullest engine) under balance_room_kv_ratio, and a queue (``queue``) at most
    balance_queue_ratio of the saturated members' shortest (``hot``: their queues), or none
    (``none``, a replica's longest engine queue, under waiting_min). Members all near full with
    similar queues have none: capacity, not imbalance."""
    match = f" on({on})" if on else ""
    return (f"{kv} < {_num(t['balance_room_kv_ratio'])}\n"
            f"  and{match} ({queue} <= on({group}) group_left() ({_num(t['balance_queue_ratio'])} * min by ({group}) ({hot}))\n"
            f"  or {none} < {_num(t['waiting_min'])})")


def _room_words(t: dict[str, float], members: str) -> str:
    """What "had room" means in an alert's description (the thresholds of :func:`_room`)."""
    return (f"KV cache under {t['balance_room_kv_ratio']:.0%}, and no request waiting or at most "
            f"{t['balance_queue_ratio']:.0%} of the saturated {members}' shortest queue")


def recording_rules(t: dict[str, float]) -> list[dict[str, Any]]:
    """Fleet-level signals, recorded so that dashboards, the alerts and ``diagnose --prometheus``
    stay cheap: latency p99 per model from the summed buckets, SLO error ratios per window, load
    and KV cache per model, saturated and idle replicas and those with room beside the saturated."""
    rules: list[dict[str, Any]] = []
    for sig, (name, slo_key, _) in LATENCY_SIGNALS.items():
        rules.append({"record": record(f"vllm_{sig}_seconds:p99_rate5m"),
                      "expr": f"histogram_quantile(0.99, {_hist(name, 'bucket', FLEET_BY + ', le', '5m')})"})
    for sig, (name, slo_key, _) in LATENCY_SIGNALS.items():
        if slo_key is None:
            continue
        good = f'le=~"{le_matcher(t[slo_key])}"'
        for w in SLO_WINDOWS:
            rules.append({
                "record": record(f"vllm_latency_slo_errors:ratio_rate{w}"),
                "expr": f"1 - (({_hist(name, 'bucket', FLEET_BY, w, good)}) / ({_hist(name, 'count', FLEET_BY, w)}))",
                "labels": {"slo": sig},
            })
    for sig, (name, slo_key, _) in LATENCY_SIGNALS.items():
        if slo_key is None:
            continue
        good = f'le=~"{le_matcher(t[slo_key])}"'
        for w in _fast_windows():
            rules.append({
                "record": replica_record(f"vllm_latency_slo_errors:ratio_rate{w}"),
                "expr": f"1 - (({_hist(name, 'bucket', REPLICA_BY, w, good)}) / ({_hist(name, 'count', REPLICA_BY, w)}))",
                "labels": {"slo": sig},
            })
    sat_replica = _saturated_replica(t)
    rules += [
        {"record": record("vllm_num_requests_running:sum"), "expr": f"sum by ({FLEET_BY}) ({V.num_requests_running})"},
        {"record": record("vllm_num_requests_waiting:sum"), "expr": f"sum by ({FLEET_BY}) ({V.num_requests_waiting})"},
        {"record": record("vllm_kv_cache_usage:avg"), "expr": f"avg by ({FLEET_BY}) {KV}"},
        {"record": record("vllm_kv_cache_usage:max"), "expr": f"max by ({FLEET_BY}) {KV}"},
        {"record": record("vllm_num_preemptions:increase5m"),
         "expr": f"sum by ({FLEET_BY}) (increase({V.num_preemptions_total}[5m]))"},
        {"record": record("vllm_generation_tokens:rate5m"),
         "expr": f"sum by ({FLEET_BY}) (rate({V.generation_tokens_total}[5m]))"},
        {"record": record("vllm_replicas:count"),
         "expr": f"count by ({FLEET_BY}) (max by ({REPLICA_BY}) ({V.num_requests_running}))"},
        {"record": record("vllm_replicas_saturated:count"), "expr": f"count by ({FLEET_BY}) ({sat_replica})"},
        # replicas with room beside the saturated ones (VllmReplicaImbalance; the idle ones among them)
        {"record": record("vllm_replicas_room:count"),
         "expr": "count by ({}) (\n  {}\n)".format(FLEET_BY, _room(
             t, f"max by ({REPLICA_BY}) {KV}", f"sum by ({REPLICA_BY}) ({V.num_requests_waiting})",
             f"max by ({REPLICA_BY}) ({V.num_requests_waiting})",
             f"sum by ({REPLICA_BY}) ({V.num_requests_waiting}) and on({REPLICA_BY}) ({sat_replica})",
             FLEET_BY, on=REPLICA_BY).replace("\n", "\n  "))},
        {"record": record("vllm_replicas_idle:count"),  # every engine of the replica idle
         "expr": (f"count by ({FLEET_BY}) (max by ({REPLICA_BY}) ({V.num_requests_waiting}) < {_num(t['waiting_min'])}\n"
                  f"  and max by ({REPLICA_BY}) {KV} < {_num(t['fleet_idle_kv_ratio'])})")},
    ]
    return rules


FLEET_WHERE = "{{ $labels.model_name }}{{ with $labels.namespace }} in {{ . }}{{ end }}"


def fleet_alerts(t: dict[str, float]) -> dict[str, list[Alert]]:
    """The latency (p99 and SLO burn rate) and fleet alerts; every threshold from ``t``."""
    budget = round(1 - t["slo_objective_ratio"], 6)
    latency: list[Alert] = []
    camel = {"ttft": "Ttft", "itl": "Itl", "e2e": "E2eLatency", "queue": "QueueTime"}
    for sig, (name, _, target_key) in LATENCY_SIGNALS.items():
        if target_key is None:
            continue
        target = _num(t[target_key])
        title = LATENCY_TITLES[sig]
        latency.append(Alert(
            name=f"Vllm{camel[sig]}P99High",
            runbook=f"vllm-{sig.replace('e2e', 'e2e-latency').replace('queue', 'queue-time')}-p99-high",
            rule="latency-objective-missed",
            severity="warning",
            expr=f"{record(f'vllm_{sig}_seconds:p99_rate5m')} > {target}",
            for_=FOR_LATENCY,
            summary=f"vLLM {title} p99 of {FLEET_WHERE} is {{{{ $value | humanizeDuration }}}}",
            description=(
                f"{title} p99 over all replicas of {FLEET_WHERE} is {{{{ $value | humanizeDuration }}}} "
                f"(vLLM's {name} buckets summed over the replicas, rate over 5m), above the {target} s "
                f"target for {FOR_LATENCY}. `vllm-doctor diagnose --prometheus` names the replicas and the cause."
            ),
        ))
    # one replica over a target: the fleet's p99 (all replicas' buckets summed) hides it in a fleet of many
    per_replica = "\nor ".join(
        f"label_replace(histogram_quantile(0.99, {_hist(name, 'bucket', REPLICA_BY + ', le', '5m')}) > "
        f"{_num(t[target_key])}, \"slo\", \"{sig}\", \"\", \"\")"
        for sig, (name, _, target_key) in LATENCY_SIGNALS.items() if target_key is not None)
    latency.append(Alert(
        name="VllmReplicaLatencyP99High",
        runbook="vllm-replica-latency-p99-high",
        rule="latency-objective-missed",
        severity="warning",
        expr=per_replica,
        for_=FOR_LATENCY,
        summary=f"vLLM {{{{ $labels.slo }}}} p99 on {WHERE} is {{{{ $value | humanizeDuration }}}}",
        description=(
            f"The {{{{ $labels.slo }}}} p99 of {WHERE} alone ({FLEET_WHERE}) is {{{{ $value | humanizeDuration }}}}, "
            f"above its target (rules/thresholds.yaml *_p99_target_seconds) for {FOR_LATENCY}, from this replica's "
            "own histogram buckets. The fleet's p99 may still be fine: one bad replica among many. "
            "`vllm-doctor diagnose --prometheus` and the replica's sidecar name the cause."
        ),
    ))
    for speed, (severity, pairs) in SLO_BURN.items():
        cond = "\nor ".join(
            f"({record(f'vllm_latency_slo_errors:ratio_rate{lw}')} > {_num(round(rate * budget, 6))}\n"
            f" and {record(f'vllm_latency_slo_errors:ratio_rate{sw}')} > {_num(round(rate * budget, 6))})"
            for lw, sw, rate in pairs)
        windows = " or ".join(f"{lw} and {sw} at {rate:g}x" for lw, sw, rate in pairs)
        latency.append(Alert(
            name=f"VllmLatencySloBurn{speed.capitalize()}",
            runbook=f"vllm-latency-slo-burn-{speed}",
            rule="latency-objective-missed",
            severity=severity,
            expr=cond,
            summary=f"vLLM {{{{ $labels.slo }}}} SLO of {FLEET_WHERE} burns its error budget {speed}",
            description=(
                f"{{{{ $value | humanizePercentage }}}} of the {{{{ $labels.slo }}}} requests of {FLEET_WHERE} missed "
                f"their bound (objective {t['slo_objective_ratio']:.2%} within the slo_*_seconds bound of "
                f"rules/thresholds.yaml, 30-day budget): burn rate over {windows}. "
                + ("Page: the month's budget goes in days." if speed == "fast" else
                   "Ticket: the budget runs out before the month ends.")
            ),
        ))
    # one replica's fast burn: its own requests against the objective (the fleet's burn dilutes
    # one bad replica among many below the page's rate)
    severity, pairs = SLO_BURN["fast"]
    latency.append(Alert(
        name="VllmReplicaLatencySloBurnFast",
        runbook="vllm-replica-latency-slo-burn-fast",
        rule="latency-objective-missed",
        severity=severity,
        expr="\nor ".join(
            f"({replica_record(f'vllm_latency_slo_errors:ratio_rate{lw}')} > {_num(round(rate * budget, 6))}\n"
            f" and {replica_record(f'vllm_latency_slo_errors:ratio_rate{sw}')} > {_num(round(rate * budget, 6))})"
            for lw, sw, rate in pairs),
        summary=f"vLLM {{{{ $labels.slo }}}} SLO on {WHERE} burns its error budget fast",
        description=(
            f"{{{{ $value | humanizePercentage }}}} of the {{{{ $labels.slo }}}} requests of {WHERE} alone "
            f"({FLEET_WHERE}) missed their bound (objective {t['slo_objective_ratio']:.2%} within the slo_*_seconds "
            "bound of rules/thresholds.yaml, 30-day budget): burn rate over "
            + " or ".join(f"{lw} and {sw} at {rate:g}x" for lw, sw, rate in pairs)
            + ", from this replica's own histogram buckets. The fleet's burn may be slow: one bad replica among many. "
            "`vllm-doctor diagnose --prometheus` and the replica's sidecar name the cause."
        ),
    ))
    sat = _saturated(t)
    engine_room = _room(t, KV, V.num_requests_waiting, V.num_requests_waiting, f"{V.num_requests_waiting} and {sat}",
                        REPLICA_BY)
    storm = _num(t["preemption_storm_min"])
    pre_w = duration(t["preemption_window_seconds"])
    wide = _num(t["fleet_wide_min_ratio"])
    storming = (f"sum by ({REPLICA_BY}) (increase({V.num_preemptions_total}[{pre_w}])) >= {storm}")
    fleet = [
        Alert(
            name="VllmReplicaImbalance",
            runbook="vllm-replica-imbalance",
            rule="replica-imbalance",
            severity="warning",
            expr=(f"{record('vllm_replicas_saturated:count')}\n"
                  f"and on({FLEET_BY}) {record('vllm_replicas_room:count')} >= 1"),
            for_=duration(t["fleet_imbalance_min_seconds"]),
            summary=f"{{{{ $value }}}} replica(s) of {FLEET_WHERE} are saturated while others have room",
            description=(
                f"{{{{ $value }}}} replica(s) of {FLEET_WHERE} had a full KV cache with requests waiting while "
                f"at least one other replica had room ({_room_words(t, 'replicas')}), for "
                f"{duration(t['fleet_imbalance_min_seconds'])}. The router does not balance on load."
            ),
        ),
        Alert(
            name="VllmEngineImbalance",
            runbook="vllm-engine-imbalance",
            rule="engine-imbalance",
            severity="warning",
            expr=(f"count by ({REPLICA_BY}) ({sat})\n"
                  f"and on({REPLICA_BY}) count by ({REPLICA_BY}) (\n  {engine_room}\n)"),
            for_=duration(t["fleet_imbalance_min_seconds"]),
            summary=f"{{{{ $value }}}} data-parallel engine(s) of {WHERE} are saturated while another has room",
            description=(
                f"On {WHERE}, {{{{ $value }}}} engine(s) had a full KV cache with requests waiting while another "
                f"engine of the same replica had room ({_room_words(t, 'engines')}), for "
                f"{duration(t['fleet_imbalance_min_seconds'])}."
            ),
        ),
        Alert(
            name="VllmFleetPreemptions",
            runbook="vllm-fleet-preemptions",
            rule="fleet-preemptions",
            severity="warning",
            expr=(f"count by ({FLEET_BY}) ({storming})\n"
                  f"  / on({FLEET_BY}) {record('vllm_replicas:count')} >= {wide}\n"
                  f"and on({FLEET_BY}) count by ({FLEET_BY}) ({storming}) >= 2"),
            for_=FOR_FLEET,
            summary=f"{{{{ $value | humanizePercentage }}}} of the replicas of {FLEET_WHERE} are in a preemption storm",
            description=(
                f"{{{{ $value | humanizePercentage }}}} of the replicas of {FLEET_WHERE} preempted {storm} or more "
                f"requests per {pre_w} ({V.num_preemptions_total}), for {FOR_FLEET}: the fleet's KV cache is too "
                "small for the load, not one configuration. Lower --max-num-seqs everywhere or add replicas."
            ),
        ),
        Alert(
            name="VllmFleetKvSaturation",
            runbook="vllm-fleet-kv-saturation",
            rule="fleet-kv-saturation",
            severity="warning",
            expr=(f"{record('vllm_replicas_saturated:count')} / on({FLEET_BY}) {record('vllm_replicas:count')} >= {wide}\n"
                  f"and on({FLEET_BY}) {record('vllm_replicas_saturated:count')} >= 2"),
            for_=FOR_FLEET,
            summary=f"{{{{ $value | humanizePercentage }}}} of the replicas of {FLEET_WHERE} have a full KV cache with a queue",
            description=(
                f"{{{{ $value | humanizePercentage }}}} of the replicas of {FLEET_WHERE} have a full KV cache "
                f"({_num(t['kv_cache_full_ratio'])} or more) with requests waiting, for {FOR_FLEET}: the fleet runs at "
                "its KV capacity. Add replicas or KV cache memory (--gpu-memory-utilization, --kv-cache-dtype fp8)."
            ),
        ),
    ]
    return {"vllm-doctor.latency": latency, "vllm-doctor.fleet": fleet}


def alert_groups(runbook_base: str = RUNBOOK_BASE_URL, t: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The recording rules' group, then the alert groups."""
    t = t or load_thresholds()
    return [{"name": "vllm-doctor.records", "rules": recording_rules(t)}] + [
        {"name": group, "rules": [a.to_rule(runbook_base) for a in alerts]}
        for group, alerts in alert_definitions(t).items()
    ]


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL stays readable), no aliases."""

    def ignore_aliases(self, data: Any) -> bool:  # noqa: D401
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def _dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)


GENERATED_HEADER = (
    "# GENERATED by `python -m vllm_doctor.monitoring.bundle --write` from vllm_doctor/monitoring/bundle.py and\n"
    "# rules/thresholds.yaml. Do not edit: change those and regenerate (tests check).\n"
)


def alerts_yaml(runbook_base: str = RUNBOOK_BASE_URL) -> str:
    """The Prometheus rule file (``rule_files:``) with every alert."""
    return GENERATED_HEADER + _dump({"groups": alert_groups(runbook_base)})


def prometheus_rule_yaml(runbook_base: str = RUNBOOK_BASE_URL, name: str = "vllm-doctor") -> str:
    """The same groups as a prometheus-operator ``PrometheusRule`` object."""
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "vllm-doctor",
                "app.kubernetes.io/part-of": "vllm-doctor",
            },
        },
        "spec": {"groups": alert_groups(runbook_base)},
    }
    return GENERATED_HEADER + _dump(obj)


# --------------------------------------------------------------------------------------------
# dashboards (grafanalib)
# --------------------------------------------------------------------------------------------

DASHBOARD_UID = "vllm-doctor"
SEL = 'namespace=~"$namespace", pod=~"$pod"'
GPU_SEL = SEL + ', gpu=~"$gpu"'


DS = {"type": "prometheus", "uid": "${datasource}"}


def _target(expr: str, legend: str, ref: str, instant: bool = False, fmt: str = "time_series"):
    from grafanalib.core import Target

    return Target(expr=expr, legendFormat=legend, refId=ref, datasource=DS, instant=instant, format=fmt)


def _series(title, targets, pos, unit="", description="", thresholds=None, min_=None, max_=None):
    """A time series panel: a table legend (last, max), the thresholds drawn as lines."""
    from grafanalib.core import GridPos, Threshold, TimeSeries

    kw: dict[str, Any] = {}
    if thresholds:
        kw["thresholds"] = [Threshold("green", 0, 0.0)] + [
            Threshold("red", i + 1, float(v)) for i, v in enumerate(thresholds)
        ]
        kw["thresholdsStyleMode"] = "line"
    if min_ is not None:
        kw["valueMin"] = min_
    if max_ is not None:
        kw["valueMax"] = max_
    return TimeSeries(
        title=title, dataSource=DS, targets=targets, gridPos=GridPos(*pos), unit=unit,
        description=description, legendDisplayMode="table", legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi", **kw,
    )


def fixes_table() -> str:
    """The Fixes panel's table: every rule of the rule catalogue (rules/, rules/fleet/) and the
    flags and environment variables its findings may compute, in the rule's order."""
    from vllm_doctor.diagnosis.loader import builtin_rules_dir

    rows = ["| rule | flags the finding computes |", "|---|---|"]
    for d in (builtin_rules_dir(), builtin_rules_dir() / "fleet"):
        for path in sorted(d.glob("VD*.yaml")):
            doc = yaml.safe_load(path.read_text())
            flags = list(dict.fromkeys(f["flag"] for f in doc.get("fixes") or []))
            rows.append(f"| {doc['id']} {doc['name']} | {', '.join(f'`{f}`' for f in flags) or 'none (the finding names the cause)'} |")
    return "\n".join(rows) + "\n"


def dashboard(t: dict[str, float] | None = None):
    """The vLLM dashboard (grafanalib ``Dashboard``); templated by namespace, pod and GPU."""
    from grafanalib.core import (
        GridPos,
        RowPanel,
        Table,
        Template,
        Templating,
        Text,
        Dashboard,
    )

    t = t or load_thresholds()
    ds = DS
    pre_w = duration(t["preemption_window_seconds"])
    leak_w = duration(t["memory_leak_window_seconds"])
    target, series = _target, _series

    panels = [
        RowPanel(title="KV cache and scheduling", gridPos=GridPos(1, 24, 0, 0)),
        series(
            "KV cache usage",
            [
                target(f"vllm_kv_cache_usage_ratio{{{SEL}}}", "{{pod}} (vllm-doctor)", "A"),
                # one query for every version: the name since 0.9.2, or the name up to 0.11.2 where that is all there is
                target(either(V.kv_cache_usage_perc, SEL),
                       "{{pod}} engine {{engine}} (vLLM)", "B"),
            ],
            (8, 12, 0, 1), unit="percentunit", min_=0, max_=1, thresholds=[t["kv_cache_full_ratio"]],
            description="Fraction (0..1) of GPU KV cache blocks in use. Not running sequences "
            "divided by KV cache tokens: that is sequences per token. vLLM's own gauge is a "
            "ratio too, despite '_perc' in its name.",
        ),
        series(
            "Running vs waiting vs limits",
            [
                target(f"vllm_running_sequences{{{SEL}}}", "{{pod}} running", "A"),
                target(f"vllm_pending_sequences{{{SEL}}}", "{{pod}} waiting", "B"),
                target(f"vllm_swapped_sequences{{{SEL}}}", "{{pod}} swapped (V0)", "C"),
                target(f"vllm_max_num_seqs{{{SEL}}}", "{{pod}} --max-num-seqs", "D"),
                target(f"vllm_max_concurrency{{{SEL}}}", "{{pod}} KV capacity (sequences of max_model_len)", "E"),
            ],
            (8, 12, 12, 1), unit="short", min_=0,
            description="Running sequences flat well below --max-num-seqs while requests wait "
            "means concurrency is bound by KV cache capacity.",
        ),
        series(
            f"Preemptions per {pre_w}",
            [
                target(f"increase(vllm_preemptions_total{{{SEL}}}[{pre_w}])", "{{pod}}", "A"),
                target(f"sum by (namespace, pod) (increase({V.num_preemptions_total}{{{SEL}}}[{pre_w}]))",
                       "{{pod}} (vLLM /metrics)", "B"),
            ],
            (8, 8, 0, 9), unit="short", min_=0, thresholds=[t["preemption_storm_min"]],
            description=f"Preemptions counted over {pre_w} (increase, not rate: rate is per second). "
            f"{_num(t['preemption_storm_min'])} or more is a storm.",
        ),
        series(
            "Time to first token",
            [
                target(f'vllm_time_to_first_token_seconds{{{SEL}, quantile=~"0.5|0.99"}}',
                       "{{pod}} p{{quantile}} (vllm-doctor)", "A"),
                target(f"histogram_quantile(0.99, sum by (namespace, pod, le) "
                       f"(rate({V.time_to_first_token_seconds}_bucket{{{SEL}}}[$__rate_interval])))",
                       "{{pod}} p99 (vLLM histogram)", "B"),
                target(f"histogram_quantile(0.5, sum by (namespace, pod, le) "
                       f"(rate({V.time_to_first_token_seconds}_bucket{{{SEL}}}[$__rate_interval])))",
                       "{{pod}} p50 (vLLM histogram)", "C"),
            ],
            (8, 8, 8, 9), unit="s", min_=0, thresholds=[t["ttft_p99_target_seconds"]],
        ),
        series(
            "Prompt and generation throughput",
            [
                target(f"vllm_prompt_throughput_tokens_per_second{{{SEL}}}", "{{pod}} prompt", "A"),
                target(f"vllm_generation_throughput_tokens_per_second{{{SEL}}}", "{{pod}} generation", "B"),
                target(f"sum by (namespace, pod) (rate({V.prompt_tokens_total}{{{SEL}}}[$__rate_interval]))",
                       "{{pod}} prompt (vLLM /metrics)", "C"),
                target(f"sum by (namespace, pod) (rate({V.generation_tokens_total}{{{SEL}}}[$__rate_interval]))",
                       "{{pod}} generation (vLLM /metrics)", "D"),
            ],
            (8, 8, 16, 9), unit="short", min_=0, description="Tokens per second.",
        ),
        RowPanel(title="GPU", gridPos=GridPos(1, 24, 0, 17)),
        series(
            "GPU memory",
            [
                target(f"gpu_memory_used_bytes{{{GPU_SEL}}}", "{{pod}} GPU {{gpu}} used", "A"),
                target(f"gpu_memory_total_bytes{{{GPU_SEL}}}", "{{pod}} GPU {{gpu}} total", "B"),
                target(f"sum by (namespace, pod, gpu, pid) (gpu_process_memory_used_bytes{{{GPU_SEL}}})",
                       "{{pod}} GPU {{gpu}} pid {{pid}}", "C"),
            ],
            (8, 8, 0, 18), unit="bytes", min_=0,
        ),
        series(
            "GPU memory slope (per hour)",
            [target(f"deriv(gpu_memory_used_bytes{{{GPU_SEL}}}[{leak_w}]) * 3600", "{{pod}} GPU {{gpu}}", "A")],
            (8, 8, 8, 18), unit="bytes", thresholds=[t["memory_leak_min_growth_bytes_per_hour"]],
            description=f"deriv() over {leak_w}, scaled to bytes per hour. Sustained growth above "
            "the line is a leak.",
        ),
        series(
            "GPU utilization",
            [
                target(f"gpu_utilization_ratio{{{GPU_SEL}}}", "{{pod}} GPU {{gpu}}", "A"),
            ],
            (8, 8, 16, 18), unit="percentunit", min_=0, max_=1,
        ),
        RowPanel(title="Findings and the sidecar", gridPos=GridPos(1, 24, 0, 26)),
        Table(
            title="Active findings",
            dataSource=ds,
            targets=[target(f"vllm_doctor_finding_active{{{SEL}}} == 1", "", "A", instant=True, fmt="table")],
            gridPos=GridPos(8, 16, 0, 27),
            description="Rules of vllm-doctor active now. The fix (vLLM flags and values) of each "
            "is on the sidecar's page and at /api/findings; `vllm-doctor explain RULE_ID`.",
            transformations=[{
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True,
                                      "endpoint": True, "container": True, "service": True},
                    "indexByName": {"severity": 0, "rule_id": 1, "name": 2, "namespace": 3, "pod": 4},
                },
            }],
            overrides=[{
                "matcher": {"id": "byName", "options": "rule_id"},
                "properties": [{"id": "links", "value": [{
                    "title": "Runbook",
                    "url": f"{RUNBOOK_BASE_URL}/vllm-doctor-finding.md",
                }]}],
            }],
        ),
        Text(
            title="Fixes",
            gridPos=GridPos(8, 8, 16, 27),
            mode="markdown",
            content=(
                "Each finding names the vLLM flag to change with a value computed from what was "
                "observed. Open the sidecar (`kubectl port-forward pod/POD 9401` then "
                "http://127.0.0.1:9401/) or `curl :9401/api/findings`.\n\n"
                + fixes_table()
            ),
        ),
        series(
            "vllm-doctor: log lines and sources",
            [
                target(f"sum by (namespace, pod) (rate(vllm_doctor_log_lines_total{{{SEL}}}[$__rate_interval]))",
                       "{{pod}} log lines/s", "A"),
                target(f"sum by (namespace, pod) (rate(vllm_doctor_unparsed_lines_total{{{SEL}}}[$__rate_interval]))",
                       "{{pod}} unparsed lines/s", "B"),
                target(f"vllm_doctor_source_up{{{SEL}}}", "{{pod}} {{source}} up", "C"),
                target(f"sum by (namespace, pod) (rate(vllm_doctor_scrape_errors_total{{{SEL}}}[$__rate_interval]))",
                       "{{pod}} scrape errors/s", "D"),
            ],
            (8, 24, 0, 35), unit="short", min_=0,
        ),
    ]

    def variable(name: str, query: str, label: str) -> Template:
        return Template(
            name=name, label=label, query=query, dataSource="${datasource}", includeAll=True,
            multi=True, allValue=".*", default="$__all", refresh=2, sort=1,
        )

    templating = Templating(list=[
        Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus"),
        variable("namespace", "label_values(vllm_doctor_build_info, namespace)", "Namespace"),
        variable("pod", 'label_values(vllm_doctor_build_info{namespace=~"$namespace"}, pod)', "Pod"),
        variable("gpu", 'label_values(gpu_memory_used_bytes{namespace=~"$namespace", pod=~"$pod"}, gpu)', "GPU"),
    ])

    return Dashboard(
        title="vLLM (vllm-doctor)",
        uid=DASHBOARD_UID,
        description="vLLM serving health from vllm-doctor and vLLM's /metrics: KV cache, "
        "scheduling, preemptions, latency, throughput, GPU memory and the active findings.",
        tags=["vllm", "vllm-doctor"],
        timezone="browser",
        refresh="30s",
        panels=panels,
        templating=templating,
        editable=True,
    ).auto_panel_ids()


FLEET_UID = "vllm-doctor-fleet"
REPLICAS_UID = "vllm-doctor-replicas"
FSEL = 'namespace=~"$namespace", model_name=~"$model_name"'
RSEL = FSEL + ', pod=~"$pod", engine=~"$engine"'


def _fleet_templating(drill_down: bool):
    from grafanalib.core import Template, Templating

    def variable(name: str, query: str, label: str) -> Template:
        return Template(name=name, label=label, query=query, dataSource="${datasource}", includeAll=True,
                        multi=True, allValue=".*", default="$__all", refresh=2, sort=1)

    vs = [
        Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus"),
        variable("namespace", f"label_values({V.num_requests_running}, namespace)", "Namespace"),
        variable("model_name", f'label_values({V.num_requests_running}{{namespace=~"$namespace"}}, model_name)', "Model"),
    ]
    if drill_down:
        vs += [
            variable("pod", f"label_values({V.num_requests_running}{{{FSEL}}}, pod)", "Replica (pod)"),
            variable("engine", f'label_values({V.num_requests_running}{{{FSEL}, pod=~"$pod"}}, engine)', "Engine"),
        ]
    return Templating(list=vs)


def _finding_annotations():
    """The findings of the sidecars and the firing fleet alerts, drawn on every time panel."""
    from grafanalib.core import Annotations

    def ann(name: str, expr: str, title: str, text: str, color: str) -> dict:
        return {"name": name, "datasource": DS, "enable": True, "iconColor": color, "expr": expr,
                "step": "60s", "titleFormat": title, "textFormat": text, "tagKeys": "severity,rule",
                "useValueForTime": False}

    return Annotations(list=[
        ann("vllm-doctor findings", 'vllm_doctor_finding_active{namespace=~"$namespace"} == 1',
            "{{rule_id}} {{name}}", "{{pod}}: vllm-doctor finding ({{severity}})", "orange"),
        ann("vLLM alerts", 'ALERTS{alertname=~"Vllm.*", alertstate="firing", namespace=~"$namespace"}',
            "{{alertname}}", "{{model_name}}{{pod}} {{slo}}", "red"),
    ])


def fleet_dashboard(t: dict[str, float] | None = None):
    """Fleet overview: SLO tiles, saturation, preemptions, findings of every replica of a model."""
    from grafanalib.core import Dashboard, GridPos, RowPanel, Stat, Table, Threshold

    t = t or load_thresholds()
    pre_w = duration(t["preemption_window_seconds"])

    def tile(title, expr, pos, unit, red_at, description, reverse=False):
        steps = ([Threshold("red", 0, 0.0), Threshold("green", 1, float(red_at))] if reverse
                 else [Threshold("green", 0, 0.0), Threshold("red", 1, float(red_at))])
        return Stat(title=title, dataSource=DS, targets=[_target(expr, "{{model_name}}", "A")], gridPos=GridPos(*pos),
                    format=unit, reduceCalc="lastNotNull", graphMode="area", colorMode="background",
                    thresholdType="absolute", thresholds=steps, description=description)

    panels = [RowPanel(title="Service level (every replica of the model)", gridPos=GridPos(1, 24, 0, 0))]
    x = 0
    for sig, key in (("ttft", "ttft_p99_target_seconds"), ("itl", "itl_p99_target_seconds"),
                     ("e2e", "e2e_p99_target_seconds"), ("queue", "queue_time_p99_target_seconds")):
        panels.append(tile(f"{LATENCY_TITLES[sig]} p99", f"{record(f'vllm_{sig}_seconds:p99_rate5m')}{{{FSEL}}}",
                           (4, 6, x, 1), "s", t[key],
                           f"p99 from vLLM's histogram buckets summed over the replicas (5m rate); red above "
                           f"the {_num(t[key])} s target of rules/thresholds.yaml."))
        x += 6
    x = 0
    for sig in ("ttft", "itl", "e2e", "queue"):
        bound = _num(t[f"slo_{sig}_seconds"])
        panels.append(tile(
            f"{LATENCY_TITLES[sig]} within {bound} s (1d)",
            f"1 - {record('vllm_latency_slo_errors:ratio_rate1d')}{{{FSEL}, slo=\"{sig}\"}}", (4, 6, x, 5),
            "percentunit", t["slo_objective_ratio"],
            f"Share of requests within the SLO bound over the last day; green at the "
            f"{t['slo_objective_ratio']:.2%} objective. The burn-rate alerts page on its rate of change.", reverse=True))
        x += 6
    panels += [
        RowPanel(title="Saturation", gridPos=GridPos(1, 24, 0, 9)),
        _series("Replicas saturated / with room", [
            _target(f"{record('vllm_replicas:count')}{{{FSEL}}}", "{{model_name}} replicas", "A"),
            _target(f"{record('vllm_replicas_saturated:count')}{{{FSEL}}}", "{{model_name}} saturated (KV full, queue)", "B"),
            _target(f"{record('vllm_replicas_idle:count')}{{{FSEL}}}", "{{model_name}} idle", "C"),
            _target(f"{record('vllm_replicas_room:count')}{{{FSEL}}}", "{{model_name}} with room (idle included)", "D"),
        ], (8, 8, 0, 10), unit="short", min_=0,
            description="Saturated replicas while others have room (KV cache under "
                        f"{t['balance_room_kv_ratio']:.0%}, a queue at most {t['balance_queue_ratio']:.0%} of the "
                        "saturated ones' or none): the load is not balanced (VllmReplicaImbalance)."),
        _series("KV cache usage", [
            _target(f"{record('vllm_kv_cache_usage:avg')}{{{FSEL}}}", "{{model_name}} mean", "A"),
            _target(f"{record('vllm_kv_cache_usage:max')}{{{FSEL}}}", "{{model_name}} max", "B"),
        ], (8, 8, 8, 10), unit="percentunit", min_=0, max_=1, thresholds=[t["kv_cache_full_ratio"]]),
        _series("Running and waiting", [
            _target(f"{record('vllm_num_requests_running:sum')}{{{FSEL}}}", "{{model_name}} running", "A"),
            _target(f"{record('vllm_num_requests_waiting:sum')}{{{FSEL}}}", "{{model_name}} waiting", "B"),
        ], (8, 8, 16, 10), unit="short", min_=0),
        _series(f"Preemptions per {pre_w}", [
            _target(f"{record('vllm_num_preemptions:increase5m')}{{{FSEL}}}", "{{model_name}} (fleet)", "A"),
            _target(f"sum by (namespace, pod) (increase({V.num_preemptions_total}{{{FSEL}}}[{pre_w}]))", "{{pod}}", "B"),
        ], (8, 12, 0, 18), unit="short", min_=0, thresholds=[t["preemption_storm_min"]],
            description=f"{V.num_preemptions_total} (without _total it matches nothing); {_num(t['preemption_storm_min'])} "
                        f"or more per {pre_w} on a replica is a storm."),
        _series("Generation throughput", [
            _target(f"{record('vllm_generation_tokens:rate5m')}{{{FSEL}}}", "{{model_name}}", "A"),
        ], (8, 12, 12, 18), unit="short", min_=0, description="Tokens per second over the fleet."),
        RowPanel(title="Findings", gridPos=GridPos(1, 24, 0, 26)),
        Table(title="Active findings (sidecars)", dataSource=DS, gridPos=GridPos(8, 12, 0, 27),
              targets=[_target('vllm_doctor_finding_active{namespace=~"$namespace"} == 1', "", "A", instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True,
                                "job": True, "endpoint": True, "container": True, "service": True}}}],
              description="Rules of the sidecars active now; `vllm-doctor diagnose --prometheus URL` judges every replica's history."),
        Table(title="Firing vLLM alerts", dataSource=DS, gridPos=GridPos(8, 12, 12, 27),
              targets=[_target('ALERTS{alertname=~"Vllm.*", alertstate="firing", namespace=~"$namespace"}', "", "A",
                               instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True,
                                "__name__": True, "alertstate": True}}}]),
    ]
    return Dashboard(
        title="vLLM fleet (vllm-doctor)", uid=FLEET_UID, tags=["vllm", "vllm-doctor", "fleet"], timezone="browser",
        description="Every replica of a vLLM model: latency objectives from the summed histograms, "
        "saturation, preemptions and findings (recording rules of alerts/vllm-doctor.rules.yaml).",
        refresh="1m", panels=panels, templating=_fleet_templating(False), annotations=_finding_annotations(),
        editable=True,
        links=[{"title": "Replicas", "type": "link", "url": f"/d/{REPLICAS_UID}?${{__url_time_range}}&${{namespace:queryparam}}&${{model_name:queryparam}}"}],
    ).auto_panel_ids()


def replicas_dashboard(t: dict[str, float] | None = None):
    """Drill-down: each replica (pod) and data-parallel engine of a model."""
    from grafanalib.core import Dashboard, GridPos, RowPanel

    t = t or load_thresholds()
    pre_w = duration(t["preemption_window_seconds"])

    def quantile(sig: str) -> str:
        names = LATENCY_SIGNALS[sig][0]
        return f"histogram_quantile(0.99, {_hist(names, 'bucket', 'namespace, pod, le', '$__rate_interval', RSEL)})"

    panels = [
        RowPanel(title="Per replica and engine", gridPos=GridPos(1, 24, 0, 0)),
        _series("KV cache usage", [
            _target(either(V.kv_cache_usage_perc, RSEL),
                    "{{pod}} engine {{engine}}", "A"),
        ], (8, 12, 0, 1), unit="percentunit", min_=0, max_=1, thresholds=[t["kv_cache_full_ratio"]]),
        _series("Waiting", [_target(f"{V.num_requests_waiting}{{{RSEL}}}", "{{pod}} engine {{engine}}", "A")],
                (8, 12, 12, 1), unit="short", min_=0),
        _series("Running", [_target(f"{V.num_requests_running}{{{RSEL}}}", "{{pod}} engine {{engine}}", "A")],
                (8, 12, 0, 9), unit="short", min_=0),
        _series(f"Preemptions per {pre_w}", [
            _target(f"increase({V.num_preemptions_total}{{{RSEL}}}[{pre_w}])", "{{pod}} engine {{engine}}", "A"),
        ], (8, 12, 12, 9), unit="short", min_=0, thresholds=[t["preemption_storm_min"]]),
        RowPanel(title="Latency per replica", gridPos=GridPos(1, 24, 0, 17)),
        _series("TTFT p99", [_target(quantile("ttft"), "{{pod}}", "A")], (8, 8, 0, 18), unit="s", min_=0,
                thresholds=[t["ttft_p99_target_seconds"]]),
        _series("ITL p99", [_target(quantile("itl"), "{{pod}}", "A")], (8, 8, 8, 18), unit="s", min_=0,
                thresholds=[t["itl_p99_target_seconds"]]),
        _series("Queue time p99", [_target(quantile("queue"), "{{pod}}", "A")], (8, 8, 16, 18), unit="s", min_=0,
                thresholds=[t["queue_time_p99_target_seconds"]]),
        _series("Generation throughput", [
            _target(f"sum by (namespace, pod, engine) (rate({V.generation_tokens_total}{{{RSEL}}}[$__rate_interval]))",
                    "{{pod}} engine {{engine}}", "A"),
        ], (8, 24, 0, 26), unit="short", min_=0, description="Tokens per second."),
    ]
    return Dashboard(
        title="vLLM replicas (vllm-doctor)", uid=REPLICAS_UID, tags=["vllm", "vllm-doctor", "fleet"],
        timezone="browser", description="Each replica and data-parallel engine of a vLLM model, from vLLM's /metrics.",
        refresh="1m", panels=panels, templating=_fleet_templating(True), annotations=_finding_annotations(),
        editable=True,
    ).auto_panel_ids()


def dashboards_json() -> dict[str, str]:
    """File name -> dashboard JSON text (grafanalib's own encoder and layout)."""
    from grafanalib._gen import write_dashboard

    out = {}
    for name, build in (("vllm-doctor.json", dashboard), ("vllm-doctor-fleet.json", fleet_dashboard),
                        ("vllm-doctor-replicas.json", replicas_dashboard)):
        buf = io.StringIO()
        write_dashboard(build(), buf)
        out[name] = buf.getvalue()
    return out


# --------------------------------------------------------------------------------------------
# export and the generated files of the repository
# --------------------------------------------------------------------------------------------

def export(kind: str) -> str:
    """The text of one generated artefact: ``alerts`` (a Prometheus rule file), ``dashboards``
    (the per-pod Grafana dashboard JSON), ``fleet-dashboard`` / ``replicas-dashboard`` (the fleet
    overview and its per-replica drill-down) or ``prometheus-rule`` (a prometheus-operator object)."""
    if kind == "alerts":
        return alerts_yaml()
    if kind == "dashboards":
        return dashboards_json()["vllm-doctor.json"]
    if kind in ("fleet-dashboard", "replicas-dashboard"):
        return dashboards_json()[f"vllm-doctor-{kind.split('-')[0]}.json"]
    if kind == "prometheus-rule":
        return prometheus_rule_yaml()
    raise ValueError(f"unknown export kind {kind!r}; one of {', '.join(KINDS)}")


def repo_files(root: Path) -> dict[Path, str]:
    """Every generated file of the repository (relative path -> text)."""
    files = {
        Path("alerts/vllm-doctor.rules.yaml"): alerts_yaml(),
        Path("deploy/kubernetes/base/generated/prometheusrule.yaml"): prometheus_rule_yaml(),
    }
    for name, text in dashboards_json().items():
        files[Path("dashboards/out") / name] = text
        files[Path("deploy/kubernetes/base/generated/dashboards") / name] = text
    return files


def write_repo_files(root: Path) -> list[Path]:
    changed = []
    for rel, text in repo_files(root).items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_doctor.monitoring.bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", choices=KINDS, help="print one artefact")
    parser.add_argument("--write", action="store_true", help="regenerate the repository's generated files")
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    if args.write:
        for rel in write_repo_files(root):
            print(f"wrote {rel}")
        return 0
    if args.check:
        stale = [str(rel) for rel, text in repo_files(root).items()
                 if not (root / rel).exists() or (root / rel).read_text() != text]
        for rel in stale:
            print(f"out of date: {rel} (run python -m vllm_doctor.monitoring.bundle --write)", file=sys.stderr)
        return 1 if stale else 0
    if not args.kind:
        parser.error("give a kind, --write or --check")
    sys.stdout.write(export(args.kind))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
