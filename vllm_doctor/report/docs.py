"""Rule documentation generated from the rules themselves (``explain``, ``rules --format
markdown`` -> docs/rules.md)."""

from __future__ import annotations

import ast

from vllm_doctor.diagnosis.loader import TEMPLATE_RE, Rule, RuleSet, split_placeholder


#: How fleet rules (rules/fleet/) are run, said wherever they are listed.
FLEET_RUN = "run by `vllm-doctor diagnose --prometheus URL` over every replica's series (--since/--until)"


#: How check rules (rules/check/) are run, said wherever they are listed.
CHECK_RUN = ("run by `vllm-doctor check` on launch commands, compose / Kubernetes / CI files and monitoring rules, "
             "before vLLM runs")


def check_ruleset() -> RuleSet:
    """check's rules (rules/check/VCnnn, VMnnn)."""
    from vllm_doctor.check.findings import load_check_rules

    return load_check_rules()


def fleet_ruleset(rs: RuleSet) -> RuleSet:
    """The fleet rules (rules/fleet/VD020+), with the thresholds of ``rs``."""
    from vllm_doctor.fleet.rules import load_fleet_rules

    return load_fleet_rules(rs.thresholds)


def explain_text(r: Rule, rs: RuleSet, fleet: bool = False) -> str:
    if r.scope == "check":
        from vllm_doctor.findings import SARIF_LEVELS

        return "\n".join([
            f"{r.id} {r.name} ({r.severity}, {r.category}) [check rule, SARIF level {SARIF_LEVELS[r.severity]}]",
            f"  {r.title}", "", f"A check rule: {CHECK_RUN}.", "", "Why it matters:",
            *("  " + ln for ln in r.docs.why.strip().splitlines()), "",
            "Example input:", *("  " + ln for ln in r.docs.example_log.strip().splitlines())]) + "\n"
    win = rs.window_seconds(r)
    out = [
        f"{r.id} {r.name} ({r.severity}, {r.category})" + (" [fleet rule]" if fleet else "")
        + (f" (also {', '.join(r.aliases)})" if r.aliases else ""),
        f"  {r.title}",
        "",
        *([f"A fleet rule: {FLEET_RUN}.", ""] if fleet else []),
        *(["Needs:", *("  " + ln for ln in r.docs.needs.strip().splitlines()), ""] if r.docs.needs else []),
        "Why it matters:",
        *("  " + ln for ln in r.docs.why.strip().splitlines()),
        "",
        "When it fires" + (" (over the range queried)" if fleet else f" (window {int(win)} s)" if win else " (whole log)") + ":",
    ]
    th = rs.thresholds
    for name, w in r.windows.items():  # the aggregates the conditions read, line by line
        what = {"stats": "stats lines", "engine_metrics": "/metrics samples (per engine)", "gpu": "NVML polls"}[w.of]
        out.append(f"  {name}: the {what} of the window" + (f" where {human(w.where, th)}" if w.where else ""))
    if r.when.all:
        out.append("  all of:" if len(r.when.all) > 1 else "  when:")
        out += [f"    - {human(c, th)}" for c in r.when.all]
    if r.when.any:
        out.append("  any of:")
        out += [f"    - {human(c, th)}" for c in r.when.any]
    if r.unless:
        out.append(f"  unless these fire: {', '.join(r.unless)}")
    used = _values_read(r, [*r.when.all, *r.when.any, *(x for f in r.fixes for x in (f.value, f.if_) if x)])
    if used:
        out += ["  where (the rule's values, from its YAML):"]
        out += [f"    {k} = {human(r.values[k], th)}" for k in used]
    out += ["", "Example log line:", *("  " + ln for ln in r.docs.example_log.strip().splitlines())]
    if r.fixes:
        out += ["", "Fixes (only flags of the detected vLLM version are recommended):"]
        for f in r.fixes:
            out.append(f"  {f.flag} {human(f.value, th)}")
            if f.if_:
                out.append(f"      when {human(f.if_, th)}")
    if r.checks:
        out += ["", "Checks (diagnostic steps to confirm the cause, not fixes):"]
        for c in r.checks:
            out.append(f"  {' '.join(_slots(c.text).split())}")
            if c.if_:
                out.append(f"      when {human(c.if_, th)}")
    if r.docs.fix:
        out += ["", *("  " + ln for ln in r.docs.fix.strip().splitlines())]
    if r.docs.limits:
        out += ["", "Limits:", *("  " + ln for ln in r.docs.limits.strip().splitlines())]
    return "\n".join(out) + "\n"


