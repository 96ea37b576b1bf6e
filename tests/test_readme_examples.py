"""The console examples of README.md are what the commands print today: every line shown (a `...` stands
for text left out) is a line of the real output, in order. A newcomer copies these; stale ones mislead."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# `vllm-doctor diagnose vllm.log` in the README is the bundled log that `make demo` diagnoses
STAND_INS = {"vllm.log": "tests/fixtures/logs/cpu-preemption-tiny-kv-cache.log"}


def examples() -> list[tuple[list[str], list[str]]]:
    out = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        lines = block.splitlines()
        n = 1
        while lines[n - 1].rstrip().endswith("\\"):
            n += 1
        cmd = " ".join(ln.rstrip().rstrip("\\") for ln in lines[:n])
        assert cmd.startswith("$ vllm-doctor "), cmd
        argv = [STAND_INS.get(a, a) for a in shlex.split(cmd[2:])[1:]]
        out.append((argv, lines[n:]))
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


@pytest.mark.parametrize("argv,shown", examples(), ids=[argv[0] for argv, _ in examples()])
def test_readme_console_example_is_the_real_output(argv, shown):
    assert len(examples()) >= 3   # diagnose, plan, check
    real = subprocess.run([sys.executable, "-m", "vllm_doctor", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120).stdout.splitlines()
    at = 0
    for line in shown:
        if not line.strip() or line.strip() == "...":
            continue
        hit = next((i for i in range(at, len(real)) if matches(line, real[i])), None)
        assert hit is not None, f"README line not in the output (after line {at}): {line!r}"
        at = hit + 1
