"""The /metrics series vLLM exports, per version, as exposed (counters with ``_total``, histograms
with ``_bucket``/``_sum``/``_count``). Read from vLLM's released source: ``vllm/engine/metrics.py``
(V0) and ``vllm/v1/metrics/loggers.py`` (+ ``v1/metrics/*.py``) (V1); the table and its ranges are
those of ../shared/reference/vllm-log-formats.md section 6 (first/last examined release).
``(type, [(first, last), ...])``; a range covers V0 and V1 releases alike (the union)."""

from __future__ import annotations

from packaging.version import Version

from vllm_doctor.versions import parse_version

G, C, H = "gauge", "counter", "histogram"
_ALL = ("0.3.3", "0.33.0")

SERIES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "vllm:num_requests_running": (G, [_ALL]),
    "vllm:num_requests_waiting": (G, [_ALL]),
    "vllm:num_requests_waiting_by_reason": (G, [("0.20.0", "0.33.0")]),
    "vllm:num_requests_swapped": (G, [("0.3.3", "0.9.0")]),
    "vllm:gpu_cache_usage_perc": (G, [("0.3.3", "0.11.2")]),
    "vllm:kv_cache_usage_perc": (G, [("0.9.2", "0.33.0")]),
    "vllm:cpu_cache_usage_perc": (G, [("0.3.3", "0.9.0")]),
    "vllm:num_preemptions_total": (C, [("0.4.3", "0.33.0")]),
    "vllm:request_num_preemptions": (H, [("0.30.0", "0.33.0")]),
    "vllm:prompt_tokens_total": (C, [_ALL]),
    "vllm:generation_tokens_total": (C, [_ALL]),
    "vllm:prompt_tokens_by_source_total": (C, [("0.16.0", "0.33.0")]),
    "vllm:prompt_tokens_cached_total": (C, [("0.16.0", "0.33.0")]),
    "vllm:time_to_first_token_seconds": (H, [_ALL]),
    "vllm:time_per_output_token_seconds": (H, [("0.3.3", "0.14.0")]),
    "vllm:inter_token_latency_seconds": (H, [("0.10.2", "0.33.0")]),
    "vllm:request_time_per_output_token_seconds": (H, [("0.11.0", "0.33.0")]),
    "vllm:e2e_request_latency_seconds": (H, [_ALL]),
    "vllm:request_queue_time_seconds": (H, [("0.6.6", "0.33.0")]),
    "vllm:request_prefill_time_seconds": (H, [("0.6.6", "0.33.0")]),
    "vllm:request_decode_time_seconds": (H, [("0.6.6", "0.33.0")]),
    "vllm:request_inference_time_seconds": (H, [("0.6.6", "0.33.0")]),
    "vllm:request_prompt_tokens": (H, [("0.4.3", "0.33.0")]),
    "vllm:request_generation_tokens": (H, [("0.4.3", "0.33.0")]),
    "vllm:request_params_n": (H, [("0.4.3", "0.33.0")]),
    "vllm:request_params_max_tokens": (H, [("0.6.6", "0.33.0")]),
    "vllm:request_max_num_generation_tokens": (H, [("0.4.3", "0.33.0")]),
    "vllm:request_success_total": (C, [("0.4.3", "0.33.0")]),
    "vllm:iteration_tokens_total": (H, [("0.6.6", "0.33.0")]),
    "vllm:gpu_prefix_cache_hit_rate": (G, [("0.6.0", "0.9.0")]),
    "vllm:cpu_prefix_cache_hit_rate": (G, [("0.6.0", "0.9.0")]),
    "vllm:gpu_prefix_cache_queries_total": (C, [("0.7.3", "0.11.2")]),
    "vllm:gpu_prefix_cache_hits_total": (C, [("0.7.3", "0.11.2")]),
    "vllm:prefix_cache_queries_total": (C, [("0.9.2", "0.33.0")]),
    "vllm:prefix_cache_hits_total": (C, [("0.9.2", "0.33.0")]),
    "vllm:kv_block_lifetime_seconds": (H, [("0.12.0", "0.33.0")]),
    "vllm:kv_block_idle_before_evict_seconds": (H, [("0.12.0", "0.33.0")]),
    "vllm:kv_block_reuse_gap_seconds": (H, [("0.12.0", "0.33.0")]),
    "vllm:cache_config_info": (G, [_ALL]),
    "vllm:lora_requests_info": (G, [("0.6.6", "0.33.0")]),
    "vllm:avg_prompt_throughput_toks_per_s": (G, [("0.3.3", "0.6.6")]),
    "vllm:avg_generation_throughput_toks_per_s": (G, [("0.3.3", "0.6.6")]),
    "vllm:model_forward_time_milliseconds": (H, [("0.6.6", "0.9.0")]),
    "vllm:model_execute_time_milliseconds": (H, [("0.6.6", "0.9.0")]),
    "vllm:time_in_queue_requests": (H, [("0.6.6", "0.9.0")]),
    "vllm:tokens_total": (C, [("0.6.6", "0.7.3")]),
    "vllm:corrupted_requests_total": (C, [("0.11.1", "0.33.0")]),
    "vllm:engine_sleep_state": (G, [("0.11.1", "0.33.0")]),
}

