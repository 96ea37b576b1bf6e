"""The safe expression language of rules (no ``eval``): simpleeval with a fixed function table.

Expressions see (all read-only):

* the facts of the report by name (``kv_cache_tokens``, ``max_model_len``, ``max_num_seqs``, ...;
  None when unknown), ``vllm_version`` (str or None), ``engine`` ("v0", "v1" or None);
* ``t.NAME``: a shared threshold from ``rules/thresholds.yaml``;
* the rule's ``windows:`` by name: aggregates over its window that the state keeps line by line
  (:class:`~vllm_doctor.state.windows.WindowView`: ``w.count``, ``w.max('num_running')``,
  ``w.at_max(f)``, ``w.quantile(f, 0.99)``, ``w.slope_per_hour(f)``, ``w.lines``, ...): what the
  built-in rules read about a window, in bounded memory;
* ``stats``: the periodic stats lines in the rule's window (:class:`~vllm_doctor.events.SchedulerStats`),
  ``metrics``: /metrics samples in the window (kept for user rules; a ring of at most
  ``State.max_items``, which a comprehension may iterate whole), ``window_seconds``;
* ``defaulted``: the names of the facts filled from the version's defaults (not in the log);
* the rule's earlier ``values`` by name;
* functions: :data:`FUNCTIONS`. Aggregates ignore None and return None for an empty input, and
  arithmetic on None is avoided with ``coalesce``. List comprehensions are allowed
  (``[x.num_running for x in stats if x.num_waiting > 0]``); a window aggregate is the better way.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import simpleeval
from simpleeval import EvalWithCompoundTypes

from vllm_doctor.diagnosis.sentences import SENTENCES
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.units import gib, human_bytes, thousands
from vllm_doctor.versions import flag_ranges_text


def _vals(xs: Iterable[Any]) -> list:
    return [x for x in xs if x is not None]


def _agg(fn: Callable) -> Callable:
    def inner(*args):
        xs = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        v = _vals(xs)
        return fn(v) if v else None

    inner.__name__ = fn.__name__
    return inner


def slope_per_hour(values: list, times: list) -> float | None:
    """Least-squares slope of ``values`` over ``times`` (seconds), per hour; None if < 3 points
    or the points span under a minute."""
    pts = [(t, v) for t, v in zip(times, values) if t is not None and v is not None]
    if len(pts) < 3 or pts[-1][0] - pts[0][0] < 60:
        return None
    n = len(pts)
    mt = sum(p[0] for p in pts) / n
    mv = sum(p[1] for p in pts) / n
    den = sum((p[0] - mt) ** 2 for p in pts)
    if den == 0:
        return None
    return sum((p[0] - mt) * (p[1] - mv) for p in pts) / den * 3600.0


def floor_to(x: float | None, m: int | None) -> int | None:
    """``x`` rounded down to a multiple of ``m`` (at least ``m``); None if x is None."""
    if x is None:
        return None
    if not m:
        return int(x)
    return max(int(m), int(x) // int(m) * int(m))


def clamp(x: float | None, lo: float, hi: float) -> float | None:
    return None if x is None else max(lo, min(hi, x))


def coalesce(*xs: Any) -> Any:
    for x in xs:
        if x is not None:
            return x
    return None


def percentile(xs: list, q: float) -> float | None:
    v = sorted(_vals(xs))
    if not v:
        return None
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _safe(fn: Callable) -> Callable:
    def inner(*a):
        if any(x is None for x in a):
            return None
        return fn(*a)

    inner.__name__ = fn.__name__
    return inner


FUNCTIONS: dict[str, Callable] = {
    "max": _agg(max), "min": _agg(min), "sum": _agg(sum),
    "mean": _agg(lambda v: sum(v) / len(v)),
    "first": _agg(lambda v: v[0]), "last": _agg(lambda v: v[-1]),
    "len": lambda xs: len(xs) if xs is not None else 0,
    "slope_per_hour": slope_per_hour, "percentile": percentile,
    "thousands": thousands,  # 79392 -> "79,392" (for '%s' messages)
    "coalesce": coalesce, "clamp": clamp, "floor_to": floor_to, "gib": gib, "human_bytes": human_bytes,
    "floor": _safe(lambda x: int(math.floor(x))), "ceil": _safe(lambda x: int(math.ceil(x))),
    "round": _safe(round), "int": _safe(int), "float": _safe(float), "abs": _safe(abs),
    "str": str, "bool": bool, "any": any, "all": all, "sorted": sorted, "set": set,
    # the examined vLLM releases that have a flag ("0.6.0–0.33.0"), None: none has it
    "flag_versions": flag_ranges_text,
    **SENTENCES,  # sentences built in Python (diagnosis/sentences.py)
}
# Functions bound to a state at evaluation (see evaluate.py); listed here for validation.
STATE_FUNCTIONS = ("count", "total", "exists", "recent", "last_event", "first_event", "events", "recent_events",
                   "preemptions", "preemptions_counted", "preemptions_total", "flag_exists", "fired", "version_at_least", "ttft_p99",
                   "stats_max", "stats_min", "concurrency", "stalls", "engine_balance", "startups", "starts_total",
                   "host_memory", "queue_growth", "prefix_collapse", "host_trend", "hang_waits")


@lru_cache(maxsize=8192)
def parse_expr(expr: str) -> ast.Expression:
    """``ast.parse(expr, mode="eval")``, once per process per expression (the rules' expressions
    are read by the loader and by every pipeline's rule engine). The tree is shared: read it,
    never change it. Raises SyntaxError as ast.parse does (not cached)."""
    return ast.parse(expr, mode="eval")


@lru_cache(maxsize=8192)
def names_in(expr: str) -> frozenset[str]:
    """Free names used by an expression (comprehension variables excluded).

    Raises RuleLoadError on a syntax error."""
    try:
        tree = parse_expr(expr)
    except SyntaxError as e:
        raise RuleLoadError(f"syntax error in expression {expr!r}: {e.msg}") from None
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    bound.add(n.id)
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in bound)


@lru_cache(maxsize=8192)
def attributes_of(expr: str, base: str) -> frozenset[str]:
    """Attributes read on name ``base`` (``t.x`` -> {"x"})."""
    return frozenset(n.attr for n in ast.walk(parse_expr(expr))
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == base)


class _MissingData(Exception):
    """An attribute read on None: the event did not happen (data missing, not a fault)."""


class _BoundedEval(EvalWithCompoundTypes):
    """simpleeval whose comprehension limit is the state's bound, not simpleeval's 10,000.

    simpleeval refuses a comprehension over more than 10,000 items (``IterableTooLong``) to guard
    against runaway input. Here the input is bounded by the state itself (every series is a ring
    of at most ``State.max_items`` entries, every event kind at most ``EVENTS_KEPT``), so the
    guard is that bound: a long window is evaluated, never skipped."""

    limit = 10_000

    def _eval_attribute(self, node):
        try:
            return super()._eval_attribute(node)
        except simpleeval.AttributeDoesNotExist:
            if self._eval(node.value) is None:
                raise _MissingData from None
            raise

    def _eval_comprehension(self, node):
        saved = simpleeval.MAX_COMPREHENSION_LENGTH
        simpleeval.MAX_COMPREHENSION_LENGTH = max(saved, self.limit)
        try:
            return super()._eval_comprehension(node)
        finally:
            simpleeval.MAX_COMPREHENSION_LENGTH = saved


_LINE_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
             ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
             ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_LINE_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


@lru_cache(maxsize=1024)
def _line_code(expr: str, fields: frozenset[str], thresholds: frozenset[str], funcs: frozenset[str],
               has_names: bool) -> tuple[Any, tuple[tuple[str, str | None], ...]]:
    """The code of :func:`compile_line`'s lambda, checked and compiled once per process, and what
    each name it binds holds: ("names", None), ("t", threshold) or ("f", function)."""
    try:
        tree = parse_expr(expr.strip()).body
    except SyntaxError as e:
        raise RuleLoadError(f"syntax error in expression {expr!r}: {e.msg}") from None
    except RecursionError:
        raise RuleLoadError(f"expression nested too deeply: {expr[:80]!r}...") from None
    slots: list[tuple[str, str | None]] = []  # what each bound name _vN holds (see compile_line)

    def bind(what: str, key: str | None) -> ast.Name:
        slots.append((what, key))
        return ast.Name(f"_v{len(slots) - 1}", ast.Load())

    def c(n: ast.AST) -> ast.expr:
        if isinstance(n, ast.Constant):
            return ast.Constant(n.value)
        if isinstance(n, ast.Name):
            if n.id in ("None", "True", "False"):
                return ast.Constant({"None": None, "True": True, "False": False}[n.id])
            if n.id in fields:
                return ast.Attribute(ast.Name("it", ast.Load()), n.id, ast.Load())
            if not has_names:
                raise RuleLoadError(f"unknown name {n.id!r} in {expr!r}")
            return ast.Call(bind("names", None), [ast.Constant(n.id)], [])
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "t":
            if n.attr not in thresholds:
                raise RuleLoadError(f"unknown threshold t.{n.attr} in {expr!r}")
            return bind("t", n.attr)
        if isinstance(n, ast.BoolOp):
            return ast.BoolOp(type(n.op)(), [c(v) for v in n.values])
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Not, ast.USub)):
            return ast.UnaryOp(type(n.op)(), c(n.operand))
        if isinstance(n, ast.Compare) and all(type(op) in _LINE_CMP for op in n.ops):
            return ast.Compare(c(n.left), [type(op)() for op in n.ops], [c(x) for x in n.comparators])
        if isinstance(n, ast.BinOp) and type(n.op) in _LINE_BIN:
            return ast.BinOp(c(n.left), type(n.op)(), c(n.right))
        if isinstance(n, ast.IfExp):
            return ast.IfExp(c(n.test), c(n.body), c(n.orelse))
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs and not n.keywords
                and not any(isinstance(a, ast.Starred) for a in n.args)):
            return ast.Call(bind("f", n.func.id), [c(a) for a in n.args], [])
        raise RuleLoadError(f"{ast.unparse(n)!r} in {expr!r}: a line's expression has comparisons, and / or / "
                            f"not, arithmetic, 'a if c else b' and calls of the rule functions only")

    try:
        body = c(tree)
        lam = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg("it")], kwonlyargs=[], kw_defaults=[],
                                       defaults=[]), body)
        code = compile(ast.fix_missing_locations(ast.Expression(lam)), f"<line expression {expr!r}>", "eval")
    except RecursionError:  # a chain of thousands of terms: the checker and the compiler recurse per node
        raise RuleLoadError(f"expression nested too deeply: {expr[:80]!r}...") from None
    return code, tuple(slots)


def compile_line(expr: str, fields: frozenset[str] | set[str], thresholds: dict[str, Any],
                 functions: dict[str, Callable] | None = None,
                 names: Callable[[str], Any] | None = None) -> Callable[[Any], Any]:
    """An expression on one line (a window's ``where`` or computed field) as a function of the
    line, for the per-line path. It reads the line's ``fields`` by name, ``t.X`` (resolved now),
    constants, the functions of :data:`FUNCTIONS` plus ``functions``, and other names through
    ``names(name)`` (the facts, read when the line arrives). Comparisons, ``and`` / ``or`` /
    ``not``, arithmetic and ``a if c else b`` only; anything else is a RuleLoadError. A
    comparison or arithmetic on None raises TypeError, which the caller reads as missing data.

    The checked tree is rewritten node by node into a Python ``lambda it: ...`` (a field
    becomes ``it.field``, ``t.X`` its value, a fact ``names('X')``, a function a bound name) and
    compiled once: a line costs what the same Python expression costs (no interpreter per
    node; the stats line of a busy log is read by several conditions). Only the node types above
    can reach the compiler, and the code has no builtins."""
    funcs = {**FUNCTIONS, **(functions or {})}
    code, slots = _line_code(expr, frozenset(fields), frozenset(thresholds), frozenset(funcs), names is not None)
    env: dict[str, Any] = {"__builtins__": {}}
    for i, (what, key) in enumerate(slots):
        env[f"_v{i}"] = names if what == "names" else thresholds[key] if what == "t" else funcs[key]
    return eval(code, env)  # noqa: S307 - a tree of the checked node types above, no builtins


class Evaluator:
    """Evaluates rule expressions against a namespace; missing data (None in arithmetic, an
    attribute of an event that did not happen) becomes None: the rule does not fire. Anything
    else is a fault of the rule and is recorded in ``errors`` (the engine turns it into a
    finding about vllm-doctor itself and a metric: never a silent skip).

    comprehension_limit: the most items one expression may iterate (the state's bound)."""

    def __init__(self, names: dict[str, Any], functions: dict[str, Callable],
                 comprehension_limit: int = 10_000) -> None:
        self._ev = _BoundedEval(names=names, functions={**FUNCTIONS, **functions})
        self._ev.limit = comprehension_limit
        self.errors: list[str] = []

    def set(self, name: str, value: Any) -> None:
        self._ev.names[name] = value

    _parsed: dict[str, Any] = {}  # expression -> parsed AST, shared by all evaluators

    def __call__(self, expr: str) -> Any:
        tree = self._parsed.get(expr)
        if tree is None:
            tree = self._parsed[expr] = self._ev.parse(expr)
        try:
            return self._ev.eval(expr, previously_parsed=tree)
        except (TypeError, _MissingData):
            return None  # arithmetic or comparison on None, an attribute of None: data missing
        except ZeroDivisionError:
            return None
        except AttributeError as e:
            if "NoneType" in str(e):
                return None  # attribute of an event that did not happen
            self.errors.append(f"{expr!r}: AttributeError: {e}")
            return None
        except Exception as e:  # noqa: BLE001 - a rule must never crash the pipeline
            self.errors.append(f"{expr!r}: {type(e).__name__}: {e}")
            return None
