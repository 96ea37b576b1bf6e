"""``vllm-doctor bench``: ``ladder`` (the highest level within the objectives, and the knee),
``compare`` (judge a tuning step) and ``chart`` (re-render a saved ladder).

Exit codes:
- ladder: 0 every request completed; 1 some requests failed (the result is still written);
  2 unusable input or an unreachable server (one line on stderr).
- compare: 0 every indicator PASSes; 1 at least one FAILs; 3 none fails but one is UNKNOWN (a
  file that does not record it, e.g. preemptions in a ``vllm bench serve`` result); 2 unusable input,
  or unlike runs (level, tool, model, workload, vLLM version) without ``--allow-unlike``.
- chart: 0 written; 2 unusable input (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from vllm_doctor.catalogue import V
from vllm_doctor.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

EXIT_UNKNOWN = 3
MAX_TOTAL_REQUESTS = 100_000

bench_app = typer.Typer(help="Prove a tuning step: a concurrency ladder, and a before/after comparison.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _fail(msg: str) -> None:
    print(f"vllm-doctor bench: {msg}", file=sys.stderr)
    raise typer.Exit(EXIT_USAGE)


def _levels(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        _fail(f"--levels {text!r}: comma-separated positive integers, e.g. 8,16,32,64")
    if not out or any(c < 1 for c in out):
        _fail(f"--levels {text!r}: comma-separated positive integers, e.g. 8,16,32,64")
    return out


def _rates(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        out = []
    if not out or any(not (0 < r < 1e6) for r in out):
        _fail(f"--rates {text!r}: comma-separated positive request rates (per second), e.g. 1,2,4,8")
    return out


def _prompts(path: Path) -> list[str]:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"{path}: cannot read ({getattr(e, 'strerror', None) or type(e).__name__})")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
                line = obj.get("prompt") or obj.get("text") or ""
            except ValueError:
                pass
        if line:
            out.append(line)
    if not out:
        _fail(f"{path}: no prompt (one per line, or JSON lines with a \"prompt\" field)")
    return out


class OutFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


def _fmt(v, spec="{:,.1f}") -> str:
    return "–" if v is None else spec.format(v)


def ladder_table(result: dict) -> str:
    rate = any(lv.get("request_rate") is not None for lv in result["levels"])
    head = (f"{'rate/s' if rate else 'conc':>6} {'done':>9} {'out tok/s':>10} {'req/s':>7} {'goodput':>8} {'TTFT p99':>9} "
            f"{'TPOT':>7} {'ITL p99':>8} {'E2E p99':>8} {'preempt':>8} {'KV max':>7} {'run':>5} {'wait':>5}")
    rows = [head]
    for lv in result["levels"]:
        kv = lv["max_kv_cache_usage_ratio"]
        rows.append(
            f"{_place(lv):>6} {lv['completed']:>4}/{lv['requests']:<4} {_fmt(lv['output_throughput']):>10} "
            f"{_fmt(lv['request_throughput'], '{:.2f}'):>7} {_fmt(lv['goodput'], '{:.2f}'):>8} "
            f"{_fmt(lv['ttft_ms']['p99'], '{:,.0f}'):>6} ms {_fmt(lv['tpot_ms']['mean']):>4} ms "
            f"{_fmt(lv['itl_ms']['p99'], '{:,.0f}'):>5} ms {_fmt(lv['e2el_ms']['p99'], '{:,.0f}'):>5} ms "
            f"{'unknown' if lv['preemptions'] is None else lv['preemptions']:>8} "
            f"{'–' if kv is None else f'{kv * 100:.0f} %':>7} {_fmt(lv['max_running'], '{:.0f}'):>5} "
            f"{_fmt(lv['max_waiting'], '{:.0f}'):>5} {_limit(lv):>8}")
    rows[0] += f" {'limit':>8}"
    return "\n".join(rows)


def _place(lv: dict) -> str:
    rate = lv.get("request_rate")
    return f"{rate:g}" if rate is not None else str(lv["concurrency"])


def _limit(lv: dict) -> str:
    return {"kv-cache": "KV cache", "queue": "queue", "compute": "compute"}.get(lv.get("limited_by") or "", "–")


def objectives_table(result: dict) -> str:
    """Each objective per level: p99 [95 % bootstrap interval] and PASS / FAIL / UNDECIDED."""
    from vllm_doctor.loadtest.objectives import METRICS, Objectives

    obj = Objectives(**(result.get("objectives") or {}))
    names = [n for n, _ in obj.items()]
    lines = [f"Objectives: {obj.describe()} (p99 [95 % bootstrap interval]; UNDECIDED: the interval "
             f"straddles the objective)"]
    rate = any(lv.get("request_rate") is not None for lv in result["levels"])
    lines.append(f"{'rate/s' if rate else 'conc':>6} " + " ".join(f"{METRICS[n][2]:>30}" for n in names) + f" {'level':>10}")
    for lv in result["levels"]:
        cells = []
        for n in names:
            v = (lv.get("objectives") or {}).get(n) or {}
            if v.get("value_ms") is None:
                cells.append(f"{'–':>30}")
                continue
            ci = ("" if v.get("ci_low_ms") is None else
                  f" [{v['ci_low_ms']:,.0f}-{v['ci_high_ms']:,.0f}]")
            cells.append(f"{v['value_ms']:,.0f}{ci} ms {v['status']:<9}".rjust(30))
        lines.append(f"{_place(lv):>6} " + " ".join(cells) + f" {lv.get('meets_objectives') or '–':>10}")
    return "\n".join(lines)


def _run_and_print(cfg, output: Path | None, chart: Path | None, format: OutFormat) -> None:
    """Run the ladder, write the result and chart, print the tables and the recommendation; exit."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vllm_doctor.loadtest.chart import html_page, ladder_svg
    from vllm_doctor.loadtest.ladder import BenchError, level_name, run_ladder
    from vllm_doctor.loadtest.simulated import SIMULATION_NOTE

    total = sum(cfg.requests_for(int(c)) or 0 for c in cfg.level_values())
    if total > MAX_TOTAL_REQUESTS:
        _fail(f"{total:,} requests in all is over the limit of {MAX_TOTAL_REQUESTS:,}")
    err = Console(stderr=True)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=err,
                        disable=not err.is_terminal)  # not a terminal (CI): one plain line per level
    state: dict = {}

    def start(c: float, n: int | None):
        what = f"rate {c:>5g}/s" if cfg.rates else f"concurrency {c:>4g}"
        state["task"] = progress.add_task(what, total=n, status="")
        state["errors"] = 0

    def one(res):
        if not res.ok:
            state["errors"] += 1
        progress.update(state["task"], advance=1,
                        status=f"[red]{state['errors']} failed" if state["errors"] else "")

    def done(level):
        p99 = level.ttft_ms.get("p99")
        status = (f"{level.output_throughput:,.0f} tok/s, TTFT p99 {'–' if p99 is None else f'{p99:,.0f} ms'}, "
                  f"preemptions {'unknown' if level.preemptions is None else level.preemptions}")
        progress.update(state["task"], status=status)
        if progress.disable:
            print(f"vllm-doctor bench: {level_name(level)}: {level.completed}/{level.requests} "
                  f"completed, {status}" + (f" ({level.stop_reason})" if level.stop_reason else ""),
                  file=sys.stderr, flush=True)

    try:
        with progress:
            import asyncio  # (here: every other command, and each start of the CLI, goes without it)

            result = asyncio.run(run_ladder(cfg, start, one, done))
    except BenchError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    text = json.dumps(result, indent=1)
    for path, body in ((output, text + "\n"), (chart, None)):
        if path is None:
            continue
        if body is None:
            body = ladder_svg(result) if path.suffix.lower() == ".svg" else html_page(result)
        try:
            path.write_text(body)
        except OSError as e:
            _fail(f"{path}: cannot write: {e.strerror}")
    if format == OutFormat.json:
        sys.stdout.write(text + "\n")
    else:
        if result.get("simulated"):
            print(SIMULATION_NOTE)
        print(f"vllm-doctor bench ladder: {result['url']} model {result['model']}")
        print(f"Workload: {result.get('workload')}; warm-up left out: the first requests of each level "
              f"({', '.join(str(lv_.get('warmup_requests', 0)) for lv_ in result['levels'])})")
        if result.get("kv_cache_tokens"):
            print(f"KV cache: {result['kv_cache_tokens']:,} tokens ({V.cache_config_info})")
        if result.get("metrics_error"):
            print(f"/metrics not read ({result['metrics_error']}): preemptions and KV usage unknown")
        elif (result.get("metrics_reads") or {}).get("failed"):
            mr = result["metrics_reads"]
            print(f"/metrics: {mr['failed']} of {mr['ok'] + mr['failed']} reads failed ({mr['last_error']}); "
                  f"the server's figures come from the other {mr['ok']}")
        print(ladder_table(result))
        print("\n" + objectives_table(result))
        print("\n" + server_table(result))
        for lv_ in result["levels"]:
            if lv_.get("stop_reason"):
                print(f"  {level_name(lv_)}: stopped sending after {lv_['requests']} measured requests: {lv_['stop_reason']}")
        for lv_ in result["levels"]:
            if lv_["errors"]:
                print(f"  {level_name(lv_)}: {lv_['errors']} of {lv_['requests']} failed: "
                      + "; ".join(lv_["error_examples"]))
        if result.get("stopped"):
            print(f"Ladder {result['stopped']}")
        k = result["knee"]
        where = "none" if k["concurrency"] is None else (f"{k['concurrency']:g}" if k.get("found") else f">= {k['concurrency']:g}")
        print(f"\nKnee: {where}: {k['reason']} (a separate fact: the recommendation follows the objectives)")
        rec = result["recommendation"]
        if rec["value"] is not None and rec["flag"]:
            print(f"Do this: {rec['flag']} {rec['value']:g}\n  why: {rec['why']}")
        elif rec["value"] is not None:
            print(f"Capacity: {rec['value']:g} requests/s\n  why: {rec['why']}")
        else:
            print(f"No recommendation: {rec['why']}")
        for line in rec["arithmetic"]:
            print(f"  how: {line}")
        if result.get("simulated"):
            print(SIMULATION_NOTE)
    failed = sum(lv_["errors"] for lv_ in result["levels"])
    raise typer.Exit(EXIT_FINDINGS if failed else EXIT_OK)


