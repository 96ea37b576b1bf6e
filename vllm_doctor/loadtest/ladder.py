"""``vllm-doctor bench ladder``: a concurrency ladder against a running vLLM, and the knee.

For each concurrency level the ladder keeps exactly that many streamed requests in flight (or
fewer, when ``request_rate`` spaces their arrivals) until the level's request count or duration is
reached. It reads the server's ``/metrics`` before and after each level (preemptions: the delta of
``vllm:num_preemptions_total``, vLLM's own counter; never a ``grep -c`` of the log) and samples it
during the level (peak running, waiting and KV cache usage): only while the level's requests are in
flight (a read at the level's edges shows an idle server), at jittered intervals (a fixed period can
lock in phase with a steady request cycle), on a connection of its own, parsed off the event loop
(so that a 50 KB /metrics does not stall the streams being timed). A level none of whose samples
showed its requests reports those peaks as None ("not sampled"), never as a false 0. The mean
numbers running and waiting come from vLLM's own counters instead (the deltas of
``vllm:request_inference_time_seconds_sum`` and ``vllm:request_queue_time_seconds_sum`` over the
level's duration: Little's law), whatever the moments sampled.

The knee is the last level before throughput stops paying: the first step up the ladder that
gains less than ``knee_gain`` (default 10 %) output-token throughput while p99 TTFT grows. The
``--max-num-seqs`` advice combines the knee with what the KV cache holds for the sequences this
run actually sent (KV cache tokens / observed prompt+output tokens per request), and with the
highest level that ran without preemption.

Bounded by construction: at most ``levels x requests`` requests, each with a timeout, each level
with a wall-clock limit; only the URL given is contacted.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import asdict, dataclass, field
from collections.abc import Callable

import httpx

from vllm_doctor.catalogue import V
from vllm_doctor.ingest.scrape import parse_metrics
from vllm_doctor.state.core import State
from vllm_doctor.loadtest.client import MAX_RESPONSE_BYTES, RequestResult, request_body, stream_one
from vllm_doctor.loadtest.objectives import Objectives, highest_meeting, judge, level_status, percentile_ci
from vllm_doctor.loadtest.workload import Workload

RESULT_KIND = "vllm-doctor-bench-ladder"
RECOMPUTED = V.prompt_tokens_recomputed_total   # vLLM 0.16-0.19 export it (prompt tokens computed again); else unknown
# seconds each finished request spent RUNNING / WAITING (histogram sums): over a level, their deltas / its
# duration are the mean numbers running and waiting (Little's law), free of when /metrics was sampled
RUNNING_SECONDS = V.request_inference_time_seconds + "_sum"
WAITING_SECONDS = V.request_queue_time_seconds + "_sum"
RESULT_VERSION = 1


class BenchError(Exception):
    """A ladder that cannot run (server unreachable, no model). One line for the CLI."""


@dataclass
class LadderConfig:
    url: str                                   # base URL of vLLM's OpenAI-compatible server
    levels: list[int]
    model: str | None = None                   # None: the first model of GET /v1/models
    requests_per_level: int | None = None      # None: 4 x level (at least 8), unless duration is set
    duration_seconds: float | None = None      # run each level this long instead of a request count
    input_len: int = 128                       # prompt length in words (about one token each)
    output_len: int = 64                       # max_tokens (exact with ignore_eos)
    prompts: list[str] | None = None           # real prompts instead of synthetic ones
    request_rate: float | None = None          # Poisson arrivals per second; None: back to back
    chat: bool = False                         # /v1/chat/completions instead of /v1/completions
    ignore_eos: bool = True
    request_timeout_seconds: float = 300.0
    max_response_bytes: int = MAX_RESPONSE_BYTES  # one response (a server that never stops is an error)
    level_timeout_seconds: float = 900.0
    metrics_url: str | None = None             # None: URL + /metrics; "" disables
    metrics_interval_seconds: float = 1.0
    knee_gain: float = 0.10
    slo_ttft_ms: float = 500.0                 # goodput: requests meeting both SLOs
    slo_tpot_ms: float | None = None
    seed: int = 0
    objectives: Objectives = field(default_factory=Objectives)   # the recommendation meets every one
    # what is sent: prompt / output length distribution, shared prefix (input_len, output_len and
    # prompts above are its fixed lengths and real prompts)
    lengths: str = "fixed"                     # fixed | sharegpt (workload.LENGTHS)
    profile: str | None = None                 # a named prompt set (workload.PROFILES)
    prefix_ratio: float = 0.0
    warmup_requests: int | None = None         # per level, sent first and left out of every figure; None: the level
    # adaptive: send until every objective's p99 interval is decided or narrow enough, within duration_seconds
    adaptive: bool = False
    ci_tolerance: float = 0.10                 # "narrow enough": interval width <= this x the p99
    max_requests_per_level: int = 10_000
    rates: list[float] | None = None           # a rate ladder: one level per Poisson arrival rate (req/s)
    max_concurrency: int = 256                 # a rate ladder's cap on requests in flight

    def requests_for(self, level: int) -> int | None:
        """Measured requests of a level (warm-up not counted); None: as many as its time allows."""
        if self.adaptive or (self.duration_seconds is not None and self.requests_per_level is None):
            return None
        return self.requests_per_level or max(8, 4 * level)

    def min_requests_for(self, level: int) -> int:
        """An adaptive level's least number of measured requests."""
        return self.requests_per_level or max(8, 2 * level)

    def warmup_for(self, level: int) -> int:
        return level if self.warmup_requests is None else self.warmup_requests

    def workload(self) -> Workload:
        return Workload(input_len=self.input_len, output_len=self.output_len, lengths=self.lengths,
                        profile=self.profile, prefix_ratio=self.prefix_ratio, seed=self.seed,
                        prompts=tuple(self.prompts or ()))

    def level_values(self) -> list[float]:
        """The ladder's levels: concurrencies, or request rates (a rate ladder)."""
        return list(self.rates) if self.rates else [float(c) for c in self.levels]


