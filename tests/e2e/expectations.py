"""What vllm-doctor must say about each recorded scenario, shared by the live e2e tests and the
replays of their recordings (test_replay.py). The numbers come from vLLM itself (its /metrics,
/v1/models, its log's own error message), saved beside each recording as expected.json; nothing
here is a value vllm-doctor computed.
"""
from __future__ import annotations

import re

from .harness import Diagnosis, as_int, fix_values

INCIDENT_NAMES = {"startup-oom", "preemption-storm", "prefill-blocking", "kv-capacity-bound",
                  "gpu-memory-leak", "nccl-failure", "runtime-oom", "engine-dead"}

# scenario -> (must: a set of alternatives, at least one fires; may: acceptable extras)
MUST = {
    "healthy": (set(), set()),
    "preemption-storm": ({"preemption-storm", "kv-capacity-bound"}, {"preemption-storm", "kv-capacity-bound"}),
    "startup-oom": ({"startup-oom"}, {"engine-dead"}),
    "engine-dead": ({"engine-dead"}, set()),
}


def check_names(scenario: str, names: set[str], where: str, require: bool = True) -> None:
    """One of the scenario's `must` names fired (when `require`), and no other incident name."""
    must, may = MUST[scenario]
    incidents = names & INCIDENT_NAMES
    if must and require:
        assert incidents & must, f"{where}: expected one of {sorted(must)}, got {sorted(names)}"
    extra = incidents - must - may
    assert not extra, f"{where}: false positive(s) {sorted(extra)} (all findings: {sorted(names)})"


def check_facts(facts: dict, truth: dict, keys: tuple[str, ...], where: str,
                optional: tuple[str, ...] = ()) -> None:
    """`keys` must equal vLLM's values; `optional` ones may be null (the log does not show them:
    vLLM 0.32 on CPU prints neither the block size nor the number of blocks) but never wrong."""
    bad = {}
    for k in keys + optional:
        want = truth.get(k)
        got = facts.get(k)
        if want is None or (got is None and k in optional):
            continue
        if got is None or abs(float(got) - float(want)) > 1e-6 * max(1.0, abs(float(want))):
            bad[k] = (got, want)
    assert not bad, f"{where}: facts differ from vLLM's own (got, vLLM): {bad}"


def check_max_num_seqs_fix(findings: list[dict], truth: dict, where: str) -> int:
    """A --max-num-seqs fix computed from what the server was seen doing (issue 11): at least 1,
    below the --max-num-seqs the server ran with, and what its stated method says: the sequences
    running when the KV cache was full (the number in the arithmetic), the KV cache over the
    observed tokens per sequence, or at most vLLM's own "maximum concurrency" when it is the
    labelled never-preempt bound (KV cache tokens / max_model_len)."""
    fixes = [x for f in findings for x in (f.get("fixes") or []) if x.get("flag") == "--max-num-seqs"]
    assert fixes, f"{where}: no --max-num-seqs fix in {[f.get('fixes') for f in findings]}"
    cap = int(float(truth["max_concurrency"]))
    ok = []
    for x in fixes:
        v, how = as_int(x["value"]), x.get("arithmetic") or ""
        if not 1 <= v < truth["max_num_seqs"]:
            continue
        m = re.match(r"(\d+) sequences were running when the KV cache was full", how)
        # issue 20: what ran without preemption, or the KV cache over the longest tokens per sequence seen
        clean = re.match(r"(\d+) running with no preemption counted in the interval", how)
        observed = re.match(r"[\d.]+% x [\d,]+ KV cache tokens / [\d.]+ running = [\d,]+ tokens per sequence at most", how)
        if (m and int(m[1]) == v) or (clean and int(clean[1]) == v) or observed or (
                "tokens per running sequence observed" in how) or (how.startswith("never-preempt bound") and v <= cap):
            ok.append(v)
    assert ok, (f"{where}: --max-num-seqs {[(x['value'], x.get('arithmetic')) for x in fixes]} is not computed "
                f"from what was observed ({truth['kv_cache_tokens']} tokens / {truth['max_model_len']} = {cap} is "
                f"only the never-preempt bound)")
    return ok[0]


