"""The wordings table read from vLLM's released wheels (vllm_doctor/data/vllm_wordings.json,
made by tools/gen_wordings.py): every logger call and raise bearing on memory, KV cache,
scheduling, preemption, engine death and NCCL, for every minor version 0.2 to the newest, has a
matcher or a written reason (vllm_doctor/data/vllm_wordings_reasons.yaml)."""

from __future__ import annotations

import json

from wordings_check import DATA, events_of, load, reason_for


def test_table_covers_every_minor_version():
    data = json.loads((DATA / "vllm_wordings.json").read_text())
    minors = {tuple(int(x) for x in v.split(".")[:2]) for v in data["versions"]}
    assert (0, 2) in minors and (0, 33) in minors and len(minors) >= 28
    assert data["generated_by"].startswith("tools/gen_wordings.py")
    assert len(data["entries"]) >= 200


def test_every_wording_has_a_matcher_or_a_reason():
    entries, reasons = load()
    missing = [f"{e['kind']} | {e['file']} | {e['text'][:120]}" for e in entries if not events_of(e) and not reason_for(e, reasons)]
    assert missing == []


def test_every_reason_still_applies_and_matched_wordings_need_none():
    entries, reasons = load()
    used = {id(reason_for(e, reasons)) for e in entries if not events_of(e)}
    assert all(id(r) in used for r in reasons), [r["match"] for r in reasons if id(r) not in used]
    matched = sum(1 for e in entries if events_of(e))
    assert matched >= 80  # the incident wordings themselves are read, not explained away


def test_key_wordings_of_every_era_are_read():
    entries, _ = load()
    by_text = {e["text"]: e for e in entries}
    for needle in ("Sequence group %s is preempted by %s mode", "No available memory for the cache blocks",
                   "KV cache size:", "Avg prompt throughput", "died unexpectedly", "Free memory on device"):
        hits = [e for t, e in by_text.items() if needle in t]
        assert hits and any(events_of(e) for e in hits), needle
