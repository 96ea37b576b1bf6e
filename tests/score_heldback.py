"""Score the held-back real logs (tests/fixtures/heldback, issue 25) once: each log is diagnosed and
checked against its README row exactly as tests/test_corpus.py checks the corpus (every "must" group
found, no other core rule, facts equal, fix bounds). Not a test: the set is scored at the end of a
piece of work and the score written to tests/fixtures/heldback/SCORE.md, never tuned on.

    .venv/bin/python tests/score_heldback.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import CORE_RULES, diagnose_file, expectations  # noqa: E402

HB = HERE / "fixtures" / "heldback"


def main() -> int:
    exp = expectations(HB / "README.md")
    ok = 0
    for name in sorted(exp):
        e = exp[name]
        rep = diagnose_file(HB / "logs" / name)
        found = {f.name for f in rep.findings}
        errs = [f"missing {'|'.join(sorted(g))}" for g in e["must"] if not found & g]
        allowed = e["may"].union(*e["must"])
        errs += [f"false positive {x}" for x in sorted((found & CORE_RULES) - allowed)]
        for k, want in e["facts"].items():
            got = rep.facts.get(k)
            if got is None or round(float(got), 2) != round(float(want), 2):
                errs.append(f"fact {k}={got!r}, want {want!r}")
        ok += not errs
        print(("PASS " if not errs else "FAIL ") + name + ("" if not errs else ": " + "; ".join(errs))
              + f"  [found: {', '.join(sorted(found)) or 'nothing'}]")
    print(f"{ok} of {len(exp)} held-back logs right")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
