#!/usr/bin/env python3
"""Regenerate the golden events dumps: ``vllm-doctor events --year 2026`` of every log in
tests/fixtures/logs/ into tests/fixtures/events/<name>.jsonl and of every corpus log
(tests/fixtures/corpus/logs/) into tests/fixtures/events/corpus/<name>.jsonl (``make golden``).
tests/test_golden_events.py diffs them; after a deliberate parser change, rerun this and review
the diff (``git diff tests/fixtures/events``) before committing it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_doctor.ingest.oneshot import event_dict, events  # noqa: E402

LOGS = ROOT / "tests" / "fixtures" / "logs"
OUT = ROOT / "tests" / "fixtures" / "events"
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "logs"
OUT_CORPUS = OUT / "corpus"
# (logs, their dumps): the handed-out logs and the corpus of real logs (issue 9 item 7)
SETS = ((LOGS, OUT), (CORPUS, OUT_CORPUS))
YEAR = 2026


def dump(path: Path) -> str:
    lines: list[str] = []
    events([str(path)], lambda e: lines.append(json.dumps(event_dict(e), ensure_ascii=False)), year=YEAR)
    return "".join(line + "\n" for line in lines)


def main() -> int:
    for logs, out in SETS:
        out.mkdir(parents=True, exist_ok=True)
        for log in sorted(logs.glob("*.log")):
            (out / (log.stem + ".jsonl")).write_text(dump(log))
        print(f"{len(list(logs.glob('*.log')))} dumps in {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