def check_max_model_len_fix(findings: list[dict], truth: dict, where: str) -> int:
    vals = fix_values(findings, "--max-model-len")
    assert vals, f"{where}: no --max-model-len fix in {[f.get('fixes') for f in findings]}"
    est = truth["estimated_max_model_len"]
    ok = [as_int(v) for v in vals if 0 < as_int(v) <= est]
    assert ok, f"{where}: --max-model-len {vals} is larger than vLLM's estimate {est}"
    return ok[0]


def check_diagnosis(scenario: str, d: Diagnosis, truth: dict, with_metrics: bool = False) -> None:
    where = f"diagnose {scenario}{' --metrics' if with_metrics else ''} ({' '.join(d.cmd[1:])})"
    assert d.rc in (0, 1), f"{where}: exit {d.rc}: {d.stderr[-1500:]}"
    assert d.report is not None, f"{where}: stdout is not JSON: {d.stdout[:500]!r} {d.stderr[-500:]}"
    assert d.report.get("engine") == "v1", f"{where}: engine {d.report.get('engine')!r}"
    assert str(d.report.get("vllm_version", "")).startswith("0.32.0"), f"{where}: vllm_version {d.report.get('vllm_version')!r}"
    # From a V1 log alone (no --metrics) a storm shows only in the periodic stats lines; how many of
    # them caught the KV cache full with requests waiting depends on timing (10 s apart, 128-token
    # blocks on CPU). Require a storm finding when vLLM's own log shows that signature at least once.
    require = not (scenario == "preemption-storm" and not with_metrics
                   and truth.get("log_stats_lines_kv_full_with_waiting", 1) == 0)
    check_names(scenario, d.names, where, require=require)
    if scenario == "healthy":
        check_facts(d.facts, truth, ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs"), where)
        serious = [f for f in d.findings if f.get("severity") in ("warning", "critical")]
        assert not serious, f"{where}: findings on a healthy server: {serious}"
    elif scenario == "preemption-storm":
        check_facts(d.facts, truth, ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs"), where)
        storm = [f for f in d.findings if f.get("name") in MUST[scenario][0]]
        # Admitting fewer sequences only buys fewer preemptions, so a --max-num-seqs fix is due
        # where vLLM counted preemptions (its counter, --metrics: issue 20, fixes from measured
        # harm). Preemption inferred from a V1 log alone (running dropping while the KV cache is
        # full) or a capacity cap is no reason to cut concurrency.
        seen = (d.facts.get("preemptions_total") or 0) > 0
        if (require or storm) and seen:
            check_max_num_seqs_fix(storm, truth, where)
        elif storm:
            assert not fix_values(storm, "--max-num-seqs"), (
                f"{where}: --max-num-seqs proposed with no preemption counted or inferred: {storm}")
        if with_metrics:  # the capture's vllm:cache_config_info names them: they must be read
            check_facts(d.facts, truth, ("block_size", "num_gpu_blocks"), where)
            assert d.facts.get("preemptions_total") == truth["preemptions_total"], (
                f"{where}: preemptions_total {d.facts.get('preemptions_total')} != vLLM's "
                f"vllm:num_preemptions_total {truth['preemptions_total']}")
    elif scenario == "startup-oom":
        check_facts(d.facts, truth, ("max_model_len",), where)
        check_max_model_len_fix([f for f in d.findings if f.get("name") == "startup-oom"], truth, where)


# Facts the log of vLLM 0.32 on CPU does not print (block size, number of blocks, defaults left
# unset on the command line). vllm-doctor may leave them null, but a value it reports must be the
# one vLLM used: vLLM's own /metrics (cache_config_info) or vLLM's own EngineArgs resolution.
OPTIONAL_FACTS = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")


def check_optional_facts(d: Diagnosis, truth: dict, where: str) -> None:
    check_facts(d.facts, truth, (), where, optional=OPTIONAL_FACTS)


def check_capacity_plateau(d: Diagnosis, truth: dict, where: str) -> None:
    """When vLLM's log shows the kv-capacity-bound signature in words (see
    harness.plateau_stats_lines) on at least two stats lines, diagnose of the log alone names it."""
    n = truth.get("log_stats_lines_capacity_plateau", 0)
    if n < 2:
        return
    assert d.names & MUST["preemption-storm"][0], (
        f"{where}: {n} stats lines show running at the KV capacity ({truth['max_concurrency']}x) far below "
        f"max_num_seqs {truth['max_num_seqs']} with requests waiting, yet no kv-capacity-bound: {sorted(d.names)}")