def server_table(result: dict) -> str:
    """The server's own view per level, from its /metrics: what limited it, and the counters'
    deltas (preemptions, prefix cache hits, recomputed prompt tokens)."""
    rate = any(lv.get("request_rate") is not None for lv in result["levels"])
    lines = [f"Server's own view (/metrics; {V.num_preemptions_total}, {V.prefix_cache_hits_total}, "
             f"{V.prompt_tokens_recomputed_total} deltas per level)",
             f"{'rate/s' if rate else 'conc':>6} {'limit':>8} {'prefix hits':>11} {'recomputed':>10}  why"]
    for lv in result["levels"]:
        q, h = lv.get("prefix_cache_queries"), lv.get("prefix_cache_hits")
        hits = "–" if not q or h is None else f"{h / q * 100:.0f} %"
        rc = lv.get("prompt_tokens_recomputed")
        lines.append(f"{_place(lv):>6} {_limit(lv):>8} {hits:>11} {_fmt(rc, '{:,.0f}'):>10}  {lv.get('limited_why') or '–'}")
    return "\n".join(lines)


@bench_app.command()
def ladder(
    url: Annotated[str, typer.Option("--url", metavar="URL", help="vLLM's OpenAI-compatible server, e.g. http://127.0.0.1:8000 (the only address contacted).")],
    levels: Annotated[str, typer.Option("--levels", metavar="N,N,...", help="Concurrency levels, comma-separated.")] = "8,16,32,64",
    requests: Annotated[int | None, typer.Option("--requests", metavar="N", help="Requests per level (default: 4 x level, at least 8).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", metavar="SECONDS", help="Run each level this long instead of a request count.")] = None,
    input_len: Annotated[int, typer.Option("--input-len", metavar="WORDS", help="Synthetic prompt length (words, about one token each).")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", metavar="TOKENS", help="max_tokens of each request (exact: ignore_eos).")] = 64,
    prompts: Annotated[Path | None, typer.Option("--prompts", metavar="FILE", help="Real prompts: one per line, or JSON lines with a \"prompt\" field.")] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="NAME", help="Model name (default: the first of /v1/models).")] = None,
    request_rate: Annotated[float | None, typer.Option("--request-rate", metavar="PER_SECOND", help="Poisson arrival rate; default: back to back.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Use /v1/chat/completions instead of /v1/completions.")] = False,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--no-ignore-eos", help="Generate exactly --output-len tokens (vLLM's ignore_eos).")] = True,
    metrics_url: Annotated[str | None, typer.Option("--metrics-url", metavar="URL", help="vLLM's /metrics (default: URL/metrics; 'none' to skip).")] = None,
    knee_gain: Annotated[float, typer.Option("--knee-gain", metavar="RATIO", help="The knee: a step up gaining less than this throughput ratio while p99 TTFT grows.")] = 0.10,
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", metavar="MS", help="Goodput counts requests with TTFT under this.")] = 500.0,
    slo_tpot_ms: Annotated[float | None, typer.Option("--slo-tpot-ms", metavar="MS", help="... and TPOT under this.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Per-request timeout.")] = 300.0,
    level_timeout: Annotated[float, typer.Option("--level-timeout", metavar="SECONDS", help="Wall-clock limit of one level.")] = 900.0,
    max_response_bytes: Annotated[int, typer.Option("--max-response-bytes", metavar="BYTES", help="Largest response read (more: the request is an error).")] = 16 << 20,
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE.json", help="Write the JSON result here.")] = None,
    chart: Annotated[Path | None, typer.Option("--chart", metavar="FILE", help="Draw the chart: .svg or .html (with the table).")] = None,
    format: Annotated[OutFormat, typer.Option("--format", "-f", help="text, json or markdown on stdout.")] = OutFormat.text,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the synthetic prompts and arrivals.")] = 0,
    ttft_p99_ms: Annotated[float, typer.Option("--ttft-p99-ms", metavar="MS", help="Objective: p99 TTFT at or under this (0: none).")] = 500.0,
    itl_p99_ms: Annotated[float, typer.Option("--itl-p99-ms", metavar="MS", help="Objective: p99 inter-token latency at or under this (0: none).")] = 100.0,
    tpot_p99_ms: Annotated[float, typer.Option("--tpot-p99-ms", metavar="MS", help="Objective: p99 TPOT at or under this (0: none).")] = 0.0,
    e2e_p99_ms: Annotated[float, typer.Option("--e2e-p99-ms", metavar="MS", help="Objective: p99 end-to-end latency at or under this (0: none).")] = 0.0,
    rates: Annotated[str | None, typer.Option("--rates", metavar="R,R,...", help=(
        "A rate ladder instead: Poisson arrivals at each rate (requests/s), at most --max-concurrency in flight."))] = None,
    max_concurrency: Annotated[int, typer.Option("--max-concurrency", metavar="N",
                                                  help="A rate ladder's cap on requests in flight.")] = 256,
    lengths: Annotated[str, typer.Option("--lengths", metavar="fixed|sharegpt", help=(
        "Prompt/output lengths: fixed (--input-len, --output-len) or ShareGPT-like synthetic (log-normal with those means)."))] = "fixed",
    profile: Annotated[str | None, typer.Option("--profile", metavar="NAME", help=(
        "A named prompt set: 512-1024-2048 (prompts of 512, 1024 and 2048 words in turn)."))] = None,
    prefix_ratio: Annotated[float, typer.Option("--prefix-ratio", metavar="RATIO", help=(
        "Share of each synthetic prompt that is one prefix common to all requests (0: none)."))] = 0.0,
    warmup: Annotated[int | None, typer.Option("--warmup", metavar="N", help=(
        "Warm-up requests per level, sent first and left out of every figure (default: the level's concurrency)."))] = None,
    adaptive: Annotated[bool | None, typer.Option("--adaptive/--fixed-count", help=(
        "Send until every objective's p99 interval is decided or within --ci-tolerance, at least --requests, at most "
        "--duration s (default 120) per level (default: adaptive unless --requests or --duration is given)."))] = None,
    ci_tolerance: Annotated[float, typer.Option("--ci-tolerance", metavar="RATIO", help=(
        "Adaptive: an interval narrower than this x its p99 is tight enough."))] = 0.10,
) -> None:
    """Run a concurrency ladder against a live vLLM: TTFT/TPOT/ITL/E2E, goodput, errors and
    vLLM's own preemptions per level; find the knee and recommend --max-num-seqs."""
    from vllm_doctor.loadtest.ladder import LadderConfig
    from vllm_doctor.loadtest.objectives import Objectives

    lv = _levels(levels)
    if requests is not None and requests < 1:
        _fail("--requests must be at least 1")
    if duration is not None and duration <= 0:
        _fail("--duration must be positive")
    if max_response_bytes < 1:
        _fail("--max-response-bytes must be at least 1")
    if input_len < 1 or output_len < 1:
        _fail("--input-len and --output-len must be at least 1")
    if chart is not None and chart.suffix.lower() not in (".svg", ".html", ".htm"):
        _fail(f"--chart {chart}: give a .svg or .html file")
    if min(ttft_p99_ms, itl_p99_ms, tpot_p99_ms, e2e_p99_ms) < 0:
        _fail("objectives (--ttft-p99-ms, --itl-p99-ms, --tpot-p99-ms, --e2e-p99-ms) are milliseconds >= 0")
    objectives = Objectives(*(v or None for v in (ttft_p99_ms, itl_p99_ms, tpot_p99_ms, e2e_p99_ms)))
    rate_list = _rates(rates) if rates else None
    if warmup is not None and warmup < 0:
        _fail("--warmup must be 0 or more")
    if max_concurrency < 1:
        _fail("--max-concurrency must be at least 1")
    if not 0 < ci_tolerance < 1:
        _fail("--ci-tolerance is a ratio between 0 and 1, e.g. 0.1")
    if adaptive is None:
        adaptive = requests is None and duration is None
    if adaptive and duration is None:
        duration = 120.0
    cfg = LadderConfig(rates=rate_list, max_concurrency=max_concurrency, lengths=lengths, profile=profile,
                       prefix_ratio=prefix_ratio, warmup_requests=warmup, adaptive=adaptive, ci_tolerance=ci_tolerance,
                       max_requests_per_level=max(1, min(10_000, MAX_TOTAL_REQUESTS // len(rate_list or lv))),
                       url=url, levels=lv, model=model, requests_per_level=requests, duration_seconds=duration,
                       input_len=input_len, output_len=output_len, prompts=_prompts(prompts) if prompts else None,
                       request_rate=request_rate, chat=chat, ignore_eos=ignore_eos,
                       request_timeout_seconds=timeout, level_timeout_seconds=level_timeout,
                       max_response_bytes=max_response_bytes,
                       metrics_url="" if (metrics_url or "").lower() == "none" else metrics_url,
                       knee_gain=knee_gain, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, seed=seed,
                       objectives=objectives)
    try:
        cfg.workload()
    except ValueError as e:
        _fail(str(e))
    _run_and_print(cfg, output, chart, format)


@bench_app.command()
def demo(
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE.json", help="Write the JSON result here.")] = None,
    chart: Annotated[Path | None, typer.Option("--chart", metavar="FILE", help="Draw the chart: .svg or .html.")] = None,
    levels: Annotated[str, typer.Option("--levels", metavar="N,N,...", help="Concurrency levels.")] = "1,2,4,8,16",
    level_seconds: Annotated[float, typer.Option("--level-seconds", metavar="SECONDS", help=(
        "Time bound of each level (adaptive: it stops earlier once its intervals are decided)."))] = 8.0,
    format: Annotated[OutFormat, typer.Option("--format", "-f", help="text or json on stdout.")] = OutFormat.text,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the prompts and arrivals.")] = 0,
) -> None:
    """Try the ladder without a GPU: run it against a bundled SIMULATED server (a cost model of
    vLLM's scheduler with a 1,536-token KV cache: preemption begins when it is full). Never a
    measurement of vLLM: every output says so. About 30-50 s."""
    from vllm_doctor.loadtest.ladder import LadderConfig
    from vllm_doctor.loadtest.objectives import Objectives
    from vllm_doctor.loadtest.simulated import SIMULATION_NOTE, SimulatedServer

    lv = _levels(levels)
    if not 0 < level_seconds <= 600:
        _fail("--level-seconds: from 0 to 600")
    if chart is not None and chart.suffix.lower() not in (".svg", ".html", ".htm"):
        _fail(f"--chart {chart}: give a .svg or .html file")
    print(SIMULATION_NOTE, file=sys.stderr, flush=True)
    try:
        server = SimulatedServer().__enter__()
    except (OSError, RuntimeError) as e:
        _fail(f"the simulated server did not start: {e}")
    try:
        cfg = LadderConfig(url=server.url, levels=lv, input_len=160, output_len=48, adaptive=True,
                           duration_seconds=level_seconds, level_timeout_seconds=level_seconds + 30,
                           request_timeout_seconds=30, seed=seed, metrics_interval_seconds=0.25,
                           objectives=Objectives(ttft_p99_ms=500, itl_p99_ms=100))
        _run_and_print(cfg, output, chart, format)
    finally:
        server.__exit__()


@bench_app.command()
def chart(
    result: Annotated[Path, typer.Argument(metavar="LADDER", help="A saved `bench ladder --output` result (JSON).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help="Where to write: .html (chart and table) or .svg (default: LADDER.html beside the result).")] = None,
) -> None:
    """Re-render a saved ladder run as its chart: throughput and p99 TTFT per level, one legend, the
    TTFT objective line, the knee, and where preemption begins (from the /metrics deltas per level)."""
    from vllm_doctor.loadtest.chart import html_page, ladder_svg
    from vllm_doctor.loadtest.ladder import RESULT_KIND

    try:
        doc = json.loads(result.read_text("utf-8"))
    except FileNotFoundError:
        _fail(f"{result}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"{result}: cannot read ({type(e).__name__})")
    except (ValueError, RecursionError):
        _fail(f"{result}: not JSON")
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND or not isinstance(doc.get("levels"), list):
        _fail(f"{result}: not a vllm-doctor bench ladder result (write one with `bench ladder --output`)")
    out = output or result.with_suffix(".html")
    if out.suffix.lower() not in (".svg", ".html", ".htm"):
        _fail(f"--output {out}: give a .svg or .html file")
    try:
        body = ladder_svg(doc) if out.suffix.lower() == ".svg" else html_page(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        _fail(f"{result}: a ladder result with a malformed level ({type(e).__name__})")
    try:
        out.write_text(body)
    except OSError as e:
        _fail(f"{out}: cannot write: {e.strerror}")
    print(out)


@bench_app.command()
def compare(
    before: Annotated[str, typer.Argument(metavar="BEFORE", help="Result before the change: bench ladder JSON, vllm bench serve --save-result JSON or a GuideLLM report.")],
    after: Annotated[str, typer.Argument(metavar="AFTER", help="Result after the change (same formats).")],
    level: Annotated[float | None, typer.Option("--level", metavar="CONCURRENCY", help="Compare this concurrency (default: the highest both files have).")] = None,
    ttft_p99_ms: Annotated[float, typer.Option("--ttft-p99-ms", metavar="MS", help="Target: p99 TTFT below this.")] = 500.0,
    max_preemptions: Annotated[int, typer.Option("--max-preemptions", metavar="N", help="Target: at most N preemptions.")] = 0,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", metavar="MS", help="Target: mean TPOT below this (default: no more than 10 % above BEFORE).")] = None,
    max_throughput_drop: Annotated[float, typer.Option("--max-throughput-drop", metavar="RATIO", help="Target: output throughput at most this ratio below BEFORE.")] = 0.05,
    format: Annotated[OutFormat, typer.Option("--format", "-f", help="text, json or markdown.")] = OutFormat.text,
    allow_unlike: Annotated[bool, typer.Option("--allow-unlike", help="Compare runs that differ in level, tool, model, workload or vLLM version (warned about) instead of refusing.")] = False,
) -> None:
    """Put TTFT p99, TPOT, throughput and preemptions of two runs side by side, PASS/FAIL each."""
    from vllm_doctor.loadtest.results import ResultError, Targets, checks_dict, compare as run_compare, load_runs, pick, unlike

    try:
        b_runs, a_runs = load_runs(before), load_runs(after)
        b = pick(b_runs, level, a_runs)
        a = pick(a_runs, level, b_runs)
    except ResultError as e:
        _fail(str(e))
    diff = unlike(b, a)
    if diff and not allow_unlike:
        _fail(f"unlike runs ({'; '.join(diff)}): compare like with like, or pass --allow-unlike")
    checks = run_compare(b, a, Targets(ttft_p99_ms=ttft_p99_ms, max_preemptions=max_preemptions,
                                       tpot_mean_ms=tpot_ms, max_throughput_drop_ratio=max_throughput_drop))
    doc = checks_dict(b, a, checks)
    if format == OutFormat.json:
        print(json.dumps(doc, indent=1))
    else:
        def conc(r):
            return "" if r.concurrency is None else f" at {r.concurrency:g} concurrent"
        md = format == OutFormat.markdown
        lines = [f"BEFORE: {b.source} ({b.format}{conc(b)})", f"AFTER:  {a.source} ({a.format}{conc(a)})"]
        if md:
            lines = [f"- BEFORE: `{b.source}` ({b.format}{conc(b)})", f"- AFTER: `{a.source}` ({a.format}{conc(a)})"]
        lines += [f"{'- ' if md else ''}WARNING: unlike runs: {d}" for d in diff]
        rows = []
        for c in checks:
            unit = f" {c.unit}" if c.unit else ""
            spec = "{:,.0f}" if not c.unit else "{:,.1f}"  # counts are whole numbers
            bv = "unknown" if c.before is None else spec.format(c.before) + unit
            av = "unknown" if c.after is None else spec.format(c.after) + unit
            rows.append((c.indicator, bv, av, c.change, c.target, c.status, c.note))
        head = ("indicator", "before", "after", "change", "target", "result")
        if md:
            lines += ["", "| " + " | ".join(head) + " |", "|---|---|---|---|---|---|"]
            for r in rows:
                lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | **{r[5]}** |")
                if r[6]:
                    lines.append(f"  - {r[6]}")
        else:
            w = [max(len(x[i]) for x in (head, *rows)) for i in range(6)]
            lines += ["", f"{head[0]:<{w[0]}}  {head[1]:>{w[1]}}    {head[2]:<{w[2]}}  {head[3]:<{w[3]}}  "
                      f"{head[4]:<{w[4]}}  {head[5]}"]
            for r in rows:
                lines.append(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}} -> {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]:<{w[4]}}  {r[5]}")
                if r[6]:
                    lines.append(f"  {r[6]}")
        lines.append("")
        lines.append(f"{'**Verdict: ' + doc['verdict'] + '**' if md else 'Verdict: ' + doc['verdict']}")
        print("\n".join(lines))
    raise typer.Exit({"PASS": EXIT_OK, "FAIL": EXIT_FINDINGS}.get(doc["verdict"], EXIT_UNKNOWN))