def _pct(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in 0..100."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 3)


@dataclass
class MetricsWindow:
    """What the server's /metrics said around one level (None: not readable)."""

    preemptions_before: float | None = None
    preemptions_after: float | None = None
    max_running: float | None = None
    max_waiting: float | None = None
    max_kv_cache_usage_ratio: float | None = None
    samples: int = 0              # taken while the level's requests were in flight
    waiting_samples: int = 0      # samples in which requests waited
    waiting_known: int = 0        # samples that carried the waiting gauge
    counters_before: dict[str, float | None] = field(default_factory=dict)
    counters_after: dict[str, float | None] = field(default_factory=dict)

    @property
    def preemptions(self) -> int | None:
        if self.preemptions_before is None or self.preemptions_after is None:
            return None
        return max(0, int(round(self.preemptions_after - self.preemptions_before)))

    def delta(self, name: str) -> float | None:
        b, a = self.counters_before.get(name), self.counters_after.get(name)
        return None if a is None or b is None else max(0.0, a - b)

    def seen(self) -> bool:
        """Whether a sample showed the level's requests (running or waiting): vLLM sets these gauges
        after each engine step, so a read during a request's first step can still show none."""
        return bool(self.max_running) or bool(self.max_waiting)

    def add(self, s) -> None:
        self.samples += 1
        if s.num_waiting is not None:
            self.waiting_samples += 1 if s.num_waiting > 0 else 0
            self.waiting_known += 1
        for attr, val in (("max_running", s.num_running), ("max_waiting", s.num_waiting),
                          ("max_kv_cache_usage_ratio", s.kv_cache_usage_ratio)):
            if val is not None:
                cur = getattr(self, attr)
                setattr(self, attr, val if cur is None else max(cur, val))


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    completed: int
    errors: int
    duration_seconds: float
    started_at: float                           # epoch seconds (wall clock)
    ended_at: float
    output_tokens: int
    prompt_tokens: int | None
    request_throughput: float                   # completed requests / s
    output_throughput: float                    # output tokens / s
    goodput: float                              # requests / s meeting the SLOs
    ttft_ms: dict[str, float | None]            # mean, p50, p90, p99
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2el_ms: dict[str, float | None]
    preemptions: int | None                     # vllm:num_preemptions_total after - before the level
    preemptions_before: float | None
    preemptions_after: float | None
    max_running: float | None
    max_waiting: float | None
    max_kv_cache_usage_ratio: float | None
    error_examples: list[str] = field(default_factory=list)
    mean_tokens_per_request: float | None = None
    warmup_requests: int = 0                    # sent first, left out of every figure above
    request_rate: float | None = None           # a rate ladder's Poisson arrival rate (req/s)
    stop_reason: str | None = None              # why an adaptive level stopped sending
    prefix_cache_queries: float | None = None   # vllm:prefix_cache_queries_total delta (tokens)
    prefix_cache_hits: float | None = None      # vllm:prefix_cache_hits_total delta (tokens)
    prompt_tokens_recomputed: float | None = None   # vllm:prompt_tokens_recomputed_total delta
    limited_by: str | None = None               # kv-cache | queue | compute (from /metrics), see limit_of
    limited_why: str | None = None
    sent: int = 0                               # requests sent, warm-up included
    waiting_sample_ratio: float | None = None   # share of the /metrics samples in which requests waited
    metrics_samples: int | None = None          # /metrics samples taken while its requests were in flight
    mean_running: float | None = None           # vllm:request_inference_time_seconds_sum delta / the level's time
    mean_waiting: float | None = None           # vllm:request_queue_time_seconds_sum delta / the level's time


def summarise(level: int, results: list[RequestResult], started: float, ended: float,
              window: MetricsWindow, cfg: LadderConfig, warmup: int = 0, rate: float | None = None,
              stop_reason: str | None = None) -> LevelResult:
    """One level's figures from its measured requests (``results``: the warm-up already left out;
    ``started``: when the first measured request was sent)."""
    ok = [r for r in results if r.ok]
    dur = max(ended - started, 1e-9)
    ttft = [r.ttft_seconds for r in ok if r.ttft_seconds is not None]
    tpot = [t for t in (r.tpot_seconds for r in ok) if t is not None]
    itl = [x for r in ok for x in r.itl_seconds]
    e2e = [r.e2e_seconds for r in ok if r.e2e_seconds is not None]

    def stats(v: list[float]) -> dict[str, float | None]:
        ci = percentile_ci(v, 99, seed=cfg.seed * 1000003 + level) or (None, None)
        return {"mean": _ms(sum(v) / len(v)) if v else None, "p50": _ms(_pct(v, 50)),
                "p90": _ms(_pct(v, 90)), "p99": _ms(_pct(v, 99)),
                "p99_ci_low": _ms(ci[0]), "p99_ci_high": _ms(ci[1])}   # 95 % bootstrap interval

    def good(r: RequestResult) -> bool:
        if r.ttft_seconds is None or r.ttft_seconds * 1000 > cfg.slo_ttft_ms:
            return False
        t = r.tpot_seconds
        return cfg.slo_tpot_ms is None or (t is not None and t * 1000 <= cfg.slo_tpot_ms)

    out_tokens = sum(r.output_tokens for r in ok)
    prompt_known = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    per_req = ([(p or 0) + r.output_tokens for p, r in zip((r.prompt_tokens for r in ok), ok)]
               if ok and len(prompt_known) == len(ok) else [])
    errors = [r.error for r in results if not r.ok and r.error]
    sampled = window.seen()   # else the peaks are unknown: a 0 read while requests ran is no peak
    return LevelResult(
        concurrency=level, requests=len(results), completed=len(ok), errors=len(results) - len(ok),
        duration_seconds=round(dur, 3), started_at=started, ended_at=ended,
        output_tokens=out_tokens, prompt_tokens=sum(prompt_known) if prompt_known else None,
        request_throughput=round(len(ok) / dur, 4), output_throughput=round(out_tokens / dur, 3),
        goodput=round(sum(1 for r in ok if good(r)) / dur, 4),
        ttft_ms=stats(ttft), tpot_ms=stats(tpot), itl_ms=stats(itl), e2el_ms=stats(e2e),
        preemptions=window.preemptions, preemptions_before=window.preemptions_before,
        preemptions_after=window.preemptions_after, max_running=window.max_running if sampled else None,
        max_waiting=window.max_waiting if sampled else None,
        max_kv_cache_usage_ratio=window.max_kv_cache_usage_ratio if sampled else None,
        error_examples=sorted(set(errors))[:3],
        mean_tokens_per_request=round(sum(per_req) / len(per_req), 1) if per_req else None,
        warmup_requests=warmup, request_rate=rate, stop_reason=stop_reason,
        prefix_cache_queries=window.delta("prefix_cache_queries_total"),
        prefix_cache_hits=window.delta("prefix_cache_hits_total"),
        prompt_tokens_recomputed=window.delta(RECOMPUTED),
        waiting_sample_ratio=(round(window.waiting_samples / window.waiting_known, 3)
                              if window.waiting_known and sampled else None),
        metrics_samples=window.samples if window.counters_before or window.samples else None,
    )


def level_key(lv) -> float:
    """A level's place on the ladder: its request rate (a rate ladder) or its concurrency."""
    get = lv.get if isinstance(lv, dict) else lambda k: getattr(lv, k)
    rate = get("request_rate")
    return float(rate) if rate is not None else float(get("concurrency") or 0)


def level_name(lv, short: bool = False) -> str:
    """"8 concurrent requests" / "2 req/s" (``short``: "8" / "2/s")."""
    get = lv.get if isinstance(lv, dict) else lambda k: getattr(lv, k)
    rate = get("request_rate")
    if rate is not None:
        return f"{rate:g}/s" if short else f"{rate:g} req/s"
    return f"{get('concurrency')}" if short else f"{get('concurrency')} concurrent requests"


def limit_of(lv: dict) -> tuple[str | None, str | None]:
    """Which resource limited a level, from the server's own /metrics around it:

    - ``kv-cache``: vLLM preempted sequences, or the KV cache was full (rules/thresholds.yaml
      ``kv_cache_full_ratio``) while requests waited;
    - ``queue``: requests waited (in at least QUEUE_SAMPLE_RATIO of the samples) while the KV cache
      had room: the scheduler admitted no more (``--max-num-seqs`` or ``--max-num-batched-tokens``);
    - ``compute``: every request ran at once, nothing waited nor was preempted: latency is the
      engine's step time for that batch.

    (None, None) when /metrics was not read."""
    from vllm_doctor.monitoring.bundle import load_thresholds

    pre, kv, wait, run = (lv.get("preemptions"), lv.get("max_kv_cache_usage_ratio"), lv.get("max_waiting"),
                          lv.get("max_running"))
    if pre is None and kv is None and wait is None:
        return None, None
    if run is None and kv is None and wait is None and not pre:
        n = lv.get("metrics_samples") or 0
        why = (f"nothing was preempted; running, waiting and KV cache usage not sampled ({n} /metrics "
               f"read{'' if n == 1 else 's'} while its requests ran showed none of them: run the level "
               f"longer (--requests))")
        m_run, m_wait = lv.get("mean_running"), lv.get("mean_waiting")
        if m_run is None:
            return None, why
        avg = (f"on average {m_run:.1f} running and {m_wait or 0:.1f} waiting ({V.request_inference_time_seconds}, "
               f"{V.request_queue_time_seconds} over the level)")
        if m_wait is not None and m_wait >= QUEUE_MEAN_WAITING:
            return "queue", f"{avg}: the scheduler admitted no more; {why}"
        return "compute", f"{avg}, nothing was preempted: the latency is the engine's step time for that batch; {why}"
    full = load_thresholds()["kv_cache_full_ratio"]
    kv_s = "unknown" if kv is None else f"{kv * 100:.0f} %"
    share = lv.get("waiting_sample_ratio")
    # a queue is requests waiting in at least QUEUE_SAMPLE_RATIO of the samples (a request that arrived
    # between two engine steps waits for an instant: one sample of it is no queue)
    queued = bool(wait) and (share is None or share >= QUEUE_SAMPLE_RATIO)
    waited = "" if share is None else f" in {share * 100:.0f} % of the samples"
    if pre or (kv is not None and kv >= full and queued):
        return "kv-cache", (f"{pre or 0} preemptions ({V.num_preemptions_total}), KV cache up to {kv_s} used, "
                            f"up to {wait or 0:.0f} waiting{waited}")
    if queued:
        return "queue", (f"up to {wait:.0f} waiting{waited} while the KV cache had room (up to {kv_s} used)"
                         + ("" if run is None else f" and up to {run:.0f} ran") + ": the scheduler admitted no more")
    what = "nothing waited" if not wait else f"up to {wait:.0f} waiting only{waited}"
    ran = "running not sampled" if run is None else f"up to {run:.0f} running"
    return "compute", (f"{what}, nothing was preempted ({ran}, KV cache up to {kv_s}): "
                       f"the latency is the engine's step time for that batch")


QUEUE_SAMPLE_RATIO = 0.2
QUEUE_MEAN_WAITING = 0.5   # requests waiting on average (Little's law) that make a queue
LIMIT_WORDS = {"kv-cache": "the KV cache", "queue": "the queue", "compute": "compute"}


@dataclass
class Knee:
    concurrency: int | None
    reason: str
    found: bool = False   # False: throughput still grew at the top of the ladder (knee at or above it)


def find_knee(levels: list[LevelResult], gain: float) -> Knee:
    """The last level worth its load: the step up from it gains < ``gain`` throughput while
    p99 TTFT grows. No such step: the highest level tried (the knee lies beyond the ladder).
    ``Knee.concurrency`` is the level's place (its request rate on a rate ladder)."""
    usable = [lv for lv in sorted(levels, key=level_key) if lv.completed > 0]
    if not usable:
        return Knee(None, "no level completed a request")
    for prev, cur in zip(usable, usable[1:]):
        if prev.output_throughput <= 0:
            continue
        g = cur.output_throughput / prev.output_throughput - 1.0
        p_prev, p_cur = prev.ttft_ms.get("p99"), cur.ttft_ms.get("p99")
        if g < gain and p_prev is not None and p_cur is not None and p_cur > p_prev:
            return Knee(_place(prev),
                        f"from {level_name(prev, short=True)} to {level_name(cur)} output throughput "
                        f"changed by {g * 100:+.1f} % ({prev.output_throughput:.1f} -> {cur.output_throughput:.1f} "
                        f"tokens/s, under {gain * 100:.0f} %) while p99 TTFT grew {p_prev:.0f} -> {p_cur:.0f} ms",
                        found=True)
    last = usable[-1]
    return Knee(_place(last), f"throughput still grew by {gain * 100:.0f} % or more at every step: "
                              f"the knee is at or above {level_name(last)}; extend the ladder to find it")


def _place(lv):
    """A level's place as stored: its concurrency (an int), or its request rate."""
    return lv.concurrency if lv.request_rate is None else lv.request_rate


@dataclass
class Recommendation:
    flag: str
    value: float | None
    why: str
    arithmetic: list[str]
    limited_by: str | None = None     # kv-cache | queue | compute: what limits the load past the recommendation
    limited_why: str | None = None


def _limit_line(levels: list[LevelResult], above: float | None) -> tuple[str | None, str | None, str | None]:
    """What limits the first level past ``above`` (None: the first level), from its /metrics."""
    past = [lv for lv in sorted(levels, key=level_key) if above is None or level_key(lv) > above]
    if not past:
        return None, None, None
    lv = past[0]
    what, why = lv.limited_by, lv.limited_why
    if what is None:
        what, why = limit_of(asdict(lv))
    if what is None:
        return None, None, None
    return what, why, f"limited by {LIMIT_WORDS[what]} at {level_name(lv)}: {why}"


def recommend(levels: list[LevelResult], knee: Knee, kv_cache_tokens: int | None,
              objectives: Objectives | None = None) -> Recommendation:
    """``--max-num-seqs``: the highest level that met every latency objective, capped by what the
    KV cache holds and by the preemption-free levels. The knee is a separate fact, never the answer
    on its own (a knee can lie far past the objective). On a rate ladder: the highest request rate
    that met every objective (a capacity, not a flag). Each says which resource limits the next
    level up (KV cache, the queue or compute), from the server's /metrics."""
    if any(lv.request_rate is not None for lv in levels):
        return _recommend_rate(levels, knee, objectives)
    lines: list[str] = []
    candidates: list[tuple[int, str, str]] = []   # (value, what, why)
    if knee.concurrency is not None:
        lines.append(f"knee (a separate fact): {knee.concurrency} concurrent requests ({knee.reason})")
    if objectives is not None and objectives.items():
        top, why_top = highest_meeting([asdict(lv) for lv in levels], objectives)
        lines.append(why_top)
        if top is None:
            what, lwhy, line = _limit_line(levels, None)
            if line:
                lines.append(line)
            return Recommendation("--max-num-seqs", None, why_top + "; nothing to recommend: try lower levels "
                                  "or more requests per level (--requests) to decide UNDECIDED ones", lines, what, lwhy)
        candidates.append((int(top), "the highest level that met every objective",
                           f"above it the latency objectives ({objectives.describe()}) were not met"))
    per_req = [lv.mean_tokens_per_request for lv in levels if lv.mean_tokens_per_request]
    if kv_cache_tokens and per_req:
        tok = max(per_req)
        fit = int(kv_cache_tokens // tok)
        lines.append(f"KV cache: {kv_cache_tokens:,} tokens / {tok:,.1f} tokens per request "
                     f"(observed prompt + output) = {fit} sequences held at once")
        candidates.append((max(fit, 1), "what the KV cache holds for these requests",
                           f"the KV cache holds {fit} sequences of this length; more are preempted and recomputed"))
    pre = [lv for lv in levels if lv.preemptions is not None]
    if pre:
        clean = [lv.concurrency for lv in pre if lv.preemptions == 0]
        first_bad = min((lv.concurrency for lv in pre if lv.preemptions), default=None)
        if first_bad is not None:
            below = max((c for c in clean if c < first_bad), default=None)
            lines.append(f"preemptions began at {first_bad} concurrent requests"
                         + (f"; {below} ran without preemption" if below else ""))
            if below:
                candidates.append((below, "the highest level without preemption",
                                   f"at {first_bad} concurrent requests vLLM preempted sequences"))
        else:
            lines.append(f"no level was preempted ({V.num_preemptions_total} did not move)")
    if not candidates:
        return Recommendation("--max-num-seqs", None, "no level completed: nothing to recommend", lines)
    value, what, reason = min(candidates, key=lambda c: c[0])  # a tie: the first named (knee, KV, preemption)
    lines.append(f"--max-num-seqs = min({', '.join(f'{v} ({w})' for v, w, _ in candidates)}) = {value}")
    if objectives is not None and objectives.items():
        # a level that was run at that value must itself have met the objectives (the highest level that
        # did may lie above one that failed or stayed UNDECIDED): else the highest below it that did
        status = {lv.concurrency: level_status(judge(asdict(lv), objectives)) for lv in levels if lv.completed}
        if status.get(value, "PASS") != "PASS":
            passed = max((c for c, st in status.items() if c < value and st == "PASS"), default=None)
            lines.append(f"{value} concurrent requests was {status[value]} on the objectives: "
                         + (f"{passed}, the highest level below it that met them" if passed else "no level below it met them"))
            if passed is None:
                limit, lwhy, line = _limit_line(levels, None)
                return Recommendation("--max-num-seqs", None, f"{value} concurrent requests was {status[value]} on the "
                                      "objectives and no lower level met them: try lower levels or more requests per "
                                      "level (--requests)", lines + ([line] if line else []), limit, lwhy)
            value, what = passed, "the highest level at or below that which met every objective"
            reason = f"the level above it did not clearly meet the objectives ({objectives.describe()})"
    limit, lwhy, line = _limit_line(levels, value)
    if line:
        lines.append(line)
    why = f"Admit at most {value} sequences ({what}): {reason}."
    if limit:
        why += f" What limits more load: {LIMIT_WORDS[limit]}."
    return Recommendation("--max-num-seqs", value, why, lines, limit, lwhy)


def _recommend_rate(levels: list[LevelResult], knee: Knee, objectives: Objectives | None) -> Recommendation:
    lines: list[str] = []
    if knee.concurrency is not None:
        lines.append(f"knee (a separate fact): {knee.concurrency:g} req/s ({knee.reason})")
    if objectives is None or not objectives.items():
        return Recommendation("", None, "no objective given: nothing to recommend", lines)
    top, why_top = highest_meeting([asdict(lv) for lv in levels], objectives)
    lines.append(why_top)
    limit, lwhy, line = _limit_line(levels, top)
    if line:
        lines.append(line)
    if top is None:
        return Recommendation("", None, why_top + "; nothing to recommend: try lower rates", lines, limit, lwhy)
    why = (f"This server meets every objective ({objectives.describe()}) up to {top:g} requests/s of this workload"
           + (f"; past it {LIMIT_WORDS[limit]} limits it." if limit else "."))
    return Recommendation("", top, why, lines, limit, lwhy)


class _MetricsReader:
    def __init__(self, client: httpx.AsyncClient, url: str | None, timeout_seconds: float = 10.0):
        self.client, self.url, self.timeout = client, url, min(10.0, timeout_seconds)
        self.last_error: str | None = None
        self.reads_ok = 0
        self.reads_failed = 0
        self.last_text: str | None = None

    @property
    def error(self) -> str | None:
        """Why /metrics could not be read, when no read succeeded (a failed read among good ones
        is :attr:`reads_failed`, not an error of the run)."""
        return self.last_error if self.reads_ok == 0 else None

    async def read(self):
        if not self.url:
            return None
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(self.timeout):   # total: httpx's timeout is per read
                    r = await self.client.get(self.url, timeout=self.timeout)
                break
            except httpx.RemoteProtocolError as e:   # the server closed a kept-alive connection: once more
                if attempt == 2:
                    return self._failed(f"{self.url}: {type(e).__name__}")
            except (httpx.HTTPError, TimeoutError) as e:
                return self._failed(f"{self.url}: {type(e).__name__}")
        if r.status_code != 200:
            return self._failed(f"{self.url}: HTTP {r.status_code}")
        self.reads_ok += 1
        self.last_text = r.text
        # off the event loop: vLLM's /metrics is about 50 KB, and parsing it there would hold back the
        # streams being timed (their chunks then arrive "together")
        return await asyncio.to_thread(parse_metrics, r.text, source=self.url)

    def _failed(self, why: str) -> None:
        self.reads_failed += 1
        self.last_error = why
        return None


def _cache_tokens(parsed) -> int | None:
    """KV cache tokens of the server, as ``diagnose`` reads them from the same /metrics sample
    (the state's resolved cache config: ``kv_cache_size_tokens``, else blocks x block size)."""
    if parsed is None:
        return None
    state = State()
    state.apply(parsed.sample)
    return state.facts().get("kv_cache_tokens")


async def _resolve_model(client: httpx.AsyncClient, base: str) -> str:
    try:
        async with asyncio.timeout(15):   # total: httpx's timeout is per read
            r = await client.get(base + "/v1/models", timeout=15)
    except (httpx.HTTPError, TimeoutError) as e:
        why = "no answer within 15 s" if isinstance(e, (httpx.TimeoutException, TimeoutError)) else (str(e) or "failed")
        raise BenchError(f"{base}/v1/models: {type(e).__name__}: {why} (is vLLM's OpenAI server at this URL?)") from None
    if r.status_code != 200:
        raise BenchError(f"{base}/v1/models: HTTP {r.status_code}")
    try:
        data = r.json().get("data") or []
        return data[0]["id"]
    except (ValueError, KeyError, IndexError, AttributeError):
        raise BenchError(f"{base}/v1/models: no model listed; give --model") from None


async def _server_version(client: httpx.AsyncClient, base: str, timeout_seconds: float) -> str | None:
    """vLLM's ``GET /version`` ({"version": "0.x.y"}); None when the server does not answer it
    within ``timeout_seconds`` (at most 2 s: a version is not worth waiting for)."""
    t = min(2.0, timeout_seconds)
    try:
        async with asyncio.timeout(t):   # total: httpx's timeout is per read
            r = await client.get(base + "/version", timeout=t)
        v = r.json().get("version") if r.status_code == 200 else None
    except (httpx.HTTPError, TimeoutError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) and len(v) <= 64 else None


def _counters(parsed, text: str | None) -> dict[str, float | None]:
    """The counters read before and after a level (besides preemptions)."""
    out: dict[str, float | None] = {}
    if parsed is not None:
        out["prefix_cache_queries_total"] = parsed.sample.prefix_cache_queries_total
        out["prefix_cache_hits_total"] = parsed.sample.prefix_cache_hits_total
    out.update(_series_sums(text or "", (RECOMPUTED, RUNNING_SECONDS, WAITING_SECONDS)))
    return out


def _series_sums(text: str, names: tuple[str, ...]) -> dict[str, float | None]:
    """The sum over labels of each series of a /metrics text (prometheus-client's parser, one pass);
    None for one that is absent."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float | None] = dict.fromkeys(names)
    if not any(name in text for name in names):
        return totals
    try:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name in totals and math.isfinite(smp.value):
                    totals[smp.name] = (totals[smp.name] or 0.0) + smp.value
    except ValueError:
        return dict.fromkeys(names)
    return totals


def interval_enough(values: dict[str, list[float]], obj: Objectives, tolerance: float, seed: int) -> str | None:
    """Why an adaptive level may stop: every objective's p99 interval is decided (wholly on one side
    of the objective) or narrower than ``tolerance`` x its p99. None: keep sending."""
    from vllm_doctor.loadtest.objectives import METRICS

    names = [n for n, _ in obj.items()] or ["ttft_p99_ms", "itl_p99_ms"]
    said = []
    for name in names:
        v = values.get(METRICS[name][0]) or []
        ci = percentile_ci(v, 99, seed=seed)
        if ci is None:
            return None
        lo, hi = ci[0] * 1000, ci[1] * 1000
        p99 = (_pct(v, 99) or 0.0) * 1000
        limit = getattr(obj, name)
        what = METRICS[name][2]
        if limit is not None and (hi <= limit or lo > limit):
            said.append(f"{what} [{lo:,.0f}-{hi:,.0f}] ms {'within' if hi <= limit else 'over'} {limit:,.0f} ms")
        elif p99 > 0 and hi - lo <= tolerance * p99:
            said.append(f"{what} [{lo:,.0f}-{hi:,.0f}] ms within {tolerance * 100:.0f} % of its p99")
        else:
            return None
    return "its intervals were decided: " + "; ".join(said)


async def run_level(client: httpx.AsyncClient, cfg: LadderConfig, model: str, level: int,
                    prompts: Workload, metrics: _MetricsReader,
                    on_request: Callable[[RequestResult], None] | None = None,
                    rate: float | None = None, first_index: int = 0) -> LevelResult:
    """One level: ``level`` requests in flight at most (a concurrency ladder), or Poisson arrivals
    at ``rate`` per second capped at ``level`` in flight (a rate ladder). The first
    ``cfg.warmup_for(level)`` requests are warm-up: sent, never counted."""
    base = cfg.url.rstrip("/")
    url = base + ("/v1/chat/completions" if cfg.chat else "/v1/completions")
    n_target = cfg.requests_for(level if rate is None else max(1, math.ceil(rate)))
    warmup = cfg.warmup_for(level if rate is None else max(1, math.ceil(rate)))   # the first wave / second
    soft: float = cfg.level_timeout_seconds
    if n_target is None and cfg.duration_seconds is not None:
        soft = cfg.duration_seconds
    deadline = time.monotonic() + soft
    hard_deadline = time.monotonic() + cfg.level_timeout_seconds
    rng = random.Random(cfg.seed * 1000003 + level + int((rate or 0) * 1000))
    arrival_rate = rate if rate is not None else cfg.request_rate
    window = MetricsWindow()
    before = await metrics.read()
    if before is not None:
        window.preemptions_before = before.sample.num_preemptions_total
        window.counters_before = _counters(before, metrics.last_text)
    results: list[tuple[int, RequestResult]] = []
    sent_at: dict[int, float] = {}
    issued = 0
    next_arrival = time.monotonic()
    sem = asyncio.Semaphore(level)
    stop = asyncio.Event()
    stop_reason: str | None = None
    measured_ok: dict[str, list[float]] = {"ttft_ms": [], "itl_ms": [], "tpot_ms": [], "e2el_ms": []}
    checked = 0
    eff = level if rate is None else max(1, math.ceil(rate))   # a rate ladder: about a second of arrivals
    min_n = cfg.min_requests_for(eff)

    in_flight = 0
    jitter = random.Random(cfg.seed * 1000003 + level + 7)

    async def sampler():
        """Peaks of the level: reads only while its requests are in flight (when the read is sent and
        when it is answered), at jittered intervals (a fixed period locks in phase with a steady request
        cycle: at one request in flight, every read could land on the same moment of it)."""
        wait = cfg.metrics_interval_seconds * jitter.uniform(0.25, 0.75)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), wait)
                break
            except TimeoutError:
                pass
            wait = cfg.metrics_interval_seconds * jitter.uniform(0.5, 1.5)
            if in_flight == 0:
                wait = min(wait, 0.05)   # between requests: read as soon as one is in flight again
                continue
            m = await metrics.read()
            if m is not None and in_flight > 0 and not stop.is_set():
                window.add(m.sample)

    async def one(i: int):
        nonlocal in_flight
        in_flight += 1
        try:
            prompt, max_tokens = prompts.request(first_index + i)   # unique in the ladder: no level reuses a prompt
            sent_at[i] = time.time()
            try:
                res = await stream_one(client, url, request_body(model, prompt, max_tokens, cfg.chat,
                                                                 cfg.ignore_eos), cfg.chat,
                                       min(cfg.request_timeout_seconds, max(1.0, hard_deadline - time.monotonic())),
                                       cfg.max_response_bytes)
            finally:
                in_flight -= 1
            results.append((i, res))
            if i >= warmup and res.ok:
                for key, v in (("ttft_ms", res.ttft_seconds), ("tpot_ms", res.tpot_seconds),
                               ("e2el_ms", res.e2e_seconds)):
                    if v is not None:
                        measured_ok[key].append(v)
                measured_ok["itl_ms"].extend(res.itl_seconds)
            if on_request:
                on_request(res)
        finally:
            sem.release()

    def enough() -> str | None:
        """An adaptive level's stop: its intervals are decided (checked every few completions)."""
        nonlocal checked
        n = len(measured_ok["e2el_ms"])
        if n < min_n or n - checked < max(4, eff // 2):
            return None
        checked = n
        return interval_enough(measured_ok, cfg.objectives, cfg.ci_tolerance, cfg.seed * 1000003 + level)

    started = time.time()
    sample_task = asyncio.create_task(sampler())
    tasks = []
    while True:
        if n_target is not None and issued >= warmup + n_target:
            break
        if cfg.adaptive:
            if issued >= warmup + cfg.max_requests_per_level:
                stop_reason = f"{cfg.max_requests_per_level:,} requests sent (the most per level)"
                break
            stop_reason = enough()
            if stop_reason:
                break
        if time.monotonic() >= deadline or time.monotonic() >= hard_deadline:
            if cfg.adaptive:
                stop_reason = f"time bound of {soft:g} s reached before the intervals were decided"
            break
        try:   # a slot frees when a request ends; a server that never ends one must not hold the level open
            await asyncio.wait_for(sem.acquire(), max(0.001, min(deadline, hard_deadline) - time.monotonic()))
        except asyncio.TimeoutError:
            continue
        if arrival_rate:
            next_arrival = max(next_arrival, time.monotonic() - 1.0) + rng.expovariate(arrival_rate)
            delay = next_arrival - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        idx = issued
        issued += 1
        tasks.append(asyncio.create_task(one(idx)))
    if tasks:
        await asyncio.wait(tasks, timeout=max(1.0, hard_deadline - time.monotonic() + 5))
    for t in tasks:
        if not t.done():
            t.cancel()
    ended = time.time()
    stop.set()
    await sample_task
    after = await metrics.read()
    if after is not None:
        window.preemptions_after = after.sample.num_preemptions_total
        window.counters_after = _counters(after, metrics.last_text)   # its gauges show the idle server: no peak
    measured = [r for i, r in sorted(results, key=lambda x: x[0]) if i >= warmup]
    first_measured = min((t for i, t in sent_at.items() if i >= warmup), default=started)
    out = summarise(level, measured, first_measured, ended, window, cfg, warmup=min(warmup, issued),
                    rate=rate, stop_reason=stop_reason)
    out.sent = issued
    span = max(ended - started, 1e-9)   # every request of the level, warm-up included, ran within it
    for attr, name in (("mean_running", RUNNING_SECONDS), ("mean_waiting", WAITING_SECONDS)):
        d = window.delta(name)
        setattr(out, attr, None if d is None else round(d / span, 2))
    return out


async def run_ladder(cfg: LadderConfig, on_level_start: Callable[[float, int | None], None] | None = None,
                     on_request: Callable[[RequestResult], None] | None = None,
                     on_level_done: Callable[[LevelResult], None] | None = None) -> dict:
    """Run every level in order; returns the JSON-ready result (see :func:`result_dict`)."""
    if cfg.rates:
        if any(not (r > 0) for r in cfg.rates):
            raise BenchError("--rates must be positive request rates, e.g. 1,2,4,8")
    elif not cfg.levels or any(c < 1 for c in cfg.levels):
        raise BenchError("--levels must be positive integers, e.g. 8,16,32")
    base = cfg.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"--url must be an http(s) URL, got {cfg.url!r}")
    try:
        workload = cfg.workload()
    except ValueError as e:
        raise BenchError(str(e)) from None
    top = cfg.max_concurrency if cfg.rates else max(cfg.levels)
    limits = httpx.Limits(max_connections=top + 4, max_keepalive_connections=top + 4)
    # /metrics on a client of its own: a sample never waits for a connection behind the streams
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client, \
            httpx.AsyncClient(limits=httpx.Limits(max_connections=1), trust_env=False) as mclient:
        model = cfg.model or await _resolve_model(client, base)
        vllm_version = await _server_version(client, base, cfg.request_timeout_seconds)
        murl = (base + "/metrics") if cfg.metrics_url is None else cfg.metrics_url
        metrics = _MetricsReader(mclient, murl, cfg.request_timeout_seconds)
        first = await metrics.read()
        if first is None:
            metrics.url = None   # unreadable before any load: reading it again each second only waits
        kv_tokens = _cache_tokens(first)
        levels: list[LevelResult] = []
        stopped = None
        steps = [(cfg.max_concurrency, r) for r in cfg.rates] if cfg.rates else [(c, None) for c in cfg.levels]
        sent = 0
        for n, (c, rate) in enumerate(steps):
            if on_level_start:
                on_level_start(c if rate is None else rate,
                               cfg.requests_for(c if rate is None else max(1, math.ceil(rate))))
            lv = await run_level(client, cfg, model, c, workload, metrics, on_request, rate=rate, first_index=sent)
            sent += lv.sent
            levels.append(lv)
            if on_level_done:
                on_level_done(lv)
            if lv.completed == 0 and n != len(steps) - 1:
                stopped = (f"stopped after {level_name(asdict(lv))}: none of its {lv.requests} requests completed "
                           f"({'; '.join(lv.error_examples) or 'no answer'}); higher levels would only wait longer")
                break
    for lv in levels:
        lv.limited_by, lv.limited_why = limit_of(asdict(lv))
    knee = find_knee(levels, cfg.knee_gain)
    rec = recommend(levels, knee, kv_tokens, cfg.objectives)
    out = result_dict(cfg, model, levels, knee, rec, kv_tokens, metrics.error)
    out["metrics_reads"] = {"ok": metrics.reads_ok, "failed": metrics.reads_failed, "last_error": metrics.last_error}
    out["vllm_version"] = vllm_version   # `bench compare` refuses runs of different versions
    out["simulated"] = bool(vllm_version and "simulated" in vllm_version)
    out["workload"] = workload.describe()
    out["stopped"] = stopped
    return out


def result_dict(cfg: LadderConfig, model: str, levels: list[LevelResult], knee: Knee,
                rec: Recommendation, kv_tokens: int | None, metrics_error: str | None) -> dict:
    c = asdict(cfg)
    c.pop("prompts", None)
    c["prompts_given"] = bool(cfg.prompts)
    return {
        "kind": RESULT_KIND, "version": RESULT_VERSION, "url": cfg.url, "model": model,
        "config": c, "kv_cache_tokens": kv_tokens, "metrics_error": metrics_error,
        "objectives": asdict(cfg.objectives),
        "levels": [_judged(asdict(lv), cfg.objectives) for lv in levels],
        "knee": asdict(knee), "recommendation": asdict(rec),
    }


def _judged(level: dict, obj: Objectives) -> dict:
    level["objectives"] = judge(level, obj)
    level["meets_objectives"] = level_status(level["objectives"]) if level["objectives"] else None
    return level
