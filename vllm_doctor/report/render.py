"""Sinks of diagnose: the report as text (for a person in a terminal), JSON (the stable schema,
docs/json-schema.md), Markdown (tickets, PRs) and HTML (jinja2, autoescaped: log text is user
input and may hold ``<script>``)."""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from vllm_doctor.diagnosis.advice import fix_tag
from vllm_doctor.pipeline import Report
from vllm_doctor.diagnosis.evaluate import RULE_ERROR_ID
from vllm_doctor.findings import SEVERITY_ORDER
from vllm_doctor.state.startup import PHASES as STARTUP_PHASES
from vllm_doctor.units import human_bytes

if TYPE_CHECKING:  # jinja2 is imported by the HTML report only (every other report starts without it)
    from jinja2 import Environment

FACT_ORDER = (
    "kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "device_total_memory_bytes", "model_weights_bytes", "kv_cache_memory_bytes", "available_kv_cache_bytes",
    "tensor_parallel_size", "kv_cache_dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "preemptions_total", "peak_num_running", "peak_num_waiting", "peak_kv_cache_usage_ratio",
)
SEV_MARK = {"critical": "CRITICAL", "warning": "WARNING", "info": "INFO"}



def evidence_at(e, ranges: bool = False) -> str:
    """Where an evidence line is: ``source:line`` (``source:first-last`` with ``ranges``), or the
    source alone for a collector's sample (/metrics, NVML: line 0)."""
    if not e.lineno:
        return e.source
    return f"{e.source}:{e.lineno}-{e.end_lineno}" if ranges and e.end_lineno else f"{e.source}:{e.lineno}"

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


#: Each fact in words, with vLLM's own name where it is a setting or a figure vLLM prints, and the
#: unit its value is counted in (None: the value carries its own: %, bytes, on/off).
FACT_WORDS: dict[str, tuple[str, str | None]] = {
    "kv_cache_tokens": ("KV cache size", "tokens"),
    "num_gpu_blocks": ("KV cache blocks on the GPU (num_gpu_blocks)", "blocks"),
    "num_cpu_blocks": ("CPU swap blocks (num_cpu_blocks)", "blocks"),
    "block_size": ("KV cache block size (block_size)", "tokens"),
    "max_concurrency": ("Requests of max_model_len the KV cache holds at once", "requests"),
    "max_model_len": ("Longest request, prompt + output (max_model_len)", "tokens"),
    "max_num_seqs": ("Most requests running at once (max_num_seqs)", "requests"),
    "max_num_batched_tokens": ("Tokens per scheduler step (max_num_batched_tokens)", "tokens"),
    "gpu_memory_utilization": ("Share of GPU memory vLLM may use (gpu_memory_utilization)", None),
    "device_total_memory_bytes": ("GPU memory", None),
    "model_weights_bytes": ("Model weights", None),
    "kv_cache_memory_bytes": ("KV cache memory", None),
    "available_kv_cache_bytes": ("Memory available for the KV cache", None),
    "tensor_parallel_size": ("Tensor parallel size (GPUs per replica)", "GPUs"),
    "kv_cache_dtype": ("KV cache data type (kv_cache_dtype)", None),
    "enable_chunked_prefill": ("Chunked prefill", None),
    "enable_prefix_caching": ("Prefix caching", None),
    "preemptions_total": ("Preemptions counted", "preemptions"),
    "peak_num_running": ("Most requests running", "requests"),
    "peak_num_waiting": ("Most requests waiting", "requests"),
    "peak_kv_cache_usage_ratio": ("Highest KV cache usage", None),
    "kv_device": ("KV cache device", None),
    "cpu_offload_kv_tokens": ("KV cache offloaded to CPU", "tokens"),
    "preemptions_inferred": ("Preemptions inferred from the stats lines", None),
    "oom_events_total": ("Out-of-memory errors", "errors"),
    "quantization": ("Quantization", None),
    "swap_space": ("CPU swap space per GPU (swap_space)", "GiB"),
    "workers_seen": ("Worker processes seen", "processes"),
}


def fact_words(name: str) -> str:
    """A fact's name as a person reads it: ``Longest request, prompt + output (max_model_len)``."""
    return FACT_WORDS.get(name, (name.replace("_", " "), None))[0]


