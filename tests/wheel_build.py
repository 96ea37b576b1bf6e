"""Builds the distribution's wheel from this working tree, as `pip install .` and `make wheel` do,
for tests/test_packaging.py and tests/test_container.py.

The tree is copied first (the files git tracks or would track, symlinks kept as symlinks: setuptools
follows vllm_doctor/data/rules -> ../../rules), so the build neither reads nor leaves a `build/`
folder in the checkout: a stale `build/lib` there could add a file to the wheel that the tree lost.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "vllm_doctor"


def _tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [p for p in out.split("\0") if p and ((ROOT / p).is_symlink() or (ROOT / p).is_file())]


def build_wheel(dest: Path, work: Path) -> Path:
    """The wheel of the working tree, built into ``dest`` (a copy of the tree under ``work``)."""
    src = work / "src"
    for rel in _tree_files():
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink():
            target.symlink_to((ROOT / rel).readlink())
        elif (ROOT / rel).is_file():
            shutil.copy2(ROOT / rel, target)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"pip wheel failed:\n{(p.stdout + p.stderr)[-3000:]}"
    wheels = sorted(dest.glob("vllm_incident_doctor-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def package_files() -> set[str]:
    """Every file of the package tree as a wheel names it (``vllm_doctor/data/rules/fleet/...``),
    following the rules symlink; no bytecode."""
    out = set()
    for d, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        out |= {"vllm_doctor/" + (Path(d) / f).relative_to(PACKAGE).as_posix() for f in files if not f.endswith(".pyc")}
    return out


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if not n.endswith("/")}


def dev_rule_ids() -> list[str]:
    """The rule ids the development setup lists (`vllm-doctor rules --format json` order): the
    deployment rules, then the fleet rules, then check's."""
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.report.docs import check_ruleset, fleet_ruleset

    rs = load_rules([])
    return [r.id for r in rs.rules] + [r.id for r in fleet_ruleset(rs).rules] + [r.id for r in check_ruleset().rules]
