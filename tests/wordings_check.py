"""Which entries of vllm_doctor/data/vllm_wordings.json the matcher table reads (shared by
tests/test_wordings.py and a quick look from the shell: python tests/wordings_check.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from vllm_doctor.ingest.envelope import Envelope, LogClock
from vllm_doctor.parsers.records import RecordParser

DATA = Path(__file__).resolve().parent.parent / "vllm_doctor" / "data"
PH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrifgx]|\{[^{}]*\}")
# What a %s / {} stands for in these messages: a number, a device, an enum, a process name.
FILLERS = ("1", "GPU", "PreemptionMode.RECOMPUTE", "cuda", "cuda:0", "VllmWorker-0", "0.9, 70.0")


def samples(text: str):
    """The wording with its placeholders filled: numbers for %d / %f, and each filler for the
    first free-text placeholder (the rest "1")."""
    for fill in FILLERS:
        first = [True]

        def sub(m, fill=fill, first=first):
            x = m.group(0)
            if x[-1] in "dfgi" or ":." in x:
                return "1.00" if x[-1] in "fg" or ":." in x else "1"
            if first[0]:
                first[0] = False
                return fill
            return "1"
        yield PH.sub(sub, text)
        yield PH.sub(lambda m, fill=fill: "1" if m.group(0)[-1] in "dfgi" else fill, text)


def events_of(entry: dict) -> list[str]:
    """Event kinds the parser gives for the entry's wording (placeholders filled), or []."""
    for msg in samples(entry["text"]):
        if entry["kind"].startswith("raise "):
            msg = entry["kind"][6:] + ": " + msg
        parser = RecordParser("wordings")
        evs = [e for r in Envelope(LogClock(2026)).records(1, msg.encode()) for e in parser.parse(r)] + parser.flush()
        kinds = [type(e).__name__ for e in evs if e is not None and type(e).__name__ != "ExceptionRaised"]
        if kinds:
            return kinds
    return []


def load():
    import yaml

    entries = json.loads((DATA / "vllm_wordings.json").read_text())["entries"]
    reasons = yaml.safe_load((DATA / "vllm_wordings_reasons.yaml").read_text())["reasons"]
    return entries, reasons


def reason_for(entry: dict, reasons: list[dict]) -> dict | None:
    key = f"{entry['kind']} | {entry['file']} | {entry['text']}"
    for r in reasons:
        if re.search(r["match"], key):
            return r
    return None


if __name__ == "__main__":
    entries, reasons = load() if (DATA / "vllm_wordings_reasons.yaml").exists() else (json.loads((DATA / "vllm_wordings.json").read_text())["entries"], [])
    for e in entries:
        if not events_of(e) and not reason_for(e, reasons):
            print(f"{e['kind']} | {e['file']} | {e['text'][:160]}")