def fact_value(name: str, v: object) -> str:
    """A fact's value with its unit: ``4,096 tokens``, ``95.0%``, ``14.96 GiB``, ``on``."""
    text = f"{int(v):,}" if isinstance(v, float) and v.is_integer() and not name.endswith(("_ratio", "_bytes")) \
        else fmt_fact(name, v)
    unit = FACT_WORDS.get(name, ("", None))[1]
    if unit and v is not None and not isinstance(v, bool) and isinstance(v, (int, float)):
        if v == 1:
            unit = {"processes": "process"}.get(unit, unit[:-1] if unit.endswith("s") else unit)
        return f"{text} {unit}"
    return text


def fix_size(fx: object) -> str:
    """A flag counted in bytes, in the unit a person reads (``16 MiB``), to show next to the exact
    value (``--kv-cache-memory-bytes 16777216 (16 MiB)``); '' for any other fix."""
    flag, value = getattr(fx, "flag", ""), getattr(fx, "value", None)
    if getattr(fx, "kind", "flag") in ("env", "upgrade") or not str(flag).endswith("-bytes"):
        return ""
    try:
        n = float(str(value).replace(",", "").replace("_", ""))
    except ValueError:
        return ""
    hb = human_bytes(n) or ""
    return hb.replace(".00 ", " ") if n >= 1024 else ""


def fix_command(fx: object) -> str:
    """The command as typed, with a byte value's size in words after it."""
    size = fix_size(fx)
    return fx.command() + (f" ({size})" if size else "")  # type: ignore[attr-defined]


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


