"""Load and validate rules: YAML data, one file per rule, in ``rules/`` (shipped inside the
package as ``vllm_doctor/data/rules``) plus the user's ``--rules DIR``.

Validation at load (a :class:`~vllm_doctor.errors.RuleLoadError` with a one-line message):
unknown fields (pydantic ``extra="forbid"``), an id not ``VD`` + 3 digits or a file name not
starting with it (built-in rules), a name not kebab-case, duplicate ids or names, expressions
that do not parse or use an unknown name, ``t.X`` without a documented threshold, an event kind
that does not exist, a fix flag that no vLLM version has, and an attribute that the event it is
read on does not have (``rej.limitt`` where ``rej = last_event('ConfigRejected')``): every field
(conditions, values, messages, fixes, evidence) is checked against one table of names
(:data:`BASE_NAMES`, the function table in expr.py, the event classes in events.py), and an
error names the file and the line.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vllm_doctor.errors import RuleLoadError
from vllm_doctor.findings import Severity
from vllm_doctor.events import EVENT_KINDS, PHASE_SELECTORS, EngineMetrics, Meta, SchedulerStats, VllmMetricsSample
from vllm_doctor.state.core import FACT_NAMES
from vllm_doctor.state.windows import GpuMemory
from vllm_doctor.textscan import top_level
from vllm_doctor.versions import known_flag
from vllm_doctor.diagnosis.expr import FUNCTIONS, STATE_FUNCTIONS, attributes_of, compile_line, names_in, parse_expr

#: libyaml's safe loader when PyYAML was built with it (the rules are read at every start; node
#: marks, and so the line numbers of load errors, are the same), else the pure-Python one
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

SEVERITIES = tuple(s.value for s in Severity)
#: The longest expression a rule may hold (a condition, a value, a placeholder of a message): a
#: sentence that needs more is built in Python (vllm_doctor/diagnosis/sentences.py)
MAX_EXPRESSION_CHARS = 600
#: What a rule judges: one deployment (its log, /metrics, GPUs: rules/VD0xx), a fleet of
#: replicas read back from Prometheus (rules/fleet/VD02x), or a launch or monitoring file before
#: vLLM runs (rules/check/VCnnn, VMnnn: `vllm-doctor check` finds them in Python; the YAML holds
#: their id, name, severity and documentation)
SCOPES = ("deployment", "fleet", "check")
#: Fields every rule but a check rule must have (a check rule's findings are built by check/)
_RULE_REQUIRED = ("when", "message")
BASE_NAMES = set(FACT_NAMES) | {"t", "stats", "metrics", "engine_metrics", "window_seconds", "vllm_version", "engine",
                                 "gpu", "None", "True", "False", "unknown_flags", "defaulted"}
TEMPLATE_RE = re.compile(r"\{([^{}]+)\}")
_SPEC_RE = re.compile(r"[<>^=+\- #0-9,._%a-zA-Z]*")


def split_placeholder(inner: str) -> tuple[str, str | None]:
    """``expr:spec`` -> (expr, spec): the last colon outside quotes and brackets, when what
    follows it is a format spec (``.1%``, ``,``, ``.2f``); else the whole text is the expression."""
    cut = max(top_level(inner, ":"), default=-1)
    if cut >= 0 and _SPEC_RE.fullmatch(inner[cut + 1 :]):
        return inner[:cut], inner[cut + 1 :]
    return inner, None
DERIVED_KINDS = PHASE_SELECTORS  # ``Kind:phase`` selectors (events.PHASE_SELECTORS)


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
    # how the harm this fix removes is known (an expression giving counted | inferred | assumed):
    # counted: vLLM's own counter or error line shows it; inferred: read from a pattern of samples;
    # assumed: rests on something the inputs do not show (a default, a worst case). None: the rule's
    grade: str | None = None


#: The series a window aggregate can read (``windows.NAME.of``) and the class of their lines.
WINDOW_SERIES = {"stats": SchedulerStats, "engine_metrics": EngineMetrics, "gpu": GpuMemory}
#: What a rule may read on a window aggregate (vllm_doctor/state/windows.py WindowView).
VIEW_FIELD_METHODS = ("max", "min", "sum", "mean", "first", "last", "at_max", "at_min", "quantile", "slope_per_hour")
VIEW_ATTRIBUTES = ("count", "span_seconds", "lines")
#: Functions only a window's ``where`` may call: ``peak(f)``, the largest ``f`` of any line of the
#: series in the rule's window up to this line.
WHERE_FUNCTIONS = ("peak",)


class WindowSpec(Strict):
    """An aggregate the state keeps for the rule, line by line (see vllm_doctor/state/windows.py)."""

    of: Literal["stats", "engine_metrics", "gpu"]
    where: str | None = None  # a condition on one line (its fields by name, t.X, facts)
    fields: list[str] | dict[str, str] = Field(default_factory=list)  # field names, or name -> expression on a line
    quantiles: list[str] = Field(default_factory=list)  # fields that also get a quantile sketch

    def field_exprs(self) -> dict[str, str]:
        return dict(self.fields) if isinstance(self.fields, dict) else {f: f for f in self.fields}


class Docs(Strict):
    why: str
    example_log: str
    fix: str | None = None
    limits: str | None = None
    needs: str | None = None  # what the rule reads that not every input has (fleet rules: Prometheus series)


class MessageCase(Strict):
    if_: str | None = Field(default=None, alias="if")
    text: str
    first: bool = False  # checks only: this step comes before any fix (the verdict leads with it)


class Escalation(Strict):
    """A higher severity for a finding whose condition holds (the rule's own is the floor)."""

    severity: Literal[Severity.warning, Severity.critical]
    if_: str = Field(alias="if")


class Rule(Strict):
    """One rule (the YAML schema; see docs/rules.md)."""

    id: str
    name: str
    title: str
    severity: Severity
    escalate: list[Escalation] = Field(default_factory=list)  # the first whose `if` holds sets the severity
    category: str
    window: float | str | None = None  # seconds, "5m", "t.NAME", or None for the whole history
    when: When = Field(default_factory=When)  # required but in scope "check" (_RULE_REQUIRED)
    unless: list[str] = Field(default_factory=list)
    # reported only when no other rule (that is not a fallback itself) fires: "nothing else explains it"
    fallback: bool = False
    windows: dict[str, WindowSpec] = Field(default_factory=dict)  # aggregates over the window, kept by the state
    values: dict[str, str] = Field(default_factory=dict)
    evidence: list[str] = Field(default_factory=list)
    message: str | list[MessageCase] = ""  # a template, or cases: the first whose `if` holds
    fixes: list[Fix] = Field(default_factory=list)
    checks: list[MessageCase] = Field(default_factory=list)  # diagnostic steps (not fixes), each with an optional `if`
    grade: str = "'inferred'"  # the evidence grade of its fixes (an expression), unless a fix says otherwise
    # "not enough evidence": the one thing to collect that would decide (the first whose `if` holds)
    collect: list[MessageCase] = Field(default_factory=list)
    docs: Docs
    # other ids this rule answers to (another tool's id for the same check: VD010 is check's VC001)
    aliases: list[str] = Field(default_factory=list)
    source: str = ""
    scope: Literal["deployment", "fleet", "check"] = "deployment"  # set by the loader from where the file is

    @cached_property
    def reads(self) -> frozenset[str]:
        """The event kinds this rule reads (named in its expressions and evidence), plus ``*``
        when it also reads what any event may move (facts, series, derived views): what its
        schedule is derived from (diagnosis/schedule.py)."""
        return rule_reads(self)

    @field_validator("name")
    @classmethod
    def _kebab(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", v):
            raise ValueError(f"name {v!r} is not kebab-case")
        return v


#: The functions that read events of a kind named by their first argument
EVENT_READERS = ("count", "total", "exists", "recent", "last_event", "first_event", "events", "recent_events")
_KIND_RE = re.compile(r"(?:" + "|".join(EVENT_READERS) + r")\(\s*[\"']([\w:]+)[\"']")


def rule_expressions(rule: Rule) -> list[str]:
    """Every expression of a rule: values, conditions, the placeholders of its texts, fixes."""
    out = [*rule.values.values(), *rule.when.all, *rule.when.any, rule.grade, *(e.if_ for e in rule.escalate)]
    texts: list[str] = []
    for case in ([] if isinstance(rule.message, str) else rule.message) + rule.checks + rule.collect:
        out += [case.if_] if case.if_ else []
        texts.append(case.text)
    texts += [rule.message] if isinstance(rule.message, str) else []
    for f in rule.fixes:
        out += [f.value] + ([f.if_] if f.if_ else []) + ([f.grade] if f.grade else [])
        texts += [f.why] + ([f.arithmetic] if f.arithmetic else [])
    out += [split_placeholder(m.group(1))[0] for t in texts for m in TEMPLATE_RE.finditer(t)]
    return out


def rule_reads(rule: Rule) -> frozenset[str]:
    """See :attr:`Rule.reads`."""
    exprs = rule_expressions(rule)
    kinds = {k for e in exprs for k in _KIND_RE.findall(e)}
    kinds |= {k for k in rule.evidence if k not in rule.values}
    pure = set(FUNCTIONS) | set(EVENT_READERS) | set(rule.values) | {"t", "None", "True", "False"}
    if rule.windows or any(names_in(e) - pure for e in exprs):
        kinds.add("*")
    return frozenset(kinds)


@dataclass(frozen=True)
class RuleSet:
    """Validated rules (in id order) and the shared thresholds (name -> value)."""

    rules: tuple[Rule, ...]
    thresholds: dict[str, float]

    def by_key(self, key: str) -> Rule | None:
        """A rule by id (``VD001``, any case), name (``preemption-storm``) or alias (``VC001``)."""
        for r in self.rules:
            if r.id.lower() == key.lower() or r.name == key or any(a.lower() == key.lower() for a in r.aliases):
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
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RuleLoadError(f"{path}: cannot read thresholds: {e}".splitlines()[0]) from None
    out = {}
    for k, v in raw.items():
        if not isinstance(v, dict) or "value" not in v or not v.get("description"):
            raise RuleLoadError(f"{path}: threshold {k!r} needs a value and a description")
        out[k] = v["value"]
    return out


#: RuleSets already loaded in this process, by :func:`_files_key` (a few: the built-in rules, and
#: each ``--rules`` directory set a serve or a test used); oldest dropped first
_LOADED: dict[tuple, RuleSet] = {}
_LOADED_MAX = 16


def _files_key(extra_dirs, builtin: bool) -> tuple | None:
    """What a RuleSet is made of: the name and text of every file load_rules would read (an
    edited, added or removed rule file changes it; reading them costs a millisecond, checking
    them a second); None when one cannot be read (load_rules then says why)."""
    dirs = ([builtin_rules_dir()] if builtin else []) + [Path(d) for d in extra_dirs]
    key: list = [builtin]
    try:
        if not builtin:  # (read anyway: the built-in thresholds)
            key.append(hashlib.sha256((builtin_rules_dir() / "thresholds.yaml").read_bytes()).digest())
        for d in dirs:
            key.append(str(d))
            key += [(p.name, hashlib.sha256(p.read_bytes()).digest()) for p in sorted([*d.glob("*.yaml"), *d.glob("*.yml")])]
    except OSError:
        return None
    return tuple(key)


def load_rules(extra_dirs: list[Path] | tuple[Path, ...] = (), builtin: bool = True) -> RuleSet:
    """Load the built-in rules and those in ``extra_dirs`` (``*.yaml`` / ``*.yml``).

    Loaded once per process for the same files (parsing and checking some 240 expressions takes
    about a second): the RuleSet is shared, read-only, by every pipeline that asks again while no
    rule file changed (its text, a file added or removed).

    Raises RuleLoadError (one-line message naming the file) on any invalid rule."""
    key = _files_key(extra_dirs, builtin)
    got = _LOADED.get(key) if key is not None else None
    if got is None:
        got = _load_rules(extra_dirs, builtin)
        if key is not None:
            if len(_LOADED) >= _LOADED_MAX:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = got
    return got


def _load_rules(extra_dirs: list[Path] | tuple[Path, ...], builtin: bool) -> RuleSet:
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
        rule = load_rule_file(path, is_builtin, thresholds)
        if rule.id in ids:
            raise RuleLoadError(f"{path}: duplicate rule id {rule.id} (also in {ids[rule.id]})")
        if rule.name in names:
            raise RuleLoadError(f"{path}: duplicate rule name {rule.name} (also in {names[rule.name]})")
        ids[rule.id] = path
        names[rule.name] = path
        rules.append(rule)
    aliases: dict[str, Path] = {}
    for r in rules:
        for a in r.aliases:
            if a in ids or a in names or a in aliases:
                raise RuleLoadError(f"{r.source}: alias {a} is already the id, name or alias of another rule "
                                    f"({ids.get(a) or names.get(a) or aliases[a]})")
            aliases[a] = Path(r.source)
    for r in rules:
        for u in r.unless:
            if u not in names:
                raise RuleLoadError(f"{r.source}: unless names unknown rule {u!r}")
    return RuleSet(tuple(sorted(rules, key=lambda r: r.id)), thresholds)


def _line_map(text: str) -> dict[tuple, int]:
    """Line number (1-based) of every node of a YAML document, by its path of keys and indexes."""
    out: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        out[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                walk(v, path + (k.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    try:
        root = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, ())
    return out


_SERIES_TYPES = {"stats": SchedulerStats, "metrics": VllmMetricsSample}
_EVENT_GETTERS = {"last_event", "first_event"}
_EVENT_LISTS = {"events", "recent_events"}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@lru_cache(maxsize=8192)
def const_args(expr: str, fn: str) -> tuple[str, ...]:
    """The string constants passed first to calls of ``fn`` (``peak('generation_tps')``)."""
    return tuple(n.args[0].value for n in ast.walk(parse_expr(expr))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == fn and n.args
                 and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str))


def _window_reads(expr: str, windows: dict[str, WindowSpec]) -> str | None:
    """The first read of a window aggregate that it does not offer, as an error text:
    ``full.max('num_runing')`` (a field it does not aggregate), ``full.maximum(...)``."""
    for n in ast.walk(parse_expr(expr)):
        if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in windows):
            continue
        if n.attr not in VIEW_FIELD_METHODS and n.attr not in VIEW_ATTRIBUTES:
            return (f"{ast.unparse(n)}: a window offers {', '.join(VIEW_ATTRIBUTES)} and "
                    f"{', '.join(m + '(field)' for m in VIEW_FIELD_METHODS)}")
    for n in ast.walk(parse_expr(expr)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and n.func.value.id in windows and n.func.attr in VIEW_FIELD_METHODS):
            w = windows[n.func.value.id]
            if not n.args or not isinstance(n.args[0], ast.Constant) or not isinstance(n.args[0].value, str):
                return f"{ast.unparse(n)}: name the field as a string"
            field = n.args[0].value
            if field not in w.field_exprs():
                return (f"{ast.unparse(n)}: window {n.func.value.id!r} does not aggregate {field!r} "
                        f"(its fields: {', '.join(w.field_exprs()) or 'none'})")
            if n.func.attr == "quantile" and field not in w.quantiles:
                return f"{ast.unparse(n)}: window {n.func.value.id!r} keeps no quantile sketch of {field!r} (add it to quantiles)"
    return None


class _Types:
    """The event class behind each name of a rule, inferred from how it was made:
    ``last_event('K')`` / ``first_event('K')`` -> K; ``[x for x in stats if ...]`` -> a list of
    SchedulerStats; ``first(list)`` / ``last(list)`` / ``coalesce(a, ...)`` -> the element's class."""

    def __init__(self, windows: dict[str, type] | None = None) -> None:
        self.one: dict[str, type] = {}  # name -> event class
        self.many: dict[str, type] = {}  # name -> class of the list's elements
        self.windows = windows or {}  # window aggregate name -> class of its lines

    @staticmethod
    def _kind(call: ast.Call) -> type | None:
        if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            return EVENT_KINDS.get(call.args[0].value.split(":")[0])
        return None

    def of(self, node: ast.AST, local: dict[str, type]) -> tuple[str, type] | None:
        """("one" | "many", class) of an expression, when known."""
        if isinstance(node, ast.Name):
            if node.id in local:
                return "one", local[node.id]
            if node.id in self.one:
                return "one", self.one[node.id]
            if node.id in self.many:
                return "many", self.many[node.id]
            if node.id in _SERIES_TYPES:
                return "many", _SERIES_TYPES[node.id]
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.windows:
            if node.attr == "lines":
                return "many", self.windows[node.value.id]
            return None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("at_max", "at_min")
                and isinstance(node.func.value, ast.Name) and node.func.value.id in self.windows):
            return "one", self.windows[node.func.value.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = node.func.id
            if fn in _EVENT_GETTERS and (k := self._kind(node)):
                return "one", k
            if fn in _EVENT_LISTS and (k := self._kind(node)):
                return "many", k
            if fn in ("first", "last", "max", "min") and node.args:
                got = self.of(node.args[0], local)
                return ("one", got[1]) if got else None
            if fn == "coalesce":
                for a in node.args:
                    got = self.of(a, local)
                    if got:
                        return got
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # list + list
            return self.of(node.left, local) or self.of(node.right, local)
        if isinstance(node, ast.ListComp) and isinstance(node.elt, ast.Name):
            inner = self._comp_locals(node, local)
            got = inner.get(node.elt.id)
            return ("many", got) if got else None
        return None

    def _comp_locals(self, node: ast.AST, local: dict[str, type]) -> dict[str, type]:
        inner = dict(local)
        for gen in getattr(node, "generators", ()):
            if isinstance(gen.target, ast.Name):
                got = self.of(gen.iter, inner)
                if got and got[0] == "many":
                    inner[gen.target.id] = got[1]
        return inner

    def check(self, expr: str) -> str | None:
        """The first attribute read that the event's class does not have, as an error text."""
        tree = parse_expr(expr)

        def visit(node: ast.AST, local: dict[str, type]) -> str | None:
            if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
                local = self._comp_locals(node, local)
            if isinstance(node, ast.Attribute):
                base = node.value
                if isinstance(base, ast.Attribute) and base.attr == "meta" and self.of(base.value, local):
                    if node.attr not in _fields(Meta):
                        return f"{ast.unparse(node)}: a line's meta has no field {node.attr!r}"
                got = self.of(base, local)
                if got is not None:
                    cls = got[1]
                    if got[0] == "many":
                        return f"{ast.unparse(node)}: {ast.unparse(base)} is a list of {cls.__name__}, not one"
                    if node.attr not in _fields(cls):
                        return (f"{ast.unparse(node)}: {cls.__name__} has no field {node.attr!r} "
                                f"(it has {', '.join(sorted(_fields(cls) - {'meta'}))})")
            for child in ast.iter_child_nodes(node):
                err = visit(child, local)
                if err:
                    return err
            return None

        return visit(tree.body, {})

    def define(self, name: str, expr: str) -> None:
        got = self.of(parse_expr(expr).body, {})
        if got:
            (self.one if got[0] == "one" else self.many)[name] = got[1]


def load_rule_file(path: Path, is_builtin: bool, thresholds: dict[str, float], scope: str = "deployment",
              scope_names: frozenset[str] | set[str] = frozenset()) -> Rule:
    """One rule file, validated. ``scope`` "deployment" (names: :data:`BASE_NAMES`, the state's
    functions, event kinds), "fleet" (names: ``scope_names``, the fleet namespace; evidence are
    values) or "check" (no condition nor message: check/ finds them). The one loader of all three
    (fleet/rules.py and check/findings.py call it)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RuleLoadError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        raise RuleLoadError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise RuleLoadError(f"{path}: a rule file must be a mapping")
    try:
        rule = Rule(**{**raw, "source": str(path), "scope": scope})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise RuleLoadError(f"{path}: {loc}: {err['msg']}") from None
    except TypeError as e:
        raise RuleLoadError(f"{path}: {e}") from None
    for required in _RULE_REQUIRED if scope != "check" else ():
        if required not in raw:
            raise RuleLoadError(f"{path}: {required}: Field required")
    if scope == "check" and (rule.when.all or rule.when.any or rule.values or rule.windows or rule.message
                             or rule.checks or rule.fixes or rule.collect or rule.escalate):
        raise RuleLoadError(f"{path}: a check rule has no when, values, windows, message, checks, collect, fixes or "
                            "escalate: `vllm-doctor check` finds it (vllm_doctor/check/)")
    if not re.fullmatch(r"[A-Z]{2,8}\d{3}", rule.id):
        raise RuleLoadError(f"{path}: id {rule.id!r} must be letters then 3 digits (VD001)")
    if is_builtin and not path.name.startswith(rule.id + "-"):
        raise RuleLoadError(f"{path}: file name must start with the id {rule.id}")
    try:
        parse_window(rule.window, thresholds)
    except KeyError as e:
        raise RuleLoadError(f"{path}: window uses unknown threshold {e}") from None
    fleet = scope == "fleet"
    known = (set(scope_names) if fleet else BASE_NAMES | set(STATE_FUNCTIONS)) | set(FUNCTIONS)
    defined: set[str] = set()
    lines = _line_map(text)
    types = _Types({n: WINDOW_SERIES[w.of] for n, w in rule.windows.items()})

    src_lines = text.splitlines()

    def at(where: str, needle: str | None = None) -> str:
        """``file:line: where`` for a field path such as ``values.kv_peak`` or ``fixes[1].if``;
        with ``needle``, the line of the field's text that holds it (a multi-line message)."""
        key: tuple = ()
        for part in re.findall(r"[^.\[\]]+", where):
            key += (int(part),) if part.isdigit() else (part,)
        if key[:1] == ("when",) and len(key) == 2 and isinstance(key[1], int):  # when[i] over all + any
            i = key[1]
            key = ("when", "all", i) if i < len(rule.when.all) else ("when", "any", i - len(rule.when.all))
        line = None
        while key and line is None:
            line = lines.get(key)
            key = key[:-1]
        if line and needle:
            for n in range(line, min(len(src_lines), line + 200) + 1):
                if needle in src_lines[n - 1]:
                    line = n
                    break
        return f"{path}:{line}: {where}" if line else f"{path}: {where}"

    def check(expr: str, where: str, extra: set[str] = frozenset()) -> None:
        if len(expr) > MAX_EXPRESSION_CHARS:
            raise RuleLoadError(f"{at(where)}: rule {rule.id} {rule.name}: an expression of {len(expr)} characters, "
                                f"over the limit of {MAX_EXPRESSION_CHARS}: build the sentence in Python "
                                "(vllm_doctor/diagnosis/sentences.py)")
        try:
            used = names_in(expr)
        except RuleLoadError as e:
            raise RuleLoadError(f"{at(where)}: {e}") from None
        unknown = used - known - defined - set(extra)
        if unknown:
            raise RuleLoadError(f"{at(where, sorted(unknown)[0])}: unknown name {sorted(unknown)[0]!r} in {expr!r}")
        for a in attributes_of(expr, "t"):
            if a not in thresholds:
                raise RuleLoadError(f"{at(where, 't.' + a)}: unknown threshold t.{a}")
        for kind in re.findall(r"(?:count|total|exists|recent|last_event|first_event|events|recent_events)\(\s*[\"']([\w:]+)[\"']", expr):
            if kind not in EVENT_KINDS and kind not in DERIVED_KINDS:
                raise RuleLoadError(f"{at(where)}: unknown event kind {kind!r}")
        err = types.check(expr)
        if err:
            raise RuleLoadError(f"{at(where, err.split(':')[0])}: {err}")
        err = _window_reads(expr, rule.windows)
        if err:
            raise RuleLoadError(f"{at(where, err.split(':')[0])}: {err}")
        for fn in ("stats_max", "stats_min"):
            for field in const_args(expr, fn):
                if field not in _fields(SchedulerStats):
                    raise RuleLoadError(f"{at(where, field)}: {fn}({field!r}): SchedulerStats has no field {field!r}")

    def check_template(text: str, where: str) -> None:
        for m in TEMPLATE_RE.finditer(text):
            check(split_placeholder(m.group(1))[0], where)

    for name, w in rule.windows.items():
        if name in known:
            raise RuleLoadError(f"{at(f'windows.{name}')}: window name {name!r} is already a name of the rule language")
        cls = WINDOW_SERIES[w.of]
        line_names = _fields(cls) - {"meta"}
        allowed = line_names | {"t", "None", "True", "False"} | set(FACT_NAMES) | set(FUNCTIONS) | set(WHERE_FUNCTIONS)
        for fname, fexpr in w.field_exprs().items():
            bad = names_in(fexpr) - line_names - {"None", "True", "False"} - set(FUNCTIONS)
            if bad:
                raise RuleLoadError(f"{at(f'windows.{name}.fields', fname)}: {sorted(bad)[0]!r} is not a field of "
                                    f"{cls.__name__} (it has {', '.join(sorted(line_names))})")
            try:  # the per-line form (expr.compile_line) takes a subset of the language
                compile_line(fexpr, line_names, thresholds)
            except RuleLoadError as e:
                raise RuleLoadError(f"{at(f'windows.{name}.fields', fname)}: {e}") from None
        for q in w.quantiles:
            if q not in w.field_exprs():
                raise RuleLoadError(f"{at(f'windows.{name}.quantiles', q)}: quantile of {q!r}, which is not in its fields")
        if w.where:
            bad = names_in(w.where) - allowed
            if bad:
                raise RuleLoadError(f"{at(f'windows.{name}.where', sorted(bad)[0])}: unknown name {sorted(bad)[0]!r} in "
                                    f"{w.where!r} (a line of {w.of} has {', '.join(sorted(line_names))})")
            for a in attributes_of(w.where, "t"):
                if a not in thresholds:
                    raise RuleLoadError(f"{at(f'windows.{name}.where', 't.' + a)}: unknown threshold t.{a}")
            try:
                compile_line(w.where, line_names, thresholds, {"peak": max}, names=lambda n: None)
            except RuleLoadError as e:
                raise RuleLoadError(f"{at(f'windows.{name}.where')}: {e}") from None
            for field in const_args(w.where, "peak"):
                if field not in line_names:
                    raise RuleLoadError(f"{at(f'windows.{name}.where', field)}: peak({field!r}): {cls.__name__} has no field {field!r}")
        defined.add(name)
    for k, e in rule.values.items():
        check(e, f"values.{k}")
        defined.add(k)
        types.define(k, e)
    for i, e in enumerate(rule.when.all + rule.when.any):
        check(e, f"when[{i}]")
    for i, kind in enumerate(rule.evidence):
        if fleet and kind not in rule.values:
            raise RuleLoadError(f"{at(f'evidence[{i}]')}: {kind!r} must be a value (a list of replicas)")
        if kind not in EVENT_KINDS and kind not in DERIVED_KINDS and kind not in rule.values:
            raise RuleLoadError(f"{at(f'evidence[{i}]')}: {kind!r} is neither an event kind nor a value")
    if isinstance(rule.message, str):
        check_template(rule.message, "message")
    else:
        for i, case in enumerate(rule.message):
            if case.if_:
                check(case.if_, f"message[{i}].if")
            check_template(case.text, f"message[{i}]")
    for i, esc in enumerate(rule.escalate):
        check(esc.if_, f"escalate[{i}].if")
    for i, case in enumerate(rule.checks):
        if case.if_:
            check(case.if_, f"checks[{i}].if")
        check_template(case.text, f"checks[{i}]")
    check(rule.grade, "grade")
    for i, case in enumerate(rule.collect):
        if case.if_:
            check(case.if_, f"collect[{i}].if")
        check_template(case.text, f"collect[{i}]")
    for i, f in enumerate(rule.fixes):
        if f.kind == "env":
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", f.flag):
                raise RuleLoadError(f"{at(f'fixes[{i}].flag')}: {f.flag!r} is not an environment variable name")
            if f.flag.startswith("VLLM_") and not known_flag(f.flag):
                raise RuleLoadError(f"{at(f'fixes[{i}].flag')}: {f.flag!r} is not an environment variable of any vLLM version")
        elif not known_flag(f.flag):
            raise RuleLoadError(f"{at(f'fixes[{i}].flag')}: {f.flag!r} is not a flag of any vLLM version")
        check(f.value, f"fixes[{i}].value")
        if f.grade:
            check(f.grade, f"fixes[{i}].grade")
        if f.if_:
            check(f.if_, f"fixes[{i}].if")
        check_template(f.why, f"fixes[{i}].why")
        if f.arithmetic:
            check_template(f.arithmetic, f"fixes[{i}].arithmetic")
    return rule