def _slots(text: str) -> str:
    """A message template for people: each ``{expr}`` placeholder becomes ``<name>``, the value's
    last name (``{root.meta.lineno}`` -> ``<lineno>``), or ``<...>`` for a computed one; filled in
    only when a finding is rendered."""
    def slot(m) -> str:
        expr = split_placeholder(m.group(1))[0].strip()
        last = expr.rpartition(".")[2]
        return f"<{last}>" if last.isidentifier() and all(p.isidentifier() for p in expr.split(".")) else "<...>"
    return TEMPLATE_RE.sub(slot, text)


def _values_read(r: Rule, exprs: list[str]) -> list[str]:
    """The names of ``r.values`` that ``exprs`` read, directly or through other values, in the
    order the YAML defines them (so that ``n_full`` or ``c.value`` in a condition is explained)."""
    from vllm_doctor.diagnosis.expr import names_in

    seen: set[str] = set()
    todo = [n for e in exprs for n in names_in(e)]
    while todo:
        n = todo.pop()
        if n in r.values and n not in seen:
            seen.add(n)
            todo += list(names_in(r.values[n]))
    return [k for k in r.values if k in seen]


def check_table(check: RuleSet, link: str = "") -> list[str]:
    """The check rules as a markdown table (id, name, severity, SARIF level, title), linked to
    their sections of docs/rules.md (``link``: the path to it, "" from within it). The one table of
    check findings: docs/rules.md and docs/check.md both hold it (``make docs``)."""
    from vllm_doctor.findings import SARIF_LEVELS

    rows = ["| id | name | severity | SARIF level | meaning |", "|---|---|---|---|---|"]
    rows += [f"| {r.id} | [`{r.name}`]({link}#{r.id.lower()}-{r.name}) | {r.severity} | {SARIF_LEVELS[r.severity]} | "
             f"{' '.join(r.title.split())} |" for r in check.rules]
    return rows


#: the markers around the generated table in docs/check.md
CHECK_TABLE_BEGIN = "<!-- generated by `make docs` from rules/check/ (vllm_doctor.report.docs.check_table): do not edit -->"
CHECK_TABLE_END = "<!-- end of the generated table -->"


def with_check_table(text: str, check: RuleSet) -> str:
    """docs/check.md's ``text`` with the table between its markers made again from the rules."""
    head, sep, rest = text.partition(CHECK_TABLE_BEGIN)
    _, sep2, tail = rest.partition(CHECK_TABLE_END)
    if not sep or not sep2:
        raise ValueError("docs/check.md has lost the markers of its generated table")
    return head + CHECK_TABLE_BEGIN + "\n" + "\n".join(check_table(check, "rules.md")) + "\n" + CHECK_TABLE_END + tail