def finding_cards(rep: Report) -> list[dict]:
    """The findings as the reader meets them: one card per finding, and in a fleet report one card
    per finding across replicas (``replicas``: the replicas it holds on, each with its own message;
    the card shows the first, most severe). ``history``: why an occurrence is not the current state
    (an earlier run, before vLLM restarted; or an earlier occurrence of an incident seen again)."""
    runs = rep.runs or {}
    cur_run = runs.get("index") or 0
    latest: dict[str, int] = {}
    for f in rep.findings:
        latest[f.rule_id] = max(latest.get(f.rule_id, 0), getattr(f, "occurrence", 1))
    cards: list[dict] = []
    by_key: dict[tuple, dict] = {}
    for f in rep.findings:
        replica = (f.values or {}).get("replica")
        if replica is not None:
            key = (f.rule_id, f.name, f.severity)
            card = by_key.get(key)
            prefix = f"{replica}: "
            if card is None:
                card = by_key[key] = {"f": f, "title": f.title[len(prefix):] if f.title.startswith(prefix) else f.title,
                                      "replicas": [], "history": None}
                cards.append(card)
            card["replicas"].append({"name": str(replica), "message": f.message, "seen": fmt_span(f.first_seen, f.last_seen)})
            continue
        history = None
        if getattr(f, "run", 0) < cur_run:
            history = (f"earlier engine run: vLLM restarted after it (at {fmt_time(runs.get('started'))})"
                       if runs.get("started") is not None else "earlier engine run: vLLM restarted after it")
        elif getattr(f, "occurrence", 1) < latest[f.rule_id]:
            history = f"earlier occurrence {f.occurrence} of {latest[f.rule_id]}: the incident was seen again later"
        cards.append({"f": f, "title": f.title, "replicas": [], "history": history})
    return cards


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
    ``headline`` (one line: what happened, and "Not enough evidence: ..." naming the one thing to
    collect where the top finding says so), ``first`` (the first fix of the most severe finding,
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
    current, history, recovered = now_and_history(rep)
    if recovered is not None:
        return recovered
    top = current[0]  # the most severe incident of the current run, its latest occurrence
    when = fmt_span(top.first_seen, top.last_seen)
    ended = ended_before_end(top, rep)
    if when and ended:  # over before the log ends: not what is going on now
        when += f"; {ended}"
    more = list(dict.fromkeys(f.name for f in current if f.name != top.name))
    title = top.title
    reps = [str(f.values["replica"]) for f in current if f.name == top.name and (f.values or {}).get("replica")]
    if reps:  # the fleet: one incident across replicas, named once with its replicas
        prefix = f"{reps[0]}: "
        title = f"on {plural(len(reps), 'replica')} ({', '.join(reps[:4])}{', ...' if len(reps) > 4 else ''}): " + (
            title[len(prefix):] if title.startswith(prefix) else title)
    head = f"{SEV_MARK[top.severity]} {top.name} {title}" if reps else f"{SEV_MARK[top.severity]} {top.name}: {title}"
    head += f" ({when})" if when else ""
    if more:
        head += f"; {plural(len(more), 'more finding')}: {', '.join(more)}"
    if history:
        head += f"; earlier: {', '.join(dict.fromkeys(f.name for f in history))} (before a restart)"
    runs = rep.runs or {}
    if getattr(top, "run", 0) < (runs.get("index") or 0) and runs.get("started") is not None:
        head += f"; vLLM restarted at {fmt_time(runs['started'])} and has not served yet"
    checks = getattr(top, "checks", None) or []  # diagnostic steps (issue 11's advice half)
    collect = getattr(top, "collect", None)  # not enough evidence: the one thing that would decide
    if collect:
        head += f". Not enough evidence: {collect}"
    # a fix two occurrences share is listed under the first: the verdict's step is the incident's
    fixes = top.fixes or next((f.fixes for f in rep.findings if f.name == top.name and f.fixes), [])
    if checks and getattr(top, "checks_first", False):  # a step that comes before any fix
        parts = [(checks[0], "")]
        if fixes:
            parts = first_step_parts(fixes)
            parts[0] = (f"{checks[0].rstrip('.')}; only if that cannot be done, {parts[0][0]}", parts[0][1])
        why = None
    elif fixes:
        parts, why = first_step_parts(fixes), fixes[0].why
    elif checks:
        parts, why = [(checks[0], "")], None
    elif collect:
        parts, why = [("collect the evidence named above;", f"vllm-doctor explain {top.name}")], None
    else:
        parts = [(f"read the evidence of {top.name} below; then", f"vllm-doctor explain {top.name}")]
        why = top.notes[0] if top.notes else None
    sized = [fx for fx in fixes if fix_size(fx) and fx.option == fixes[0].option] if fixes and hasattr(
        fixes[0], "option") else []
    # one byte value in the step: its size alone (16 MiB); several: each named by its flag
    size = fix_size(sized[0]) if len(sized) == 1 else ", ".join(f"{fx.flag} {fix_size(fx)}" for fx in sized)
    first = ", then ".join(f"{p} {c}".strip() for p, c in parts) + (f" ({size})" if size else "")
    # first: the whole step in words (text); first_parts: [words, what to type] for formats that
    # set the typed part as code (markdown, html); first_size: a byte value's size in words
    return {"status": top.severity, "headline": head, "first": first, "first_parts": parts, "why": why,
            "more": more, "first_size": size, "current": top}


def live_verdict(rep: Report, replay: bool) -> dict:
    """The verdict of the sidecar's page and ``watch``: of what is wrong now (the active findings,
    and those of engine runs before a restart, so that a recovery is said as one); on an old or
    replayed log, of what the log shows (every finding, as diagnose reports it)."""
    import dataclasses

    cur_run = (rep.runs or {}).get("index") or 0
    return verdict(rep if replay else dataclasses.replace(
        rep, findings=[f for f in rep.findings if f.active or getattr(f, "run", 0) < cur_run]))


def now_and_history(rep: Report) -> tuple[list, list, dict | None]:
    """(current, history, recovered): the findings of the current engine run, most severe first and
    of one incident its latest occurrence first; those of earlier runs (before vLLM restarted); and,
    when the current run has served with no finding of its own after an earlier run's incident, the
    verdict that says so ("recovered at 10:14; healthy for 58 min"), else None."""
    sev = SEVERITY_ORDER
    runs = rep.runs or {}
    cur_run = runs.get("index") or 0
    now = [f for f in rep.findings if getattr(f, "run", 0) >= cur_run]
    past = [f for f in rep.findings if getattr(f, "run", 0) < cur_run]
    latest = sorted(now, key=lambda f: (-sev[f.severity], f.rule_id, -getattr(f, "occurrence", 1)))
    if latest or not past:
        return latest, past, None
    worst = sorted(past, key=lambda f: (-sev[f.severity], -(f.last_seen or 0.0)))[0]
    started, end = runs.get("started"), runs.get("log_last_ts")
    if not runs.get("served") or started is None:  # restarted, not serving yet: the last incident stands
        return sorted(past, key=lambda f: (-sev[f.severity], f.rule_id, -getattr(f, "occurrence", 1))), [], None
    was = f"{SEV_MARK[worst.severity]} {worst.name}" + (
        f" ({fmt_span(worst.first_seen, worst.last_seen)})" if worst.first_seen else "")
    healthy = f"; healthy for {_ago(end - started)} since, to the newest log line ({fmt_time(end)})" if (
        end is not None and end > started) else ""
    head = f"Recovered: vLLM restarted at {fmt_time(started)} after {was} and has served with no finding{healthy}."
    fixes = next((f.fixes for f in rep.findings if f.name == worst.name and f.fixes), [])
    parts = first_step_parts(fixes) if fixes else []
    return [], past, {
        "status": "ok", "headline": head, "recovered": True, "current": None,
        "first": ", then ".join(f"{p} {c}".strip() for p, c in parts) or None, "first_parts": parts,
        "first_label": "Against a repeat", "why": fixes[0].why if fixes else None, "first_size": "",
        "more": [f.name for f in past]}


#: an incident whose last sign is this long before the log's newest line is said to have ended
ENDED_MIN_SECONDS = 60.0


def ended_before_end(f, rep: Report) -> str | None:
    """``ended 11.5 h before the log's newest line, 03-02 07:19:50`` when finding ``f`` is no
    longer active and its last sign is at least ENDED_MIN_SECONDS before the newest line of the
    logs (an operator reading a day's log asks first whether it is going on now); else None."""
    end = (rep.runs or {}).get("log_last_ts")
    last = getattr(f, "last_seen", None)
    if getattr(f, "active", True) or end is None or last is None or end - last < ENDED_MIN_SECONDS:
        return None
    return f"ended {_ago(end - last)} before the log's newest line, {fmt_time(end)}"


def _ago(seconds: float) -> str:
    """A duration as a person reads it: ``40 min``, ``34.2 h``, ``3.5 days``."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _at(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _span_words(tr: dict) -> str:
    lo, hi = tr.get("since"), tr.get("until")
    return (f"{_at(lo)} .. {_at(hi)}" if lo is not None and hi is not None else
            f"since {_at(lo)}" if lo is not None else f"until {_at(hi)}")


def span_line(rep: Report) -> str | None:
    """Under ``--since`` / ``--until``: the span judged, on the log's clock, and how many events fell in
    it and outside it (the JSON's ``time_range``); None without a span."""
    tr = rep.time_range
    if not tr:
        return None
    return (f"Judged only the span {_span_words(tr)} (UTC, the log's clock; --since/--until): "
            f"{plural(tr.get('events_in_range', 0), 'event')} in it, {tr.get('events_outside', 0):,} outside it")


def out_of_range_headline(rep: Report) -> str:
    """The verdict when ``--since`` / ``--until`` left nothing to judge: the span, that no line of
    the logs fell in it, and when the logs begin and end (on their own clock)."""
    tr = rep.time_range or {}
    lo, hi, first, last = tr.get("since"), tr.get("until"), tr.get("log_first_ts"), tr.get("log_last_ts")
    at = _at
    head = (f"Nothing to diagnose in the span {_span_words(tr)} (UTC, the log's clock): no vLLM line read "
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


def startup_lines(starts: list[dict]) -> list[str]:
    """One line per engine start (the newest 8): where it began, each timed phase, how it ended."""
    out = []
    for s in starts[-8:]:
        phases = ", ".join(f"{p['label']} {fmt_secs(p['seconds'])}" for p in s["phases"]) or "no timed phase logged"
        end = (f"ready after {'at least ' if s['begins_inside'] else ''}{fmt_secs(s['seconds'])}" if s["wall_seconds"] is not None
               else "ready" if s["served"] else "failed before serving" if s["failed"] else "not ready in this log")
        out.append(f"{s['source']}:{s['lineno']} ({fmt_time(s['started']) or 'untimed'}): {phases}; {end}")
    return out


def fmt_secs(v: float) -> str:
    return f"{v:.1f} s" if v < 10 else f"{v:.0f} s"


def to_text(rep: Report, color: bool = False) -> str:
    """Plain text; with ``color`` (a terminal) severities are coloured with ANSI codes. Opens
    with the verdict and what to do first, then the findings, then the facts."""
    def c(code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if color else s

    sev_col = {"critical": "1;31", "warning": "1;33", "info": "1;36", "ok": "1;32", "nothing": "1"}
    v = verdict(rep)
    lines = [c(sev_col[v["status"]], v["headline"])]
    if v["first"]:
        lines.append(c("1", f"{v.get('first_label', 'Do this first')}: ") + v["first"] + (f"  ({v['why']})" if v["why"] else ""))
    src = ", ".join(f"{s['name']} ({plural(s['lines_total'], 'line')})" for s in rep.sources)
    lines.append(f"Read {src}; {version_line(rep)}")
    if (judged := span_line(rep)) is not None and not nothing_judged(rep):
        lines.append(judged)
    if nothing_judged(rep):
        return "\n".join(lines) + "\n"
    cards = finding_cards(rep)
    if rep.replicas:  # the fleet: the replica table first, then one finding across replicas
        lines.append("")
        lines.append(c("1", f"Replicas ({sum(1 for r in rep.replicas if r.get('engine') is None)})"))
        rows = [[h for _, h in REPLICA_COLUMNS]] + [replica_cells(r) for r in rep.replicas]
        widths = [max(len(r[i]) for r in rows) for i in range(len(REPLICA_COLUMNS) - 1)]
        for r in rows:
            lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)) + "  " + r[-1])
    if cards:
        lines.append("")
        lines.append(c("1", f"Findings ({len(cards)})"))
    for card in cards:
        f = card["f"]
        lines.append("")
        lines.append(c(sev_col[f.severity], f"{SEV_MARK[f.severity]} {f.rule_id} {f.name}") + f": {card['title']}")
        if card["history"]:
            lines.append(f"  history: {card['history']}")
        if card["replicas"]:
            lines.append(f"  on {plural(len(card['replicas']), 'replica')}: " + ", ".join(r["name"] for r in card["replicas"]))
        when = fmt_span(f.first_seen, f.last_seen)
        if when and not card["replicas"]:
            lines.append(f"  seen {when}")
        for ln in f.message.splitlines():
            lines.append(f"  {ln}")
        for r in card["replicas"][1:]:
            lines.append(f"  {r['name']}" + (f" (seen {r['seen']})" if r["seen"] else "") + f": {r['message']}")
        if f.fixes:
            lines.append(c("1", "  Fix:"))
            for fx in f.fixes:
                label = fix_tag(fx, f.fixes)
                lines.append(f"    {fix_command(fx)}" + (f"   ({label})" if label else ""))
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
                text = e.text if len(e.text) <= 240 else e.text[:239] + "…"
                lines.append(f"    {evidence_at(e, ranges=True)}: {text}")
        if f.rule_id != RULE_ERROR_ID:  # the finding about vllm-doctor itself has no rule to explain
            lines.append(f"  More: vllm-doctor explain {f.name}")
    if rep.startup:
        lines.append("")
        lines.append(c("1", f"Start-up ({plural(len(rep.startup), 'engine start')})"))
        lines.extend(f"  {ln}" for ln in startup_lines(rep.startup))
    seen, dflt = split_facts(rep)
    if seen:
        lines.append("")
        lines.append(c("1", "Facts (from the inputs)"))
        width = max(len(fact_words(k)) for k, _ in seen)
        for k, val in seen:
            lines.append(f"  {fact_words(k):<{width}}  {fact_value(k, val)}")
    if dflt:
        lines.append("")
        lines.append(c("2", "Version defaults (not in the inputs): "
                       + ", ".join(f"{fact_words(k)} {fact_value(k, val)}" for k, val in dflt)))
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
        step += f" ({v['first_size']})" if v.get("first_size") else ""
        out += [f"**{v.get('first_label', 'Do this first')}:** {step}" + (f": {_md(v['why'])}" if v["why"] else ""), ""]
    out += [f"- vLLM: {rep.vllm_version or 'unknown'} ({rep.engine or 'engine unknown'})",
            "- Sources: " + ", ".join(f"`{s['name']}` ({s['lines_total']:,} lines)" for s in rep.sources)]
    if (judged := span_line(rep)) is not None and not nothing_judged(rep):
        out.append(f"- {judged}")
    out.append("")
    if nothing_judged(rep):
        return "\n".join(out) + "\n"
    cards = finding_cards(rep)
    if rep.replicas:  # the fleet: the replica table first
        out += [f"## Replicas ({sum(1 for r in rep.replicas if r.get('engine') is None)})", "",
                "| " + " | ".join(h for _, h in REPLICA_COLUMNS) + " |", "|" + "---|" * len(REPLICA_COLUMNS)]
        out += ["| " + " | ".join(_md(x).replace("|", "\\|") for x in replica_cells(r)) + " |" for r in rep.replicas]
        out.append("")
    if cards:
        out += [f"## Findings ({len(cards)})", ""]
    for card in cards:
        f = card["f"]
        out += [f"### {f.severity.upper()} {f.rule_id} `{f.name}`: {_md(card['title'])}", ""]
        if card["history"]:
            out += [f"_History: {card['history']}._", ""]
        if card["replicas"]:
            out += [f"**On {plural(len(card['replicas']), 'replica')}:** "
                    + ", ".join(f"`{r['name']}`" for r in card["replicas"]), ""]
        when = fmt_span(f.first_seen, f.last_seen)
        if when and not card["replicas"]:
            out += [f"_seen {when}_", ""]
        out += [_md(f.message).replace("\n", "  \n"), ""]
        out += [f"- `{r['name']}`: {_md(r['message'])}" for r in card["replicas"][1:]] + ([""] if card["replicas"][1:] else [])
        if f.fixes:
            out.append("**Fix**")
            out.append("")
            for fx in f.fixes:
                label = fix_tag(fx, f.fixes)
                size = f" ({fix_size(fx)})" if fix_size(fx) else ""
                out.append(f"- `{fx.command()}`{size}{' (' + label + ')' if label else ''}: {_md(fx.why)}"
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
                out.append(f"{evidence_at(e)}: {e.text[:200]}".replace("```", "'''"))
            out.append("```")
            out.append("")
    seen, dflt = split_facts(rep)
    if rep.startup:
        out += ["## Start-up", ""] + [f"- {_md(ln)}" for ln in startup_lines(rep.startup)] + [""]
    if seen:
        out += ["## Facts (from the inputs)", "", "| fact | value |", "|---|---|"]
        out += [f"| {fact_words(k)} | {fact_value(k, val)} |" for k, val in seen]
        out.append("")
    if dflt:
        out += ["<details><summary>Version defaults (not in the inputs)</summary>", "",
                "| fact | default |", "|---|---|"]
        out += [f"| {fact_words(k)} | {fact_value(k, val)} |" for k, val in dflt]
        out += ["", "</details>", ""]
    return "\n".join(out) + "\n"


_env: Environment | None = None


def jinja_env() -> Environment:
    """The package's jinja2 environment (templates/, autoescape on for .html/.j2)."""
    global _env
    if _env is None:
        from jinja2 import Environment, PackageLoader, select_autoescape

        _env = Environment(loader=PackageLoader("vllm_doctor", "templates"),
                           autoescape=select_autoescape(["html", "j2", "htm"], default=True))
        _env.filters["fact"] = lambda v, k: fmt_fact(k, v)
        _env.filters["ts"] = fmt_time
        _env.globals["evidence_at"] = evidence_at
        _env.globals["fix_label"] = fix_tag  # with the evidence grade
        _env.globals["fix_size"] = fix_size
        _env.globals["fact_words"] = fact_words
        _env.globals["fact_value"] = fact_value
    return _env


def to_html(rep: Report) -> str:
    from vllm_doctor.report.timeline import charts, finding_spans

    seen, dflt = split_facts(rep)
    return jinja_env().get_template("report.html.j2").render(
        rep=rep, verdict=verdict(rep), stop=nothing_judged(rep), plural=plural, facts_seen=seen, facts_default=dflt, span=fmt_span,
        version_line=version_line(rep), span_line=None if nothing_judged(rep) else span_line(rep),
        charts=charts(rep.timeline, finding_spans(rep.findings), rep.facts.get("preemptions_total"),
                      # the fleet's series are keyed by replica name
                      names={k: k for k in (rep.timeline or {}).get("series", {})} if rep.replicas else None),
        replica_headers=[h for _, h in REPLICA_COLUMNS], replica_rows=[replica_cells(r) for r in rep.replicas],
        cards=finding_cards(rep), startup_phases=STARTUP_PHASES, secs=fmt_secs)


FORMATS = {"text": to_text, "json": to_json, "markdown": to_markdown, "html": to_html}
