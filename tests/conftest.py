"""Shared test helpers: paths of the real fixtures, and running diagnose in-process."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
LOGS = FIXTURES / "logs"
METRICS = FIXTURES / "metrics"
CORE_RULES = {"startup-oom", "preemption-storm", "prefill-blocking", "kv-capacity-bound",
              "slow-startup", "restart-loop", "overload", "request-too-long", "kv-transfer-failure",
              "gpu-unsupported", "prefix-cache-collapse", "host-memory-growth",
              "gpu-memory-leak", "nccl-failure", "runtime-oom", "engine-dead", "engine-stalled"}


def log(name_prefix: str) -> Path:
    """The fixture log whose name starts with ``name_prefix`` (exactly one)."""
    hits = sorted(p for p in LOGS.glob("*.log") if p.name.startswith(name_prefix))
    assert len(hits) == 1, f"{name_prefix}: {hits}"
    return hits[0]


def expectations(readme: Path = LOGS / "README.md") -> dict[str, dict]:
    """Rows of a fixtures README table (default tests/fixtures/logs/README.md): file -> {must, may, facts, fix_max}."""
    exp = {}
    for line in readme.read_text().splitlines():
        if not line.startswith("| ") or ".log" not in line.split("|")[1]:
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        name, must, may, facts = c[0], c[3], c[4], c[5]
        e = {"must": [] if must.startswith("(none") else [set(m.strip().split(" or ")) for m in must.split(",") if m.strip()],
             "may": {m.strip() for m in may.split(",") if m.strip()}, "facts": {}, "fix_max": None}
        for part in [p.strip() for p in facts.split(",") if p.strip()]:
            m = re.match(r"fix (\S+) <= (\d+)", part)
            if m:
                e["fix_max"] = (m.group(1), int(m.group(2)))
                continue
            k, v = part.split("=", 1)
            e["facts"][k.strip()] = float(v) if "." in v else int(v)
        exp[name] = e
    return exp


@pytest.fixture(scope="session")
def builtin_rules():
    from vllm_doctor.diagnosis import load_rules

    return load_rules()


def diagnose_file(path: Path | str, **kw):
    from vllm_doctor import diagnose

    return diagnose([str(path)], **kw)


@pytest.fixture(scope="session")
def progress(request):
    """Writes one line to the terminal at once (past pytest's capture): what a long step is doing
    and how long it usually takes."""
    tr = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(msg: str) -> None:
        if tr is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            tr.ensure_newline()
            tr.write_line(f"[{time.strftime('%H:%M:%S')}] {msg}")
    return say


#: Test modules that are slow by what they run (a real Prometheus/Alertmanager, the container image,
#: a browser, seeded kill and fuzz loops of the sidecar and the follower, the bench ladder against
#: a stand-in server): marked ``slow`` here, in one place, so that ``make test-fast`` (pytest -m
#: "not e2e and not slow") leaves them to ``make test``. Individual slow tests carry the mark.
SLOW_MODULES = {"test_alerting_e2e", "test_container", "test_charts_browser", "test_pages_browser", "test_kill_loop",
                "test_serve_prometheus", "test_fleet_prometheus", "test_fleet_scored", "test_follow_killpoints",
                "test_serve_fuzz", "test_bench", "test_bench_demo"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
