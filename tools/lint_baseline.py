#!/usr/bin/env python3
"""ruff and mypy against a recorded baseline that may only shrink (``make lint``).

The findings the code had when the linters were introduced are counted per rule (ruff: ``E741``,
``B023``, ...) and per error code (mypy: ``arg-type``, ...) in tools/lint_baseline.json. A count
above its baseline (a new finding of that rule), or a rule not in it, fails with the findings of
that rule; a count below it is reported, and ``--update`` records the smaller figures (never larger
ones: fix the new finding, or mark it ``# noqa: CODE`` / ``# type: ignore[code]`` with a reason).

    python tools/lint_baseline.py            # check (exit 1 on a new finding)
    python tools/lint_baseline.py --update   # record the counts, when none grew
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tools" / "lint_baseline.json"
RUFF_PATHS = ["vllm_doctor", "tests", "bench", "tools"]
MYPY_LINE = re.compile(r"^(?P<where>[^:\s]+:\d+): error: (?P<msg>.*?)\s+\[(?P<code>[\w-]+)\]$")


def ruff() -> dict[str, list[str]]:
    """Rule -> its findings (``path:line: message``)."""
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "json", "--exit-zero", *RUFF_PATHS],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    out: dict[str, list[str]] = {}
    for f in json.loads(p.stdout):
        where = f"{Path(f['filename']).relative_to(ROOT)}:{f['location']['row']}"
        out.setdefault(f["code"] or "syntax", []).append(f"{where}: {f['message']}")
    return out


def mypy() -> dict[str, list[str]]:
    """Error code -> its errors (``path:line: message``)."""
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "vllm_doctor"],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"mypy failed to run:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    out: dict[str, list[str]] = {}
    for line in p.stdout.splitlines():
        m = MYPY_LINE.match(line)
        if m:
            out.setdefault(m["code"], []).append(f"{m['where']}: {m['msg']}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="record the current counts (when none grew)")
    a = ap.parse_args()
    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else {"ruff": {}, "mypy": {}}
    now = {"ruff": ruff(), "mypy": mypy()}
    grew, shrank = [], []
    for tool, found in now.items():
        counts = Counter({code: len(v) for code, v in found.items()})
        for code, n in sorted(counts.items()):
            was = base[tool].get(code, 0)
            if n > was:
                grew.append(f"{tool} {code}: {n} (baseline {was}):\n    " + "\n    ".join(found[code][:20]))
        for code, was in sorted(base[tool].items()):
            if counts.get(code, 0) < was:
                shrank.append(f"{tool} {code}: {counts.get(code, 0)} (baseline {was})")
    for line in grew:
        print("new finding:", line)
    for line in shrank:
        print("fewer findings:", line, "(python tools/lint_baseline.py --update records it)")
    total = {tool: sum(len(v) for v in found.values()) for tool, found in now.items()}
    print(f"lint: ruff {total['ruff']} findings, mypy {total['mypy']} errors; "
          f"{'no new finding' if not grew else str(len(grew)) + ' rule(s) with new findings'}")
    if a.update:
        if grew and BASELINE.exists():
            print("not updated: a count grew (fix those findings first)")
            return 1
        BASELINE.write_text(json.dumps({tool: {c: len(v) for c, v in sorted(found.items())} for tool, found in now.items()},
                                       indent=1, sort_keys=True) + "\n")
        print(f"wrote {BASELINE.relative_to(ROOT)}")
        return 0
    return 1 if grew else 0


if __name__ == "__main__":
    sys.exit(main())
