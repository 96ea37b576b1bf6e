"""The enlarged corpus of real vLLM logs (tests/fixtures/corpus, issue 9 item 6).

Every excerpt under tests/fixtures/corpus/logs is diagnosed in-process and checked exactly like
../shared/tools/check-fixtures checks it: every "must" group is found, no other core rule fires,
facts are equal (2 decimals), "fix FLAG <= N" bounds hold. The README table is parsed by the same
reader as tests/fixtures/logs/README.md (conftest.expectations).

Logs the current tool gets wrong are listed in tests/fixtures/corpus/known_misses.yaml and marked
xfail(strict=True) with their miss class, so a parser fix that makes one pass fails this test until
its line is removed from that file.
"""

from __future__ import annotations

import pytest
import yaml

from conftest import CORE_RULES, FIXTURES, diagnose_file, expectations

CORPUS = FIXTURES / "corpus"
LOGS = CORPUS / "logs"
EXP = expectations(CORPUS / "README.md")
KNOWN_MISSES: dict[str, str] = yaml.safe_load((CORPUS / "known_misses.yaml").read_text()) or {}

# Names the README and known_misses.yaml may use: the core rules plus the configuration rules, and
# the fallback for an error no rule explains (never a false positive: "engine-dead or unexplained-error")
RULE_NAMES = CORE_RULES | {"max-model-len-exceeds-model", "unknown-flag", "unexplained-error"}


def check(name: str, exp: dict | None = None, logs=LOGS) -> list[str]:
    """The differences between the diagnosis of one corpus log and its README row (another set's
    rows and folder: ``exp``, ``logs``)."""
    e = (EXP if exp is None else exp)[name]
    rep = diagnose_file(logs / name)
    found = {f.name for f in rep.findings}
    errs = [f"missing {'|'.join(sorted(g))}" for g in e["must"] if not found & g]
    allowed = e["may"].union(*e["must"])
    errs += [f"false positive {x}" for x in sorted((found & CORE_RULES) - allowed)]
    for k, want in e["facts"].items():
        got = rep.facts.get(k)
        if got is None or round(float(got), 2) != round(float(want), 2):
            errs.append(f"fact {k}={got!r}, want {want!r}")
    if e["fix_max"]:
        flag, bound = e["fix_max"]
        vals = [int(str(fx.value).replace(",", "")) for f in rep.findings for fx in f.fixes
                if fx.flag == flag and str(fx.value).replace(",", "").isdigit()]
        if not vals or min(vals) > bound:
            errs.append(f"no fix {flag} <= {bound} (got {vals})")
    for f in rep.findings:
        if not f.evidence:
            errs.append(f"{f.name} cites no line")
    return errs


def test_every_corpus_log_has_one_expectation():
    logs = {p.name for p in LOGS.glob("*.log")}
    assert logs == set(EXP), logs ^ set(EXP)
    assert len(logs) >= 100


def test_expectations_use_rule_names_only():
    for name, e in EXP.items():
        names = set().union(*e["must"]) | e["may"]
        assert names <= RULE_NAMES, f"{name}: {names - RULE_NAMES}"


def test_known_misses_name_corpus_logs():
    assert set(KNOWN_MISSES) <= set(EXP), set(KNOWN_MISSES) - set(EXP)
    assert all(isinstance(v, str) and v for v in KNOWN_MISSES.values())


def _case(name: str):
    if name in KNOWN_MISSES:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[name]))
    return name


@pytest.mark.parametrize("name", [_case(n) for n in sorted(EXP)])
def test_corpus_diagnosis(name):
    errs = check(name)
    assert not errs, f"{name}: " + "; ".join(errs)


def test_corpus_files_are_anonymised():
    """No home directory of a real user name is left (they were replaced by /home/user)."""
    allowed = {"user", "ray", "jovyan", "***"}
    for p in sorted(LOGS.glob("*.log")):
        for part in p.read_text(errors="replace").split("/home/")[1:]:
            who = part.split("/", 1)[0]
            assert who in allowed, f"{p.name}: /home/{who}"


def test_readme_sources_are_public_urls():
    for line in (CORPUS / "README.md").read_text().splitlines():
        if line.startswith("| ") and ".log" in line.split("|")[1]:
            assert "https://github.com/" in line.split("|")[2], line[:80]

