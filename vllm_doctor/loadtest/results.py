"""Benchmark result files, read into the four figures a tuning step is judged by, and compared.

Formats read (recognised by their content, never by file name):

- ``vllm-doctor bench ladder --output``: ``{"kind": "vllm-doctor-bench-ladder", "levels": [...]}``;
  one level is compared (``--level``; default: the highest level both files have).
- ``vllm bench serve --save-result`` (vLLM's ``vllm/benchmarks/serve.py``, also the older
  ``benchmarks/benchmark_serving.py``): flat keys ``p99_ttft_ms``, ``mean_tpot_ms``,
  ``output_throughput``, ``request_throughput``, ``completed``, ``max_concurrency``. It holds no
  preemption count, so preemptions are unknown for it.
- GuideLLM's report (``guidellm benchmark ... --output-path x.json``; ``GenerativeBenchmarksReport``):
  ``benchmarks[i].metrics.<name>.successful.{mean, percentiles.p99}`` with ``time_to_first_token_ms``,
  ``time_per_output_token_ms``, ``output_tokens_per_second``, ``requests_per_second``; the
  concurrency of a ``concurrent`` strategy is ``config.strategy.streams``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from vllm_doctor.catalogue import V
from vllm_doctor.loadtest.ladder import RESULT_KIND


class ResultError(Exception):
    """A file that is not a benchmark result this command reads (one line for the CLI)."""


@dataclass
class RunFigures:
    """The four indicators of one run (None: the file does not say)."""

    source: str
    format: str                       # vllm-doctor-ladder | vllm-bench-serve | guidellm
    concurrency: float | None
    ttft_p99_ms: float | None
    tpot_mean_ms: float | None
    output_throughput: float | None   # output tokens / s
    request_throughput: float | None  # requests / s
    preemptions: int | None
    completed: int | None
    errors: int | None
    # what makes two runs comparable (None: the file does not say)
    model: str | None = None
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    vllm_version: str | None = None
    ttft_p99_ci_ms: tuple[float, float] | None = None   # 95 % interval (ladder results carry one)
    request_rate: float | None = None  # a rate ladder's level (requests/s)
    workload: str | None = None        # what the ladder sent, in words
    # more p99s with their 95 % intervals (ladder results): name -> (p99, low, high)
    p99s: dict[str, tuple[float, float, float]] | None = None


def _num(x) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return None


def _dig(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _per(total, n) -> float | None:
    t, n = _num(total), _num(n)
    return None if t is None or not n else t / n


def _str(x) -> str | None:
    return x if isinstance(x, str) and x else None


def _from_ladder(doc: dict, src: str, level: int | None) -> list[RunFigures]:
    out = []
    for lv in doc.get("levels") or ():
        if not isinstance(lv, dict):
            continue
        lo, hi = _num(_dig(lv, "ttft_ms", "p99_ci_low")), _num(_dig(lv, "ttft_ms", "p99_ci_high"))
        p99s: dict[str, tuple[float, float, float]] = {}
        for key, name in (("itl_ms", "ITL p99"), ("tpot_ms", "TPOT p99"), ("e2el_ms", "E2E p99")):
            p, plo, phi = (_num(_dig(lv, key, k)) for k in ("p99", "p99_ci_low", "p99_ci_high"))
            if p is not None and plo is not None and phi is not None:
                p99s[name] = (p, plo, phi)
        rate = _num(lv.get("request_rate"))
        out.append(RunFigures(
            request_rate=rate, workload=_str(doc.get("workload")), p99s=p99s or None,
            model=_str(doc.get("model")), vllm_version=_str(doc.get("vllm_version")),
            mean_input_tokens=_per(lv.get("prompt_tokens"), lv.get("completed")),
            mean_output_tokens=_per(lv.get("output_tokens"), lv.get("completed")),
            ttft_p99_ci_ms=None if lo is None or hi is None else (lo, hi),
            source=src, format="vllm-doctor-ladder", concurrency=None if rate is not None else _num(lv.get("concurrency")),
            ttft_p99_ms=_num(_dig(lv, "ttft_ms", "p99")), tpot_mean_ms=_num(_dig(lv, "tpot_ms", "mean")),
            output_throughput=_num(lv.get("output_throughput")),
            request_throughput=_num(lv.get("request_throughput")),
            preemptions=None if lv.get("preemptions") is None else int(lv["preemptions"]),
            completed=lv.get("completed"), errors=lv.get("errors")))
    if not out:
        raise ResultError(f"{src}: a vllm-doctor ladder result with no level")
    return out


def _from_vllm(doc: dict, src: str) -> list[RunFigures]:
    failed = doc.get("failed")
    return [RunFigures(
        model=_str(doc.get("model_id")), mean_input_tokens=_per(doc.get("total_input_tokens"), doc.get("completed")),
        mean_output_tokens=_per(doc.get("total_output_tokens"), doc.get("completed")),
        source=src, format="vllm-bench-serve", concurrency=_num(doc.get("max_concurrency")),
        ttft_p99_ms=_num(doc.get("p99_ttft_ms")), tpot_mean_ms=_num(doc.get("mean_tpot_ms")),
        output_throughput=_num(doc.get("output_throughput")),
        request_throughput=_num(doc.get("request_throughput")),
        preemptions=None, completed=doc.get("completed"),
        errors=failed if isinstance(failed, int) else None)]


def _from_guidellm(doc: dict, src: str) -> list[RunFigures]:
    out = []
    for b in doc.get("benchmarks") or ():
        m = b.get("metrics") if isinstance(b, dict) else None
        if not isinstance(m, dict):
            continue
        streams = _num(_dig(b, "config", "strategy", "streams")) or _num(_dig(b, "args", "strategy", "streams"))
        totals = _dig(b, "metrics", "request_totals") or {}
        out.append(RunFigures(
            model=_str(_dig(doc, "config", "spec", "backend", "model")),
            mean_input_tokens=_num(_dig(m, "prompt_token_count", "successful", "mean")),
            mean_output_tokens=_num(_dig(m, "output_token_count", "successful", "mean")),
            source=src, format="guidellm", concurrency=streams,
            ttft_p99_ms=_num(_dig(m, "time_to_first_token_ms", "successful", "percentiles", "p99")),
            tpot_mean_ms=_num(_dig(m, "time_per_output_token_ms", "successful", "mean")),
            output_throughput=_num(_dig(m, "output_tokens_per_second", "successful", "mean")),
            request_throughput=_num(_dig(m, "requests_per_second", "successful", "mean")),
            preemptions=None,
            completed=totals.get("successful") if isinstance(totals, dict) else None,
            errors=totals.get("errored") if isinstance(totals, dict) else None))
    if not out:
        raise ResultError(f"{src}: a GuideLLM report with no benchmark")
    return out


def load_runs(path: str) -> list[RunFigures]:
    """Every run a result file holds (one per ladder level / GuideLLM benchmark)."""
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except FileNotFoundError:
        raise ResultError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultError(f"{path}: is a directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultError(f"{path}: cannot read ({type(e).__name__})") from None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ResultError(f"{path}: not JSON") from None
    except RecursionError:
        raise ResultError(f"{path}: JSON nested too deeply to be a benchmark result") from None
    if not isinstance(doc, dict):
        raise ResultError(f"{path}: not a benchmark result (a JSON object is expected)")
    if doc.get("kind") == RESULT_KIND:
        return _from_ladder(doc, path, None)
    if "benchmarks" in doc and isinstance(doc["benchmarks"], list):
        return _from_guidellm(doc, path)
    if "p99_ttft_ms" in doc or ("request_throughput" in doc and "completed" in doc):
        return _from_vllm(doc, path)
    raise ResultError(f"{path}: not a result of vllm-doctor bench ladder, vllm bench serve or GuideLLM")


def pick(runs: list[RunFigures], level: float | None, other: list[RunFigures]) -> RunFigures:
    """The run at ``level`` (a concurrency); default: the highest concurrency both files have,
    else the file's only (or last) run."""
    if level is not None:
        for r in runs:
            if r.concurrency == level or (r.concurrency is None and r.request_rate == level):
                return r
        have = ", ".join(f"{r.concurrency:g}" if r.concurrency is not None else f"{r.request_rate:g} req/s"
                         for r in runs if r.concurrency is not None or r.request_rate is not None) or "none"
        raise ResultError(f"{runs[0].source}: no run at concurrency {level:g} (it has: {have})")
    if len(runs) == 1:
        return runs[0]
    common = {r.concurrency if r.concurrency is not None else r.request_rate for r in runs} & \
        {o.concurrency if o.concurrency is not None else o.request_rate for o in other}
    common.discard(None)
    if common:
        top = max(common)
        return next(r for r in runs if top in (r.concurrency, r.request_rate))
    return runs[-1]


