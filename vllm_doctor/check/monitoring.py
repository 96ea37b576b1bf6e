"""Monitoring that queries vLLM: Prometheus rule files, raw PromQL, Grafana dashboard JSON.

PromQL is parsed with ``promql-parser`` (the Rust PromQL parser of GreptimeDB, on PyPI); series
names are judged against ``metric_names`` for the target version."""

from __future__ import annotations

import difflib
import json
import re

import promql_parser as pq

from vllm_doctor import catalogue
from vllm_doctor.bounded import check_promql
from vllm_doctor.check import metric_names as mn
from vllm_doctor.check.findings import CheckFinding

RATE_FUNCS = {"rate", "irate", "increase"}
PROMQL_NOT = {"derivative": "deriv", "derive": "deriv", "avg": "avg_over_time", "percentile": "quantile_over_time",
              "histogram_percentile": "histogram_quantile"}


def _suggest(name: str, version: str) -> str | None:
    hit = mn.lookup(name)
    new = catalogue.successor(hit[0]) if hit else None  # vLLM renamed it: its new name
    if new and catalogue.exported(new, version):
        return new + name[len(hit[0]):] if name.startswith(hit[0]) else new
    cands = mn.names_in(version)
    base = name.replace("vllm_", "vllm:", 1) if name.startswith("vllm_") else name
    for c in cands:
        if c == base or c == base + "_total" or c.replace("_total", "") == base:
            return c
    words = set(re.split(r"[:_]", base)) - {"vllm", "total", "num", ""}
    scored = sorted(cands, key=lambda c: (-len(words & set(re.split(r"[:_]", c))),
                                          -difflib.SequenceMatcher(None, base, c).ratio()))
    if scored and words & set(re.split(r"[:_]", scored[0])):
        return scored[0]
    m = difflib.get_close_matches(base, cands, n=1, cutoff=0.6)
    return m[0] if m else None


def _walk(e, visit, parent=None) -> None:
    visit(e, parent)
    for attr in ("lhs", "rhs", "expr"):
        sub = getattr(e, attr, None)
        if isinstance(sub, pq.Expr):
            _walk(sub, visit, e)
    if isinstance(e, pq.Call):
        for a in e.args:
            _walk(a, visit, e)
    if isinstance(e, pq.AggregateExpr) and isinstance(getattr(e, "param", None), pq.Expr):
        _walk(e.param, visit, e)


def _selector_name(e) -> str | None:
    if isinstance(e, pq.MatrixSelector):
        e = e.vector_selector
    if isinstance(e, pq.VectorSelector):
        if e.name:
            return e.name
        for m in e.matchers.matchers:
            if m.name == "__name__":
                return m.value
    return None


def _inner_selectors(e) -> list[str]:
    names: list[str] = []
    _walk(e, lambda x, _p: names.append(n) if (n := _selector_name(x)) else None)
    return names


def _fallbacks(tree, version: str) -> set[str]:
    """Names that are the older leg of an ``or``: ``new or old`` (either order), where every vLLM series of
    one side exists in ``version`` and the other side's names existed in some vLLM release (a rename:
    ``vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc``). Such a leg is how one query serves several
    versions: it matches on the versions that export it, and never hides a missing series on the others."""
    out: set[str] = set()

    def side_ok(names: list[str]) -> bool:
        vllm = [n for n in names if n.startswith("vllm:")]
        return bool(vllm) and all(mn.exported(n, version) for n in vllm)

    def visit(e, _p) -> None:
        if isinstance(e, pq.BinaryExpr) and str(e.op) == "or":
            lhs, rhs = _inner_selectors(e.lhs), _inner_selectors(e.rhs)
            for have, other in ((lhs, rhs), (rhs, lhs)):
                if side_ok(have):
                    out.update(n for n in other if n.startswith("vllm:") and mn.lookup(n) and not mn.exported(n, version))
    _walk(tree, visit)
    return out


