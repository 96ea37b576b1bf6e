"""The installed package is the development setup: the wheel `pip install .` builds holds every
file of the package tree (rules, fleet rules, templates, data), and installed into a fresh venv
(its dependencies from pip's cache or PyPI, nothing from the project's .venv) it lists the same
rules and explains a fleet rule.

Cost: the wheel about 15 s; the fresh venv 30-90 s (pip's cache holds the dependencies once
`make setup` ran). Skipped with the reason where no package index can be reached.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from wheel_build import build_wheel, dev_rule_ids, package_files, wheel_files

pytestmark = pytest.mark.slow

_OFFLINE = ("Could not find a version", "No matching distribution", "Failed to establish", "Temporary failure",
            "Network is unreachable", "Connection refused")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, progress) -> Path:
    progress("packaging: pip wheel of the working tree (usually 15 s)")
    work = tmp_path_factory.mktemp("wheel")
    return build_wheel(work / "dist", work)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory, progress) -> Path:
    """A fresh venv with the wheel and its dependencies installed: its bin/ folder."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    progress("packaging: the wheel into a fresh venv, dependencies from pip's cache / PyPI (usually 30-90 s)")
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        str(wheel)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        out = p.stdout + p.stderr
        if any(s in out for s in _OFFLINE):
            pytest.skip(f"the wheel's dependencies cannot be installed (no package index): {out.strip().splitlines()[-1]}")
        pytest.fail(f"pip install of the wheel failed:\n{out[-3000:]}", pytrace=False)
    return venv / "bin"


def _run(bin_: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # cwd outside the checkout: `import vllm_doctor` must find the installed package, not the tree
    return subprocess.run([str(bin_ / "vllm-doctor"), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_wheel_holds_every_file_of_the_package(wheel):
    """Every rule (rules/fleet/ included, through the data/rules symlink), template and data file."""
    have = wheel_files(wheel)
    want = package_files()
    assert "vllm_doctor/data/rules/fleet/VD020-replica-imbalance.yaml" in want
    assert "vllm_doctor/data/rules/check/VC010-kv-capacity.yaml" in want
    # the wordings table and its reasons are read only by tests/ and tools/: not shipped
    test_only = {"vllm_doctor/data/vllm_wordings.json", "vllm_doctor/data/vllm_wordings_reasons.yaml"}
    assert sorted(want - test_only - have) == []
    assert sorted(test_only & have) == []


def test_installed_wheel_lists_and_explains_every_rule(installed, tmp_path):
    dev = dev_rule_ids()
    # every rule file of the checkout, the fleet rules (rules/fleet/) and check's (rules/check/) too
    assert len(dev) == len(list((ROOT / "rules").glob("VD*.yaml")) + list((ROOT / "rules" / "fleet").glob("VD*.yaml"))
                           + list((ROOT / "rules" / "check").glob("V*.yaml")))
    assert "VD024" in dev
    p = _run(installed, "rules", "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert [r["id"] for r in json.loads(p.stdout)] == dev
    where = subprocess.run([str(installed / "python"), "-c", "import vllm_doctor; print(vllm_doctor.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert str(ROOT) not in where and "site-packages" in where
    p = _run(installed, "explain", "VD020", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("VD020 replica-imbalance (") and "[fleet rule]" in p.stdout
    p = _run(installed, "explain", "VC010", cwd=tmp_path)  # check's rules ship as package data too
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("VC010 kv-capacity (critical, launch) [check rule, SARIF level error]")
    p = _run(installed, "export", "alertmanager", cwd=tmp_path)
    assert p.returncode == 0 and "route:" in p.stdout, p.stderr