def rules_markdown(rs: RuleSet, fleet: RuleSet | None = None, check: RuleSet | None = None) -> str:
    out = ["# Rule catalogue", "", "Generated by `vllm-doctor rules --format markdown`. Thresholds: `rules/thresholds.yaml`.",
           "A rule's windows (`windows:` in its YAML) are aggregates the state keeps line by line over the",
           "rule's window: the stats lines (or /metrics samples, or NVML polls) that meet its condition.", ""]
    out += ["| id | name | severity | title |", "|---|---|---|---|"]
    out += [f"| {r.id} | [`{r.name}`](#{r.name}) | {r.severity} | {r.title} |" for r in rs.rules]
    if fleet is not None and fleet.rules:
        out += ["", f"Fleet rules ({FLEET_RUN}):", "", "| id | name | severity | title | needs |", "|---|---|---|---|---|"]
        out += [f"| {r.id} | [`{r.name}`](#{r.name}) | {r.severity} | {r.title} | {' '.join((r.docs.needs or '').split())} |"
                for r in fleet.rules]
    if check is not None and check.rules:
        out += ["", f"Check rules ({CHECK_RUN}):", "", *check_table(check)]
    for r in rs.rules:
        out += ["", f"## {r.name}", "", "```", explain_text(r, rs).rstrip(), "```"]
    for fr in (fleet,) if fleet is not None else ():
        out += [ln for r in fr.rules for ln in ("", f"## {r.name}", "", "```", explain_text(r, fr, fleet=True).rstrip(), "```")]
    for cr in (check,) if check is not None else ():  # (ids in the headings: VC001's name is also VD010's)
        out += [ln for r in cr.rules for ln in ("", f"## {r.id} {r.name}", "", "```", explain_text(r, cr).rstrip(), "```")]
    return "\n".join(out) + "\n"


# ---- rule expressions for people (explain, docs/rules.md) -----------------------------------------

_CMP = {ast.GtE: "is at least", ast.Gt: "is more than", ast.LtE: "is at most", ast.Lt: "is less than",
        ast.Eq: "is", ast.NotEq: "is not", ast.In: "is one of", ast.NotIn: "is not one of"}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "x", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "^"}
_CALLS = {
    "coalesce": lambda a: f"{a[0]} (or {', then '.join(a[1:])} when unknown)" if len(a) > 1 else a[0],
    "clamp": lambda a: f"{a[0]} kept within {a[1]}..{a[2]}" if len(a) == 3 else None,
    "max": lambda a: f"the largest of {_and(a)}" if len(a) > 1 else f"the largest {a[0]}",
    "min": lambda a: f"the smallest of {_and(a)}" if len(a) > 1 else f"the smallest {a[0]}",
    "len": lambda a: f"the number of {a[0]}",
    "count": lambda a: f"the number of {a[0]}",
    "exists": lambda a: f"the log shows {_event_words(a[0])}",
    "version_at_least": lambda a: f"vLLM is {a[0]} or later",
    "flag_exists": lambda a: f"this vLLM has {a[0]}",
    "fired": lambda a: f"{a[0]} fired",
    "gib": lambda a: f"{a[0]} in GiB",
    "mean": lambda a: f"the mean of {a[0]}",
    "sum": lambda a: f"the sum of {a[0]}",
    "last": lambda a: f"the last {a[0]}",
    "first": lambda a: f"the first {a[0]}",
    "floor_to": lambda a: f"{a[0]} rounded down to a multiple of {a[1]}" if len(a) == 2 else None,
    "preemptions": lambda a: "the preemptions in the window",
    "concurrency": lambda a: ("the sequences the KV cache holds at once, as seen in the window (the most running "
                              "while it was full; else KV cache tokens / the tokens a running sequence held)"),
}


def _event_words(kind: str) -> str:
    """An event kind in words: ``KvCacheTooSmall`` -> ``KV cache too small``,
    ``OutOfMemory:startup`` -> ``out of memory (startup)``."""
    import re

    base, _, phase = kind.partition(":")
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]+", base):
        return kind
    words = re.findall(r"[A-Z][a-z0-9]*", base)
    text = " ".join(w if w in ("NCCL",) else w.lower() for w in words)
    text = text.replace("kv cache", "KV cache").replace("nccl", "NCCL")
    text = text[0].upper() + text[1:] if text.startswith("KV") else text
    return f"'{text}'" + (f" ({phase})" if phase else "")