def lint_promql(expr: str, version: str, file: str, line: int, context: str = "",
                version_known: bool = True, recorded: frozenset[str] = frozenset()) -> list[CheckFinding]:
    """Findings for one PromQL expression. ``context`` "sidecar": the file is written for
    vllm-doctor's sidecar too (its own series are fine). ``version_known`` False: a series that
    exists in other vLLM versions is a warning, not an error (the file may serve several)."""
    out: list[CheckFinding] = []
    src = expr.strip()
    check_promql(src)  # (TooComplex: check_files says so in one line)
    try:
        tree = pq.parse(src)
    except ValueError as e:
        msg = str(e).splitlines()[0]
        m = re.search(r"unknown function with name '(\w+)'", msg)
        fix = {"setting": PROMQL_NOT.get(m.group(1)), "value": None} if m and m.group(1) in PROMQL_NOT else None
        text = f"not valid PromQL: {msg}"
        if fix:
            text += f"; PromQL's function is {fix['setting']}()"
        out.append(CheckFinding("VM005", text + " (the query never returns data; a rule with it never fires)",
                                file, line, fix=fix, snippet=src))
        return out

    fallback = _fallbacks(tree, version)

    def visit(e, parent) -> None:
        name = _selector_name(e)
        if name in fallback or name in recorded:
            name = None
        if name and not isinstance(parent, pq.MatrixSelector):
            looks_vllm = name.startswith(("vllm:", "vllm_"))
            sidecar_ok = context == "sidecar" and name in mn.SIDECAR_SERIES
            if looks_vllm and not name.startswith("vllm_doctor") and not sidecar_ok and not mn.exported(name, version):
                hit = mn.lookup(name)
                sug = _suggest(name, version)
                why = (f"vLLM exports it only in {', '.join(a + '–' + b for a, b in hit[2])}" if hit
                       else "vLLM never exports this name")
                side = ("; only vllm-doctor's sidecar exports a series of this name (it matches if Prometheus "
                        "scrapes the sidecar, not vLLM)" if name in mn.SIDECAR_SERIES else "")
                out.append(CheckFinding("VM001", f"{name}: {why}; in {version} this selector matches nothing on "
                                        f"vLLM's /metrics" + (f" (the real series: {sug})" if sug else "") + side,
                                        file, line, fix={"setting": sug, "value": None} if sug else None, snippet=src,
                                        level="warning" if (hit and not version_known) else ""))
            elif not looks_vllm and not mn.lookup(name) and not (context == "sidecar" and name in mn.SIDECAR_SERIES) \
                    and name not in ("up", "ALERTS", "ALERTS_FOR_STATE"):
                other = ("vllm-doctor's sidecar exports it from NVML" if name in mn.SIDECAR_SERIES
                         else "e.g. DCGM exports GPU memory as DCGM_FI_DEV_FB_USED")
                out.append(CheckFinding("VM006", f"{name} is not a vLLM series; it matches only if another exporter "
                                        f"provides it ({other})", file, line, snippet=src))
        if isinstance(e, pq.Call):
            fn = e.func.name
            if fn in RATE_FUNCS and e.args:
                for n in _inner_selectors(e.args[0]):
                    if mn.kind(n) == "gauge" or mn.SIDECAR_SERIES.get(n) == "gauge":
                        out.append(CheckFinding("VM002", f"{fn}() on {n}, a gauge: {fn}() is for counters; use "
                                                f"deriv() or avg_over_time() for a gauge", file, line,
                                                fix={"setting": "deriv" if fn != "increase" else "delta", "value": None},
                                                snippet=src))
            if fn == "histogram_quantile" and len(e.args) == 2:
                inner = e.args[1]
                names = _inner_selectors(inner)
                bad = [n for n in names if not n.endswith("_bucket")]
                if bad:
                    out.append(CheckFinding("VM003", f"histogram_quantile over {', '.join(bad)}: it needs the "
                                            f"_bucket series (with its le label)", file, line,
                                            fix={"setting": bad[0] + "_bucket" if mn.kind(bad[0] + "_bucket") == "histogram" else None,
                                                 "value": None}, snippet=src))
                _check_le(inner, file, line, src, out)
                _check_bare_buckets(inner, recorded, file, line, src, out)

    _walk(tree, visit)
    _check_rate_threshold(tree, file, line, src, out)
    return out


def _check_le(e, file, line, src, out) -> None:
    """Every aggregation between histogram_quantile and the buckets must keep ``le``."""
    def visit(x, _p) -> None:
        if isinstance(x, pq.AggregateExpr):
            mod = x.modifier
            labels = list(mod.labels) if mod is not None else []
            kept = (mod is not None and str(mod.type).endswith("By") and "le" in labels) or \
                   (mod is not None and str(mod.type).endswith("Without") and "le" not in labels)
            if not kept:
                out.append(CheckFinding("VM003", "histogram_quantile over an aggregation that drops the le label: "
                                        "write sum by (le, ...) (rate(..._bucket[5m]))", file, line,
                                        fix={"setting": "sum by (le)", "value": None}, snippet=src))
    _walk(e, visit)


def _check_bare_buckets(e, recorded, file, line, src, out) -> None:
    """``histogram_quantile(0.99, x_bucket)`` without rate()/increase(): the buckets are counters since
    the process started, so the quantile is over the whole uptime (and jumps at every restart), never the
    recent latency an alert or a panel means."""
    def visit(x, parent) -> None:
        if isinstance(x, pq.VectorSelector) and not isinstance(parent, pq.SubqueryExpr):
            n = _selector_name(x)
            if n and n.endswith("_bucket") and n not in recorded:
                out.append(CheckFinding("VM003", f"histogram_quantile over {n} without rate()/increase(): the "
                                        "buckets are counters since vLLM started, so this is the quantile over its "
                                        "whole uptime (reset at each restart), not the recent one; write "
                                        f"histogram_quantile(..., sum by (le) (rate({n}[5m])))", file, line,
                                        fix={"setting": "rate", "value": None}, snippet=src))
    _walk(e, visit)