WORKLOAD_TOLERANCE = 0.10   # mean prompt / output tokens per request: runs within 10 % send the same work


def unlike(before: RunFigures, after: RunFigures) -> list[str]:
    """What makes the two runs not comparable: level, tool, model, workload, vLLM version (each
    checked only where both files say)."""
    out = []
    if before.concurrency is not None and after.concurrency is not None and before.concurrency != after.concurrency:
        out.append(f"concurrency {before.concurrency:g} vs {after.concurrency:g}")
    if before.request_rate != after.request_rate:
        rb = "closed loop" if before.request_rate is None else f"{before.request_rate:g} req/s"
        ra = "closed loop" if after.request_rate is None else f"{after.request_rate:g} req/s"
        out.append(f"request rate {rb} vs {ra}")
    if before.format != after.format:
        out.append(f"tool {before.format} vs {after.format}")
    if before.workload and after.workload and before.workload != after.workload:
        out.append(f"workload: {before.workload!r} vs {after.workload!r}")
    if before.model and after.model and before.model != after.model:
        out.append(f"model {before.model} vs {after.model}")
    for what, b, a in (("prompt", before.mean_input_tokens, after.mean_input_tokens),
                       ("output", before.mean_output_tokens, after.mean_output_tokens)):
        if b and a and abs(a - b) / max(a, b) > WORKLOAD_TOLERANCE:
            out.append(f"workload: {b:,.0f} vs {a:,.0f} {what} tokens per request")
    if before.vllm_version and after.vllm_version and before.vllm_version != after.vllm_version:
        out.append(f"vLLM {before.vllm_version} vs {after.vllm_version}")
    return out


