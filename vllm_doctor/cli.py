"""The ``vllm-doctor`` command (typer). Each command is a thin wrapper over the public API.

Exit codes (vllm_doctor.errors): 0 nothing at or above ``--fail-on``; 1 findings at or above it;
2 unusable input, usage error or invalid rules (a one-line message on stderr, never a traceback).
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__
from .errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, VllmDoctorError

app = typer.Typer(
    name="vllm-doctor",
    help="Diagnose vLLM incidents from its logs, /metrics and GPU, and name the flag fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"


class FailOn(str, Enum):
    info = "info"
    warning = "warning"
    critical = "critical"
    never = "never"


def _fail(msg: str) -> None:
    print(f"vllm-doctor: {msg}", file=sys.stderr)
    raise typer.Exit(EXIT_USAGE)


def _when(text: str | None, option: str) -> float | None:
    """``--since`` / ``--until``: an ISO time (no zone: UTC, as vLLM's log clock is read) or a
    duration before now (``90s``, ``30m``, ``2h``, ``1d``, ``1w``) -> epoch seconds."""
    import re
    import time
    from datetime import datetime, timezone

    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m:
        return time.time() - float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m[2]]
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        _fail(f"{option} {text!r}: not a time (2026-03-22T16:50, 2026-03-22 16:50:00) nor a duration (30m, 2h, 1d)")
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


@app.command()
def diagnose(
    paths: Annotated[list[str], typer.Argument(help="vLLM log files (.gz read directly; - for stdin). Several files of one deployment are merged in time order.")],
    format: Annotated[Format, typer.Option("--format", "-f", help="Report format.")] = Format.text,
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="Exit 1 when a finding at or above this severity exists.")] = FailOn.warning,
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="A directory of extra rule files (repeatable).")] = None,
    metrics: Annotated[Optional[list[str]], typer.Option("--metrics", help="A saved vLLM /metrics capture of the same server (repeatable).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file instead of stdout.")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Judge only what happened from this time: ISO (2026-03-22T16:50, read as the log's clock, which vLLM prints without a zone) or a time before now (30m, 2h, 1d).")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Judge only what happened up to this time (same forms as --since).")] = None,
) -> None:
    """Read vLLM logs to the end; report the facts, the incidents and the flag fixes."""
    from .oneshot import diagnose as run
    from .findings import SEVERITY_ORDER
    from .report import FORMATS, to_text

    lo, hi = _when(since, "--since"), _when(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        _fail(f"--since {since} is after --until {until}")
    try:
        rep = run(paths, rules_dirs=rules or [], metrics_files=metrics or [], since=lo, until=hi)
    except VllmDoctorError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    for rid, errs in rep.rule_errors.items():
        print(f"vllm-doctor: rule {rid}: expression failed: {errs[-1]}", file=sys.stderr)
    if format == Format.text:
        text = to_text(rep, color=output is None and sys.stdout.isatty())
    else:
        text = FORMATS[format.value](rep)
    if output:
        try:
            output.write_text(text)
        except OSError as e:
            _fail(f"{output}: cannot write: {e.strerror}")
    else:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            pass
    if fail_on != FailOn.never:
        level = SEVERITY_ORDER[fail_on.value]
        if any(SEVERITY_ORDER[f.severity] >= level for f in rep.findings):
            raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_OK)


@app.command("rules")
def rules_cmd(
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="A directory of extra rule files.")] = None,
    format: Annotated[str, typer.Option("--format", help="text, markdown or json")] = "text",
) -> None:
    """List the rule catalogue."""
    if format not in ("text", "markdown", "json"):
        _fail(f"unknown format {format!r}: text, markdown or json")
    from .diagnosis import load_rules

    try:
        rs = load_rules(rules or [])
    except VllmDoctorError as e:
        _fail(str(e))
    if format == "markdown":
        from .docs import rules_markdown

        sys.stdout.write(rules_markdown(rs))
        return
    if format == "json":
        import json

        print(json.dumps([{"id": r.id, "name": r.name, "severity": r.severity, "category": r.category,
                           "title": r.title, "window_seconds": rs.window_seconds(r),
                           "flags": sorted({f.flag for f in r.fixes})} for r in rs.rules], indent=2))
        return
    for r in rs.rules:
        win = rs.window_seconds(r)
        w = f"{int(win)}s" if win else "whole log"
        print(f"{r.id}  {r.name:<28} {r.severity:<8} {r.category:<10} {w:<9} {r.title}")


@app.command()
def explain(
    rule: Annotated[str, typer.Argument(help="A rule id (VD001) or name (preemption-storm).")],
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="A directory of extra rule files.")] = None,
) -> None:
    """Print a rule's documentation: what it means, why it matters, an example log line, the fix."""
    from .diagnosis import load_rules
    from .docs import explain_text

    try:
        rs = load_rules(rules or [])
    except VllmDoctorError as e:
        _fail(str(e))
    r = rs.by_key(rule)
    if r is None:
        _fail(f"no rule {rule!r}; `vllm-doctor rules` lists them")
    sys.stdout.write(explain_text(r, rs))


@app.command()
def version() -> None:
    """Print vllm-doctor's version."""
    print(f"vllm-doctor {__version__}")


@app.command()
def export(
    kind: Annotated[str, typer.Argument(help="alerts | dashboards | prometheus-rule | alertmanager")],
) -> None:
    """Print a generated monitoring artefact (Prometheus alert rules, Grafana dashboards, ...)."""
    try:
        from .bundle import export as bundle_export
    except ImportError as e:  # pragma: no cover - packaging error
        _fail(f"monitoring bundle unavailable: {e}")
    try:
        sys.stdout.write(bundle_export(kind))
    except (KeyError, ValueError) as e:
        _fail(f"unknown export {kind!r}: {e}")


# --- serve/watch (issue 3) ---
def _serve_flags(**kw: object) -> dict:
    """Only the options given on the command line (None = not given: env / config file decide)."""
    return {k: (v if not isinstance(v, list) else [str(x) for x in v]) for k, v in kw.items()
            if v is not None and v != []}


@app.command()
def serve(
    log: Annotated[Optional[list[str]], typer.Option("--log", help="vLLM log file to follow (repeatable; - reads stdin). [env: VLLM_DOCTOR_LOGS, comma-separated]")] = None,
    metrics_url: Annotated[Optional[str], typer.Option("--metrics-url", help="vLLM's /metrics URL, or 'none'. (default: http://127.0.0.1:8000/metrics)")] = None,
    nvml: Annotated[Optional[bool], typer.Option("--nvml/--no-nvml", help="Poll the GPUs through NVML. (default: on)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="Address to serve on. (default: 0.0.0.0)")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="Port to serve on. (default: 9401)")] = None,
    from_start: Annotated[Optional[bool], typer.Option("--from-start/--from-end", help="Read files present at start from their beginning (default: from their end).")] = None,
    state_file: Annotated[Optional[str], typer.Option("--state-file", help="Offset checkpoint file: a restarted sidecar neither loses nor re-reads lines.")] = None,
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="A directory of extra rule files (repeatable).")] = None,
    eval_interval: Annotated[Optional[float], typer.Option("--eval-interval", help="Seconds between rule evaluations. (default: 5)")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="YAML file of settings (flags and VLLM_DOCTOR_* variables win). [env: VLLM_DOCTOR_CONFIG]")] = None,
    log_level: Annotated[Optional[str], typer.Option("--log-level", help="debug | info | warning | error. (default: info)")] = None,
) -> None:
    """Run the sidecar: follow vLLM's log, scrape its /metrics, poll NVML; serve /metrics, /healthz,
    /readyz, /api/findings, /api/state and a live page. Stops cleanly on SIGTERM."""
    from .serve import load_config, run

    try:
        cfg = load_config(_serve_flags(logs=log, metrics_url=metrics_url, nvml=nvml, host=host, port=port,
                                       from_start=from_start, state_file=state_file, rules=rules,
                                       eval_interval=eval_interval, log_level=log_level), config_file=config)
        code = run(cfg)
    except VllmDoctorError as e:
        _fail(str(e))
    raise typer.Exit(code)