_WINDOW_ATTRS = {"count": lambda w: f"the number of {w} lines", "span_seconds": lambda w: f"the seconds the {w} lines span"}
_WINDOW_READS = {"max": "the largest", "min": "the smallest", "sum": "the sum of", "mean": "the mean",
                 "first": "the first", "last": "the last", "slope_per_hour": "the hourly growth of",
                 "at_max": "the line with the largest", "at_min": "the line with the smallest"}


def _and(parts: list[str]) -> str:
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def human(expr: str, thresholds: dict | None = None) -> str:
    """A rule expression in words: ``preempted >= t.preemption_storm_min`` becomes ``preempted is
    at least 2 (preemption_storm_min)``; None checks read "is known" / "is unknown". Whatever has
    no wording (a comprehension, an unknown function) keeps its expression form."""
    th = thresholds or {}
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return expr

    def num(v: object) -> str:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000 else str(v)

    def h(n: ast.AST, top: bool = False) -> str:
        if isinstance(n, ast.BoolOp):
            word = " and " if isinstance(n.op, ast.And) else " or "
            s = word.join(h(v) for v in n.values)
            return s if top else f"({s})"
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return f"not {h(n.operand)}"
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return f"-{h(n.operand)}"
        if (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.comparators[0], ast.Constant)
                and isinstance(n.comparators[0].value, bool)):  # x is True, x != False, ...
            positive = isinstance(n.ops[0], (ast.Eq, ast.Is)) == n.comparators[0].value
            exact = isinstance(n.ops[0], (ast.Eq, ast.Is))
            s = h(n.left) if positive else f"not {h(n.left)}"
            return s if exact else f"{s} (or unknown)"
        if isinstance(n, ast.Compare):
            out, left = [], n.left
            for op, right in zip(n.ops, n.comparators):
                if isinstance(right, ast.Constant) and right.value is None and isinstance(op, (ast.Is, ast.IsNot)):
                    out.append(f"{h(left)} is {'known' if isinstance(op, ast.IsNot) else 'unknown'}")
                elif isinstance(op, (ast.Is, ast.IsNot)):
                    out.append(f"{h(left)} {'is' if isinstance(op, ast.Is) else 'is not'} {h(right)}")
                else:
                    out.append(f"{h(left)} {_CMP.get(type(op), '?')} {h(right)}")
                left = right
            return " and ".join(out)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "t":
            return f"{num(th[n.attr])} ({n.attr})" if n.attr in th else n.attr
        if isinstance(n, ast.Constant):
            if isinstance(n.value, str):
                return n.value
            return "unknown" if n.value is None else num(n.value)
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in n.elts):
            return ", ".join(h(e) for e in n.elts) if top else "(" + ", ".join(h(e) for e in n.elts) + ")"
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            return f"{h(n.left)} {_BIN[type(n.op)]} {h(n.right)}"
        if isinstance(n, ast.IfExp):
            return f"{h(n.body)} if {h(n.test, True)}, else {h(n.orelse)}"
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.attr in _WINDOW_ATTRS:
            return _WINDOW_ATTRS[n.attr](n.value.id)  # a window aggregate (state_windows.py)
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and n.func.attr in _WINDOW_READS and n.args and isinstance(n.args[0], ast.Constant)):
            return f"{_WINDOW_READS[n.func.attr]} {n.args[0].value} of the {n.func.value.id} lines"
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "peak" and n.args:
            return f"the highest {h(n.args[0])} so far in the window"
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _CALLS and not n.keywords:
            got = (_CALLS[n.func.id]([h(a, True) for a in n.args])
                   if n.args or n.func.id in ("preemptions", "concurrency") else None)
            if got:
                return got
        return ast.unparse(n)

    return h(tree, top=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m vllm_doctor.report.docs --write-check-table docs/check.md`` (``make docs``)."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(description="write the generated parts of the docs")
    ap.add_argument("--write-check-table", metavar="FILE", type=Path, required=True)
    path = ap.parse_args(argv).write_check_table
    text = path.read_text()
    path.write_text(with_check_table(text, check_ruleset()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
