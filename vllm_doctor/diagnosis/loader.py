"""Load and validate rules: YAML data, one file per rule, in ``rules/`` (shipped inside the
package as ``vllm_doctor/data/rules``) plus the user's ``--rules DIR``.

Validation at load (a :class:`~vllm_doctor.errors.RuleLoadError` with a one-line message):
unknown fields (pydantic ``extra="forbid"``), an id not ``VD`` + 3 digits or a file name not
starting with it (built-in rules), a name not kebab-case, duplicate ids or names, expressions
that do not parse or use an unknown name, ``t.X`` without a documented threshold, an event kind
that does not exist, a fix flag that no vLLM version has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import RuleLoadError
from ..events import EVENT_KINDS
from ..state import FACT_NAMES
from ..textscan import top_level
from ..versions import known_flag
from .expr import FUNCTIONS, STATE_FUNCTIONS, attributes_of, names_in

SEVERITIES = ("info", "warning", "critical")
BASE_NAMES = set(FACT_NAMES) | {"t", "stats", "metrics", "engine_metrics", "window_seconds", "vllm_version", "engine",
                                 "gpu", "None", "True", "False", "unknown_flags"}
TEMPLATE_RE = re.compile(r"\{([^{}]+)\}")
_SPEC_RE = re.compile(r"[<>^=+\- #0-9,._%a-zA-Z]*")


def split_placeholder(inner: str) -> tuple[str, str | None]:
    """``expr:spec`` -> (expr, spec): the last colon outside quotes and brackets, when what
    follows it is a format spec (``.1%``, ``,``, ``.2f``); else the whole text is the expression."""
    cut = max(top_level(inner, ":"), default=-1)
    if cut >= 0 and _SPEC_RE.fullmatch(inner[cut + 1 :]):
        return inner[:cut], inner[cut + 1 :]
    return inner, None
DERIVED_KINDS = {"OutOfMemory:startup", "OutOfMemory:runtime"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class When(Strict):
    all: list[str] = Field(default_factory=list)
    any: list[str] = Field(default_factory=list)


class Fix(Strict):
    flag: str
    kind: Literal["flag", "env"] = "flag"  # env: an environment variable (NCCL_*, VLLM_*)
    value: str
    if_: str | None = Field(default=None, alias="if")
    why: str
    arithmetic: str | None = None
    option: str | None = None  # fixes naming the same option go together; options are alternatives


class Docs(Strict):
    why: str
    example_log: str
    fix: str | None = None
    limits: str | None = None


class MessageCase(Strict):
    if_: str | None = Field(default=None, alias="if")
    text: str


class Rule(Strict):
    """One rule (the YAML schema; see docs/rules.md)."""

    id: str
    name: str
    title: str
    severity: Literal["info", "warning", "critical"]
    category: str
    window: float | str | None = None  # seconds, "5m", "t.NAME", or None for the whole history
    when: When
    unless: list[str] = Field(default_factory=list)
    values: dict[str, str] = Field(default_factory=dict)
    evidence: list[str] = Field(default_factory=list)
    message: str | list[MessageCase]  # a template, or cases: the first whose `if` holds
    fixes: list[Fix] = Field(default_factory=list)
    checks: list[MessageCase] = Field(default_factory=list)  # diagnostic steps (not fixes), each with an optional `if`
    docs: Docs
    source: str = ""

    @field_validator("name")
    @classmethod
    def _kebab(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", v):
            raise ValueError(f"name {v!r} is not kebab-case")
        return v


@dataclass(frozen=True)
class RuleSet:
    """Validated rules (in id order) and the shared thresholds (name -> value)."""

    rules: tuple[Rule, ...]
    thresholds: dict[str, float]

    def by_key(self, key: str) -> Rule | None:
        """A rule by id (``VD001``, any case) or name (``preemption-storm``)."""
        for r in self.rules:
            if r.id.lower() == key.lower() or r.name == key:
                return r
        return None

    def window_seconds(self, rule: Rule) -> float | None:
        return parse_window(rule.window, self.thresholds)


def parse_window(w: float | str | None, thresholds: dict[str, float]) -> float | None:
    """``300``, ``"5m"``, ``"1h"``, ``"t.preemption_window_seconds"`` -> seconds; None -> None."""
    if w is None:
        return None
    if isinstance(w, (int, float)):
        return float(w)
    w = w.strip()
    if w.startswith("t."):
        return float(thresholds[w[2:]])
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)?", w)
    if not m:
        raise RuleLoadError(f"bad window {w!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def builtin_rules_dir() -> Path:
    """The rules shipped with the package (``rules/`` in the repository)."""
    return Path(str(resources.files("vllm_doctor").joinpath("data/rules")))


def load_thresholds(path: Path) -> dict[str, float]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RuleLoadError(f"{path}: cannot read thresholds: {e}".splitlines()[0]) from None
    out = {}
    for k, v in raw.items():
        if not isinstance(v, dict) or "value" not in v or not v.get("description"):
            raise RuleLoadError(f"{path}: threshold {k!r} needs a value and a description")
        out[k] = v["value"]
    return out


def load_rules(extra_dirs: list[Path] | tuple[Path, ...] = (), builtin: bool = True) -> RuleSet:
    """Load the built-in rules and those in ``extra_dirs`` (``*.yaml`` / ``*.yml``).

    Raises RuleLoadError (one-line message naming the file) on any invalid rule."""
    base = builtin_rules_dir()
    thresholds = load_thresholds(base / "thresholds.yaml")
    files: list[tuple[Path, bool]] = []
    if builtin:
        files += [(p, True) for p in sorted(base.glob("VD*.yaml"))]
    for d in extra_dirs:
        d = Path(d)
        try:
            if not d.is_dir():
                raise RuleLoadError(f"{d}: not a rules directory" + (" (a file)" if d.exists() else " (not found)"))
            list(d.iterdir())
        except PermissionError:
            raise RuleLoadError(f"{d}: permission denied") from None
        if (d / "thresholds.yaml").exists():
            thresholds = {**thresholds, **load_thresholds(d / "thresholds.yaml")}
        files += [(p, False) for p in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]) if p.name != "thresholds.yaml"]
    rules: list[Rule] = []
    ids: dict[str, Path] = {}
    names: dict[str, Path] = {}
    for path, is_builtin in files:
        rule = _load_one(path, is_builtin, thresholds)
        if rule.id in ids:
            raise RuleLoadError(f"{path}: duplicate rule id {rule.id} (also in {ids[rule.id]})")
        if rule.name in names:
            raise RuleLoadError(f"{path}: duplicate rule name {rule.name} (also in {names[rule.name]})")
        ids[rule.id] = path
        names[rule.name] = path
        rules.append(rule)
    for r in rules:
        for u in r.unless:
            if u not in names:
                raise RuleLoadError(f"{r.source}: unless names unknown rule {u!r}")
    return RuleSet(tuple(sorted(rules, key=lambda r: r.id)), thresholds)


def _load_one(path: Path, is_builtin: bool, thresholds: dict[str, float]) -> Rule:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RuleLoadError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuleLoadError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise RuleLoadError(f"{path}: a rule file must be a mapping")
    try:
        rule = Rule(**raw, source=str(path))
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise RuleLoadError(f"{path}: {loc}: {err['msg']}") from None
    except TypeError as e:
        raise RuleLoadError(f"{path}: {e}") from None
    if not re.fullmatch(r"[A-Z]{2,8}\d{3}", rule.id):
        raise RuleLoadError(f"{path}: id {rule.id!r} must be letters then 3 digits (VD001)")
    if is_builtin and not path.name.startswith(rule.id + "-"):
        raise RuleLoadError(f"{path}: file name must start with the id {rule.id}")
    try:
        parse_window(rule.window, thresholds)
    except KeyError as e:
        raise RuleLoadError(f"{path}: window uses unknown threshold {e}") from None
    known = BASE_NAMES | set(FUNCTIONS) | set(STATE_FUNCTIONS)
    defined: set[str] = set()

    def check(expr: str, where: str, extra: set[str] = frozenset()) -> None:
        try:
            used = names_in(expr)
        except RuleLoadError as e:
            raise RuleLoadError(f"{path}: {where}: {e}") from None
        unknown = used - known - defined - set(extra)
        if unknown:
            raise RuleLoadError(f"{path}: {where}: unknown name {sorted(unknown)[0]!r} in {expr!r}")
        for a in attributes_of(expr, "t"):
            if a not in thresholds:
                raise RuleLoadError(f"{path}: {where}: unknown threshold t.{a}")
        for kind in re.findall(r"(?:count|total|exists|recent|last_event|first_event|events|recent_events)\(\s*[\"']([\w:]+)[\"']", expr):
            if kind not in EVENT_KINDS and kind not in DERIVED_KINDS:
                raise RuleLoadError(f"{path}: {where}: unknown event kind {kind!r}")

    def check_template(text: str, where: str) -> None:
        for m in TEMPLATE_RE.finditer(text):
            check(split_placeholder(m.group(1))[0], where)

    for k, e in rule.values.items():
        check(e, f"values.{k}")
        defined.add(k)
    for i, e in enumerate(rule.when.all + rule.when.any):
        check(e, f"when[{i}]")
    for kind in rule.evidence:
        if kind not in EVENT_KINDS and kind not in DERIVED_KINDS and kind not in rule.values:
            raise RuleLoadError(f"{path}: evidence: {kind!r} is neither an event kind nor a value")
    if isinstance(rule.message, str):
        check_template(rule.message, "message")
    else:
        for i, case in enumerate(rule.message):
            if case.if_:
                check(case.if_, f"message[{i}].if")
            check_template(case.text, f"message[{i}]")
    for i, case in enumerate(rule.checks):
        if case.if_:
            check(case.if_, f"checks[{i}].if")
        check_template(case.text, f"checks[{i}]")
    for i, f in enumerate(rule.fixes):
        if f.kind == "env":
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", f.flag):
                raise RuleLoadError(f"{path}: fixes[{i}]: {f.flag!r} is not an environment variable name")
            if f.flag.startswith("VLLM_") and not known_flag(f.flag):
                raise RuleLoadError(f"{path}: fixes[{i}]: {f.flag!r} is not an environment variable of any vLLM version")
        elif not known_flag(f.flag):
            raise RuleLoadError(f"{path}: fixes[{i}]: {f.flag!r} is not a flag of any vLLM version")
        check(f.value, f"fixes[{i}].value")
        if f.if_:
            check(f.if_, f"fixes[{i}].if")
        check_template(f.why, f"fixes[{i}].why")
        if f.arithmetic:
            check_template(f.arithmetic, f"fixes[{i}].arithmetic")
    return rule
