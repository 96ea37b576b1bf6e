"""Sinks of diagnose: the report as text (for a person in a terminal), JSON (the stable schema,
docs/json-schema.md), Markdown (tickets, PRs) and HTML (jinja2, autoescaped: log text is user
input and may hold ``<script>``)."""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone

from jinja2 import Environment, PackageLoader, select_autoescape

from .pipeline import Report

FACT_ORDER = (
    "kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
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
        return f"{v / (1 << 30):.2f} GiB"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%m-%d %H:%M:%S")


def to_json(rep: Report) -> str:
    return json.dumps(rep.to_dict(), indent=2, default=str)


def to_text(rep: Report, color: bool = False) -> str:
    """Plain text; with ``color`` (a terminal) severities are coloured with ANSI codes."""
    def c(code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if color else s

    sev_col = {"critical": "1;31", "warning": "1;33", "info": "1;36"}
    lines = []
    src = ", ".join(f"{s['name']} ({s['lines_total']:,} line{'' if s['lines_total'] == 1 else 's'})" for s in rep.sources)
    eng = rep.engine.upper() if rep.engine else "engine unknown"
    ver = rep.vllm_version or "version unknown"
    if rep.vllm_version and rep.vllm_version_source == "fingerprint":
        ver = f"~{rep.vllm_version} (from log line fingerprints)"
    lines.append(c("1", f"vllm-doctor: {src}"))
    lines.append(f"vLLM {ver}, {eng}")
    if rep.nothing_to_diagnose:
        lines.append("")
        lines.append("Nothing to diagnose: no vLLM log lines were recognised in the input.")
        return "\n".join(lines) + "\n"
    shown = [(k, rep.facts.get(k)) for k in FACT_ORDER if rep.facts.get(k) is not None]
    if shown:
        lines.append("")
        lines.append(c("1", "Facts"))
        for k, v in shown:
            mark = " (default)" if k in rep.facts_defaulted else ""
            lines.append(f"  {k:<32} {fmt_fact(k, v)}{mark}")
    lines.append("")
    if not rep.findings:
        lines.append(c("1;32", "No incident found."))
    else:
        lines.append(c("1", f"Findings ({len(rep.findings)})"))
    for f in rep.findings:
        lines.append("")
        lines.append(c(sev_col[f.severity], f"{SEV_MARK[f.severity]} {f.rule_id} {f.name}") + f": {f.title}")
        when = f"seen {fmt_time(f.first_seen)} .. {fmt_time(f.last_seen)}" if f.first_seen else ""
        if when:
            lines.append(f"  {when}")
        for ln in f.message.splitlines():
            lines.append(f"  {ln}")
        if f.fixes:
            lines.append(c("1", "  Fix:"))
            for fx in f.fixes:
                lines.append(f"    {fx.command()}")
                lines.append(f"        why: {fx.why}")
                if fx.arithmetic:
                    lines.append(f"        how: {fx.arithmetic}")
        for n in f.notes:
            lines.append(f"  note: {n}")
        if f.evidence:
            lines.append("  Evidence:")
            for e in f.evidence[:8]:
                rng = f"{e.lineno}-{e.end_lineno}" if e.end_lineno else f"{e.lineno}"
                text = e.text if len(e.text) <= 240 else e.text[:239] + "…"
                lines.append(f"    {e.source}:{rng}: {text}")
        lines.append(f"  More: vllm-doctor explain {f.name}")
    if rep.unknown_flags:
        lines.append("")
        for k, v in rep.unknown_flags.items():
            lines.append(f"note: {k} is not a vLLM flag; the real one is {v}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Log text in Markdown prose: HTML is escaped (a prompt can hold ``<script>``)."""
    return html.escape(text, quote=False)


def to_markdown(rep: Report) -> str:
    out = [f"# vllm-doctor report", "",
           f"- vLLM: {rep.vllm_version or 'unknown'} ({rep.engine or 'engine unknown'})",
           f"- Sources: " + ", ".join(f"`{s['name']}` ({s['lines_total']:,} lines)" for s in rep.sources), ""]
    if rep.nothing_to_diagnose:
        out.append("Nothing to diagnose: no vLLM log lines were recognised in the input.")
        return "\n".join(out) + "\n"
    out += ["## Facts", "", "| fact | value |", "|---|---|"]
    for k in FACT_ORDER:
        v = rep.facts.get(k)
        if v is not None:
            out.append(f"| `{k}` | {fmt_fact(k, v)}{' (default)' if k in rep.facts_defaulted else ''} |")
    out += ["", f"## Findings ({len(rep.findings)})", ""]
    if not rep.findings:
        out.append("No incident found.")
    for f in rep.findings:
        out += [f"### {f.severity.upper()} {f.rule_id} `{f.name}`: {f.title}", "", _md(f.message).replace("\n", "  \n"), ""]
        if f.fixes:
            out.append("**Fix**")
            out.append("")
            for fx in f.fixes:
                out.append(f"- `{fx.command()}`: {_md(fx.why)}" + (f" ({_md(fx.arithmetic)})" if fx.arithmetic else ""))
            out.append("")
        if f.evidence:
            out.append("**Evidence**")
            out.append("")
            out.append("```")
            for e in f.evidence[:8]:
                out.append(f"{e.source}:{e.lineno}: {e.text[:200]}".replace("```", "'''"))
            out.append("```")
            out.append("")
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
    return _env


def to_html(rep: Report) -> str:
    return jinja_env().get_template("report.html.j2").render(rep=rep, fact_order=FACT_ORDER)


FORMATS = {"text": to_text, "json": to_json, "markdown": to_markdown, "html": to_html}
