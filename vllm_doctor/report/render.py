"""Sinks of diagnose: the report as text (for a person in a terminal), JSON (the stable schema,
docs/json-schema.md), Markdown (tickets, PRs) and HTML (jinja2, autoescaped: log text is user
input and may hold ``<script>``)."""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone

from jinja2 import Environment, PackageLoader, select_autoescape

from vllm_doctor.diagnosis.advice import fix_label
from vllm_doctor.pipeline import Report
from vllm_doctor.diagnosis.evaluate import RULE_ERROR_ID
from vllm_doctor.diagnosis.expr import human_bytes

FACT_ORDER = (
    "kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "device_total_memory_bytes", "model_weights_bytes", "kv_cache_memory_bytes", "available_kv_cache_bytes",
    "tensor_parallel_size", "kv_cache_dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "preemptions_total", "peak_num_running", "peak_num_waiting", "peak_kv_cache_usage_ratio",
)
SEV_MARK = {"critical": "CRITICAL", "warning": "WARNING", "info": "INFO"}


def fmt_fact(name: str, v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if name.endswith("_ratio") and isinstance(v, (int, float)):
        return f"{v:.1%}"
    if name.endswith("_bytes") and isinstance(v, (int, float)):
        return human_bytes(v)  # in the unit that fits: 4.00 MiB, not 0.00 GiB
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%m-%d %H:%M:%S")


REPLICA_COLUMNS = (
    ("replica", "replica"), ("engine", "engine"), ("running_peak", "running peak"),
    ("waiting_peak", "waiting peak"), ("kv_cache_usage_peak_ratio", "KV peak"),
    ("kv_cache_usage_mean_ratio", "KV mean"), ("preemptions", "preemptions"),
    ("saturated_ratio", "saturated"), ("idle_ratio", "idle"), ("ttft_p99_seconds", "TTFT p99 s"),
    ("itl_p99_seconds", "ITL p99 s"), ("findings", "findings"),
)


def replica_cells(row: dict) -> list[str]:
    """One row of the per-replica table (``diagnose --prometheus``) as text cells."""
    out = []
    for key, _ in REPLICA_COLUMNS:
        v = row.get(key)
        if key == "findings":
            out.append(", ".join(v) if v else "-")
        elif v is None:
            out.append("-")
        elif key.endswith("_ratio"):
            out.append(f"{v:.0%}")
        elif isinstance(v, float) and key.endswith("_seconds"):
            out.append(f"{v:.3g}")
        elif isinstance(v, float):
            out.append(f"{v:,.0f}")
        else:
            out.append(str(v))
    return out


def to_json(rep: Report) -> str:
    return json.dumps(rep.to_dict(), indent=2, default=str)


def fmt_span(a: float | None, b: float | None) -> str:
    """``11-30 09:11:19 .. 09:11:49`` (the date once when both ends share it)."""
    if a is None:
        return ""
    sa, sb = fmt_time(a), fmt_time(b if b is not None else a)
    if sa == sb:
        return sa
    return f"{sa} .. {sb[6:] if sa[:5] == sb[:5] else sb}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def verdict(rep: Report) -> dict:
    """What the report opens with: ``status`` (nothing | ok | critical | warning | info),
    ``headline`` (one line: what happened), ``first`` (the first fix of the most severe finding,
    as typed, or the step to take when it has none), ``why`` (its reason) and ``more`` (the names
    of the other findings)."""
    lines = sum(s["lines_total"] for s in rep.sources)
    sampled = any((rep.timeline or {}).get("series", {}).values())  # stats or /metrics samples
    if not rep.findings and rep.nothing_to_diagnose and not sampled:
        return {"status": "nothing", "headline": "Nothing to diagnose: no vLLM log lines were recognised "
                f"in the input ({plural(lines, 'line')}).", "first": None, "why": None, "more": []}
    if not rep.findings and rep.nothing_in_range:
        return {"status": "nothing", "headline": out_of_range_headline(rep), "first": None, "why": None, "more": []}
    if not rep.findings:
        return {"status": "ok", "headline": "No incident found"
                + (f" in {plural(lines, 'line')}" if lines else "")
                + (f" of vLLM {rep.vllm_version}" if rep.vllm_version else "") + ".",
                "first": None, "why": None, "more": []}
    top = rep.findings[0]  # findings are sorted most severe first
    when = fmt_span(top.first_seen, top.last_seen)
    more = [f.name for f in rep.findings[1:]]
    head = f"{SEV_MARK[top.severity]} {top.name}: {top.title}" + (f" ({when})" if when else "")
    if more:
        head += f"; {plural(len(more), 'more finding')}: {', '.join(more)}"
    checks = getattr(top, "checks", None) or []  # diagnostic steps (issue 11's advice half)
    if top.fixes:
        parts, why = first_step_parts(top.fixes), top.fixes[0].why
    elif checks:
        parts, why = [(checks[0], "")], None
    else:
        parts = [(f"read the evidence of {top.name} below; then", f"vllm-doctor explain {top.name}")]
        why = top.notes[0] if top.notes else None
    first = ", then ".join(f"{p} {c}".strip() for p, c in parts)
    # first: the whole step in words (text); first_parts: [words, what to type] for formats that
    # set the typed part as code (markdown, html)
    return {"status": top.severity, "headline": head, "first": first, "first_parts": parts, "why": why,
            "more": more}


def _ago(seconds: float) -> str:
    """A duration as a person reads it: ``40 min``, ``34.2 h``, ``3.5 days``."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def out_of_range_headline(rep: Report) -> str:
    """The verdict when ``--since`` / ``--until`` left nothing to judge: the span, that no line of
    the logs fell in it, and when the logs begin and end (on their own clock)."""
    tr = rep.time_range or {}
    lo, hi, first, last = tr.get("since"), tr.get("until"), tr.get("log_first_ts"), tr.get("log_last_ts")
    def at(ts: float) -> str:
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    span = (f"{at(lo)} .. {at(hi)}" if lo is not None and hi is not None else
            f"since {at(lo)}" if lo is not None else f"until {at(hi)}")
    head = (f"Nothing to diagnose in the span {span} (UTC, the log's clock): no vLLM line read "
            f"({plural(tr.get('events_outside', 0), 'event')}) falls in it")
    if first is not None and last is not None:
        head += f"; the log runs {at(first)} .. {at(last)}"
        if lo is not None and last < lo:
            head += f", ending {_ago(lo - last)} before the span begins"
        elif hi is not None and first > hi:
            head += f", starting {_ago(first - hi)} after the span ends"
    return head + ". Nothing was judged."


def nothing_judged(rep: Report) -> bool:
    """The report stops after its header: no vLLM line at all, or none in the --since / --until span."""
    return rep.nothing_to_diagnose or (rep.nothing_in_range and not rep.findings)


def first_step(fixes: list) -> str:
    """The first option of a finding's fixes as one instruction: the fixes that go together with
    the first one (same ``option``; an upgrade first, then the environment, then the flags)."""
    return ", then ".join(f"{prose} {code}" for prose, code in first_step_parts(fixes))


def first_step_parts(fixes: list) -> list[tuple[str, str]]:
    """:func:`first_step` as (words, what to type) pairs, so a format can set only what is typed as
    code: ``[("restart vLLM with", "--max-num-seqs 2")]``."""
    if not hasattr(fixes[0], "option"):  # fixes not yet grouped into options: the first alone
        group = fixes[:1]
    else:
        group = [fx for fx in fixes if fx.option == fixes[0].option]
    parts = []
    up = [fx.command() for fx in group if fx.kind == "upgrade"]
    env = [fx.command() for fx in group if fx.kind == "env"]
    flags = [fx.command() for fx in group if fx.kind not in ("upgrade", "env")]
    if up:
        parts.append(("upgrade vLLM:", "; ".join(up)))
    if env:
        parts.append(("set", " ".join(env)))
    if flags:
        parts.append(("restart vLLM with", " ".join(flags)))
    return parts


def split_facts(rep: Report) -> tuple[list[tuple[str, object]], list[tuple[str, object]]]:
    """(observed, defaulted): the facts the inputs showed, and those filled from the version's
    defaults (kept out of the way: they are what vLLM would use, not what was seen)."""
    seen: list[tuple[str, object]] = []
    dflt: list[tuple[str, object]] = []
    for k in FACT_ORDER:
        v = rep.facts.get(k)
        if v is not None:
            (dflt if k in rep.facts_defaulted else seen).append((k, v))
    return seen, dflt


def version_line(rep: Report) -> str:
    eng = rep.engine.upper() if rep.engine else "engine unknown"
    ver = rep.vllm_version or "version unknown"
    if rep.vllm_version and rep.vllm_version_source == "fingerprint":
        ver = f"~{rep.vllm_version} (from log line fingerprints)"
    return f"vLLM {ver}, {eng}"


def to_text(rep: Report, color: bool = False) -> str:
    """Plain text; with ``color`` (a terminal) severities are coloured with ANSI codes. Opens
    with the verdict and what to do first, then the findings, then the facts."""
    def c(code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if color else s

    sev_col = {"critical": "1;31", "warning": "1;33", "info": "1;36", "ok": "1;32", "nothing": "1"}
    v = verdict(rep)
    lines = [c(sev_col[v["status"]], v["headline"])]
    if v["first"]:
        lines.append(c("1", "Do this first: ") + v["first"] + (f"  ({v['why']})" if v["why"] else ""))
    src = ", ".join(f"{s['name']} ({plural(s['lines_total'], 'line')})" for s in rep.sources)
    lines.append(f"Read {src}; {version_line(rep)}")
    if nothing_judged(rep):
        return "\n".join(lines) + "\n"
    if rep.findings:
        lines.append("")
        lines.append(c("1", f"Findings ({len(rep.findings)})"))
    for f in rep.findings:
        lines.append("")
        lines.append(c(sev_col[f.severity], f"{SEV_MARK[f.severity]} {f.rule_id} {f.name}") + f": {f.title}")
        when = fmt_span(f.first_seen, f.last_seen)
        if when:
            lines.append(f"  seen {when}")
        for ln in f.message.splitlines():
            lines.append(f"  {ln}")
        if f.fixes:
            lines.append(c("1", "  Fix:"))
            for fx in f.fixes:
                label = fix_label(fx, f.fixes)
                lines.append(f"    {fx.command()}" + (f"   ({label})" if label else ""))
                lines.append(f"        why: {fx.why}")
                if fx.arithmetic:
                    lines.append(f"        how: {fx.arithmetic}")
        for n in f.checks:
            lines.append(f"  check: {n}")
        for n in f.notes:
            lines.append(f"  note: {n}")
        if f.evidence:
            lines.append("  Evidence:")
            for e in f.evidence[:8]:
                rng = f"{e.lineno}-{e.end_lineno}" if e.end_lineno else f"{e.lineno}"
                text = e.text if len(e.text) <= 240 else e.text[:239] + "…"
                lines.append(f"    {e.source}:{rng}: {text}")
        if f.rule_id != RULE_ERROR_ID:  # the finding about vllm-doctor itself has no rule to explain
            lines.append(f"  More: vllm-doctor explain {f.name}")
    if rep.replicas:
        lines.append("")
        lines.append(c("1", f"Replicas ({sum(1 for r in rep.replicas if r.get('engine') is None)})"))
        rows = [[h for _, h in REPLICA_COLUMNS]] + [replica_cells(r) for r in rep.replicas]
        widths = [max(len(r[i]) for r in rows) for i in range(len(REPLICA_COLUMNS) - 1)]
        for r in rows:
            lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)) + "  " + r[-1])
    seen, dflt = split_facts(rep)
    if seen:
        lines.append("")
        lines.append(c("1", "Facts (from the inputs)"))
        for k, val in seen:
            lines.append(f"  {k:<32} {fmt_fact(k, val)}")
    if dflt:
        lines.append("")
        lines.append(c("2", "Version defaults (not in the inputs): "
                       + ", ".join(f"{k} {fmt_fact(k, val)}" for k, val in dflt)))
    if rep.unknown_flags:
        lines.append("")
        for k, val in rep.unknown_flags.items():
            lines.append(f"note: {k} was not accepted" + (f"; the real setting: {val}" if val else " (see unknown-flag above)"))
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Log text in Markdown prose: HTML is escaped (a prompt can hold ``<script>``)."""
    return html.escape(text, quote=False)


def to_markdown(rep: Report) -> str:
    v = verdict(rep)
    out = ["# vllm-doctor report", "", f"**{_md(v['headline'])}**", ""]
    if v["first"]:
        step = ", then ".join(_md(p) + (f" `{c}`" if c else "") for p, c in v["first_parts"])
        out += [f"**Do this first:** {step}" + (f": {_md(v['why'])}" if v["why"] else ""), ""]
    out += [f"- vLLM: {rep.vllm_version or 'unknown'} ({rep.engine or 'engine unknown'})",
            "- Sources: " + ", ".join(f"`{s['name']}` ({s['lines_total']:,} lines)" for s in rep.sources), ""]
    if nothing_judged(rep):
        return "\n".join(out) + "\n"
    if rep.findings:
        out += [f"## Findings ({len(rep.findings)})", ""]
    for f in rep.findings:
        out += [f"### {f.severity.upper()} {f.rule_id} `{f.name}`: {f.title}", ""]
        when = fmt_span(f.first_seen, f.last_seen)
        if when:
            out += [f"_seen {when}_", ""]
        out += [_md(f.message).replace("\n", "  \n"), ""]
        if f.fixes:
            out.append("**Fix**")
            out.append("")
            for fx in f.fixes:
                label = fix_label(fx, f.fixes)
                out.append(f"- `{fx.command()}`{' (' + label + ')' if label else ''}: {_md(fx.why)}"
                           + (f" ({_md(fx.arithmetic)})" if fx.arithmetic else ""))
            out.append("")
        for n in f.checks:
            out += [f"_Check:_ {_md(n)}", ""]
        for n in f.notes:
            out += [f"_Note:_ {_md(n)}", ""]
        if f.evidence:
            out.append("**Evidence**")
            out.append("")
            out.append("```")
            for e in f.evidence[:8]:
                out.append(f"{e.source}:{e.lineno}: {e.text[:200]}".replace("```", "'''"))
            out.append("```")
            out.append("")
    if rep.replicas:
        out += [f"## Replicas ({sum(1 for r in rep.replicas if r.get('engine') is None)})", "",
                "| " + " | ".join(h for _, h in REPLICA_COLUMNS) + " |", "|" + "---|" * len(REPLICA_COLUMNS)]
        out += ["| " + " | ".join(_md(x).replace("|", "\\|") for x in replica_cells(r)) + " |" for r in rep.replicas]
        out.append("")
    seen, dflt = split_facts(rep)
    if seen:
        out += ["## Facts (from the inputs)", "", "| fact | value |", "|---|---|"]
        out += [f"| `{k}` | {fmt_fact(k, val)} |" for k, val in seen]
        out.append("")
    if dflt:
        out += ["<details><summary>Version defaults (not in the inputs)</summary>", "",
                "| fact | default |", "|---|---|"]
        out += [f"| `{k}` | {fmt_fact(k, val)} |" for k, val in dflt]
        out += ["", "</details>", ""]
    return "\n".join(out) + "\n"


_env: Environment | None = None


def jinja_env() -> Environment:
    """The package's jinja2 environment (templates/, autoescape on for .html/.j2)."""
    global _env
    if _env is None:
        _env = Environment(loader=PackageLoader("vllm_doctor", "templates"),
                           autoescape=select_autoescape(["html", "j2", "htm"], default=True))
        _env.filters["fact"] = lambda v, k: fmt_fact(k, v)
        _env.filters["ts"] = fmt_time
        _env.globals["fix_label"] = fix_label
    return _env


def to_html(rep: Report) -> str:
    from vllm_doctor.report.timeline import charts, finding_spans

    seen, dflt = split_facts(rep)
    return jinja_env().get_template("report.html.j2").render(
        rep=rep, verdict=verdict(rep), stop=nothing_judged(rep), plural=plural, facts_seen=seen, facts_default=dflt, span=fmt_span,
        version_line=version_line(rep), charts=charts(rep.timeline, finding_spans(rep.findings), rep.facts.get("preemptions_total")),
        replica_headers=[h for _, h in REPLICA_COLUMNS], replica_rows=[replica_cells(r) for r in rep.replicas])


FORMATS = {"text": to_text, "json": to_json, "markdown": to_markdown, "html": to_html}
