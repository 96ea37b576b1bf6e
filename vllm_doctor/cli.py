"""The ``vllm-doctor`` command (typer). Each command is a thin wrapper over the public API.

Exit codes (vllm_doctor.errors): 0 nothing at or above ``--fail-on`` now; 1 findings at or above it
in the current state (an incident vLLM restarted after and served cleanly since is history);
2 unusable input, usage error or invalid rules (a one-line message on stderr, never a traceback);
3 (diagnose --since / --until) no line of the logs fell in the span: nothing was judged.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
import typer.core

from vllm_doctor.about import __version__
from vllm_doctor.errors import EXIT_FINDINGS, EXIT_NOTHING_IN_RANGE, EXIT_OK, EXIT_USAGE, VllmDoctorError

app = typer.Typer(
    name="vllm-doctor",
    help="Diagnose vLLM incidents from its logs, /metrics and GPU, and name the flag fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command and subcommand inherits it
)


# Help shows what to type, never a Python type: typer would print "<list[Path]>", "<str>",
# "<int range>". An option's metavar when it has one; else click's word for its type (TEXT,
# INTEGER, PATH) or its choices; nothing for a flag or an argument (its name says it). Applies to
# every command, including those added below.
_TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "Path": "PATH", "bool": "",
               "int range": "INTEGER", "float range": "FLOAT", "datetime": "DATETIME", "UUID": "UUID"}
_typer_type = typer.core.TyperOption.display_type


def _help_type(self, ctx) -> str | None:  # noqa: ANN001 - typer's signature
    if isinstance(self, typer.core.TyperArgument):  # its name is its metavar already: never "LOG LOG"
        return None
    if self.metavar is not None:
        return self.metavar or None
    word = (_typer_type(self, ctx) or "").strip("<>")
    if word.startswith("list[") and word.endswith("]"):
        word = word[5:-1]
    if "|" in word:  # choices
        return word
    return _TYPE_WORDS.get(word, word.upper()) or None


typer.core.TyperArgument.display_type_rich = _help_type  # type: ignore[method-assign]
typer.core.TyperOption.display_type_rich = _help_type  # type: ignore[method-assign]


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


def _version(value: bool) -> None:
    if value:
        print(f"vllm-doctor {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[bool | None, typer.Option("--version", callback=_version, is_eager=True, metavar="",
                                                    help="Print vllm-doctor's version and exit.")] = None,
) -> None:
    """Diagnose vLLM incidents from its logs, /metrics and GPU, and name the flag fix."""


def _choice(option: str, enum: type[Enum]):
    """A typer callback: an unknown value of ``option`` is one line on stderr and exit 2 (not a
    usage box with a validation library's wording)."""
    names = [m.value for m in enum]

    def check(value: str | None) -> str | None:
        if value is not None and value not in names:
            _fail(f"{option} {value!r}: expected one of {', '.join(names)}")
        return value

    return check


def _when(text: str | None, option: str) -> float | None:
    """``diagnose --since`` / ``--until`` on logs: the same forms as for ``--prometheus``
    (:func:`vllm_doctor.fleet.parse_time`): a duration before now (``30m``, ``2h``), epoch seconds or
    ISO 8601 (no zone: UTC, as vLLM's log clock is read) -> epoch seconds."""
    if text is None:  # (no import of the fleet package, and its Prometheus client, for nothing)
        return None
    import time

    from vllm_doctor.fleet import parse_time

    try:
        return parse_time(text, time.time())
    except VllmDoctorError as e:
        _fail(f"{option} {text!r}: {e}")


# Options that `diagnose` and `fleet` share (one declaration each).
_FormatOpt = Annotated[str, typer.Option("--format", "-f", metavar="text|json|markdown|html", callback=_choice("--format", Format), help="Report format.")]
_FailOnOpt = Annotated[str, typer.Option("--fail-on", metavar="info|warning|critical|never", callback=_choice("--fail-on", FailOn), help="Exit 1 when a finding at or above this severity exists.")]
_RulesOpt = Annotated[list[Path] | None, typer.Option("--rules", metavar="DIR", help="A directory of extra rule files (repeatable).")]
_OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the report to this file instead of stdout.")]
_BenchOpt = Annotated[str | None, typer.Option("--bench", metavar="RESULT.json", help="A `bench ladder` result of this server: each finding names the level at which it began.")]
_SelectorOpt = Annotated[str | None, typer.Option("--selector", help="--prometheus: label matchers of the vLLM series, e.g. 'namespace=\"prod\", model_name=\"llama\"'.")]
_SinceOpt = Annotated[str | None, typer.Option("--since", help="Judge only what happened from this time: a duration before now (30m, 6h), epoch seconds or ISO 8601 (a log's clock has no zone: read as UTC). With --prometheus the range's start (default: 6h).")]
_UntilOpt = Annotated[str | None, typer.Option("--until", help="Judge only what happened up to this time, as --since. With --prometheus the range's end (default: now).")]
_StepOpt = Annotated[str | None, typer.Option("--step", help="--prometheus: resolution of the range queries. (default: 15s)")]


@app.command()
def diagnose(
    paths: Annotated[list[str] | None, typer.Argument(metavar="LOG", help="vLLM log files (.gz read directly; - for stdin). Several files of one deployment are merged in time order; files of two servers running at once are refused.")] = None,
    format: _FormatOpt = "text",
    fail_on: _FailOnOpt = "warning",
    rules: _RulesOpt = None,
    metrics: Annotated[list[str] | None, typer.Option("--metrics", metavar="FILE", help="A saved vLLM /metrics capture of the same server (repeatable).")] = None,
    output: _OutputOpt = None,
    bench: _BenchOpt = None,
    # --- fleet (issue 13) ---
    prometheus: Annotated[str | None, typer.Option("--prometheus", help="Diagnose every replica from this Prometheus (or Thanos / Mimir) query URL instead of logs (also: vllm-doctor fleet URL). [env: VLLM_DOCTOR_PROMETHEUS_HEADERS='Name: value; ...', VLLM_DOCTOR_PROMETHEUS_TOKEN]")] = None,
    selector: _SelectorOpt = None,
    since: _SinceOpt = None,
    until: _UntilOpt = None,
    step: _StepOpt = None,
    # --- end fleet ---
) -> None:
    """Read vLLM logs to the end (or every replica's series from Prometheus): what happened, what to do
    first, the incidents, the facts."""
    format, fail_on = Format(format), FailOn(fail_on)
    from vllm_doctor.ingest.oneshot import diagnose as run
    from vllm_doctor.findings import SEVERITY_ORDER
    from vllm_doctor.report.render import FORMATS, to_text

    lo, hi = _when(since, "--since"), _when(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        _fail(f"--since {since} is after --until {until}")
    try:
        if prometheus:
            if paths:
                _fail("give log files or --prometheus, not both")
            from vllm_doctor.fleet import diagnose_from_env

            rep = diagnose_from_env(prometheus, selector=selector, since=since, until=until, step=step,
                                    rules_dirs=rules or []).report
        elif selector or step:
            _fail("--selector and --step need --prometheus")
        elif not paths:
            _fail("give a vLLM log file (- for stdin) or --prometheus URL")
        else:
            rep = run(paths, rules_dirs=rules or [], metrics_files=metrics or [], since=lo, until=hi)
    except VllmDoctorError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    if bench:
        from vllm_doctor.loadtest.annotate import BenchFileError, annotate, load_ladder

        try:
            annotate(rep.findings, load_ladder(bench))
        except BenchFileError as e:
            _fail(str(e))
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
        from vllm_doctor.report.render import now_and_history

        level = SEVERITY_ORDER[fail_on.value]
        # the current state's findings: an earlier engine run's incident that vLLM restarted after
        # and has served cleanly since is history (exit 0); restarted and not serving yet, it stands
        current, _, _ = now_and_history(rep)
        if any(SEVERITY_ORDER[f.severity] >= level for f in current):
            raise typer.Exit(EXIT_FINDINGS)
    if rep.nothing_in_range and not rep.findings:  # not "healthy": no line was in the span to judge
        raise typer.Exit(EXIT_NOTHING_IN_RANGE)
    raise typer.Exit(EXIT_OK)


@app.command()
def fleet(
    url: Annotated[str, typer.Argument(metavar="URL", help="A Prometheus (or Thanos / Mimir) query URL, e.g. http://prometheus-operated.monitoring:9090. [env: VLLM_DOCTOR_PROMETHEUS_HEADERS='Name: value; ...', VLLM_DOCTOR_PROMETHEUS_TOKEN]")],
    selector: _SelectorOpt = None,
    since: _SinceOpt = None,
    until: _UntilOpt = None,
    step: _StepOpt = None,
    format: _FormatOpt = "text",
    fail_on: _FailOnOpt = "warning",
    rules: _RulesOpt = None,
    output: _OutputOpt = None,
) -> None:
    """Diagnose every vLLM replica (and data-parallel engine) from Prometheus: the per-replica table,
    each replica's incidents and the fleet rules (imbalance, fleet-wide preemptions and KV saturation,
    latency objectives). The same as `vllm-doctor diagnose --prometheus URL` (docs/fleet.md)."""
    diagnose(paths=None, format=format, fail_on=fail_on, rules=rules, metrics=None, output=output, bench=None,
             prometheus=url, selector=selector, since=since, until=until, step=step)


@app.command()
def events(
    paths: Annotated[list[str], typer.Argument(metavar="LOG", help="vLLM log files (.gz read directly; - for stdin); several are merged in time order.")],
    year: Annotated[int | None, typer.Option("--year", metavar="YEAR", help="Year of vLLM's year-less timestamps (default: each file's modification time).")] = None,
) -> None:
    """Print the typed events read from vLLM logs, one JSON object per line (what the rules see)."""
    import json

    from vllm_doctor.ingest.oneshot import event_dict, events as run

    out = sys.stdout
    try:
        run(paths, lambda e: out.write(json.dumps(event_dict(e), ensure_ascii=False) + "\n"), year=year)
    except VllmDoctorError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    except BrokenPipeError:
        raise typer.Exit(EXIT_OK)


@app.command("rules")
def rules_cmd(
    rules: Annotated[list[Path] | None, typer.Option("--rules", metavar="DIR", help="A directory of extra rule files.")] = None,
    format: Annotated[str, typer.Option("--format", metavar="text|markdown|json", help="Output format.")] = "text",
) -> None:
    """List the rule catalogue."""
    if format not in ("text", "markdown", "json"):
        _fail(f"unknown format {format!r}: text, markdown or json")
    from vllm_doctor.diagnosis import load_rules

    from vllm_doctor.report.docs import CHECK_RUN, FLEET_RUN, check_ruleset, fleet_ruleset

    try:
        rs = load_rules(rules or [])
        fleet = fleet_ruleset(rs)
        check = check_ruleset()
    except VllmDoctorError as e:
        _fail(str(e))
    if format == "markdown":
        from vllm_doctor.report.docs import rules_markdown

        sys.stdout.write(rules_markdown(rs, fleet, check))
        return
    if format == "json":
        import json

        print(json.dumps([{"id": r.id, "name": r.name, "severity": r.severity, "category": r.category,
                           "title": r.title, "window_seconds": None if scope == "fleet" else rs.window_seconds(r),
                           "flags": sorted({f.flag for f in r.fixes}), "scope": scope,
                           "needs": " ".join(r.docs.needs.split()) if r.docs.needs else None}
                          for scope, rules_ in (("deployment", rs.rules), ("fleet", fleet.rules), ("check", check.rules))
                          for r in rules_],
                         indent=2))
        return
    for r in rs.rules:
        win = rs.window_seconds(r)
        w = f"{int(win)}s" if win else "whole log"
        print(f"{r.id}  {r.name:<28} {r.severity:<8} {r.category:<10} {w:<9} {r.title}")
    if fleet.rules:
        print(f"\nFleet rules ({FLEET_RUN}):")
        for r in fleet.rules:
            print(f"{r.id}  {r.name:<28} {r.severity:<8} {r.category:<10} {'range':<9} {r.title}")
            if r.docs.needs:
                print(f"       needs: {' '.join(r.docs.needs.split())}")
    if check.rules:
        print(f"\nCheck rules ({CHECK_RUN}):")
        for r in check.rules:
            print(f"{r.id}  {r.name:<28} {r.severity:<8} {r.category:<10} {'file':<9} {r.title}")


@app.command()
def explain(
    rule: Annotated[str, typer.Argument(metavar="RULE", help="A rule id (VD001, VC010) or name (preemption-storm).")],
    rules: Annotated[list[Path] | None, typer.Option("--rules", metavar="DIR", help="A directory of extra rule files.")] = None,
) -> None:
    """Print a rule's documentation: what it means, why it matters, an example log line, the fix."""
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.report.docs import check_ruleset, explain_text, fleet_ruleset

    try:
        rs = load_rules(rules or [])
        fleet = fleet_ruleset(rs)
        check = check_ruleset()
    except VllmDoctorError as e:
        _fail(str(e))
    r = rs.by_key(rule)
    if r is None and (f := fleet.by_key(rule)) is not None:
        sys.stdout.write(explain_text(f, fleet, fleet=True))
        return
    if r is None and (c := check.by_key(rule)) is not None:  # (VC001 is VD010's alias: VD010 answers it)
        sys.stdout.write(explain_text(c, check))
        return
    if r is None:
        _fail(f"no rule {rule!r}; `vllm-doctor rules` lists them")
    sys.stdout.write(explain_text(r, rs))


@app.command()
def version() -> None:
    """Print vllm-doctor's version."""
    print(f"vllm-doctor {__version__}")


@app.command()
def export(
    kind: Annotated[str, typer.Argument(metavar="KIND", help="alerts | dashboards | prometheus-rule | alertmanager | "
                                                           "fleet-dashboard | replicas-dashboard")],
) -> None:
    """Print a monitoring artefact: alert rules, dashboards, PrometheusRule, Alertmanager routing."""
    if kind == "alertmanager":  # hand-written (alerts/alertmanager.yml), shipped as package data
        from importlib import resources

        sys.stdout.write(resources.files("vllm_doctor").joinpath("data/alertmanager.yml").read_text())
        return
    try:
        from vllm_doctor.monitoring.bundle import export as bundle_export
    except ImportError as e:  # pragma: no cover - packaging error
        _fail(f"monitoring bundle unavailable: {e}")
    try:
        sys.stdout.write(bundle_export(kind))
    except (KeyError, ValueError):
        from vllm_doctor.monitoring.bundle import KINDS

        _fail(f"unknown export {kind!r}: one of {', '.join((*KINDS, 'alertmanager'))}")


# --- serve/watch (issue 3) ---
def _serve_flags(**kw: object) -> dict:
    """Only the options given on the command line (None = not given: env / config file decide)."""
    return {k: (v if not isinstance(v, list) else [str(x) for x in v]) for k, v in kw.items()
            if v is not None and v != []}


@app.command()
def serve(
    log: Annotated[list[str] | None, typer.Option("--log", metavar="FILE", help="vLLM log file to follow (repeatable; - reads stdin). [env: VLLM_DOCTOR_LOGS, comma-separated]")] = None,
    metrics_url: Annotated[str | None, typer.Option("--metrics-url", metavar="URL", help="vLLM's /metrics URL, or 'none'. (default: http://127.0.0.1:8000/metrics)")] = None,
    nvml: Annotated[bool | None, typer.Option("--nvml/--no-nvml", metavar="", help="Poll the GPUs through NVML. (default: on)")] = None,
    host: Annotated[str | None, typer.Option("--host", metavar="ADDR", help="Address to serve on. (default: 0.0.0.0)")] = None,
    port: Annotated[int | None, typer.Option("--port", metavar="PORT", help="Port to serve on. (default: 9401)")] = None,
    from_start: Annotated[bool | None, typer.Option("--from-start/--from-end", metavar="", help="Read files present at start from their beginning (default: from their end).")] = None,
    state_file: Annotated[str | None, typer.Option("--state-file", metavar="FILE", help="Offset checkpoint file: a restarted sidecar neither loses nor re-reads lines.")] = None,
    rules: Annotated[list[Path] | None, typer.Option("--rules", metavar="DIR", help="A directory of extra rule files (repeatable).")] = None,
    eval_interval: Annotated[float | None, typer.Option("--eval-interval", metavar="SECONDS", help="Seconds between rule evaluations. (default: 5)")] = None,
    config: Annotated[Path | None, typer.Option("--config", metavar="FILE", help="YAML file of settings (flags and VLLM_DOCTOR_* variables win). [env: VLLM_DOCTOR_CONFIG]")] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", metavar="LEVEL", help="debug | info | warning | error | critical. (default: info)")] = None,
    bench: Annotated[str | None, typer.Option("--bench", metavar="RESULT.json", help="A `bench ladder` result of this server: each finding names the level at which it began.")] = None,
) -> None:
    """Run the sidecar: follow vLLM's log, scrape its /metrics, poll NVML; serve /metrics, /healthz,
    /readyz, /api/findings, /api/state and a live page. Stops cleanly on SIGTERM."""
    from vllm_doctor.export.serve import load_config, run

    try:
        cfg = load_config(_serve_flags(logs=log, metrics_url=metrics_url, nvml=nvml, host=host, port=port,
                                       from_start=from_start, state_file=state_file, rules=rules,
                                       eval_interval=eval_interval, log_level=log_level, bench=bench),
                          config_file=config)
        code = run(cfg)
    except VllmDoctorError as e:
        _fail(str(e))
    raise typer.Exit(code)


@app.command()
def watch(
    log: Annotated[list[str] | None, typer.Argument(metavar="LOG", help="vLLM log file(s) to follow (- reads stdin).")] = None,
    metrics_url: Annotated[str | None, typer.Option("--metrics-url", metavar="URL", help="vLLM's /metrics URL (default: none).")] = None,
    nvml: Annotated[bool, typer.Option("--nvml/--no-nvml", metavar="", help="Show the GPUs through NVML.")] = True,
    interval: Annotated[float, typer.Option("--interval", metavar="SECONDS", help="Seconds between refreshes.")] = 2.0,
    from_start: Annotated[bool, typer.Option("--from-start/--from-end", metavar="", help="Read the log from its beginning first (default), or only what comes next.")] = True,
    rules: Annotated[list[Path] | None, typer.Option("--rules", metavar="DIR", help="A directory of extra rule files (repeatable).")] = None,
    once: Annotated[bool, typer.Option("--once", metavar="", help="Print one frame and exit.")] = False,
) -> None:
    """A live terminal view of running / waiting, KV cache usage, preemptions, GPU memory and the
    active findings."""
    from vllm_doctor.export.serve import load_config
    from vllm_doctor.report.watch import watch as run_watch

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


# --- plan/check (issue 12) ---
def _warn_newer(version: str | None) -> None:
    """One line on stderr when ``--vllm-version`` is newer than any known release (a typo, or a
    release after vllm-doctor's tables): which known release it is judged as."""
    from vllm_doctor.versions import newer_than_known

    if (msg := newer_than_known(version)) is not None:
        print(f"vllm-doctor: warning: {msg}", file=sys.stderr)


@app.command()
def plan(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="config.json, a model directory or a Hugging Face cache directory (never downloads).")],
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", metavar="SIZE", help="Memory of one GPU (80GiB, 24G, 81559MiB). Default: read through NVML.")] = None,
    gpu_name: Annotated[str | None, typer.Option(
        "--gpu-name", metavar="NAME",
        help="The GPU's name (A100, H100, ...): vLLM's defaults differ by GPU. Default: NVML's, where NVML is read.")] = None,
    vllm_version: Annotated[str, typer.Option("--vllm-version", metavar="X.Y.Z", help="vLLM version whose accounting and defaults to use.")] = "0.33.0",
    device: Annotated[str, typer.Option("--device", metavar="cuda|cpu", help="cuda or cpu (the CPU backend: block size 128, KV cache from --kv-cache-memory-bytes).")] = "cuda",
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp", metavar="N", min=1, help="GPUs per pipeline stage.")] = 1,
    pipeline_parallel_size: Annotated[int, typer.Option("--pipeline-parallel-size", "-pp", metavar="N", min=1, help="Pipeline stages.")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", metavar="DTYPE", help="Weight dtype; auto: the config's (float32 served as bfloat16 on GPU).")] = "auto",
    quantization: Annotated[str | None, typer.Option("--quantization", "-q", metavar="METHOD", help="fp8, awq, gptq, bitsandbytes, mxfp4, nvfp4. Default: the config's quantization_config.")] = None,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", metavar="DTYPE", help="auto (the model dtype), fp8, ...")] = "auto",
    mamba_cache_dtype: Annotated[str, typer.Option("--mamba-cache-dtype", metavar="DTYPE", help="Hybrid models: dtype of the Mamba / linear-attention state.")] = "auto",
    mamba_ssm_cache_dtype: Annotated[str, typer.Option("--mamba-ssm-cache-dtype", metavar="DTYPE", help="Hybrid models: dtype of the SSM (temporal) state.")] = "auto",
    enable_prefix_caching: Annotated[bool | None, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Hybrid models: prefix caching changes the Mamba cache mode (default: the version's).")] = None,
    block_size: Annotated[int | None, typer.Option("--block-size", metavar="TOKENS", min=1, help="Default: the version's (16; 128 on the CPU backend).")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", metavar="TOKENS", min=1, help="Default: the config's max_position_embeddings.")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option("--gpu-memory-utilization", metavar="RATIO", min=0.01, max=1.0, help="Default: the version's (0.9; 0.92 from 0.20).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs", metavar="N", min=1, help="Default: the version's (V1: 1024 on GPUs of 70 GiB or more, else 256).")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens", metavar="TOKENS", min=1, help="Default: the version's (V1: 8192 on GPUs of 70 GiB or more, else 2048).")] = None,
    kv_cache_memory_bytes: Annotated[str | None, typer.Option("--kv-cache-memory-bytes", metavar="SIZE", help="KV cache size as vLLM takes it (skips the profiling formula).")] = None,
    overhead: Annotated[str | None, typer.Option("--overhead", metavar="SIZE", help="Measured activation peak + non-torch memory per GPU (default: estimated).")] = None,
    target_concurrency: Annotated[int | None, typer.Option("--target-concurrency", metavar="N", min=1, help="Requests at max_model_len to hold at once.")] = None,
    mean_request_tokens: Annotated[int | None, typer.Option("--mean-request-tokens", metavar="TOKENS", min=1, help="Mean prompt + output tokens of a request.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="N", min=1, help="GPUs there are: a recommended TP x PP stays within them (default: TP up to 16 is tried).")] = None,
    sampler: Annotated[str, typer.Option(
        "--sampler", metavar="native|flashinfer",
        help="V1's top-k/top-p sampler, whose profiling run is most of the activation peak: native (PyTorch; "
             "pip install vllm) or flashinfer (FlashInfer installed, as in the vllm/vllm-openai image; about a "
             "third of the memory).")] = "native",
    disable_custom_all_reduce: Annotated[bool, typer.Option(
        "--disable-custom-all-reduce",
        help="vLLM's flag (or GPUs without P2P / on other nodes, where vLLM turns it off itself): no custom "
             "all-reduce buffers in the non-torch estimate with TP.")] = False,
    enable_lora: Annotated[bool, typer.Option(
        "--enable-lora",
        help="vLLM's flag: its LoRA slots (--max-loras x --max-lora-rank on every linear layer, the embedding "
             "and lm_head) are added to the weights; LoRA's share of the profiling run is named as not sized.")] = False,
    max_loras: Annotated[int, typer.Option(
        "--max-loras", metavar="N", min=1, help="With --enable-lora: LoRA slots per batch (vLLM's default 1).")] = 1,
    max_lora_rank: Annotated[int, typer.Option(
        "--max-lora-rank", metavar="RANK", min=1, help="With --enable-lora: the rank of each slot (vLLM's default 16).")] = 16,
    entrypoint: Annotated[str, typer.Option(
        "--entrypoint", metavar="server|llm",
        help="How vLLM is started: server (vllm serve) or llm (the offline LLM() class, whose V1 default "
             "max_num_batched_tokens is larger: 16384 / 8192 against 8192 / 2048).")] = "server",
    engine: Annotated[str | None, typer.Option("--engine", metavar="v0|v1", help="The engine the server runs (default: VLLM_USE_V1 if set, else the version's: V0 before 0.8.0, V1 from 0.8.0, the only one from 0.11.0).")] = None,
    format: Annotated[str, typer.Option("--format", "-f", metavar="text|json|markdown", help="Output format.")] = "text",
) -> None:
    """Capacity before launch: weights, KV bytes per token, KV cache blocks and tokens, concurrency,
    whether start-up fails, and the flags for a target, with the arithmetic shown.
    Exit 1 when start-up would fail."""
    from vllm_doctor.plan import planner as planmod
    if format not in planmod.FORMATS:
        _fail(f"unknown format {format!r}: text, json or markdown")
    if device not in ("cuda", "cpu"):
        _fail(f"unknown device {device!r}: cuda or cpu")
    from vllm_doctor.versions import parse_version

    if parse_version(vllm_version) is None:
        _fail(f"not a vLLM version: {vllm_version!r} (e.g. 0.11.0)")
    _warn_newer(vllm_version)
    try:
        cfg, name = planmod.load_config(model)
        kvb = planmod.parse_size(kv_cache_memory_bytes) if kv_cache_memory_bytes else None
        mem = planmod.parse_size(gpu_memory) if gpu_memory else (None if kvb is not None else planmod.nvml_total_memory())
        if gpu_name is None and not gpu_memory and kvb is None:
            gpu_name = planmod.nvml_gpu_name()
        p = planmod.make_plan(planmod.PlanInputs(
            config=cfg, model=name, gpu_memory_bytes=mem, gpu_name=gpu_name, vllm_version=vllm_version, device=device,
            tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size, dtype=dtype,
            quantization=quantization, kv_cache_dtype=kv_cache_dtype, mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_cache_dtype, enable_prefix_caching=enable_prefix_caching,
            block_size=block_size, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory_bytes=kvb,
            overhead_bytes=planmod.parse_size(overhead) if overhead else None,
            target_concurrency=target_concurrency, mean_request_tokens=mean_request_tokens, gpu_count=gpus,
            engine=engine, vllm_use_v1=os.environ.get("VLLM_USE_V1") or None, sampler=sampler,
            entrypoint=entrypoint, disable_custom_all_reduce=disable_custom_all_reduce, enable_lora=enable_lora,
            max_loras=max_loras, max_lora_rank=max_lora_rank))
    except VllmDoctorError as e:
        _fail(str(e))
    sys.stdout.write(planmod.FORMATS[format](p))
    raise typer.Exit(EXIT_FINDINGS if p.startup["fails"] else EXIT_OK)

@app.command()
def check(
    paths: Annotated[list[str], typer.Argument(metavar="FILE", help="Launch configs or monitoring files (- for stdin): shell / docker run / vllm serve lines, docker-compose, Kubernetes, CI YAML, .env, Dockerfile, vLLM --config YAML, Prometheus rules, PromQL, Grafana JSON.")],
    vllm_version: Annotated[str | None, typer.Option("--vllm-version", metavar="X.Y.Z", help="Target vLLM version (default: the vllm/vllm-openai:vX.Y.Z image tag, else the newest known).")] = None,
    model_config: Annotated[str | None, typer.Option("--model-config", metavar="PATH", help="The served model's config.json (file, model dir or HF cache dir) for capacity checks.")] = None,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", metavar="SIZE", help="Memory of one GPU (80GiB) for capacity checks.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", metavar="text|json|sarif|github", help="Output format.")] = "text",
    fail_on: Annotated[str, typer.Option("--fail-on", metavar="error|warning|note|never", help="Exit 1 when a finding is at or above this level.")] = "error",
    mean_request_tokens: Annotated[int | None, typer.Option("--mean-request-tokens", metavar="TOKENS", min=1, help="Mean prompt + output tokens of a request: the capacity check (VC010) sizes --max-num-seqs at it (without it, only the worst case of max_model_len is stated, as a note).")] = None,
) -> None:
    """Lint a vLLM launch config or vLLM monitoring before it reaches a GPU. Exit 1 on findings at or
    above --fail-on, 2 on unusable input."""
    from vllm_doctor import check as chk
    from vllm_doctor.plan import planner as planmod
    if format not in chk.FORMATS:
        _fail(f"unknown format {format!r}: text, json, sarif or github")
    if fail_on not in ("error", "warning", "note", "never"):
        _fail(f"unknown --fail-on {fail_on!r}: error, warning, note or never")
    from vllm_doctor.versions import parse_version

    if vllm_version is not None and parse_version(vllm_version) is None:
        _fail(f"not a vLLM version: {vllm_version!r} (e.g. 0.11.0)")
    _warn_newer(vllm_version)
    try:
        cfg = planmod.load_config(model_config)[0] if model_config else None
        mem = planmod.parse_size(gpu_memory) if gpu_memory else None
        if cfg is not None and mem is None:
            try:
                mem = planmod.nvml_total_memory()       # as plan does; on a machine without a GPU, say what is skipped
            except VllmDoctorError:
                print("vllm-doctor: --model-config without --gpu-memory (and no GPU through NVML): the capacity "
                      "check (VC010) runs only on launches that set --kv-cache-memory-bytes", file=sys.stderr)
        results = chk.check_files(paths, vllm_version=vllm_version, model_config=cfg, gpu_memory=mem,
                                  mean_request_tokens=mean_request_tokens)
    except VllmDoctorError as e:
        _fail(str(e))
    sys.stdout.write(chk.FORMATS[format](results))
    if fail_on != "never" and chk.worst(results) >= chk.LEVEL_ORDER[fail_on]:
        raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_OK)
# --- end plan/check ---


# --- bench (issue 14) ---
from vllm_doctor.loadtest.cli import bench_app  # noqa: E402

app.add_typer(bench_app, name="bench")
# --- end bench ---


def main() -> None:
    """Console-script entry point. An unexpected error is one line on stderr and exit 2
    (VLLM_DOCTOR_DEBUG=1 shows the traceback)."""
    import os

    try:
        app(prog_name="vllm-doctor")
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