def _check_rate_threshold(tree, file, line, src, out) -> None:
    """``rate(x[5m]) > 5`` compares a per-second rate with a count per window."""
    if not isinstance(tree, pq.BinaryExpr) or str(tree.op) not in (">", ">=", "<", "<="):
        return
    lhs, rhs = tree.lhs, tree.rhs
    while isinstance(lhs, (pq.AggregateExpr, pq.ParenExpr)):
        lhs = lhs.expr
    if not (isinstance(lhs, pq.Call) and lhs.func.name in ("rate", "irate") and isinstance(rhs, pq.NumberLiteral)):
        return
    arg = lhs.args[0]
    if not isinstance(arg, pq.MatrixSelector):
        return
    secs = int(arg.range.total_seconds())
    n = rhs.val
    if n >= 1 and secs >= 60:
        w = f"{secs // 60}m" if secs % 60 == 0 else f"{secs}s"
        out.append(CheckFinding("VM004", f"rate() is per second: `> {n:g}` means more than {n * secs:g} per {w}; "
                                f"if the threshold is {n:g} per {w}, write increase(...[{w}]) > {n:g} "
                                f"(or rate(...[{w}]) > {n / secs:.4g})", file, line,
                                fix={"setting": "increase", "value": f"> {n:g}"}, snippet=src))


# ---------------------------------------------------------------- containers of PromQL

def _context(text: str) -> str:
    """Files that query vllm-doctor's own series (``vllm_doctor_*``) are written for its sidecar."""
    return "sidecar" if "vllm_doctor_" in text else ""


def recorded_names(doc: object) -> set[str]:
    """The series a Prometheus rule file records (``record:``): queries of them are not vLLM series."""
    out: set[str] = set()
    for g in (doc.get("groups") or []) if isinstance(doc, dict) else []:
        for r in (g or {}).get("rules") or [] if isinstance(g, dict) else []:
            if isinstance(r, dict) and isinstance(r.get("record"), str):
                out.add(r["record"])
    return out


def lint_rules_file(doc: dict, text: str, file: str, version: str, version_known: bool = True,
                    recorded: frozenset[str] = frozenset()) -> list[CheckFinding]:
    out = []
    recorded = frozenset(recorded | recorded_names(doc))
    for g in doc.get("groups") or []:
        for r in (g or {}).get("rules") or []:
            expr = (r or {}).get("expr")
            if expr is None:
                continue
            name = r.get("alert") or r.get("record") or ""
            line = _line_of_expr(text, str(expr), name)
            out += lint_promql(str(expr), version, file, line, _context(text), version_known, recorded)
    return out


def _line_of_expr(text: str, expr: str, name: str) -> int:
    lines = text.splitlines()
    start = 0
    if name:
        for i, l in enumerate(lines):
            if name in l:
                start = i
                break
    first = expr.strip().splitlines()[0][:60] if expr.strip() else ""
    for i in range(start, len(lines)):
        if first and first in lines[i]:
            return i + 1
    return start + 1


def lint_grafana(doc: dict, text: str, file: str, version: str, version_known: bool = True,
                 recorded: frozenset[str] = frozenset()) -> list[CheckFinding]:
    out = []
    dash = doc.get("dashboard", doc)
    dash = dash if isinstance(dash, dict) else {}

    def panels(ps):   # what is not a panel (a number, a string) is skipped, never an error
        for p in ps if isinstance(ps, list) else []:
            if isinstance(p, dict):
                yield p
                yield from panels(p.get("panels"))

    for p in panels(dash.get("panels")):
        targets = p.get("targets")
        for t in targets if isinstance(targets, list) else []:
            expr = t.get("expr") if isinstance(t, dict) else None
            if isinstance(expr, str) and expr.strip():
                expr_v = re.sub(r"\$__(rate_interval|interval|range)", "5m", expr)
                expr_v = re.sub(r"\$\{?\w+\}?", "x", expr_v) if "$" in expr_v else expr_v
                # the file holds the expression JSON-escaped (\" for "): find that form
                line = _line_of_expr(text, json.dumps(expr.strip().splitlines()[0][:60])[1:-1], "")
                out += lint_promql(expr_v, version, file, line, _context(text), version_known, recorded)
    return out


def lint_promql_text(text: str, file: str, version: str, version_known: bool = True,
                     recorded: frozenset[str] = frozenset()) -> list[CheckFinding]:
    """A raw PromQL file: one expression per paragraph or line; ``#`` comments."""
    out = []
    buf, start = [], 0
    for i, raw in enumerate(text.splitlines() + [""], 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            if buf:
                out += lint_promql(" ".join(buf), version, file, start, _context(text), version_known, recorded)
                buf = []
            continue
        if not buf:
            start = i
        buf.append(s)
    return out
