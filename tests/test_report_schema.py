"""Every report validates against the JSON Schema shipped with the package (docs/report.schema.json,
issue 11): each real fixture log through ``diagnose --format json``, a saved /metrics capture with
a log, empty and non-vLLM input, and the sidecar's /api/state on /metrics alone."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from conftest import LOGS, METRICS, ROOT
from serve_helpers import Pages, live_sidecar, timeline_pages, wait_for
from typer.testing import CliRunner

from vllm_doctor.cli import app

SCHEMA = json.loads(resources.files("vllm_doctor").joinpath("data/report.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
LOG_FILES = sorted(LOGS.glob("*.log"))


def diagnose_json(*args) -> dict:
    r = CliRunner().invoke(app, ["diagnose", "--format", "json", "--fail-on", "never", *map(str, args)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def assert_valid(doc: dict) -> None:
    errs = sorted(VALIDATOR.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errs, "\n".join(f"{list(e.absolute_path)}: {e.message[:200]}" for e in errs[:5])


def test_schema_is_valid_and_docs_point_at_the_shipped_copy():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert json.loads((ROOT / "docs" / "report.schema.json").read_text()) == SCHEMA
    assert "report.schema.json" in (ROOT / "docs" / "json-schema.md").read_text()


@pytest.mark.parametrize("path", LOG_FILES, ids=[p.name[:40] for p in LOG_FILES])
def test_every_fixture_report_validates(path):
    doc = diagnose_json(path)
    assert_valid(doc)
    # rule values are plain: an event is a reference to its line, never "SchedulerStats(meta=..."
    for f in doc["findings"]:
        assert "Meta(" not in json.dumps(f["values"])


def test_every_corpus_report_validates():
    """The public-log corpus too (tests/fixtures/corpus: real logs of many versions and setups)."""
    from vllm_doctor.ingest.oneshot import diagnose
    from vllm_doctor.report.render import to_json

    corpus = sorted((ROOT / "tests" / "fixtures" / "corpus" / "logs").glob("*"))
    assert len(corpus) >= 100
    for path in corpus:
        doc = json.loads(to_json(diagnose([str(path)])))
        errs = list(VALIDATOR.iter_errors(doc))
        assert not errs, (path.name, [f"{list(e.absolute_path)}: {e.message[:200]}" for e in errs[:3]])


def test_report_with_a_metrics_capture_validates():
    doc = diagnose_json("--metrics", METRICS / "vllm-0.32-cpu-preemption.txt", LOGS / "cpu-preemption-tiny-kv-cache.log")
    assert_valid(doc)
    assert doc["facts"]["preemptions_total"] == 105
    series = doc["timeline"]["series"]
    assert list(series) == ["0"] and len(series["0"]) == 6  # Engine 000: six stats lines


def test_values_holding_events_are_line_references():
    doc = diagnose_json(LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log")
    assert_valid(doc)
    refs = [v for f in doc["findings"] for val in f["values"].values() if isinstance(val, list)
            for v in val if isinstance(v, dict)]
    assert refs and all(set(r) == {"source", "lineno", "ts"} for r in refs)
    assert {r["lineno"] for r in refs} <= {1, 3}  # the two stats lines of that log


@pytest.mark.parametrize("content", [b"", b"hello\nnot vllm at all\n"], ids=["empty", "not-vllm"])
def test_empty_and_foreign_input_validate(tmp_path, content):
    p = tmp_path / "in.log"
    p.write_bytes(content)
    doc = diagnose_json(p)
    assert_valid(doc)
    assert doc["nothing_to_diagnose"] is True and doc["findings"] == []


def test_a_python_repr_fails_the_schema():  # noqa: D103
    doc = diagnose_json(LOGS / "034-v0.3-stuck-kv99-running35-pending115.log")
    doc["findings"][0]["values"]["full"] = "[SchedulerStats(meta=Meta(source='x', lineno=1))]"
    assert list(VALIDATOR.iter_errors(doc))


def test_sidecar_state_on_metrics_alone_validates():
    with Pages(timeline_pages()) as vllm, live_sidecar({"metrics_url": vllm.url, "scrape_interval": 0.1}) as s:
        wait_for(lambda: len((s.get("/api/state").json()["timeline"] or {}).get("series", {}).get("metrics", [])) >= 3,
                 what="three /metrics samples")
        s.sidecar.evaluate()
        doc = s.get("/api/state").json()
    assert_valid(doc)
    assert doc["clock"]["mode"] == "no-log-time" and doc["sources"] == []


def test_computed_records_become_plain_objects():
    """A rule value that is a computed record (a dataclass holding events) is its fields, the
    events as line references: valid against the schema's plain values."""
    from dataclasses import dataclass

    from vllm_doctor.diagnosis.evaluate import _jsonable
    from vllm_doctor.events import Meta, SchedulerStats

    @dataclass
    class Record:
        value: int
        method: str
        sample: SchedulerStats
        samples: tuple

    st = SchedulerStats(meta=Meta(source="vllm.log", lineno=138, ts=1796029889.0), prompt_tps=23.8,
                        generation_tps=933.8, num_running=4, num_waiting=12)
    got = _jsonable(Record(4, "running-at-full", st, (st, st)))
    ref = {"source": "vllm.log", "lineno": 138, "ts": 1796029889.0}
    assert got == {"value": 4, "method": "running-at-full", "sample": ref, "samples": [ref, ref]}
    doc = diagnose_json(LOGS / "034-v0.3-stuck-kv99-running35-pending115.log")
    doc["findings"][0]["values"]["c"] = got
    assert_valid(doc)
