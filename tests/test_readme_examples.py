"""The console examples of README.md and docs/*.md are what the commands print today: every line shown (a `...` stands
for text left out) is a line of the real output, in order. A newcomer copies these; stale ones mislead."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `vllm-doctor diagnose vllm.log` in the README is the bundled log that `make demo` diagnoses
STAND_INS = {"vllm.log": "tests/fixtures/logs/cpu-preemption-tiny-kv-cache.log"}
# bench ladder measures a running vLLM, fleet reads a Prometheus: their examples are recordings
NEEDS_A_SERVER = ("bench", "fleet")


def examples() -> list[tuple[str, list[str], list[str]]]:
    """(where, argv, the lines shown after the command) of every `$ vllm-doctor ...` in a console block."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```console\n(.*?)```", doc.read_text(), re.S):
            lines = block.splitlines()
            starts = [i for i, ln in enumerate(lines) if ln.startswith("$ ")] + [len(lines)]
            for a, b in zip(starts, starts[1:]):
                n = a + 1
                while lines[n - 1].rstrip().endswith("\\"):
                    n += 1
                cmd = " ".join(ln.rstrip().rstrip("\\") for ln in lines[a:n])
                assert cmd.startswith("$ vllm-doctor "), cmd
                argv = [STAND_INS.get(x, x) for x in shlex.split(cmd[2:])[1:]]
                if argv[0] not in NEEDS_A_SERVER:
                    out.append((f"{doc.name}:{argv[0]}", argv, lines[n:b]))
    return out


def matches(shown: str, real: str) -> bool:
    parts = shown.split("...")
    if not real.startswith(parts[0]) or (len(parts) == 1 and real != shown):
        return False
    pos = len(parts[0])
    for p in parts[1:]:
        pos = real.find(p, pos)
        if pos < 0:
            return False
        pos += len(p)
    return parts[-1] == "" or real.endswith(parts[-1])


@pytest.mark.parametrize("where,argv,shown", examples(), ids=[w for w, _, _ in examples()])
def test_readme_console_example_is_the_real_output(where, argv, shown):
    assert len(examples()) >= 5   # README: diagnose, plan, check; docs/check.md, docs/plan.md
    real = subprocess.run([sys.executable, "-m", "vllm_doctor", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120).stdout.splitlines()
    at = 0
    for line in shown:
        if not line.strip() or line.strip() == "...":
            continue
        hit = next((i for i in range(at, len(real)) if matches(line, real[i])), None)
        assert hit is not None, f"README line not in the output (after line {at}): {line!r}"
        at = hit + 1


def test_readme_names_every_debian_package_make_system_deps_installs():
    """Issue 27: the README's list left out chromium and chromium-driver; .ci/apt-packages.txt is the truth."""
    listed = [ln.strip() for ln in (ROOT / ".ci" / "apt-packages.txt").read_text().splitlines()
              if ln.strip() and not ln.lstrip().startswith("#")]
    readme = (ROOT / "README.md").read_text()
    part = readme[readme.index("- `make system-deps`: the Debian packages"):]
    part = part[:part.index("\n- ")]
    assert "chromium-driver" in listed
    assert [p for p in listed if f"`{p}`" not in part] == []