def change(before: float | None, after: float | None, b_ci: tuple[float, float] | None,
           a_ci: tuple[float, float] | None, whole: bool = False) -> str:
    """AFTER - BEFORE, with the interval of the change where both runs carry one; "no measurable
    change" where the two intervals overlap."""
    if before is None or after is None:
        return "unknown"
    d = after - before
    pct = f" ({d / before * 100:+.0f} %)" if before else ""
    if b_ci is None or a_ci is None:
        return f"{d:+,.{0 if whole else 1}f}{pct}, no interval in the files"
    if a_ci[0] <= b_ci[1] and b_ci[0] <= a_ci[1]:
        return f"no measurable change ({d:+,.1f}; intervals [{b_ci[0]:,.0f}-{b_ci[1]:,.0f}] and [{a_ci[0]:,.0f}-{a_ci[1]:,.0f}] overlap)"
    return f"{d:+,.1f}{pct} [{a_ci[0] - b_ci[1]:+,.0f} to {a_ci[1] - b_ci[0]:+,.0f}]"


@dataclass
class Check:
    indicator: str
    unit: str
    before: float | None
    after: float | None
    target: str
    status: str            # PASS | FAIL | UNKNOWN
    note: str = ""
    change: str = ""       # AFTER - BEFORE, with its interval where the files carry one


