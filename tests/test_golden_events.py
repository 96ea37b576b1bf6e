"""Golden events: ``vllm-doctor events`` of each handed-out log and of each corpus log equals its
dump in tests/fixtures/events (corpus: tests/fixtures/events/corpus; regenerate with ``make
golden`` and review the diff)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log"))
sys.path.insert(0, str(ROOT / "tools"))

from gen_golden_events import OUT, OUT_CORPUS, dump  # noqa: E402

CORPUS = sorted((ROOT / "tests" / "fixtures" / "corpus" / "logs").glob("*.log"))


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_events_match_golden_dump(log):
    golden = (OUT / (log.stem + ".jsonl")).read_text().splitlines()
    got = dump(log).splitlines()
    assert [json.loads(x) for x in got] == [json.loads(x) for x in golden]
    assert golden, "every handed-out log gives events"


@pytest.mark.parametrize("log", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_events_match_golden_dump(log):
    golden = (OUT_CORPUS / (log.stem + ".jsonl")).read_text().splitlines()
    assert [json.loads(x) for x in dump(log).splitlines()] == [json.loads(x) for x in golden]


def test_events_command_prints_plain_json_lines():
    log = ROOT / "tests" / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log"
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "events", "--year", "2026", str(log)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows == [json.loads(x) for x in (OUT / (log.stem + ".jsonl")).read_text().splitlines()]
    stats = [x for x in rows if x["event"] == "SchedulerStats"]
    assert stats and all(isinstance(x["num_running"], int) and isinstance(x["ts"], float) for x in stats)
    # plain values only: no Python reprs of events or metas
    assert "Meta(" not in r.stdout and "SchedulerStats(" not in r.stdout
    bad = subprocess.run([sys.executable, "-m", "vllm_doctor", "events", str(ROOT / "nonexistent.log")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("vllm-doctor: ") and "Traceback" not in bad.stderr
