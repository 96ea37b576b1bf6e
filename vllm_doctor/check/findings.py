"""One finding of ``vllm-doctor check``; its rules are part of the one rule catalogue
(rules/check/VCnnn-*.yaml, VMnnn-*.yaml: id, name, severity, what it means, scope "check"),
read by the rules' one loader."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from vllm_doctor.diagnosis.loader import Rule, RuleSet, builtin_rules_dir, load_rule_file
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.findings import SARIF_LEVELS


def check_rules_dir() -> Path:
    return builtin_rules_dir() / "check"


@lru_cache(maxsize=1)
def load_check_rules() -> RuleSet:
    """check's rules (rules/check/), validated by the one loader with scope "check"; loaded once
    per process. The directory without a rule is an installation that lost its package data."""
    d = check_rules_dir()
    paths = sorted([*d.glob("VC*.yaml"), *d.glob("VM*.yaml")])
    if not paths:
        raise RuleLoadError(f"no check rule (VC001+) in {d}: this installation of vllm-incident-doctor lacks its "
                            "package data; reinstall it (pip install --force-reinstall vllm-incident-doctor)")
    return RuleSet(tuple(load_rule_file(p, True, {}, scope="check") for p in paths), {})


def check_rule(rule_id: str) -> Rule:
    """A check rule by its id (``VC010``)."""
    rule = load_check_rules().by_key(rule_id)
    if rule is None or rule.id != rule_id:
        raise KeyError(rule_id)
    return rule


def sarif_level(rule_id: str) -> str:
    """The SARIF level of a check rule's findings unless a finding says otherwise (its severity's)."""
    return SARIF_LEVELS[check_rule(rule_id).severity]


@dataclass
class CheckFinding:
    rule_id: str
    message: str
    file: str = "-"
    line: int = 1
    level: str = ""
    fix: dict | None = None          # {"setting": real flag / env var / function, "value": ...}
    snippet: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.level:
            self.level = sarif_level(self.rule_id)

    @property
    def name(self) -> str:
        return check_rule(self.rule_id).name

    def to_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        return d