@dataclass
class Targets:
    ttft_p99_ms: float = 500.0
    max_preemptions: int = 0
    tpot_mean_ms: float | None = None
    max_throughput_drop_ratio: float = 0.05


def compare(before: RunFigures, after: RunFigures, t: Targets) -> list[Check]:
    """The four indicators side by side, each judged on the AFTER run against its target."""
    out: list[Check] = []

    def judge(val, ok) -> str:
        return "UNKNOWN" if val is None else ("PASS" if ok(val) else "FAIL")

    a = after.ttft_p99_ms
    out.append(Check("TTFT p99", "ms", before.ttft_p99_ms, a, f"< {t.ttft_p99_ms:g} ms",
                     judge(a, lambda v: v < t.ttft_p99_ms),
                     change=change(before.ttft_p99_ms, a, before.ttft_p99_ci_ms, after.ttft_p99_ci_ms)))
    a = after.tpot_mean_ms
    if t.tpot_mean_ms is not None:
        out.append(Check("TPOT mean", "ms", before.tpot_mean_ms, a, f"< {t.tpot_mean_ms:g} ms",
                         judge(a, lambda v: v < t.tpot_mean_ms)))
    else:
        b = before.tpot_mean_ms
        ok = None if (a is None or b is None) else a <= b * 1.10
        out.append(Check("TPOT mean", "ms", b, a, "no more than 10 % above BEFORE",
                         "UNKNOWN" if ok is None else ("PASS" if ok else "FAIL")))
    b, a = before.output_throughput, after.output_throughput
    floor = None if b is None else b * (1 - t.max_throughput_drop_ratio)
    out.append(Check("output throughput", "tokens/s", b, a,
                     f"no more than {t.max_throughput_drop_ratio * 100:g} % below BEFORE",
                     "UNKNOWN" if a is None or floor is None else ("PASS" if a >= floor else "FAIL")))
    a = after.preemptions
    note = ""
    if a is None and after.format == "vllm-doctor-ladder":
        note = f"the ladder could not read the server's /metrics ({V.num_preemptions_total})"
    elif a is None:
        note = (f"{after.format} records no preemption count: run `vllm-doctor bench ladder`, which reads "
                f"{V.num_preemptions_total} before and after each level")
    out.append(Check("preemptions", "", None if before.preemptions is None else float(before.preemptions),
                     None if a is None else float(a), f"<= {t.max_preemptions}",
                     judge(a, lambda v: v <= t.max_preemptions), note))
    # the other p99s the ladder measured, each with its interval: reported, no target
    for name, (bv, blo, bhi) in (before.p99s or {}).items():
        if name in (after.p99s or {}):
            av, alo, ahi = (after.p99s or {})[name]
            out.append(Check(name, "ms", bv, av, "none (reported)", "INFO",
                             change=change(bv, av, (blo, bhi), (alo, ahi))))
    # A run whose requests failed proves nothing about the four figures: failures are judged too.
    if after.errors or before.errors:
        out.append(Check("failed requests", "", None if before.errors is None else float(before.errors),
                         None if after.errors is None else float(after.errors), "0",
                         judge(after.errors, lambda v: v == 0)))
    for c in out:
        if not c.change:
            c.change = change(c.before, c.after, None, None, whole=not c.unit)   # counts are whole numbers
    return out


def checks_dict(before: RunFigures, after: RunFigures, checks: list[Check]) -> dict:
    return {"before": asdict(before), "after": asdict(after), "unlike": unlike(before, after),
            "checks": [asdict(c) for c in checks], "verdict": verdict(checks)}


def verdict(checks: list[Check]) -> str:
    if any(c.status == "FAIL" for c in checks):
        return "FAIL"
    if any(c.status == "UNKNOWN" for c in checks):
        return "UNKNOWN"
    return "PASS"
