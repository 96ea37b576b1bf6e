"""Score the held-back real logs (tests/fixtures/heldback, issue 25) once: each log is diagnosed and
checked against its README row by tests/test_corpus.py's own check (every "must" group found, no
other core rule, facts equal, fix bounds, cited lines). Not a test: the set is scored at the end of a
piece of work and the score written to tests/fixtures/heldback/SCORE.md, never tuned on.

    .venv/bin/python tests/score_heldback.py            # tests/fixtures/heldback
    .venv/bin/python tests/score_heldback.py round2     # a later held-back part, tests/fixtures/heldback/round2
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import diagnose_file, expectations  # noqa: E402
from test_corpus import check  # noqa: E402

HB = HERE / "fixtures" / "heldback"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    hb = HB / argv[0] if argv else HB
    exp = expectations(hb / "README.md")
    ok = 0
    for name in sorted(exp):
        errs = check(name, exp, hb / "logs")
        found = sorted(f.name for f in diagnose_file(hb / "logs" / name).findings)
        ok += not errs
        print(("PASS " if not errs else "FAIL ") + name + ("" if not errs else ": " + "; ".join(errs))
              + f"  [found: {', '.join(found) or 'nothing'}]")
    print(f"{ok} of {len(exp)} held-back logs right")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