PREFIXES = {  # families listed in the table as prefixes (any name under them exists in the range)
    "vllm:spec_decode_": [("0.5.4", "0.33.0")],
    "vllm:external_prefix_cache_": [("0.11.1", "0.33.0")],
    "vllm:mm_cache_": [("0.11.1", "0.33.0")],
    "vllm:estimated_": [("0.17.0", "0.33.0")],
}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def _in(ranges, version: str) -> bool:
    pv = parse_version(version) or Version("0.33.0")
    return any(Version(a) <= pv <= Version(b) for a, b in ranges)


def lookup(name: str) -> tuple[str, str, list] | None:
    """(base name, type, ranges) of an exposed series name, or None if vLLM never exports it.
    ``vllm:e2e_request_latency_seconds_bucket`` -> the histogram; a counter's ``_created`` too."""
    if name in SERIES:
        t, r = SERIES[name]
        return name, t, r
    for suf in HIST_SUFFIXES:
        base = name[: -len(suf)] if name.endswith(suf) else None
        if base and SERIES.get(base, ("",))[0] == H:
            return base, H, SERIES[base][1]
    if name.endswith("_created") and SERIES.get(name[:-8] + "_total", ("",))[0] == C:
        return name[:-8] + "_total", G, SERIES[name[:-8] + "_total"][1]
    for p, r in PREFIXES.items():
        if name.startswith(p):
            return name, "unknown", r
    return None


def exported(name: str, version: str) -> bool:
    hit = lookup(name)
    return bool(hit) and _in(hit[2], version)


def names_in(version: str) -> list[str]:
    return [n for n, (_, r) in SERIES.items() if _in(r, version)]


def kind(name: str) -> str | None:
    """gauge | counter | histogram (a ``_bucket``/``_sum``/``_count`` series: histogram) or None."""
    hit = lookup(name)
    return hit[1] if hit else None


# Series vllm-doctor's own sidecar exports (vllm_doctor/export/collectors.py; tests/test_check.py keeps the
# two in step). Some carry the names the tuning note invented, so the note's queries match when
# Prometheus scrapes the sidecar (port 9401) rather than vLLM.
SIDECAR_SERIES = {
    "vllm_kv_cache_tokens": G, "vllm_max_concurrency": G, "vllm_max_num_seqs": G, "vllm_max_model_len": G,
    "vllm_running_sequences": G, "vllm_pending_sequences": G, "vllm_swapped_sequences": G,
    "vllm_kv_cache_usage_ratio": G, "vllm_prompt_throughput_tokens_per_second": G,
    "vllm_generation_throughput_tokens_per_second": G, "vllm_prefix_cache_hit_ratio": G,
    "vllm_preemptions_total": C, "vllm_oom_events_total": C, "vllm_time_to_first_token_seconds": G,
    "gpu_memory_used_bytes": G, "gpu_memory_total_bytes": G, "gpu_utilization_ratio": G, "gpu_power_watts": G,
    "gpu_temperature_celsius": G, "gpu_process_memory_used_bytes": G,
}
