"""Every rule's pass/fail cases (tests/rule_cases/VDnnn.yaml, sqlfluff-style), run through the
one pipeline exactly as ``diagnose`` reads a log. See tests/rule_cases/README.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.events import HostMemorySample, Meta
from vllm_doctor.ingest.scrape import parse_metrics
from vllm_doctor.pipeline import Pipeline

HERE = Path(__file__).resolve().parent
CASES = HERE / "rule_cases"
RULESET = load_rules()
T0 = 1_760_000_000.0  # the collectors' samples' clock in a case
GIB = 1 << 30


def _cases():
    for path in sorted(CASES.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        for case in spec["cases"]:
            yield pytest.param(spec["rule"], case, id=f"{spec['rule']}-{case['name']}")


def test_every_rule_has_a_firing_and_a_silent_case():
    seen: dict[str, set[bool]] = {}
    for path in CASES.glob("*.yaml"):
        spec = yaml.safe_load(path.read_text())
        assert path.stem == spec["rule"]
        seen[spec["rule"]] = {bool(c["fires"]) for c in spec["cases"]}
    for r in RULESET.rules:
        assert seen.get(r.id) == {True, False}, f"{r.id} needs a case where it fires and one where it does not"


@pytest.mark.parametrize("rule_id,case", list(_cases()))
def test_rule_case(rule_id, case):
    data = (HERE / "fixtures" / case["file"]).read_bytes() if "file" in case else case.get("log", "").encode()
    p = Pipeline(RULESET, follow=False, base_year=2025)
    if data:
        p.run_files([("case.log", [data])])
    # samples of the sidecar's collectors: /metrics texts and host-memory readings at offsets (s)
    # from T0, as `serve` observes them
    for off, text in case.get("metrics") or []:
        p.observe(parse_metrics(text, now=T0 + off).sample)
    for off, used_gib, limit_gib in case.get("host_memory") or []:
        p.observe(HostMemorySample(Meta("host", ts=T0 + off), int(used_gib * GIB),
                                   None if limit_gib is None else int(limit_gib * GIB)))
    if case.get("metrics") or case.get("host_memory"):
        p.evaluate()
    rep = p.report()
    assert rep.rule_errors == {}
    got = {f.rule_id: f for f in rep.findings}
    assert (rule_id in got) == case["fires"], (case["name"], sorted(got))
    if not case["fires"]:
        return
    f = got[rule_id]
    if "severity" in case:
        assert f.severity == case["severity"], (case["name"], f.severity)
    for k, v in (case.get("values") or {}).items():
        assert f.values.get(k) == v, (k, f.values.get(k), v)
    fixes = {x.flag: x.value for x in f.fixes}
    for flag, v in (case.get("fixes") or {}).items():
        if v is None:
            assert flag not in fixes
        else:
            assert fixes.get(flag) == str(v), (flag, fixes)
