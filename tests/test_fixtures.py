"""Every real vLLM log in tests/fixtures/logs gives the diagnosis its README row expects:
the "must" rules fire, no other core rule fires (false positives), facts are exact, fix bounds hold."""

from __future__ import annotations

import pytest

from conftest import CORE_RULES, LOGS, diagnose_file, expectations

EXP = expectations()


def test_all_fixture_logs_have_expectations():
    logs = {p.name for p in LOGS.glob("*.log")}
    assert logs == set(EXP), logs ^ set(EXP)
    assert len(logs) == 33


@pytest.mark.parametrize("name", sorted(EXP))
def test_fixture_diagnosis(name):
    e = EXP[name]
    rep = diagnose_file(LOGS / name)
    found = {f.name for f in rep.findings}
    for group in e["must"]:
        assert found & group, f"{name}: none of {group} in {found}"
    allowed = e["may"] | set().union(*e["must"]) if e["must"] else e["may"]
    assert not (found & CORE_RULES) - allowed, f"{name}: false positives {(found & CORE_RULES) - allowed}"
    for k, want in e["facts"].items():
        got = rep.facts.get(k)
        assert got is not None and round(float(got), 2) == round(float(want), 2), f"{name}: {k}={got!r}, want {want!r}"
    if e["fix_max"]:
        flag, bound = e["fix_max"]
        vals = [int(fx.value) for f in rep.findings for fx in f.fixes if fx.flag == flag]
        assert vals and min(vals) <= bound, f"{name}: {flag} fixes {vals}"
    # every report is serialisable and names a line for every finding
    d = rep.to_dict()
    assert d["findings"] == [f.to_dict() for f in rep.findings]
    for f in rep.findings:
        assert f.evidence, f"{f.name} on {name} cites no line"
        assert all(ev.lineno >= 1 for ev in f.evidence)