@app.command()
def watch(
    log: Annotated[Optional[list[str]], typer.Argument(help="vLLM log file(s) to follow (- reads stdin).")] = None,
    metrics_url: Annotated[Optional[str], typer.Option("--metrics-url", help="vLLM's /metrics URL (default: none).")] = None,
    nvml: Annotated[bool, typer.Option("--nvml/--no-nvml", help="Show the GPUs through NVML.")] = True,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    from_start: Annotated[bool, typer.Option("--from-start/--from-end", help="Read the log from its beginning first (default), or only what comes next.")] = True,
    rules: Annotated[Optional[list[Path]], typer.Option("--rules", help="A directory of extra rule files (repeatable).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """A live terminal view of running / waiting, KV cache usage, preemptions, GPU memory and the
    active findings."""
    from .serve import load_config
    from .watch import watch as run_watch

    if not log and not metrics_url:
        _fail("give a log file (or - for stdin) or --metrics-url")
    try:
        cfg = load_config(_serve_flags(logs=log, metrics_url=metrics_url or "none", nvml=nvml,
                                       from_start=from_start, rules=rules), env={})
        code = run_watch(cfg, interval=interval, once=once)
    except VllmDoctorError as e:
        _fail(str(e))
    raise typer.Exit(code)
# --- end serve/watch ---


def main() -> None:
    """Console-script entry point. An unexpected error is one line on stderr and exit 2
    (VLLM_DOCTOR_DEBUG=1 shows the traceback)."""
    import os

    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback
        if os.environ.get("VLLM_DOCTOR_DEBUG"):
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"vllm-doctor: internal error: {type(e).__name__}: {msg} (VLLM_DOCTOR_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
