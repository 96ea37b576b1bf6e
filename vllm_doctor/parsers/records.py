"""Stage 3 of the pipeline: records -> typed events.

One matcher table for every vLLM version in use (0.2 to 0.33, V0 and V1 engines). Each entry
names the vLLM source file and versions its format comes from; the exact format strings per
version are in ``docs/log-formats.md`` (read from the released wheels). Formats drift between
versions, so each matcher accepts the known variants (``# GPU blocks`` / ``# cuda blocks``,
``models's`` / ``model's``, ``GB`` / ``GiB``, one-line and two-line capacity messages, ...).

Messages are matched from their start (after the envelope removed prefixes and an optional
``SomeError: `` exception prefix), so text inside a request's prompt cannot fake an event.
Error signatures that vLLM wraps in other messages (``RuntimeError: Worker failed with error
'...'``) are searched inside the message, but never inside request-logging lines.

A :class:`RecordParser` also joins the lines of a Python traceback into one
:class:`~vllm_doctor.events.ExceptionRaised` event spanning its first to last line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from vllm_doctor import events as ev
from vllm_doctor.ingest.envelope import CLIENT_KEYWORDS, KeywordScanner, Record
from vllm_doctor.textscan import top_level
from vllm_doctor.versions import known_flag

GIB = 1 << 30
UNITS = {"B": 1, "KiB": 1 << 10, "KB": 1 << 10, "MiB": 1 << 20, "MB": 1 << 20, "GiB": GIB, "GB": GIB,
         "TiB": 1 << 40, "TB": 1 << 40}


def to_bytes(value: str | float, unit: str) -> int:
    """``"14.62", "GiB"`` -> bytes. vLLM's "GB" messages divide by 1024**3, so GB means GiB."""
    return round(float(value) * UNITS.get(unit, GIB))  # round() of a float is an int


def _int(s: str | None) -> int | None:
    return None if s is None else int(s.replace(",", ""))


def _float(s: str | None) -> float | None:
    return None if s is None else float(s.replace(",", ""))


Builder = Callable[[re.Match, ev.Meta], Any]


@dataclass(frozen=True)
class Matcher:
    """One entry of the matcher table, the single source of truth for what vllm-doctor reads.

    name: stable id; regex: compiled pattern (anchored at the message start unless ``search``);
    build: match -> event(s) or None; keywords: literal texts one of which every line this
    matcher can match contains (the prefilter is derived from them: :func:`prefilter_keywords`);
    versions / source: the vLLM versions and source files the wording comes from; examples: real
    log lines (as printed, with vLLM's prefix) that it must turn into an event (tests feed them
    through :class:`~vllm_doctor.pipeline.Pipeline` under every wrapper). exc_types: on a
    traceback's exception line (``Type: message``, :data:`EXC_LINE_RE`) it matches only when the
    type's last dotted name is one of these (the types its failure is raised as; any other type's
    message is someone else's text: a request's, a template's, the model's output); None: any line.
    """

    name: str
    regex: re.Pattern
    build: Builder
    search: bool
    keywords: tuple[str, ...]
    versions: str
    source: str
    examples: tuple[str, ...]
    exc_types: frozenset[str] | None = None


MATCHERS: list[Matcher] = []


def matcher(name: str, pattern: str, search: bool = False, flags: int = 0, *, keywords: tuple[str, ...],
            versions: str, source: str, examples: tuple[str, ...], exc_types: frozenset[str] | None = None):
    """Register a builder for messages matching ``pattern`` (anchored unless ``search``).

    An anchored pattern matches at the start of vLLM's message (after blanks), never after an
    exception's ``SomeError: `` head: what vLLM logs as a fact (a stats line, a KV cache size, a
    preemption warning) is its logger's own text, and an exception line that holds it is someone
    else's (``ValueError: GPU KV cache size: 1 tokens`` from a client's schema set kv_cache_tokens
    to 1). No anchored matcher meets an exception head in any of the 253 real logs of the corpus
    and fixtures. What vLLM raises is read by the search matchers, anchored to the exception types
    it is raised as (``exc_types``)."""

    def deco(fn: Builder) -> Builder:
        rx = re.compile(pattern if search else r"\s*" + pattern, flags)
        MATCHERS.append(Matcher(name, rx, fn, search, tuple(keywords), versions, source, tuple(examples), exc_types))
        return fn

    return deco


# ---- periodic stats (engine/metrics.py V0 0.3.3-0.10.2, llm_engine.py 0.1-0.3, v1/metrics/loggers.py V1)
STATS_FIELD = re.compile(
    r"(Running|Swapped|Pending|Waiting|Preemptions|Prefix cache hit rate|"
    r"(?P<dev>[A-Z][A-Za-z]{0,15}(?: \+ \w{1,15})?) KV cache usage): (?P<val>\d{1,9}(?:\.\d{1,6})?)(?![\d.])"
)


@matcher("stats", r"(?:Engine (?P<eng>\d+): |(?P<agg>\d+) Engines Aggregated: )?Avg prompt throughput: (?P<p>[\d.]+) tokens/s, Avg generation throughput: (?P<g>[\d.]+) tokens/s,(?P<rest>.*)",
         keywords=('Avg prompt throughput: ',),
         versions='0.1-0.33', source='llm_engine.py (0.1-0.3), engine/metrics.py (0.3.3-0.10.2), v1/metrics/loggers.py (0.7.3+)',
         examples=(
             'INFO 08-22 20:52:46 metrics.py:406] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%.',
             '(APIServer pid=1) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 300.0 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%, Prefix cache hit rate: 0.0%',
         ))
def _stats(m: re.Match, meta: ev.Meta):
    rest, p, g, eng = m.group("rest", "p", "g", "eng")
    fields, devs = _stats_fields(rest)
    get = fields.get
    running = get("Running")
    if running is None:
        return None
    hit = get("Prefix cache hit rate")
    if hit is not None and hit > 100.0:
        return None  # a usage above 100 % cannot be true (a damaged line)
    for _, val in devs:
        if val > 100.0:
            return None
    swapped = get("Swapped")
    pending = get("Pending")
    kv = cpu = None
    kv_dev = None
    if pending is not None or swapped is not None:  # V0: GPU is the KV cache, CPU the swap space
        waiting = get("Waiting", 0.0) if pending is None else pending
        for dev, val in devs:
            if dev == "GPU":
                kv = round(val / 100, 6)
            elif dev == "CPU":
                cpu = round(val / 100, 6)
        kv_dev = "GPU"
    else:
        waiting = get("Waiting", 0.0)
        if devs:  # V1: the one "<device> KV cache usage" is the KV cache (CPU on the CPU backend)
            kv_dev, val = devs[0]
            kv = round(val / 100, 6)
    pre = get("Preemptions")
    return ev.SchedulerStats(
        meta, float(p), float(g), int(running), int(waiting),
        None if swapped is None else int(swapped), kv, cpu,
        None if hit is None else round(hit / 100, 6), None if pre is None else int(pre),
        int(eng) if eng else None, kv_dev,
    )


def _stats_fields(rest: str) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """The fields of a stats line after its throughputs: ({field: value} for the first of each
    name, [(device, usage)] for each ``<device> KV cache usage``), as ``STATS_FIELD.findall``
    reads them. Where each one lies is the same for every text of the same shape (the regex is
    digit-blind), so it is worked out once per shape (:data:`_STATS_PLANS`, bounded)."""
    shape = rest.encode("utf-8", "surrogatepass").translate(_SHAPE) if len(rest) <= MAX_SHAPE_BYTES else None
    plan = _STATS_PLANS.get(shape) if shape is not None else None
    if plan is None:
        named: list[tuple[str, int, int]] = []
        dev_spans: list[tuple[int, int, int, int]] = []
        for fm in STATS_FIELD.finditer(rest):
            if fm.group("dev"):
                dev_spans.append((*fm.span("dev"), *fm.span("val")))
            elif fm.group(1) not in [k for k, _, _ in named]:
                named.append((fm.group(1), *fm.span("val")))
        plan = (tuple(named), tuple(dev_spans))
        if shape is not None:
            if len(_STATS_PLANS) >= MAX_SHAPES:
                _STATS_PLANS.clear()
            _STATS_PLANS[shape] = plan
    return ({k: float(rest[a:b]) for k, a, b in plan[0]},
            [(rest[a:b], float(rest[c:d])) for a, b, c, d in plan[1]])


_STATS_PLANS: dict[bytes, tuple] = {}


@matcher("stats-note", r"running=(?P<r>\d+),? (?:pending|waiting)=(?P<w>\d+),? gpu_cache=(?P<u>[\d.]+)%",
         keywords=('running=',),
         versions='tuning note (not a vLLM wording)', source='../shared/reference/tuning-note.txt',
         examples=(
             'running=128 pending=512 gpu_cache=0%',
         ))
def _stats_note(m, meta):  # the tuning note's simplified stats line
    return ev.SchedulerStats(meta, None, None, int(m["r"]), int(m["w"]), None, round(float(m["u"]) / 100, 6), kv_device="GPU")


# ---- KV cache capacity
@matcher("blocks", r"# (?P<dev>GPU|cuda|[A-Za-z]+) blocks: (?P<g>\d+)(?:, # CPU blocks: (?P<c>\d+))?",
         keywords=('blocks: ',),
         versions='0.1-0.10 (V0), 0.7.x (early V1)', source='llm_engine.py, gpu_executor.py, executor_base.py, v1/core/kv_cache_utils.py',
         examples=(
             'INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381',
             'INFO 02-11 10:17:54 [executor_base.py:113] # cuda blocks: 36184, # CPU blocks: 2340',
         ))
def _blocks(m, meta):  # V0 llm_engine.py / gpu_executor.py / executor_base.py, early V1 kv_cache_utils.py
    return ev.KvCacheCapacity(meta, num_gpu_blocks=int(m["g"]), num_cpu_blocks=_int(m["c"]),
                              device="GPU" if m["dev"] in ("GPU", "cuda") else m["dev"].upper())


@matcher("kv-size", r"(?P<dev>GPU \+ host|[A-Z][A-Za-z]*) KV cache size: (?P<t>[\d,]+) tokens(?:, Maximum concurrency for (?P<n>[\d,]+) tokens per request: (?P<x>[\d.]+)x)?",
         keywords=('KV cache size: ',),
         versions='0.8-0.33 (V1)', source='v1/core/kv_cache_utils.py',
         examples=(
             '(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2146] GPU KV cache size: 567,978 tokens',
         ))
def _kv_size(m, meta):  # V1 kv_cache_utils.py 0.8+ (one line from 0.28)
    return ev.KvCacheCapacity(meta, kv_cache_tokens=_int(m["t"]), device=m["dev"],
                              max_concurrency=_float(m["x"]), concurrency_tokens=_int(m["n"]))


@matcher("kv-offload", r"CPU offload KV cache size: (?P<t>[\d,]+) tokens",
         keywords=('offload KV cache size: ',),
         versions='tuning note (not a vLLM wording)', source='../shared/reference/tuning-note.txt',
         examples=(
             'CPU offload KV cache size: 65,536 tokens',
         ))
def _kv_offload(m, meta):  # the tuning note
    return ev.KvCacheCapacity(meta, cpu_offload_tokens=_int(m["t"]))


@matcher("concurrency", r"Maximum concurrency for (?P<n>[\d,]+) tokens(?: per request)?: (?P<x>[\d.,]+)(?:x| sequences)",
         keywords=('Maximum concurrency for ',),
         versions='0.6.3-0.10 (V0), 0.8-0.27 (V1)', source='executor/gpu_executor.py, v1/core/kv_cache_utils.py',
         examples=(
             '(EngineCore_0 pid=1399537) INFO 08-19 14:58:40 [kv_cache_utils.py:853] Maximum concurrency for 40,000 tokens per request: 23.06x',
             'INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x',
         ))
def _concurrency(m, meta):  # V0 gpu_executor.py 0.6.3+, V1 kv_cache_utils.py 0.8-0.27, tuning note
    return ev.KvCacheCapacity(meta, max_concurrency=_float(m["x"]), concurrency_tokens=_int(m["n"]))


@matcher("cache-config-info", r"(?:Engine \d+: |\d+ Engines: )?vllm cache_config_info with initialization after num_gpu_blocks is: (?P<g>\d+)",
         keywords=('cache_config_info with initialization after num_gpu_blocks',),
         versions='0.8.5-0.11', source='v1/metrics/loggers.py',
         examples=(
             '(APIServer pid=1391815) INFO 08-19 14:58:41 [loggers.py:142] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 57656',
         ))
def _cache_info(m, meta):  # V1 v1/metrics/loggers.py 0.8.5-0.11
    return ev.KvCacheCapacity(meta, num_gpu_blocks=int(m["g"]))


# ---- memory budget
@matcher("kv-memory", r"Available KV cache memory: (?P<v>-?[\d.]+) (?P<u>GiB|GB)",
         keywords=('Available KV cache memory: ',),
         versions='0.9.1-0.33', source='v1/worker/gpu_worker.py',
         examples=(
             '(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:27 [gpu_worker.py:255] Available KV cache memory: 18.83 GiB',
             '(VllmWorker rank=0 pid=5521) INFO 03-03 10:12:40 [gpu_worker.py:276] Available KV cache memory: -2.57 GiB',
         ))
def _kv_mem(m, meta):  # V1 gpu_worker.py 0.9.1+
    return _kv_budget(ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["v"], m["u"])))


def _kv_budget(e: ev.MemoryProfile):
    """A memory profile whose KV cache budget is below zero (the weights, activations and other
    processes already take more than gpu_memory_utilization of the device): vLLM then raises "No
    available memory for the cache blocks"; the line alone says so when that error is cut off."""
    if e.available_kv_cache_bytes is not None and e.available_kv_cache_bytes < 0:
        return [e, ev.NoCacheMemory(e.meta)]
    return e


@matcher("profile-total", r"the current vLLM instance can use total_gpu_memory \((?P<t>[\d.]+)GiB\) x gpu_memory_utilization \((?P<u>[\d.]+)\)",
         keywords=('total_gpu_memory (',),
         versions='0.6.5-0.10', source='worker/worker.py',
         examples=(
             'INFO 02-11 10:17:54 [worker.py:294] the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.80) = 63.35GiB',
         ))
def _profile_total(m, meta):  # V0 worker.py 0.6.5-0.10
    return ev.MemoryProfile(meta, total_memory_bytes=to_bytes(m["t"], "GiB"), gpu_memory_utilization=float(m["u"]))


@matcher("profile-kv", r"model weights take (?P<w>[\d.]+)GiB;.*the rest of the memory reserved for KV Cache is (?P<k>-?[\d.]+)GiB",
         keywords=('reserved for KV Cache is ',),
         versions='0.6.5-0.10', source='worker/worker.py',
         examples=(
             'INFO 02-11 10:17:54 [worker.py:294] model weights take 1.12GiB; non_torch_memory takes 0.16GiB; PyTorch activation peak memory takes 0.23GiB; the rest of the memory reserved for KV Cache is 61.84GiB.',
         ))
def _profile_kv(m, meta):  # V0 worker.py 0.6.5-0.10
    return _kv_budget(ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["k"], "GiB"), model_weights_bytes=to_bytes(m["w"], "GiB")))


@matcher("model-loading", r"(?:Model loading|Loading model weights) took (?P<v>[\d.]+) (?P<u>GiB|GB)(?: memory)?(?: and (?P<s>[\d.]+) seconds)?",
         keywords=('Model loading took ', 'Loading model weights took '),
         versions='0.4-0.33', source='worker/model_runner.py (0.4-0.7), v1/worker/gpu_model_runner.py (0.6.6+)',
         examples=(
             'INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB',
             '(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:26 [gpu_model_runner.py:1892] Model loading took 1.1201 GiB and 0.494173 seconds',
         ))
def _model_loading(m, meta):  # model_runner.py 0.4-0.7, gpu_model_runner.py 0.6.6+
    return ev.MemoryProfile(meta, model_weights_bytes=to_bytes(m["v"], m["u"]), model_load_seconds=_float(m["s"]))


@matcher("cpu-kv-space", r"Explicitly set \((?P<v>[\d.]+)/(?P<t>[\d.]+)\) GiB for KV cache",
         keywords=('GiB for KV cache',),
         versions='0.2x-0.33 (CPU backend)', source='v1/worker/cpu_worker.py',
         examples=(
             '(Worker pid=14857) INFO 11-30 09:07:54 [cpu_worker.py:260] Explicitly set (1.0/11.71) GiB for KV cache on node 0.',
         ))
def _cpu_kv(m, meta):  # CPU backend cpu_worker.py (0.3x)
    return [ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["v"], "GiB"), total_memory_bytes=to_bytes(m["t"], "GiB")),
            ev.KvCacheCapacity(meta, device="CPU")]


# ---- preemption
# The cumulative count at the end of V0's preemption warning: read by the builder from where the
# matcher's regex stops, on the same line (a lazy ``.*?`` in the regex cost 3 us a line).
CUMULATIVE_RE = re.compile(r"total_num_cumulative_preemption=(\d+)")


@matcher("preempted", r"Sequence group (?P<s>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode",
         keywords=('is preempted by PreemptionMode.',),
         versions='0.2-0.10.2 (V0)', source='core/scheduler.py',
         examples=(
             'WARNING 08-20 10:18:39 scheduler.py:1141] Sequence group 147 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=1',
         ))
def _preempted(m, meta):  # V0 core/scheduler.py 0.4.3-0.10.2 (logged for the 1st, 51st, 101st ...)
    # The sequence group's id is the request id, which from 0.6.4 is the client's X-Request-Id
    # header verbatim (spaces included): it may hold this very phrase and a count of its own. What
    # follows the id is vLLM's fixed text, so vLLM's mode and count are those after the LAST
    # " is preempted by PreemptionMode." of the line.
    text = m.string
    nl = text.find("\n", m.end())
    end = len(text) if nl < 0 else nl
    mode, seq = m["mode"], m["s"]
    last = text.rfind(_PREEMPTED_AT, m.end(), end)
    if last >= 0:
        tm = _PREEMPTED_MODE_RE.match(text, last + len(_PREEMPTED_AT))
        if tm:
            mode, seq = tm[1], text[m.start("s") : last]
            last = tm.end()
    c = CUMULATIVE_RE.search(text, m.end() if last < 0 else last, end)
    mode = mode.upper()
    return ev.Preemption(meta, mode if mode in ("RECOMPUTE", "SWAP") else None, int(c[1]) if c else None, seq)


_PREEMPTED_AT = " is preempted by PreemptionMode."
_PREEMPTED_MODE_RE = re.compile(r"(\w+) mode")


@matcher("preempting-note", r"Preempting seq_id=(?P<s>\S+?) \((?P<how>swap out|swap|recompute)(?:, (?P<b>\d+) blocks)?\)",
         keywords=('Preempting seq_id=',),
         versions='tuning note (not a vLLM wording)', source='../shared/reference/tuning-note.txt',
         examples=(
             'Preempting seq_id=1021 (swap out, 512 blocks)',
         ))
def _preempting(m, meta):  # the tuning note
    return ev.Preemption(meta, "SWAP" if m["how"].startswith("swap") else "RECOMPUTE", None, m["s"], _int(m["b"]))


@matcher("preemption-count-note", r"preemption count: (?P<n>\d+) in (?:the )?last (?P<k>\d+) ?(?P<u>s|sec|seconds?|m|min|minutes?|h|hours?)\b", flags=re.I,
         keywords=('reemption count', 'REEMPTION COUNT'),
         versions='tuning note (not a vLLM wording)', source='../shared/reference/tuning-note.txt',
         examples=(
             'preemption count: 45 in last 5 minutes',
         ))
def _preemption_count(m, meta):  # the tuning note
    unit = m["u"].lower()[0]
    return ev.PreemptionCount(meta, int(m["n"]), int(m["k"]) * {"s": 1, "m": 60, "h": 3600}[unit])


# ---- KV cache too small / no memory / free memory
@matcher("maxlen-gt-kv-v0", r"The model's max seq len \((?P<l>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((?P<t>\d+)\)", search=True,
         keywords=('max seq len (',),
         versions='0.3-0.10 (V0)', source='worker/worker.py raise_if_cache_size_invalid',
         examples=(
             "(VllmWorkerProcess pid=6499) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226] ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (79392). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
         ))
def _too_small_v0(m, meta):  # V0 worker.py raise_if_cache_size_invalid 0.3-0.10
    return ev.KvCacheTooSmall(meta, int(m["l"]), int(m["t"]))


@matcher("maxlen-gt-kv-v1", r"To serve at least one request with the models?'s max seq len \((?P<l>\d+)\),? \((?P<n>[\d.]+) (?P<nu>GiB|GB) KV cache is needed, which is larger than the available KV cache memory \((?P<a>[\d.]+) (?P<au>GiB|GB)\)\.(?: Based on the available memory,(?: the estimated maximum model length is (?P<e>\d+))?)?", search=True,
         keywords=('max seq len (',),
         versions='0.7.3-0.33 (V1)', source='v1/core/kv_cache_utils.py, v1/core/kv_cache_planning.py (0.33)',
         examples=(
             "ERROR 04-05 01:12:55 [core.py:390] ValueError: To serve at least one request with the models's max seq len (1048576), (24.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.97 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
         ))
def _too_small_v1(m, meta):  # V1 kv_cache_utils.py 0.7.3+ ("models's" typo until 0.25), kv_cache_planning.py 0.33
    return ev.KvCacheTooSmall(meta, int(m["l"]), None, to_bytes(m["n"], m["nu"]), to_bytes(m["a"], m["au"]), _int(m["e"]))


@matcher("maxlen-gt-kv-v1-cut", r"To serve at least one request with the models?'s max seq len \((?P<l>\d+)\)(?:,? \((?P<n>[\d.]+) (?P<nu>GiB|GB) KV)?(?!.*available KV cache memory \()", search=True,
         keywords=('max seq len (',),
         versions='0.7.3-0.33 (V1)', source='v1/core/kv_cache_utils.py check_enough_kv_cache_memory, v1/core/kv_cache_planning.py (0.33)',
         examples=(
             # a 120-column terminal cut it (printed by an EngineCore whose `(EngineCore pid=316) ` decoration is left out here)
             "ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach",
         ))
def _too_small_v1_cut(m, meta):
    # The same V1 ValueError cut before "available KV cache memory (...)" (a terminal's hard wrap,
    # a paste): the engine still refused to start because the KV cache cannot hold one sequence of
    # max_model_len tokens; what the cut removed (available memory, estimate) stays unknown.
    return ev.KvCacheTooSmall(meta, int(m["l"]), None, to_bytes(m["n"], m["nu"]) if m["n"] else None)


@matcher("no-cache-memory", r"No available memory for the cache blocks|Cannot auto-fit max_model_len: not enough GPU memory|more than the [\d.]+ GiB of CPU memory reserved for it on node \d+, leaving none for the KV cache", search=True,
         keywords=('No available memory for the cache blocks', 'Cannot auto-fit max_model_len', 'leaving none for the KV cache'),
         versions='0.2-0.33', source='worker/worker.py, v1/core/kv_cache_utils.py, v1/core/kv_cache_planning.py',
         examples=(
             'ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.',
         ))
def _no_mem(m, meta):  # V0 worker.py, V1 kv_cache_utils.py / kv_cache_planning.py
    return ev.NoCacheMemory(meta)


@matcher("kv-check-frame", r"\s+_?(?:raise_if_cache_size_invalid|check_enough_kv_cache_memory)\(",
         keywords=('raise_if_cache_size_invalid(', 'check_enough_kv_cache_memory('),
         versions='0.4-0.10 (V0), 0.7.3-0.33 (V1)', source='worker/worker.py initialize_cache -> raise_if_cache_size_invalid, v1/core/kv_cache_utils.py (kv_cache_planning.py 0.33) check_enough_kv_cache_memory (a traceback\'s source lines)',
         examples=(
             'ERROR 04-28 15:55:45 worker_base.py:157]     raise_if_cache_size_invalid(num_gpu_blocks,',
             '(EngineCore_0 pid=62) ERROR 03-19 11:14:31 [core.py:700]     check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory)',
         ))
def _kv_check_frame(m, meta):
    # A traceback through vLLM's start-up KV cache check, cut before its ValueError: the check
    # only raises "No available memory for the cache blocks" or "max seq len ... larger than ... KV
    # cache": either way the KV cache cannot hold one sequence.
    return ev.NoCacheMemory(meta, from_traceback=True)


@matcher("kv-alloc-frame", r"\s+kv_caches = self\.initialize_kv_cache_tensors\(",
         keywords=('initialize_kv_cache_tensors(',),
         versions='0.9-0.33 (V1)', source='v1/worker/gpu_model_runner.py initialize_kv_cache (a traceback\'s source lines)',
         examples=(
             # corpus 026, as vLLM wrote it (a supervisor added "2026-05-08 11:50:14.753 [Info] (Process) " before it)
             '(EngineCore pid=3043)     kv_caches = self.initialize_kv_cache_tensors(',
         ))
@matcher("kv-init-frame", r"(?:[\w, ]{1,80} = )?self\._initialize_kv_caches\(",
         keywords=('self._initialize_kv_caches(',),
         versions='0.4-0.10 (V0 engine/llm_engine.py), 0.7.3-0.33 (V1 v1/engine/core.py)', source="engine/llm_engine.py LLMEngine.__init__, v1/engine/core.py EngineCore.__init__ (a traceback's source lines)",
         examples=(
             '        self._initialize_kv_caches()',
             '(EngineCore pid=20389) ERROR 11-30 09:14:19 [core.py:1510]     kv_cache_config = self._initialize_kv_caches(vllm_config)',
             '(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708]     num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(',
         ))
def _kv_setup_frame(m, meta):
    # A traceback through the engine's start-up KV cache set-up (memory profiling, the KV check,
    # the cache tensor allocation) printed this source line, its exception cut off or printed by
    # another process: the engine failed to start there.
    return ev.EngineFailure(meta, "core-failed", meta.text[:300])


@matcher("free-memory", r"Free memory on device(?: [\w:.-]+)? \((?P<f>[\d.]+)/(?P<t>[\d.]+) GiB\) on startup is less than (?:desired GPU memory utilization|the engine's budget after excluding external process's weights) \((?P<u>[\d.]+), (?P<r>[\d.]+) GiB\)", search=True,
         keywords=('Free memory on device',),
         versions='0.9-0.33', source='v1/worker/gpu_worker.py, v1/worker/utils.py',
         examples=(
             '(EngineCore_0 pid=1810465) ERROR 09-03 11:03:37 [core.py:712] ValueError: Free memory on device (7.34/139.72 GiB) on startup is less than desired GPU memory utilization (0.9, 125.75 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.',
         ))
def _free_mem(m, meta):  # V1 gpu_worker.py 0.9+
    return ev.InsufficientFreeMemory(meta, to_bytes(m["f"], "GiB"), to_bytes(m["t"], "GiB"), to_bytes(m["r"], "GiB"), float(m["u"]), "GPU")


@matcher("cpu-free-memory", r"Available memory on node \d+ \((?P<f>[\d.]+)/(?P<t>[\d.]+) GiB\) (?:on [\w ]+ )?is less than (?:requested memory for kv|desired CPU memory utilization) \((?:(?P<u>[\d.]+), )?(?P<r>[\d.]+)(?:/[\d.]+)? GiB\)", search=True,
         keywords=('Available memory on node ',),
         versions='0.2x-0.33 (CPU backend)', source='v1/worker/cpu_worker.py',
         examples=(
             '(Worker pid=20401) ERROR 11-30 09:14:19 [multiproc_executor.py:1063] ValueError: Available memory on node 0 (10.11/11.71 GiB) on kv cache allocation is less than requested memory for kv (100.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.',
         ))
def _cpu_free_mem(m, meta):  # CPU backend cpu_worker.py 0.3x
    return ev.InsufficientFreeMemory(meta, to_bytes(m["f"], "GiB"), to_bytes(m["t"], "GiB"), to_bytes(m["r"], "GiB"), _float(m["u"]), "CPU")


# ---- the exception types a failure is raised as (the last dotted name of a traceback's exception
# line: module paths differ by version, and a cut line keeps the end: ``orch.OutOfMemoryError``).
# Read from the real logs (tests/fixtures/corpus/logs, tests/fixtures/logs, the shared fixtures: every
# exception line on which these matchers match) and from where torch and vLLM raise them; on an
# exception line of any other type (ValueError, KeyError, TypeError, jinja2's TemplateError, pydantic's
# ValidationError, JSONDecodeError, vLLM's VLLMValidationError, openai's BadRequestError, ...) the
# phrase is in someone else's text: a request's, a chat template's, the model's output (vLLM 0.32
# chat_completion/serving.py:929 "Error in chat completion stream generator." logs the traceback of
# whatever the stream raised, a parser's error on the model's output included).
# vLLM's engine-death wrappers quote the error that stopped the engine (V0 MQEngineDeadError: "...
# the original error: OutOfMemoryError('CUDA out of memory. ...')", corpus 009).
ENGINE_DEAD_TYPES = frozenset(("EngineDeadError", "MQEngineDeadError", "AsyncEngineDeadError"))
# torch.OutOfMemoryError / torch.cuda.OutOfMemoryError (torch 2.x; RuntimeError's subclass), the
# RuntimeError of torch 1.x, torch_xla (TPU) and torch_npu (Ascend), torch.AcceleratorError (2.8+:
# c10's CUDA errors, "CUDA error: out of memory"); ray's RayTaskError when it cannot take the cause's type.
OOM_TYPES = frozenset(("OutOfMemoryError", "RuntimeError", "AcceleratorError", "RayTaskError")) | ENGINE_DEAD_TYPES
# vLLM's pynccl_wrapper.py ``RuntimeError(f"NCCL error: {error_str}")``, torch ProcessGroupNCCL's
# DistBackendError (DistError's subclasses: torch.distributed.DistBackendError, DistNetworkError) and the
# line of its message that starts with NCCL's result name (c10d NCCLUtils getNcclErrorDetailStr:
# "ncclSystemError: System call ...", "ncclUnhandledCudaError: Call to CUDA function failed.").
NCCL_TYPES = frozenset(("RuntimeError", "DistBackendError", "DistError", "DistNetworkError", "RayTaskError",
                        "ncclSystemError", "ncclInternalError", "ncclUnhandledCudaError", "ncclInvalidUsage",
                        "ncclInvalidArgument", "ncclRemoteError")) | ENGINE_DEAD_TYPES
# vLLM's EngineDeadError (V1), MQEngineDeadError (V0 multiprocessing), AsyncEngineDeadError (V0
# async_llm_engine.py "Background loop is stopped."), RuntimeError (v1/engine/utils.py "Engine core
# initialization failed. ...", v1/utils.py "Process ... died with exit code N", V0 "Engine process
# failed to start", "RPCServer process died before responding to readiness probe"), TimeoutError
# (v1/engine/core_client.py "Timed out waiting for engine core processes to start."), and V0's failed
# step (worker/model_runner_base.py ``type(err)(f"Error in model execution (input dumped to ...): ...")``:
# the step's own error type, an out-of-memory one in the corpus; its "Writing input of failed execution
# to" line, logged first, is no exception line).
ENGINE_TYPES = frozenset(("RuntimeError", "TimeoutError", "OutOfMemoryError", "AcceleratorError",
                          "RayTaskError")) | ENGINE_DEAD_TYPES
assert not any(c.isdigit() for t in OOM_TYPES | NCCL_TYPES | ENGINE_TYPES for c in t)  # the shape table's


# ---- out of memory (torch caching allocator messages, all torch versions in use)
@matcher("cuda-oom", r"(?P<dev>CUDA|XPU|HIP|NPU) out of memory\.(?: Tried to allocate (?P<a>[\d.]+) (?P<au>[KMGT]?i?B)\.)?(?: GPU (?P<i>\d+) has a total capac(?:i)?ty of (?P<t>[\d.]+) (?P<tu>[KMGT]?i?B) of which (?P<f>[\d.]+) (?P<fu>[KMGT]?i?B) is free\.)?(?: Including non-PyTorch memory, this process has (?P<u>[\d.]+) (?P<uu>[KMGT]?i?B) memory in use)?", search=True,
         exc_types=OOM_TYPES,
         keywords=(' out of memory.',),
         versions='every (torch caching allocator)', source='torch c10/cuda/CUDACachingAllocator.cpp (and HIP/XPU/NPU ports)',
         examples=(
             'torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total capacty of 21.67 GiB of which 4.06 MiB is free. Process 2417585 has 21.65 GiB memory in use.',
             'torch.OutOfMemoryError: HIP out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity of 31.98 GiB of which 136.00 MiB is free. Of the allocated memory 31.61 GiB is allocated by PyTorch, and 1.21 MiB is reserved by PyTorch but unallocated.',
         ))
def _oom(m, meta):
    a, au, t, tu, f, fu, i, u, uu = m.group("a", "au", "t", "tu", "f", "fu", "i", "u", "uu")
    unit = UNITS.get  # to_bytes, inlined: one OOM line can follow another thousands of times
    return ev.OutOfMemory(
        meta,
        round(float(a) * unit(au, GIB)) if a else None,
        round(float(t) * unit(tu, GIB)) if t else None,
        round(float(f) * unit(fu, GIB)) if f else None,
        None if i is None else int(i),
        round(float(u) * unit(uu, GIB)) if u else None,
    )


@matcher("cuda-error-oom", r"(?:CUDA (?:driver )?error: out of memory|OutOfMemoryError: (?!\w+ out of memory\.)|cudaErrorMemoryAllocation|(?:CUDA|HIP|XPU|NPU) out of memory occurred|(?:CUDA|HIP|XPU|NPU) out of(?: mem\w*)?$|Ran out of memory in memory space \w+)", search=True,
         exc_types=OOM_TYPES,
         keywords=('error: out of memory', 'OutOfMemoryError: ', 'cudaErrorMemoryAllocation', ' out of', 'Ran out of memory'),
         versions='every (torch / CUDA runtime / XLA), 0.8+ sampler warm-up', source='torch c10/cuda/CUDAException.h, CUDA runtime, XLA (TPU), v1/worker/gpu_model_runner.py _dummy_sampler_run (CUDA out of memory occurred when warming up sampler)',
         examples=(
             'RuntimeError: CUDA error: out of memory',
             'RuntimeError: CUDA driver error: out of memory',
             'RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space smem. Used 1.00M of 1.00M smem. Exceeded smem capacity by 1.7K.',
             '(Worker pid=226322) ERROR 10-25 13:12:42 [multiproc_executor.py:671] RuntimeError: CUDA out of',
         ))
def _oom2(m, meta):
    return ev.OutOfMemory(meta)


# ---- engine death / hangs
_ENGINE_FAILURES = [
    ("engine-dead", r"(?:MQ|Async)?EngineDeadError\b"),
    # V0 async_llm_engine.py; asyncio's report of the callback that re-raised the loop's end (0.2-0.10)
    ("background-task-failed", r"Engine background task failed|Exception in callback functools\.partial\(<function _(?:log_task_completion|raise_exception_on_finish)\b|^handle: <Handle functools\.partial\(<function _(?:log_task_completion|raise_exception_on_finish)\b"),
    ("iteration-timeout", r"Engine iteration timed out"),
    ("core-failed", r"EngineCore(?:Proc)? failed to start|EngineCore encountered a fatal error|EngineCore hit an exception|Engine core initialization failed|Engine process failed to start|WorkerProc failed to start|Frontend process failed during engine core initialization|Timed out waiting for (?:new )?engine core processes to start"),
    ("proc-died", r"(?:Engine core proc|Worker proc|Engine core process|RayWorkerProc rank=\S+) \S* ?died unexpectedly|Worker \S+ pid \S+ died, exit code|Process \S+ \(PID: \S+\) died with exit code|engine core exited unexpectedly|RPCServer process died before responding"),
    ("output-handler", r"AsyncLLM output_handler failed|EngineCore output handler hit an error"),
    ("background-loop", r"Background loop (?:has errored already|is not running|is stopped)|[Tt]ask finished unexpectedly"),
    ("step-failed", r"Writing input of failed execution to|Error in model execution \(input dumped"),
]
_ENGINE_RE = re.compile("|".join(f"(?P<k{i}>{p})" for i, (_, p) in enumerate(_ENGINE_FAILURES)))
_EXIT_CODE_RE = re.compile(r"died unexpectedly \(exit code: (?P<c>-?\d+)\)|died with exit code (?P<d>-?\d+)")


@matcher("engine-failure", _ENGINE_RE.pattern, search=True,
         exc_types=ENGINE_TYPES,
         keywords=('EngineDeadError', 'Engine background task failed', '<function _log_task_completion', '<function _raise_exception_on_finish', 'Engine iteration timed out', 'EngineCore failed to start', 'EngineCore encountered a fatal error', 'EngineCore hit an exception', 'Engine core initialization failed', 'Engine process failed to start', 'died unexpectedly', 'output_handler failed', 'output handler hit an error', 'Background loop ', 'ask finished unexpectedly', 'WorkerProc failed to start', 'EngineCoreProc failed to start', 'Frontend process failed', 'engine core processes to start', ' died, exit code', ') died with exit code', 'exited unexpectedly', 'RPCServer process died', 'failed execution to', 'Error in model execution'),
         versions='0.2-0.33', source='engine/async_llm_engine.py (V0), v1/engine/core.py, core_client.py, async_llm.py, v1/executor/multiproc_executor.py, logging_utils/dump_input.py',
         examples=(
             'ERROR 09-05 17:22:27 async_llm_engine.py:63] Engine background task failed',
             'Exception in callback functools.partial(<function _log_task_completion at 0x7fa306a24220>, error_callback=<bound method AsyncLLMEngine._error_callback of <vllm.engine.async_llm_engine.AsyncLLMEngine object at 0x7fa2f068a010>>)',
             'INFO 10-11 06:51:31 model_runner_base.py:120] Writing input of failed execution to /tmp/err_execute_model_input_20241011-065131.pkl...',
             '(APIServer pid=1) ERROR 05-12 01:48:42 [api_router.py:72] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.',
         ))
def _engine_failure(m, meta):  # V0 async_llm_engine.py, V1 v1/engine/core.py, core_client.py, multiproc_executor.py
    for i, (kind, _) in enumerate(_ENGINE_FAILURES):
        if m.group(f"k{i}"):
            # multiproc_executor.py 0.30+ "... died unexpectedly (exit code: %s)", v1/utils.py "... died with exit code N"
            code = _EXIT_CODE_RE.search(meta.text, m.start()) if kind == "proc-died" else None
            return ev.EngineFailure(meta, kind, meta.text[:300], int(code["c"] or code["d"]) if code else None)
    return None


# ---- NCCL (vLLM pynccl_wrapper.py 0.4.3+; torch ProcessGroupNCCL.cpp)
@matcher("nccl-watchdog", r"Watchdog caught collective operation timeout: WorkNCCL\((?:.*?OpType=(?P<op>\w+))?(?:.*?Timeout\(ms\)=(?P<t>\d+))?", search=True,
         exc_types=NCCL_TYPES,
         keywords=('Watchdog caught collective operation timeout',),
         versions='every (torch ProcessGroupNCCL)', source='torch csrc/distributed/c10d/ProcessGroupNCCL.cpp',
         examples=(
             '(RayWorkerVllm pid=409241) [E ProcessGroupNCCL.cpp:474] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800762 milliseconds before timing out.',
         ))
def _nccl_watchdog(m, meta):
    return ev.NcclError(meta, "watchdog-timeout", meta.text[:300], m["op"], int(m["t"]) / 1000 if m["t"] else None)


@matcher("nccl-error", r"pynccl_wrapper\.py\", line \d+, in \w+|NCCL [Ee]rror(?: \d+)?: |Some NCCL operations have failed or timed out|NCCL watchdog thread terminated|ncclCommInitRank failed|ncclSystemError|ncclInternalError|ncclUnhandledCudaError", search=True,
         exc_types=NCCL_TYPES,
         keywords=('pynccl_wrapper.py", line', 'NCCL error', 'NCCL Error', 'NCCL operations have failed', 'NCCL watchdog thread terminated', 'ncclCommInitRank failed', 'ncclSystemError', 'ncclInternalError', 'ncclUnhandledCudaError'),
         versions='0.4.3-0.33 (pynccl), every (torch)', source='distributed/device_communicators/pynccl_wrapper.py, torch ProcessGroupNCCL.cpp',
         examples=(
             '(RayWorkerVllm pid=409240) [E ProcessGroupNCCL.cpp:488] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.',
             '(VllmWorkerProcess pid=236) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)',
         ))
def _nccl_error(m, meta):
    return ev.NcclError(meta, "error", meta.text[:300])


@matcher("nccl-init-frame", r"\s+(?:self\.pynccl_comm = PyNcclCommunicator|self\.comm: ncclComm_t = self\.nccl\.ncclCommInitRank|self\.nccl\.ncclCommInitRank)\(",
         keywords=("PyNcclCommunicator(", "ncclCommInitRank("),
         versions="0.4.3-0.33", source="distributed/parallel_state.py, distributed/device_communicators/pynccl.py (a traceback's source lines)",
         examples=(
             '(VllmWorkerProcess pid=1252) ERROR 12-25 01:10:28 multiproc_worker_utils.py:229]     self.comm: ncclComm_t = self.nccl.ncclCommInitRank(',
             '(Worker pid=1541060) ERROR 04-14 13:46:59 [multiproc_executor.py:857]     self.pynccl_comm = PyNcclCommunicator(',
         ))
def _nccl_init_frame(m, meta):  # a traceback through NCCL communicator set-up, its error line cut off
    return ev.NcclError(meta, "error", meta.text[:300])


# ---- a process that ended abnormally, as its supervisor or shell says (not vLLM's own wording)
_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9, "SEGV": 11, "TERM": 15}


@matcher("process-exit", r"Main process exited, code=(?P<how>exited|killed|dumped), status=(?P<st>\d+)(?:/(?P<sig>[A-Z]+))?"
         r"|\bexited with code (?P<dc>\d+)$|^(?P<killed>Killed)$|^(?P<segv>Segmentation fault)(?: \(core dumped\))?$"
         r"|^Fatal Python error: (?P<fatal>Segmentation fault|Aborted|Bus error)", search=True,
         keywords=('Main process exited', 'exited with code ', 'Killed', 'Segmentation fault', 'Fatal Python error: '),
         versions='every (the supervisor or shell around vLLM)', source='systemd, docker / docker compose, bash, CPython faulthandler',
         examples=('Jan 28 10:40:10 localhost systemd[1]: vllm.service: Main process exited, code=exited, status=1/FAILURE',
                   'Jan 28 10:40:10 localhost systemd[1]: vllm.service: Main process exited, code=killed, status=9/KILL',
                   'vllm-1 exited with code 137', 'Killed', 'Segmentation fault (core dumped)'))
def _process_exit(m, meta):
    if m["st"] is not None:
        if m["how"] == "exited":
            code = int(m["st"])
            return ev.ProcessExited(meta, code, None) if code else None
        return ev.ProcessExited(meta, None, _SIGNALS.get(m["sig"] or "", int(m["st"])))
    if m["dc"] is not None:
        code = int(m["dc"])
        return ev.ProcessExited(meta, code, code - 128 if code > 128 else None) if code else None
    if m["killed"]:
        return ev.ProcessExited(meta, None, 9)
    return ev.ProcessExited(meta, None, 11 if m["segv"] or m["fatal"] == "Segmentation fault" else 6 if m["fatal"] == "Aborted" else 7)


@matcher("shm-stall", r"No available (?:shared memory broadcast )?block found ?in (?P<s>\d+) seconds?",
         keywords=('block found in ', 'block foundin '),
         versions='0.5-0.33', source='distributed/device_communicators/shm_broadcast.py',
         examples=(
             'INFO 11-11 01:44:59 [shm_broadcast.py:542] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).',
         ))
def _shm(m, meta):  # shm_broadcast.py 0.5+ (WARNING until 0.6.3, DEBUG 0.6.6-0.10, INFO 0.11+): shared memory, not NCCL
    return ev.BroadcastWait(meta, float(m["s"]))


# ---- configuration and version
NAMESPACE_RE = re.compile(r"args: Namespace\((?P<a>.*?)(?P<close>\)\s*)?$")
MAX_NS_PIECES = 8  # continuation lines read after a hard-wrapped args echo
MAX_NS_TAIL = 2000  # characters of a cut pair carried to the next line
# A continuation piece of the args echo: it goes on with a pair (``ow=False, ...``, ``=16384, ...``,
# ``'x', b=1``), never with a logger prefix or a traceback; what a piece holds to pass the prefilter:
# a fact's name or Namespace's way of printing values.
NS_CONT_RE = re.compile(r"[\w'\"\]\[{}.,= -]{0,200}=")
NS_CONT_KEYWORDS = ("=None, ", "=False, ", "=True, ", "max_model_len=", "max_num_seqs=",
                    "max_num_batched_tokens=", "gpu_memory_utilization=", "block_size=")


def _ns_tail(text: str) -> str | None:
    """The cut last pair of an unclosed args echo (to join with the next line); None when it is
    longer than :data:`MAX_NS_TAIL`."""
    cuts = list(top_level(text, ","))
    tail = text[cuts[-1] + 1 :] if cuts else text
    return tail if len(tail) <= MAX_NS_TAIL else None


@matcher("namespace", NAMESPACE_RE.pattern,
         keywords=('args: Namespace(',),
         versions='0.2-0.8.5', source='entrypoints/openai/api_server.py',
         examples=(
             "INFO 02-07 18:06:00 api_server.py:841] args: Namespace(subparser='serve', model_tag='.', config='', host=None, port=8000, max_model_len=4096, max_num_seqs=256)",
             # cut by the paste (corpus 052): the pairs before the cut one
             "INFO 01-23 21:18:03 api_server.py:727] args: Namespace(host='0.0.0.0', port=5000, allow_credentials=False, allowed_origins=['*'], allowed_methods=['*'], allowed_headers=['*'], served_model_name=None, chat_template=None, response_role='assistant', ssl_keyfile=None, ssl_certfile=None, model='01-ai/Yi-34B-Chat', tokenizer=None, revision=None, tokenizer_revision=None, tokenizer_mode='auto', trust_remote_code=True, download_dir='/workspace/.cache/huggingface/hub', load_format='auto', dtype='auto', max_model_len=204800, worker_use_ray=False, pipeline_parallel_size=1, tensor_parallel_size=4, max_parallel_loading_workers=None, block_size=16, seed=1234, swap_space=4, gpu_memory_utilization=0.9, max_num_batched_tokens=None, max_num_seqs=256, max_paddings=256, disable_log_stats=False, quantization=None, enforce_eager=False, max_context_len_to_capture=8192, engine_use_ray=False, disable_log_requests=Fa",
         ))
def _namespace(m, meta):  # entrypoints/openai/api_server.py 0.4.3-0.8.5 (every arg)
    text = m["a"]
    if not m["close"]:  # cut by a paste: the last pair may be cut too
        cuts = list(top_level(text, ","))
        text = text[: cuts[-1]] if cuts else ""
    values = _kv_pairs(text)
    return _config(meta, "namespace", values)


@matcher("non-default-args", r"non-default args: (?P<a>\{.*)$",
         keywords=('non-default args: ',),
         versions='0.9-0.33', source='entrypoints/openai/cli_args.py (0.9), entrypoints/utils.py (0.10), entrypoints/openai/api_utils.py (0.25+)',
         examples=(
             "(APIServer pid=16315) INFO 11-30 09:10:22 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 18002, 'model': '/srv/vllm-test/tiny-llama', 'max_model_len': 2048, 'enforce_eager': True, 'served_model_name': ['tiny'], 'kv_cache_memory_bytes': 4194304, 'max_num_seqs': 32}",
         ))
def _non_default(m, meta):  # entrypoints/openai/cli_args.py 0.9, entrypoints/utils.py 0.10, api_utils.py 0.25+
    text = m["a"]
    try:
        values = ast.literal_eval(text)
        if not isinstance(values, dict):
            raise ValueError
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        values = {k: _literal(v) for k, v in re.findall(r"'(\w+)': ('[^']*'|[^,}{\[\]]+)", text)}
    return _config(meta, "non-default-args", {str(k): v for k, v in values.items()})


ENGINE_INIT_KEYS = {
    "max_seq_len": "max_model_len", "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size", "kv_cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching", "chunked_prefill_enabled": "enable_chunked_prefill",
    "enable_chunked_prefill": "enable_chunked_prefill", "quantization": "quantization",
    "enforce_eager": "enforce_eager", "model": "model", "dtype": "dtype", "device_config": "device",
}


@matcher("engine-init", r"Initializing an? (?:(?P<eng>V[01]) )?LLM engine(?: \(v(?P<v>[^)\s]+)\))? with config: (?P<c>.*)",
         keywords=('LLM engine',),
         versions='0.1-0.10 (V0), 0.7.3-0.33 (V1)', source='engine/llm_engine.py, v1/engine/core.py',
         examples=(
             "INFO 08-29 20:48:52 llm_engine.py:70] Initializing an LLM engine with config: model='llama2-MultiTQ-20230829-01', tokenizer='llama2-MultiTQ-20230829-01', tokenizer_mode=auto, trust_remote_code=False, dtype=torch.float16, use_dummy_weights=False, download_dir=None, use_np_weights=False, tensor_parallel_size=1, seed=0)",
         ))
def _engine_init(m, meta):  # llm_engine.py 0.2-0.10 (V0), v1/engine/core.py 0.7.3+ (V1)
    values: dict[str, object] = {}
    c = m["c"].rstrip()
    pairs = list(re.finditer(r"(?:^|, )(\w+)=('[^']*'|[^,]*)", c))
    for i, pm in enumerate(pairs):
        k, v = pm.group(1), pm.group(2)
        if i == len(pairs) - 1 and pm.end() == len(c) and not c.endswith((")", "}")):
            continue  # the echo stops inside its last pair (a hard wrap, a paste): that value is not whole
        if k in ENGINE_INIT_KEYS and ENGINE_INIT_KEYS[k] not in values and v.strip():
            values[ENGINE_INIT_KEYS[k]] = _literal(v)
    engine = (m["eng"] or "").lower() or ("v0" if m["v"] else None)
    out = list(_config(meta, "engine-init", values))
    if m["v"]:
        out.append(ev.VersionSeen(meta, m["v"], engine))
    elif engine:
        out.append(ev.VersionSeen(meta, "", engine))
    return out


@matcher("api-version", r"vLLM (?:API )?server version (?P<v>[\w.+-]+)",
         keywords=('server version ',),
         versions='0.4-0.33', source='entrypoints/openai/api_server.py, entrypoints/utils.py',
         examples=(
             'INFO 08-25 14:50:36 [api_server.py:1395] vLLM API server version 0.9.2',
         ))
def _api_version(m, meta):  # entrypoints/openai/api_server.py 0.4-0.13, 0.15+
    return ev.VersionSeen(meta, m["v"].rstrip(","))


@matcher("banner-version", r".*█.*\bversion (?P<v>\d+\.\d+[\w.+-]*)",
         keywords=('█',),
         versions='0.11-0.33', source='entrypoints/utils.py (ASCII banner)',
         examples=(
             '(APIServer pid=14564) INFO 11-30 09:07:05 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0',
         ))
def _banner(m, meta):  # the ASCII banner (0.11+)
    return ev.VersionSeen(meta, m["v"])


@matcher("chunked-prefill", r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)",
         keywords=('Chunked prefill is enabled with',),
         versions='0.5-0.33', source='config.py, config/scheduler.py',
         examples=(
             'INFO 07-10 10:07:14 [config.py:2195] Chunked prefill is enabled with max_num_batched_tokens=5120.',
         ))
def _chunked(m, meta):  # config.py / core/sched/scheduler.py 0.5+
    return _config(meta, "scheduler", {"enable_chunked_prefill": True, "max_num_batched_tokens": int(m["n"])})


@matcher("model-len", r"Using max model len (?P<n>\d+)",
         keywords=('Using max model len ',),
         versions='0.10-0.33', source='config/model.py',
         examples=(
             '(APIServer pid=14564) INFO 11-30 09:07:14 [model.py:2152] Using max model len 2048',
         ))
def _model_len(m, meta):  # config 0.10+
    return _config(meta, "model-len", {"max_model_len": int(m["n"])})


@matcher("scheduler-note", r"Initializing scheduler with max_num_seqs=(?P<n>\d+)",
         keywords=('Initializing scheduler with',),
         versions='tuning note (not a vLLM wording)', source='../shared/reference/tuning-note.txt',
         examples=(
             'Initializing scheduler with max_num_seqs=128',
         ))
def _sched_note(m, meta):  # the tuning note
    return _config(meta, "scheduler", {"max_num_seqs": int(m["n"])})


@matcher("config-rejected", r"User-specified max_model_len \((?P<v>\d+)\) is greater than the derived max_model_len \((?:\w+)=(?P<l>[\d.]+)", search=True,
         keywords=('User-specified max_model_len',),
         versions='0.4-0.33', source='config.py _get_and_verify_max_len, config/model.py',
         examples=(
             "ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len (seq_length=2048 or model_max_length=None in model's config.json). This may lead to incorrect model outputs or CUDA errors. Make sure the value is correct and within the model context size.",
         ))
def _rejected(m, meta):  # config/model.py validation
    return ev.ConfigRejected(meta, "max_model_len", int(m["v"]), int(float(m["l"])), meta.text[:300])


@matcher("server-ready", r"(?:Application startup complete|Starting vLLM API server|Uvicorn running on|Available routes are)",
         keywords=('Application startup complete', 'Starting vLLM API server', 'Uvicorn running on', 'Available routes are'),
         versions='0.1-0.33', source='uvicorn, entrypoints/openai/api_server.py, entrypoints/launcher.py',
         examples=(
             '(APIServer pid=14564) INFO 11-30 09:07:56 [launcher.py:186] Available routes are:',
             'INFO:     Application startup complete.',
         ))
def _ready(m, meta):
    return ev.ServerReady(meta)


@matcher("offline-progress", r"(?:Processed prompts|Adding requests):\s+\d{1,3}%\|",
         keywords=('Processed prompts:', 'Adding requests:'),
         versions='0.1-0.33',
         source='entrypoints/llm.py (tqdm "Processed prompts", "Adding requests" 0.1x), entrypoints/common/offline.py',
         examples=(
             'Processed prompts:   0%|          | 0/4 [00:00<?, ?it/s, est. speed input: 0.00 toks/s, output: 0.00 toks/s]',
             'Adding requests: 100%|██████████| 4/4 [00:00<00:00, 1520.78it/s]',
         ))
def _offline_progress(m, meta):  # the offline LLM's progress bar: requests were handed to a started engine
    return ev.ServerReady(meta, inferred=True)


@matcher("shutdown", r"(?:\[shutdown\] API server: shutdown triggered|Received (?:SIGTERM|SIGINT|signal SIGTERM|signal SIGINT)\b)",
         keywords=('shutdown triggered', 'Received SIGTERM', 'Received SIGINT', 'signal SIGTERM', 'signal SIGINT'),
         versions='0.2x-0.33', source='entrypoints/launcher.py, entrypoints/openai/api_server.py',
         examples=(
             '(APIServer pid=14564) INFO 11-30 09:08:54 [launcher.py:254] [shutdown] API server: shutdown triggered',
         ))
def _shutdown(m, meta):  # entrypoints launcher.py (0.3x), api_server signal handlers
    return ev.ServerShutdown(meta)


# Flags that no vLLM version has (the tuning note), and what was meant.
FAKE_FLAGS = {
    "--kv-cache": "--kv-cache-dtype (data type) or --kv-cache-memory-bytes / --gpu-memory-utilization (size)",
    "--chunked-prefill-size": "--max-num-batched-tokens (with --enable-chunked-prefill)",
    "VLLM_USE_PREFILL": "--enable-chunked-prefill (a flag, not an environment variable)",
    "VLLM_LOG_LEVEL": "VLLM_LOGGING_LEVEL",
}
FAKE_KEYS = {"kv_cache": "--kv-cache", "chunked_prefill_size": "--chunked-prefill-size"}
_FAKE_RE = re.compile(r"(?<![\w-])(--kv-cache|--chunked-prefill-size|VLLM_USE_PREFILL|VLLM_LOG_LEVEL)(?![\w-])(?:[ =]+([\w.]+))?")


def _literal(v: str) -> object:
    v = v.strip()
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return v


def _kv_pairs(text: str) -> dict[str, object]:
    """``a=1, b='x, y', c=[1, 2]`` -> dict, splitting only at top-level commas."""
    out: dict[str, object] = {}
    cuts = [-1, *top_level(text, ","), len(text)]
    parts = [text[cuts[i] + 1 : cuts[i + 1]] for i in range(len(cuts) - 1)]
    for p in parts:
        if "=" in p:
            k, v = p.split("=", 1)
            k = k.strip()
            if re.fullmatch(r"\w+", k):
                out[k] = _literal(v)
    return out


def _config(meta: ev.Meta, kind: str, values: dict[str, object]):
    unknown = tuple(FAKE_KEYS[k] for k in values if k in FAKE_KEYS)
    cfg = ev.EngineConfigObserved(meta, kind, tuple(values.items()), unknown)
    return [cfg] + [ev.UnknownFlag(meta, f, FAKE_FLAGS[f], str(values.get(k)) if values.get(k) is not None else None)
                    for k, f in FAKE_KEYS.items() if f in unknown]


# ---- argparse rejecting the command line (Python's argparse, every vLLM version: FlexibleArgumentParser
# is an argparse.ArgumentParser). ``parse_args`` ends with ``self.error(_('unrecognized arguments: %s') %
# ' '.join(argv))`` and ``error`` prints ``'%(prog)s: error: %(message)s\n'`` (prog: ``vllm``, ``vllm
# serve``, ``api_server.py``). The flags are read out of argparse's own text: the tokens that start
# with ``-``, each with the token after it as its value when that is no flag.
MAX_ARGPARSE_FLAGS = 16


@matcher("argparse-unrecognized", r"`?(?P<prog>[\w.-]{1,64}(?: [\w.-]{1,64}){0,3}): error: unrecognized arguments: (?P<a>.{1,2000})",
         keywords=('error: unrecognized arguments: ',),
         versions='every (Python argparse; vllm/utils FlexibleArgumentParser)', source='Python Lib/argparse.py (ArgumentParser.parse_args, error)',
         examples=(
             'vllm: error: unrecognized arguments: --omni',
             '`vllm: error: unrecognized arguments: --config`',
             'api_server.py: error: unrecognized arguments: --max_model_len 4096',
         ))
def _argparse_unrecognized(m, meta):
    toks = m["a"].rstrip("`").split()  # a paste may quote the line as markdown inline code
    out = []
    for i, tok in enumerate(toks):
        if len(out) >= MAX_ARGPARSE_FLAGS:
            break
        if not re.fullmatch(r"--?[A-Za-z][\w.-]{0,80}(?:=\S*)?", tok):
            continue
        flag, eq, value = tok.partition("=")
        if not eq:
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            value = nxt if nxt is not None and not nxt.startswith("-") else None
        out.append(ev.UnknownFlag(meta, flag, _real_flag(flag), value[:80] if value else None, rejected=True))
    return out or None


def _real_flag(flag: str) -> str | None:
    """The setting meant by a flag that argparse rejected: the tuning note's invented flags have
    one (:data:`FAKE_FLAGS`); ``--max_model_len`` is ``--max-model-len`` (argparse accepts
    underscores only from 0.5.4); else None (whether the flag exists in other versions is the
    rule's to say, from the detected version)."""
    if flag in FAKE_FLAGS:
        return FAKE_FLAGS[flag]
    dashed = "--" + flag.lstrip("-").replace("_", "-")
    if dashed != flag and known_flag(dashed):
        return dashed
    return None


# ---- issue 25 item 4: start-up phases, requests rejected for length, KV transfer, GPU support.
# Wordings read from the released wheels (0.6.6, 0.8.0, 0.10.2, 0.33.0); see docs/rules.md.
_PHASE_UNITS = r"(?P<s>\d{1,7}(?:\.\d{1,6})?) ?(?:s|secs?|seconds)\b"


def _phase(name: str) -> Builder:
    def build(m: re.Match, meta: ev.Meta):
        return ev.StartupPhase(meta, name, float(m["s"]))
    return build


for _name, _phase_name, _pattern, _kw, _ver, _src, _ex in (
    ("startup-download", "download", r"Time spent downloading weights for \S{1,300}: " + _PHASE_UNITS,
     ('Time spent downloading weights for ',), '0.7-0.33', 'model_executor/model_loader/weight_utils.py',
     ('INFO 03-12 14:21:37 [weight_utils.py:273] Time spent downloading weights for meta-llama/Llama-3.1-8B-Instruct: 118.207446 seconds',)),
    ("startup-weights", "weights", r"Loading weights took " + _PHASE_UNITS,
     ('Loading weights took ',), '0.7-0.33', 'model_executor/model_loader/default_loader.py, sharded_state_loader.py, tpu.py',
     ('(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:25 [default_loader.py:262] Loading weights took 0.43 seconds',)),
    ("startup-model-load", "model_load", r"Model loading took [\d.]+ ?(?:GiB|GB)(?: memory)? and " + _PHASE_UNITS,
     ('Model loading took ',), '0.7-0.33', 'worker/model_runner.py (V0), v1/worker/gpu_model_runner.py',
     ('(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:26 [gpu_model_runner.py:1892] Model loading took 1.1201 GiB and 0.494173 seconds',)),
    ("startup-dynamo", "dynamo", r"Dynamo bytecode transform time: " + _PHASE_UNITS,
     ('Dynamo bytecode transform time: ',), '0.6.6-0.33', 'compilation/backends.py',
     ('(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:31 [backends.py:541] Dynamo bytecode transform time: 4.89 s',)),
    ("startup-compile", "compile", r"(?:\[[\w.-]{1,40}\] )?torch\.compile (?:takes|took) " + _PHASE_UNITS + r" in total",
     ('torch.compile takes ', 'torch.compile took '), '0.6.6-0.33', 'compilation/monitor.py',
     ('(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:38 [monitor.py:34] torch.compile takes 9.86 s in total',)),
    ("startup-profile", "profile", r"(?:Memory profiling takes|(?:\[[\w.-]{1,40}\] )?Initial profiling/warmup run took) " + _PHASE_UNITS,
     ('Memory profiling takes ', 'Initial profiling/warmup run took '), '0.6.4-0.10 (V0 worker.py), 0.2x-0.33 (compilation/monitor.py)', 'worker/worker.py, compilation/monitor.py',
     ('INFO 11-26 07:29:13 worker.py:232] Memory profiling takes 5.60 seconds',)),
    ("startup-graph-capture", "graph_capture", r"Graph capturing finished in " + _PHASE_UNITS,
     ('Graph capturing finished in ',), '0.3-0.33', 'worker/model_runner.py (V0), v1/worker/gpu_model_runner.py, v1/worker/gpu/model_runner.py',
     ('(VllmWorker rank=0 pid=2120280) INFO 07-28 23:02:49 [gpu_model_runner.py:2567] Graph capturing finished in 9 secs, took 0.61 GiB',)),
    ("startup-init-engine", "init_engine", r"init engine \(profile, create kv cache, warmup model\) took " + _PHASE_UNITS,
     ('init engine (profile, create kv cache, warmup model) took ',), '0.6.4-0.33', 'engine/llm_engine.py (V0), v1/engine/core.py',
     ('INFO 07-28 23:02:50 [core.py:193] init engine (profile, create kv cache, warmup model) took 23.58 seconds',)),
):
    matcher(_name, _pattern, keywords=_kw, versions=_ver, source=_src, examples=_ex)(_phase(_phase_name))

# Exception types a rejected request is raised as: ValueError (0.2-0.10), VLLMValidationError
# (0.2x+, a ValueError), and the wrappers that quote it.
LENGTH_TYPES = frozenset(("ValueError", "VLLMValidationError", "BadRequestError")) | ENGINE_DEAD_TYPES


@matcher("request-too-long", r"(?:Input prompt \((?P<a>\d+) tokens\)(?: \+ lookahead slots \(\d+\))? is too long and exceeds (?:the )?(?:capacity of block_manager|limit of (?P<b>\d+))"
         r"|This model's maximum context length is (?P<c>\d+) tokens\. However, (?:you requested (?P<d>\d+) tokens|your request has (?P<e>\d+) input tokens|your prompt contains (?:at least )?(?P<f>\d+) input tokens|you requested \d+ output tokens and your prompt contains (?:at least )?(?P<g>\d+) input tokens)"
         r"|The (?:decoder |encoder )?prompt \((?:total )?length (?P<h>\d+)\) (?:is longer than the maximum model length of (?P<i>\d+)|is too long to fit into the model \(context length (?P<j>\d+)\)))", search=True,
         exc_types=LENGTH_TYPES,
         keywords=('is too long and exceeds', "maximum context length is ", 'is longer than the maximum model length', 'is too long to fit into the model'),
         versions='0.2-0.33', source='core/scheduler.py (V0), entrypoints/openai/serving_engine.py (0.2-0.11), renderers/params.py (0.3x), v1/engine/processor.py / input_processor.py (V1), inputs/preprocess.py (0.6)',
         examples=(
             'WARNING 05-06 10:02:11 scheduler.py:1089] Input prompt (9000 tokens) is too long and exceeds limit of 8192',
             "ERROR 05-08 21:27:27 [engine.py:198] ValueError: This model's maximum context length is 8192 tokens. However, you requested 8203 tokens (7691 in the messages, 512 in the completion). Please reduce the length of the messages or completion.",
             'ValueError: The decoder prompt (length 12324) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens.',
         ))
def _too_long(m, meta):
    n = next((int(m[g]) for g in "adefgh" if m[g]), None)
    lim = next((int(m[g]) for g in "bcij" if m[g]), None)
    return ev.RequestTooLong(meta, n, lim)


_KV_XFER = [
    ("nixl", "transfer-failed", r"NIXL transfer failure: |NIXLConnectorWorker gets |NIXL_ERR_\w+"),
    # (0.11.1+ "Handshake failed for request %s, marking blocks as invalid"; the handshake's own
    # RuntimeError "Remote NIXL agent engine ID mismatch", 0.10-0.33)
    ("nixl", "handshake-failed", r"Handshake with \S{1,200} failed|NIXL handshake (?:failed|timed out)|Handshake failed for request\b"
                                 r"|Remote NIXL agent engine ID mismatch"),
    # the head alone: the request id and count that follow may be hard-wrapped onto the next line
    ("nixl", "expired", r"Releasing expired KV blocks for request\b|Potentially invalid KV blocks for unrecognized request\b"),
    ("nixl", "unavailable", r"NIXL is not available"),
    ("kv-connector", "load-failed", r"Failing (?P<n>\d+) request\(s\) due to KV load failure|Recovered from KV load failure: (?P<r>\d+) request\(s\) rescheduled"),
    ("p2pnccl", "transfer-failed", r"P2pNcclEngine\w* .{0,80}(?:failed|timed out|[Ee]rror)"),
    ("lmcache", "transfer-failed", r"LMCache (?:ERROR|error)\b|LMCacheConnector.{0,60}(?:failed|[Ee]rror)"),
    # LMCache's own warning when its buffer cannot take a request's KV cache (v1 cache_engine.py,
    # "Failed to allocate memory for the KV cache.\nThe KV cache will not be stored."): not offloaded
    ("lmcache", "store-failed", r"LMCache WARNING: Failed to allocate memory for the KV cache"),
    ("mooncake", "transfer-failed", r"Mooncake\w* .{0,80}(?:transfer failed|[Tt]ransfer (?:error|timed out))"),
]
_KV_XFER_RE = re.compile("|".join(f"(?P<x{i}>{p})" for i, (_, _, p) in enumerate(_KV_XFER)))


@matcher("kv-transfer-failure", _KV_XFER_RE.pattern, search=True,
         exc_types=frozenset(("RuntimeError", "TimeoutError", "nixlBackendError", "NixlError", "KeyError")) | ENGINE_DEAD_TYPES,
         keywords=('NIXL transfer failure: ', 'NIXLConnectorWorker gets ', 'NIXL_ERR_', 'Handshake with ', 'NIXL handshake ',
                   'Handshake failed for request', 'Remote NIXL agent engine ID mismatch',
                   'Releasing expired KV blocks', 'Potentially invalid KV blocks', 'NIXL is not available',
                   'due to KV load failure', 'Recovered from KV load failure', 'P2pNcclEngine', 'LMCache', 'Mooncake'),
         versions='0.9-0.33 (V1 KV connectors)', source='distributed/kv_transfer/kv_connector/v1/nixl_connector.py (0.9-0.1x), nixl/base_worker.py (0.2x+), v1/core/sched/scheduler.py (KV load failure policy), p2p_nccl_engine.py, lmcache_connector.py, mooncake',
         examples=(
             '(EngineCore_DP0 pid=123) ERROR 10-17 08:12:41 [nixl_connector.py:1412] NIXL transfer failure: NIXL_ERR_BACKEND | Context: {}',
             '(EngineCore_DP0 pid=88) WARNING 09-29 13:05:10 [nixl_connector.py:1063] Releasing expired KV blocks for request cmpl-1 which were retrieved by 0 decode worker(s) within 120 seconds.',
             '(EngineCore_DP0 pid=88) ERROR 09-29 13:05:12 [scheduler.py:1612] Failing 3 request(s) due to KV load failure (failure_policy=fail, 4096 tokens affected). Request IDs: {}',
             '(Worker_TP0 pid=91) ERROR 11-03 10:21:07 [nixl_connector.py:1111] Handshake failed for request cmpl-1',
             '[2025-07-03 12:45:27,563] LMCache WARNING: Failed to allocate memory for the KV cache.',
         ))
def _kv_xfer(m, meta):
    for i, (conn, kind, _) in enumerate(_KV_XFER):
        if m.group(f"x{i}"):
            n = m["n"] or m["r"]
            return ev.KvTransferFailure(meta, conn, kind, int(n) if n else None)
    return None


@matcher("gpu-unsupported", r"(?P<nk>no kernel image is available for execution on the device)"
         r"|with CUDA capability (?P<arch>sm_\d{2,3}a?) is not compatible with the current PyTorch installation"
         r"|(?P<ptx>the provided PTX was compiled with an unsupported toolchain)"
         r"|(?P<jit>Ninja build failed|FlashInfer JIT (?:compilation|build) failed|Command '\[?'ninja')"
         r"|(?P<cap>Bfloat16 is only supported on GPUs with compute capability of at least 8\.0|FlashAttention only supports Ampere GPUs or newer|Cannot use FlashAttention-2 backend for Volta and Turing GPUs)", search=True,
         exc_types=frozenset(("RuntimeError", "AcceleratorError", "CalledProcessError", "ValueError", "UserWarning", "RayTaskError")) | ENGINE_DEAD_TYPES,
         keywords=('no kernel image is available', 'is not compatible with the current PyTorch installation', 'unsupported toolchain', 'Ninja build failed', 'FlashInfer JIT', "'ninja'", 'Bfloat16 is only supported', 'FlashAttention only supports', 'for Volta and Turing GPUs'),
         versions='every (CUDA runtime, torch, FlashInfer JIT), platforms/cuda.py capability checks', source='torch/cuda/__init__.py (_check_capability), CUDA runtime, flashinfer/jit/cpp_ext.py, worker/worker.py _check_if_gpu_supports_dtype',
         examples=(
             'ERROR 07-28 15:07:22 [core.py:632] RuntimeError: CUDA error: no kernel image is available for execution on the device',
             'NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.',
         ))
def _gpu_unsupported(m, meta):
    kind = ("no-kernel-image" if m["nk"] else "ptx-toolchain" if m["ptx"] else "jit-failed" if m["jit"]
            else "capability" if m["cap"] else "arch-not-compiled")
    arch = m["arch"]
    if arch is None:
        am = re.search(r"\bsm_(\d{2,3})a?\b", meta.text)
        arch = am.group(0) if am else None
    return ev.GpuUnsupported(meta, kind, arch)


# ---- tracebacks: the exception line closes the traceback opened by "Traceback (most recent call last):"
EXC_LINE_RE = re.compile(r"^(?P<t>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?:: (?P<m>.*))?$")
# (a frame line hard-wrapped after its line number still opens or continues a traceback: no function name)
# V0 MQLLMEngine's ``logger.exception(repr(e))``: the exception's repr as the message (``KeyError('x')``),
# read as the exception where the engine's own module logged it at ERROR (a literal ``^M`` a paste kept)
EXC_REPR_RE = re.compile(r"^(?P<t>[A-Za-z_][\w.]*(?:Error|Exception))\((?P<m>.*)\)(?:\^M)?\s*$")
FRAME_RE = re.compile(r'^\s*File "(?P<path>[^"]*)", line \d+(?:, in (?P<f>\w+|<module>))?')
# A frame in a KV connector's code, by its file: the connectors' libraries (LMCache, NIXL and ROCm's
# RIXL, Mooncake) as installed, LMCache's source tree, and vLLM's own connector modules
# (distributed/kv_transfer/: kv_connector/v1/lmcache_connector.py and lmcache_integration/,
# nixl_connector.py, mooncake/, p2p/p2p_nccl_*.py, offloading_connector.py, ... in 0.9-0.33). The
# connector is the library's or the module's name; another kv_transfer module is "kv-connector".
KV_CONNECTOR_PATH_RE = re.compile(r"(?:site|dist)-packages/(?P<pkg>lmcache|nixl|rixl|mooncake)/|/(?P<src>lmcache)/(?:v1|integration)/"
                                  r"|/vllm/distributed/kv_transfer/(?P<mod>[\w/]+)\.py$")
_KV_CONNECTOR_NAMES = (("lmcache", "lmcache"), ("nixl", "nixl"), ("rixl", "nixl"), ("mooncake", "mooncake"), ("p2p", "p2pnccl"))


def kv_connector_of(path: str) -> str | None:
    """The KV connector whose code a traceback frame's file is (:data:`KV_CONNECTOR_PATH_RE`), or None."""
    m = KV_CONNECTOR_PATH_RE.search(path) if ("kv_transfer" in path or "mooncake" in path or "lmcache" in path
                                               or "ixl" in path) else None
    if m is None:
        return None
    name = m["pkg"] or m["src"] or m["mod"]
    return next((c for k, c in _KV_CONNECTOR_NAMES if k in name), "kv-connector")


# What the traceback joiner and the unknown-flag scan read, besides the matcher table.
TRACEBACK_KEYWORDS = ("Traceback (most recent call last)", 'File "', "Error", "Exception", "Exit", "Interrupt")
FLAG_KEYWORDS = tuple(FAKE_FLAGS)

# ---- where a traceback was raised, by its frames (issue 25): the function names of vLLM's own
# code paths, read from the released sources of 0.2-0.33 (engine/llm_engine.py,
# engine/async_llm_engine.py, engine/multiprocessing/engine.py, worker/worker.py, worker/model_runner.py,
# executor/multiproc_worker_utils.py, v1/engine/core.py, v1/engine/async_llm.py,
# v1/executor/multiproc_executor.py, v1/worker/gpu_worker.py, v1/worker/gpu_model_runner.py,
# entrypoints/openai/serving_*.py). A frame may tell the phase (what the engine was doing), the
# process (which process runs that code) and whether it is the top of its process (an uncaught
# exception reached it, or the process's own last handler logged it and exited).
PHASES = ("output-handler", "serving-loop", "graph-capture", "kv-cache", "profiling", "loading", "startup", "serving-step",
          "worker-rpc")
_PHASE_FRAMES = {
    # V1's output handler (AsyncLLM, in the API server process) and its output processing
    "output-handler": ("output_handler", "_run_output_handler", "process_outputs"),
    # loops that run only once the engine serves: V0's background loop and step, V1's busy loop
    "serving-loop": ("run_engine_loop", "engine_step", "engine_step_async", "step_async", "run_busy_loop",
                     "_process_engine_step", "step_with_batch_queue", "_run_engine", "_process_input_queue",
                     # V0 AsyncLLMEngine: the callbacks run when the background loop's task ends (it ends only by an exception)
                     "_log_task_completion", "_raise_exception_on_finish"),
    "graph-capture": ("capture_model", "_capture_cudagraphs", "capture"),
    "kv-cache": ("initialize_cache", "initialize_kv_cache", "initialize_from_config", "_allocate_kv_cache",
                 "allocate_kv_cache", "_init_cache", "initialize_kv_cache_tensors", "raise_if_cache_size_invalid",
                 "check_enough_kv_cache_memory", "get_kv_cache_config", "get_kv_cache_configs", "_init_cache_engine",
                 "init_cache_engine", "_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors"),
    "profiling": ("profile_run", "determine_num_available_blocks", "determine_available_memory", "_dummy_sampler_run",
                  "_dummy_pooler_run"),
    "loading": ("load_model", "load_weights", "get_model", "download_weights_from_hf", "_prepare_weights",
                "load_weights_and_postprocess"),
    "startup": ("init_device", "_dummy_run", "compile_or_warm_up_model", "init_worker", "_init_executor", "_init_engine",
                "init_model", "_run_workers_init", "_initialize_kv_caches", "_init_workers_ray", "init_worker_distributed_environment",
                "_init_workers", "init_distributed_environment", "ensure_model_parallel_initialized"),
    # a model step for requests; these also run inside a start-up step (V0's profile_run calls execute_model)
    "serving-step": ("step", "execute_model", "execute_model_spmd", "_execute_model_spmd", "generate", "_process_model_outputs",
                     "execute_model_async", "sample_tokens"),
    # the executor's call to its workers, waiting for their replies (v1/executor: collective_rpc,
    # multiproc's get_response and FutureWrapper._wait_for_response): the engine core waited on a
    # worker's step; which step, only a frame further in tells (those phases come first)
    "worker-rpc": ("collective_rpc", "_wait_for_response", "get_response"),
}
_PROCESS_FRAMES = {
    "engine-core": ("run_engine_core", "run_busy_loop", "run_mp_engine", "run_engine_loop", "engine_step", "step_async",
                    "_process_engine_step", "step_with_batch_queue", "run_engine_busy_loop", "_log_task_completion",
                    "_raise_exception_on_finish",
                    # V1's multiproc executor waits for its workers' replies in the engine core's process
                    # (collective_rpc is not here: the API server's AsyncLLM and core client have one too)
                    "_wait_for_response", "get_response"),
    "worker": ("worker_main", "worker_busy_loop", "_run_worker_process", "execute_method", "_worker_loop"),
    "ray-actor": ("ray",),  # "ray._raylet.execute_task" (a Ray actor's task)
    "api-server": ("create_chat_completion", "create_completion", "chat_completion_stream_generator",
                   "chat_completion_full_generator", "completion_stream_generator", "create_embedding",
                   "create_responses", "run_asgi", "create_transcription", "create_score", "create_pooling"),
}
# The top of a process: an exception whose traceback reaches it was not caught by a handler that
# carried on (the module, multiprocessing's process entry, vLLM's engine and worker entries, whose
# handlers log the failure and exit: "EngineCore failed to start" / "encountered a fatal error",
# V0's run_mp_engine, "WorkerProc failed to start").
TOP_FRAMES = frozenset(("<module>", "_run_module_as_main", "_bootstrap", "spawn_main", "run_engine_core", "run_mp_engine",
                        "worker_main", "run_engine_busy_loop"))
# Handlers of V1's engine core (v1/engine/core.py, 0.8-0.33) that log an exception at ERROR and
# carry on: a utility call's failure ("Invocation of %s method failed", _handle_client_request) and
# a request's pre-processing error (process_input_sockets -> _handle_request_preproc_error).
CAUGHT_FRAMES = ("_handle_client_request", "process_input_sockets", "_handle_request_preproc_error", "preprocess_add_request")
FRAME_MARKS: dict[str, tuple[str, ...]] = {}
for _tag, _names in [*_PHASE_FRAMES.items(), *(("p:" + k, v) for k, v in _PROCESS_FRAMES.items()), ("caught", CAUGHT_FRAMES)]:
    for _n in _names:
        FRAME_MARKS[_n] = FRAME_MARKS.get(_n, ()) + (_tag,)
for _n in TOP_FRAMES:
    FRAME_MARKS[_n] = FRAME_MARKS.get(_n, ()) + ("top",)
# the phases of start-up and of serving (an out-of-memory error's phase)
STARTUP_PHASES = frozenset(("graph-capture", "kv-cache", "profiling", "loading", "startup"))
RUNTIME_PHASES = frozenset(("output-handler", "serving-loop", "serving-step"))
STARTUP_FRAMES = frozenset(n for p in STARTUP_PHASES for n in _PHASE_FRAMES[p])
# (a lone frame line after an undecided OOM: not the model step, which V0's profiling run calls too)
RUNTIME_FRAMES = frozenset(n for p in RUNTIME_PHASES for n in _PHASE_FRAMES[p]) - {"execute_model", "execute_model_async", "sample_tokens"}
# A process prefix's name (``(EngineCore_DP0 pid=N)``) and the logger's file tell the process too.
_PROCESS_PREFIX = (("EngineCore", "engine-core"), ("APIServer", "api-server"), ("ApiServer", "api-server"),
                   ("RayWorker", "ray-actor"), ("Worker", "worker"))
# The engine process's own module: V1's core.py (the only core.py in vLLM), whose handlers that log
# a traceback at ERROR are the fatal ones ("EngineCore failed to start." / "EngineCore encountered a
# fatal error.", which end the process) and the two of CAUGHT_FRAMES; V0's MQLLMEngine
# engine/multiprocessing/engine.py (0.6-0.10, the only engine.py), which logs one only where its
# engine loop or process ended (``start``: ``logger.exception(repr(e))``, ``run_mp_engine``); V0's
# AsyncLLMEngine (engine/async_llm_engine.py, 0.2-0.10), whose only one is its background loop's end
# ("Engine background task failed", _log_task_completion)
_CORE_SRC = re.compile(r"^(?:.*/)?(?:core|engine|async_llm_engine)\.py:")
# The worker's: worker_base.py, gpu_worker.py, worker.py, and the files whose handlers log a worker
# process's traceback: V1's multiproc_executor.py (WorkerProc: "WorkerProc failed to start." /
# "WorkerProc failed." / "WorkerProc hit an exception.", "Error getting async model runner output",
# 0.8-0.33: its every logger.exception runs in the worker) and V0's multiproc_worker_utils.py
# (_run_worker_process: "Exception in worker %s while processing method %s." / "Worker failed").
_PROCESS_SRC = re.compile(r"^(?:.*/)?(?:(?P<api>serving\w*|api_server|launcher|api_router|async_llm|api_utils)"
                          r"|(?P<core>core|engine|async_llm_engine)"
                          r"|(?P<worker>worker_base|gpu_worker|worker|multiproc_executor|multiproc_worker_utils))\.py:")


def _prefix_process(process: str | None) -> str | None:
    """The vLLM process a line's process prefix names (:data:`_PROCESS_PREFIX`), or None."""
    return next((v for k, v in _PROCESS_PREFIX if k in process), None) if process else None


def classify_traceback(marks: set, process: str | None, src: str | None, exc_type: str,
                       level: str | None = None) -> tuple[str | None, str | None, bool]:
    """(process, phase, ended) of a traceback from the marks of its frames (:data:`FRAME_MARKS`),
    the process prefix of its lines and the logger's file. The phase is the first of
    :data:`PHASES` its frames hold: the loops that run only while serving decide over start-up
    frames (V1's busy loop runs dummy batches through ``_dummy_run``), start-up steps over a bare
    model step (V0's profiling run calls ``execute_model``). The process: from the frames of the
    code that raised (an engine loop's step re-raised by an HTTP handler was raised by the
    engine), else the prefix, else the file that logged it. Ended: its frames reach the top of
    the process, or the engine core's own module logged it at ERROR (``level``) from a handler
    that is not one of :data:`CAUGHT_FRAMES`: V1's fatal handlers, whose line ("EngineCore failed
    to start.") and outer frames an excerpt often cuts off."""
    phase = next((p for p in PHASES if p in marks), None)
    if phase == "serving-loop":
        phase = "serving-step"
    proc = None
    if "p:engine-core" in marks:
        proc = "engine-core"
    elif process:
        proc = _prefix_process(process)
    if proc is None:
        proc = next((k for k in ("worker", "ray-actor", "api-server") if "p:" + k in marks), None)
    if proc is None and src:
        m = _PROCESS_SRC.match(src)
        if m:
            proc = "api-server" if m["api"] else "engine-core" if m["core"] else "worker"
    ended = "top" in marks or exc_type.rpartition(".")[2] == "SystemExit"
    if not ended and level == "ERROR" and src and _CORE_SRC.match(src) and "caught" not in marks:
        ended = True
    return proc, phase, ended


MAX_FRAMES = 12  # function names kept per traceback (the innermost)


def _connector_error(marks, meta: ev.Meta) -> ev.KvTransferFailure | None:
    """A traceback raised through a KV connector's code (a ``kv:`` mark of its frames) as the
    connector's failure ("connector-error"); None when no frame is a connector's."""
    conn = next((m[3:] for m in sorted(marks) if m.startswith("kv:")), None)
    return None if conn is None else ev.KvTransferFailure(meta, conn, "connector-error")


_NO_MARKS: frozenset = frozenset()
CUT_TRACEBACK = "(traceback cut before its exception line)"  # the exc_type of a traceback the log ends inside
MAX_OPEN_TRACEBACKS = 64  # processes with a traceback in progress


def prefilter_keywords() -> tuple[str, ...]:
    """Every literal the keyword prefilter scans for in every line: derived from the matcher
    table (each matcher's keywords), the traceback joiner and the unknown-flag scan. A line that
    holds none of them, and none of :data:`NEAR_KEYWORDS` near their anchor, cannot give an event."""
    kws = {k for m in MATCHERS for k in m.keywords}
    kws.update(TRACEBACK_KEYWORDS)
    kws.update(FLAG_KEYWORDS)
    kws.update(CLIENT_KEYWORDS)  # the heads of client-text lines that still tell something
    return tuple(sorted(kws))


def keyword_scanner() -> KeywordScanner:
    """The keyword scan of the matcher table (:func:`prefilter_keywords`, :data:`NEAR_KEYWORDS`);
    its Hyperscan database is compiled once per process."""
    return KeywordScanner(prefilter_keywords(), NEAR_KEYWORDS)


#: Literals that tell something only in the lines right after an anchor: (anchor, lines after it,
#: literals). The pieces of a hard-wrapped args echo (at most MAX_NS_PIECES, each at most 2 lines
#: after the one before: RecordParser._namespace_continued) are found by Namespace's way of
#: printing values (``=None, ``), which every V0 request line's SamplingParams echo holds too:
#: scanned for in every line, they sent each ``Received request`` line of a V0 log to Python.
NEAR_KEYWORDS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("args: Namespace(", 2 * MAX_NS_PIECES, NS_CONT_KEYWORDS),
)


def _dispatch_table() -> tuple[re.Pattern, dict[str, tuple[Matcher, ...]]]:
    """One regex finding every matcher keyword in a message (overlapping hits too) and, per
    keyword, the matchers to try: a record is matched only against the matchers whose keywords
    it holds."""
    by_kw: dict[str, list[Matcher]] = {}
    for m in MATCHERS:
        for k in m.keywords:
            by_kw.setdefault(k, []).append(m)
    # A keyword that begins with another one hides it at the same position: it carries its matchers.
    for k1 in list(by_kw):
        for k2 in list(by_kw):
            if k1 != k2 and k1.startswith(k2):
                by_kw[k1] = by_kw[k1] + [m for m in by_kw[k2] if m not in by_kw[k1]]
    alts = sorted(by_kw, key=len, reverse=True)
    rx = re.compile("(?=(" + "|".join(re.escape(k) for k in alts) + "))")
    order = {m.name: i for i, m in enumerate(MATCHERS)}
    return rx, {k: tuple(sorted(v, key=lambda m: order[m.name])) for k, v in by_kw.items()}


_ORDER: dict = {}


@lru_cache(maxsize=4)
def _keywords_db(keywords: tuple[str, ...]):
    """A Hyperscan database finding each of ``keywords`` once (None: Hyperscan is missing or the
    CPU lacks what it needs), compiled once per process and shared by every parser."""
    try:
        import hyperscan  # type: ignore[import-not-found]

        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        n = len(keywords)
        db.compile(expressions=[re.escape(k).encode() for k in keywords], ids=list(range(n)), elements=n,
                   flags=[hyperscan.HS_FLAG_SINGLEMATCH] * n)
        return db
    except Exception:  # noqa: BLE001 - missing or no CPU support: re
        return None


class _KeywordHits:
    """The keywords of the matcher table found in a message: Hyperscan (about 1 us a message)
    where it imports, else one ``re`` with a lookahead (overlapping hits, slower)."""

    def __init__(self, rx: re.Pattern, keywords: list[str]) -> None:
        self.rx = rx
        self.keywords = keywords
        self._db = _keywords_db(tuple(keywords))  # compiled once per process
        self._scratch = None
        if self._db is not None:
            import hyperscan  # type: ignore[import-not-found]

            self._scratch = hyperscan.Scratch(self._db)  # per parser: a Hyperscan scratch is not shared

    def __call__(self, msg: str) -> list[str]:
        if self._db is None:
            return [m.group(1) for m in self.rx.finditer(msg)]
        ids: list[int] = []
        self._db.scan(msg.encode("utf-8", "replace"), match_event_handler=lambda i, _f, _t, _fl, _c: ids.append(i),
                      scratch=self._scratch)
        kws = self.keywords
        return [kws[i] for i in sorted(ids)]


def _digit_blind(rx: re.Pattern) -> bool:
    """True when ``rx`` treats every ASCII digit alike: no digit literal, no range or set that
    holds some digits and not others, no back-reference. Then whether it matches a message, and
    where each group lies, is the same for every message of the same :func:`_shape` (the regex
    engine's every test gives the same answer on ``7`` as on ``0``)."""
    from re import _constants as C, _parser as P  # noqa: N814

    digits = set(range(48, 58))

    def blind(items) -> bool:
        for op, av in items:
            if op in (C.LITERAL, C.NOT_LITERAL, C.LITERAL_IGNORE, C.NOT_LITERAL_IGNORE,
                      C.LITERAL_UNI_IGNORE, C.NOT_LITERAL_UNI_IGNORE, C.LITERAL_LOC_IGNORE, C.NOT_LITERAL_LOC_IGNORE):
                if av in digits:
                    return False
            elif op is C.IN:
                if not blind(av):
                    return False
            elif op in (C.RANGE, C.RANGE_UNI_IGNORE):
                covered = digits & set(range(av[0], av[1] + 1))
                if covered and covered != digits:
                    return False
            elif op is C.SUBPATTERN:
                if not blind(av[3]):
                    return False
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
                if not blind(av[2]):
                    return False
            elif op is C.BRANCH:
                if not all(blind(b) for b in av[1]):
                    return False
            elif op in (C.ASSERT, C.ASSERT_NOT):
                if not blind(av[1]):
                    return False
            elif op is C.ATOMIC_GROUP:
                if not blind(av):
                    return False
            elif op not in (C.ANY, C.AT, C.CATEGORY, C.NEGATE):
                return False  # a back-reference, or anything not known to be blind
        return True

    return blind(P.parse(rx.pattern, rx.flags))


# A message's shape: its UTF-8 bytes with every ASCII digit 1-9 written as 0 (same length). vLLM's
# periodic lines (stats, preemption warnings, OOM errors, traceback frames) differ from each other
# only in their numbers, so what the matcher table makes of a shape is worked out once: which
# matchers' regexes match (each regex used that way is digit-blind, checked below), whether it
# opens or closes a traceback, names a frame, or may name a flag. The table of shapes is bounded.
_SHAPE = bytes.maketrans(b"123456789", b"000000000")
MAX_SHAPE_BYTES = 1024  # longer messages are matched without the table
MAX_SHAPES = 2048  # shapes kept (the table is emptied when full)
_SHAPES: dict[bytes, tuple] = {}


class RecordParser:
    """Records -> events, for one log source (tracebacks are tracked per process).

    ``parse(record) -> list[Event]``; an empty list means the record matched nothing (``None``
    items: consumed as part of a traceback). Client-text records (``rec.client``: request
    logging, request-id lines, access log, the fatal-step dump) never reach a matcher; the dump's
    header gives one ``EngineFailure("step-failed")``. The first stats line of an engine run also
    gives :class:`~vllm_doctor.events.ServerReady` (the engine served).
    """

    MAX_MESSAGE = 32768  # longer messages are matched on their first 32 KiB
    _DISPATCH: tuple[re.Pattern, dict[str, tuple[Matcher, ...]]] | None = None

    def __init__(self, source: str) -> None:
        self.source = source
        self._tb: dict[object, tuple] = {}  # process key -> (start line, frames, marks, its first record)
        self._served_seen = False  # a stats line was seen in this engine run
        self._dump_seen = False  # a fatal-step dump was seen in this engine run
        self._cfg: dict[str, int] = {}  # max_model_len, block_size echoed in this engine run
        self._held: list = []  # out-of-memory events whose phase the next records decide
        self._ns: tuple[int, str | None, int] | None = None  # a cut args echo: (last line, tail, pieces)
        self._held_left = 0  # records left before they are released undecided
        if RecordParser._DISPATCH is None:
            RecordParser._DISPATCH = _dispatch_table()
            _ORDER.update({id(m): i for i, m in enumerate(MATCHERS)})
        rx, self._by_kw = RecordParser._DISPATCH
        self._hits = _KeywordHits(rx, list(self._by_kw))

    def parse(self, rec: Record) -> list:
        msg = rec.msg if len(rec.msg) <= self.MAX_MESSAGE else rec.msg[: self.MAX_MESSAGE]
        if rec.client:
            self._ns = None
            if rec.client == "engine-dump" and not self._dump_seen:
                # V1's fatal-step dump (logging_utils/dump_input.py): an engine step raised.
                self._dump_seen = True
                res = [ev.EngineFailure(ev.Meta(self.source, rec.lineno, rec.lineno, rec.ts, rec.process, rec.level, msg),
                                        "step-failed", msg)]
                return (self._release(msg, res) if self._held else []) + res
            return [None] if rec.client == "engine-dump" else []
        if not msg:
            return []
        if self._ns is not None:
            meta = ev.Meta(self.source, rec.lineno, rec.lineno, rec.ts, rec.process, rec.level, msg[:400])
            cont = self._namespace_continued(rec, msg, meta)
            if cont is not None:
                return cont
        out: list = []
        key = rec.pid or rec.process
        tb_start, exc_line, frame_line, matchers, flag_text, unread = self._shape(msg)
        if tb_start:
            if key not in self._tb and len(self._tb) >= MAX_OPEN_TRACEBACKS:
                self._tb.pop(next(iter(self._tb)))
            self._tb[key] = (rec.lineno, [], set(), rec)
            return [None]  # consumed: part of a traceback event
        frames: list[str] = []
        if frame_line:
            tb = self._tb.get(key) or self._tb.get(self._orphan(key))
            if tb is None and len(self._tb) < MAX_OPEN_TRACEBACKS:
                # a frame with no "Traceback (most recent call last):" before it: the log (an
                # excerpt, a rotated file) begins inside the traceback; its frames still tell
                tb = self._tb[key] = (rec.lineno, [], set(), rec)
            if tb is not None:
                f, path = FRAME_RE.match(msg).group("f", "path")
                conn = kv_connector_of(path)
                if conn is not None:
                    tb[2].add("kv:" + conn)  # raised through a KV connector's code
                if f is not None:
                    tb[1].append(f)
                    marks = FRAME_MARKS.get(f)
                    if marks:  # what the frame tells, kept for the whole traceback (bounded: a few tags)
                        tb[2].update(marks)
                if len(tb[1]) > 2 * MAX_FRAMES:
                    del tb[1][: len(tb[1]) - MAX_FRAMES]
        repr_exc = (EXC_REPR_RE.match(msg) if exc_line is None and rec.level == "ERROR" and rec.src
                    and _CORE_SRC.match(rec.src) and msg[-1:] in ")M " else None)
        if exc_line is None and not matchers and not self._held and not flag_text and unread is None and repr_exc is None:
            return out  # no matcher matches, no flag, no held OOM: nothing below can give an event
        meta = ev.Meta(self.source, rec.lineno, rec.lineno, rec.ts, rec.process, rec.level, msg[:400])
        tb_phase = kv_error = None
        if exc_line is not None:  # the exception line: (type span, message span or None) in msg
            (t0, t1), m_span = exc_line
            start, frames, marks, _ = self._tb.pop(key if key in self._tb else self._orphan(key), (rec.lineno, [], _NO_MARKS, None))
            tmeta = meta if start == rec.lineno else ev.Meta(self.source, start, rec.lineno, rec.ts, rec.process, rec.level, msg[:400])
            exc_type = msg[t0:t1]
            proc, phase, ended = classify_traceback(marks, rec.process, rec.src, exc_type, rec.level)
            out.append(ev.ExceptionRaised(tmeta, exc_type, msg[m_span[0] : m_span[1]][:400] if m_span else "",
                                          tuple(frames[-MAX_FRAMES:]), proc, phase, ended))
            tb_phase = phase
            kv_error = _connector_error(marks, tmeta)
        elif repr_exc is not None:
            exc_type = repr_exc["t"]
            proc, phase, ended = classify_traceback(set(), rec.process, rec.src, exc_type, rec.level)
            out.append(ev.ExceptionRaised(meta, exc_type, repr_exc["m"][:400], (), proc, phase, ended))
        for mt in matchers:  # the matchers whose regexes match (digit-sensitive ones: whose keywords it holds)
            m = mt.regex.search(msg) if mt.search else mt.regex.match(msg)
            if m:
                try:
                    res = mt.build(m, meta)
                except (ValueError, OverflowError):
                    continue  # a damaged number ("1.2.3", ".", 400 digits: inf): the line says nothing
                if res is None:
                    continue
                if type(res) is list:
                    out.extend(res)
                else:
                    out.append(res)
        if kv_error is not None and not any(type(e) is ev.KvTransferFailure for e in out):
            out.append(kv_error)  # (a wording the matchers know already tells the kind)
        if unread is not None and not out:
            # vLLM's own wording behind text the envelope did not take off: a wrapper it does not know
            out.append(ev.UnreadLine(meta, unread[0], msg[: unread[1]][-80:]))
        if not out and not flag_text:
            return self._release(msg, out) if self._held else out
        kinds = {type(e) for e in out}  # events are final classes: exact types
        if not self._held and not flag_text and kinds.isdisjoint(_FOLLOWED_UP):
            return out  # nothing below reads these events
        oom = ev.OutOfMemory
        if oom in kinds:
            step_failed = ev.EngineFailure in kinds and any(type(x) is ev.EngineFailure and x.kind == "step-failed" for x in out)
            out = [_with_phase(e, tb_phase, rec.src, step_failed) if type(e) is oom else e for e in out]
        released = self._release(msg, out) if self._held else []
        if not self._served_seen and oom in kinds:
            # An OOM whose own record and traceback do not tell the phase: vLLM often logs the error
            # first and its traceback after it (V0 MQLLMEngine ``logger.exception(repr(e))``) or the
            # other process's failure follows (V1 ``AsyncLLM output_handler failed``): the next
            # records decide (see :meth:`_release`).
            new = [e for e in out if type(e) is oom and e.phase is None]
            if new:
                out = [e for e in out if not (type(e) is oom and e.phase is None)]
                if len(self._held) + len(new) > MAX_HELD_OOM:  # bounded: the oldest go out undecided
                    released += self._held
                    self._held = []
                self._held.extend(new)
                self._held_left = HOLD_RECORDS
        if released:
            out = released + out
        if ev.ServerReady in kinds and any(type(e) is ev.ServerReady and e.inferred for e in out):
            if self._served_seen:  # the offline progress bar again (tqdm redraws it): served already
                out = [e for e in out if not (type(e) is ev.ServerReady and e.inferred)]
            self._served_seen = True
        if not self._served_seen and ev.SchedulerStats in kinds:
            self._served_seen = True  # periodic stats: the engine is up and serving
            out.append(ev.ServerReady(meta, inferred=True))
        cfg = ev.EngineConfigObserved
        if cfg in kinds:
            if any(type(e) is cfg and e.kind in ("namespace", "non-default-args") for e in out):
                self._served_seen = self._dump_seen = False  # a new engine run
                self._cfg.clear()
                self._ns = None
                if any(type(e) is cfg and e.kind == "namespace" for e in out):
                    nm = NAMESPACE_RE.search(msg)
                    if nm and not nm["close"]:  # cut or hard-wrapped: the next lines may continue it
                        self._ns = (rec.lineno, _ns_tail(nm["a"]), 0)
        if cfg in kinds or ev.KvCacheCapacity in kinds:
            for e in out:
                if isinstance(e, ev.EngineConfigObserved):
                    for k, v in e.values:
                        if k in ("max_model_len", "block_size") and isinstance(v, int) and not isinstance(v, bool):
                            self._cfg[k] = v
                elif isinstance(e, ev.KvCacheCapacity) and e.num_gpu_blocks is not None and e.device == "GPU" and e.num_cpu_blocks is not None:
                    too_small = self._blocks_too_small(e, meta)
                    if too_small is not None:
                        out.append(too_small)
        if flag_text and ev.UnknownFlag not in kinds:
            for m in _FAKE_RE.finditer(msg):
                out.append(ev.UnknownFlag(meta, m.group(1), FAKE_FLAGS[m.group(1)], m.group(2)))
        return out

    def _orphan(self, key: object) -> object:
        """The traceback a line without any process prefix continues when none is open under its
        own key: the one opened last (a hard-wrapped or re-pasted line lost the prefix that the
        traceback's first lines carry)."""
        if key is not None or not self._tb:
            return key
        return next(reversed(self._tb))

    def _shape(self, msg: str) -> tuple:
        """(opens a traceback, the exception line's group spans or None, is a traceback frame, the
        matchers to run in table order, may name a flag) for a message: the same for every message
        of its shape (see :data:`_SHAPES`), so looked up there when it was seen before."""
        shape = msg.encode("utf-8", "surrogatepass").translate(_SHAPE) if len(msg) <= MAX_SHAPE_BYTES else None
        if shape is not None:
            got = _SHAPES.get(shape)
            if got is not None:
                return got
        stripped = msg.strip()
        cands = {mt.name: mt for kw in self._hits(msg) for mt in self._by_kw[kw]}
        matchers = tuple(mt for mt in sorted(cands.values(), key=lambda m: _ORDER[id(m)])
                         if id(mt) in _SENSITIVE or (mt.regex.search(msg) if mt.search else mt.regex.match(msg)))
        em = EXC_LINE_RE.match(stripped) if msg[:1] not in " \t" else None
        exc = None
        if em:  # the spans of its groups in msg (stripped starts where msg's leading blanks end)
            off = len(msg) - len(msg.lstrip())
            exc = ((em.start("t") + off, em.end("t") + off),
                   (em.start("m") + off, em.end("m") + off) if em.group("m") is not None else None)
            if matchers:  # a failure's phrase counts on the types it is raised as (Matcher.exc_types)
                last = em.group("t").rpartition(".")[2]
                matchers = tuple(mt for mt in matchers if mt.exc_types is None or last in mt.exc_types)
        unread = None
        if cands and em is None:
            # an anchored wording found later in the message: what precedes it is a prefix that no
            # wrapper of the envelope took off (the line is vLLM's, and it is not read)
            for mt in cands.values():
                if not mt.search and id(mt) not in _NO_UNREAD:
                    if mt.regex.match(msg):
                        unread = None
                        break
                    um = mt.regex.search(msg)
                    if um is not None and um.start() > 0 and UNREAD_PREFIX_RE.search(msg, 0, um.start()):
                        unread = (mt.name, um.start())
                        break
        got = (stripped.startswith("Traceback (most recent call last)"), exc,
               FRAME_RE.match(msg) is not None, matchers, "--" in msg or "VLLM_" in msg, unread)
        if shape is not None and len(shape) <= MAX_SHAPE_BYTES:
            if len(_SHAPES) >= MAX_SHAPES:
                _SHAPES.clear()
            _SHAPES[shape] = got
        return got

    def _namespace_continued(self, rec: Record, msg: str, meta: ev.Meta) -> list | None:
        """The next piece of a hard-wrapped ``args: Namespace(...)`` echo: a line with no logger
        prefix right after it (the next line, or the one after when a container runtime split
        the echo in two). Its pairs are read with the cut pair of the line before joined in front
        (``disable_sliding_wind`` + ``ow=False``); at most :data:`MAX_NS_PIECES` pieces of at most
        :attr:`MAX_MESSAGE` characters each. None: not a continuation (the echo ends here)."""
        last, tail, pieces = self._ns
        self._ns = None
        # no logger prefix (a JSON log record without vLLM's file: not written by vLLM's logger)
        bare = rec.src is None and rec.level is None or rec.src == "json"
        if not bare or not 0 < rec.lineno - last <= 2 or pieces >= MAX_NS_PIECES:
            return None
        if not NS_CONT_RE.match(msg):
            return None
        text = msg.rstrip()
        if tail is None:  # the cut pair was too long to keep: this piece's first pair is unusable
            cuts = list(top_level(text, ","))
            if not cuts:
                return []
            text = text[cuts[0] + 1 :]
        else:
            text = tail + text
        if text.endswith(")"):
            values = _kv_pairs(text[:-1])
        else:
            cuts = list(top_level(text, ","))
            values = _kv_pairs(text[: cuts[-1]]) if cuts else {}
            self._ns = (rec.lineno, _ns_tail(text), pieces + 1)
        return _config(meta, "namespace-continued", values) if values else [None]

    def _release(self, msg: str, out: list) -> list:
        """The held out-of-memory events, with their phase, when this record decides it (see
        :func:`phase_cue`), a new engine run begins, or :data:`HOLD_RECORDS` records passed;
        else [] (still held)."""
        cue = phase_cue(msg, out)
        self._held_left -= 1
        if cue is None and self._held_left > 0:
            for e in out:  # a new engine run decides too
                t = type(e)
                if t is ev.VersionSeen and e.version or t is ev.EngineConfigObserved and e.kind in ("namespace", "non-default-args"):
                    break
            else:
                return []
        held, self._held = self._held, []
        return [replace(e, phase=cue) if cue else e for e in held]

    def flush(self) -> list:
        """End of the source (or an evaluation in ``serve``): the events still held, undecided
        (the state then decides the phase from what came before)."""
        held, self._held = self._held, []
        return held

    def cut_tracebacks(self) -> list:
        """The end of the input: each traceback still open (its exception line is not in the log:
        the excerpt or the log ends inside it) whose frames tell where it was raised, as an
        :class:`~vllm_doctor.events.ExceptionRaised` with the type ``CUT_TRACEBACK``. One whose
        frames tell nothing (only torch's, a kernel's or a library's) counts when a vLLM process
        logged it at ERROR under its own prefix (``(VllmWorker rank=0 pid=N)``, ``(Worker_TP0
        pid=N)``, ``(EngineCore_DP0 pid=N)``) or from its logger's file (``[multiproc_executor.py:597]``,
        a worker's handler): an error of that process all the same. One through a KV connector's
        code also gives the connector's :class:`~vllm_doctor.events.KvTransferFailure`."""
        out: list = []
        for start, frames, marks, first in self._tb.values():
            proc, phase, ended = classify_traceback(marks, first.process, first.src, "", first.level)
            if not marks and not ended and not (first.level in ("ERROR", "CRITICAL") and proc is not None):
                continue  # (ended: the engine process's own module logged it)
            meta = ev.Meta(self.source, start, start, first.ts, first.process, first.level, "Traceback (most recent call last):")
            out.append(ev.ExceptionRaised(meta, CUT_TRACEBACK, "", tuple(frames[-MAX_FRAMES:]), proc, phase, ended))
            kv_error = _connector_error(marks, meta)
            if kv_error is not None:
                out.append(kv_error)
        self._tb.clear()
        return out

    def _blocks_too_small(self, e: ev.KvCacheCapacity, meta: ev.Meta):
        """V0's ``# GPU blocks: N, # CPU blocks: M`` with a max_model_len (``max_seq_len`` of the
        engine config echo) that N blocks cannot hold: vLLM's own check (worker.py
        raise_if_cache_size_invalid, 0.3+) raises next, and 0.2 had none. The block size is the
        echoed one, else 16 (V0's default in every version)."""
        max_len = self._cfg.get("max_model_len")
        if not max_len:
            return None
        tokens = e.num_gpu_blocks * self._cfg.get("block_size", 16)
        if tokens >= max_len:
            return None
        return ev.KvCacheTooSmall(meta, max_len, tokens)


# The events that parse() reads after the matchers (phase of an OOM, the first stats line or
# offline progress bar of a run, the config echo, V0's block count against max_model_len; unknown flags only where the
# text may name one).
_FOLLOWED_UP = frozenset((ev.OutOfMemory, ev.SchedulerStats, ev.EngineConfigObserved, ev.KvCacheCapacity, ev.ServerReady))

# What a wrapper's prefix before an unread vLLM message holds: a time, a date or a level (text
# glued before vLLM's wording in a sentence, a quote or a exception head is not a wrapper).
UNREAD_PREFIX_RE = re.compile(r"\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d|\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b", re.I)
# anchored matchers whose wording is also a traceback's source line (their text mid-line is not a cut prefix)
_NO_UNREAD: frozenset = frozenset()
# Matchers whose regexes tell digits apart: run on every message that holds their keywords.
_SENSITIVE = frozenset(id(m) for m in MATCHERS if not _digit_blind(m.regex))
assert _digit_blind(EXC_LINE_RE) and _digit_blind(FRAME_RE) and _digit_blind(STATS_FIELD)

HOLD_RECORDS = 64  # records after an undecided OOM that may still tell its phase
MAX_HELD_OOM = 64  # OOM events held at once (the same OOM echoed by every process)
# EngineFailure texts that tell the engine had finished starting (v1/engine/core.py run_engine_core
# logs "EngineCore encountered a fatal error." only once ``engine_core`` exists, "EngineCore failed to
# start." before; v1/engine/async_llm.py creates the output handler only after the engine core's
# start-up handshake; a failed step dump is written only for a step run for requests).
RUNTIME_FAILURES = ("output-handler", "step-failed", "background-task-failed")  # V0's background loop runs once the engine is up
RUNTIME_FAILURE_TEXT = re.compile(r"EngineCore encountered a fatal error")
STARTUP_FAILURE_TEXT = re.compile(r"EngineCore(?:Proc)? failed to start|Engine core initialization failed|WorkerProc failed to start|"
                                  r"^\s+kv_caches = self\.initialize_kv_cache_tensors\(")


def phase_cue(msg: str, out: list) -> str | None:
    """What a record after an undecided out-of-memory error says of its phase: "runtime" for a
    traceback frame that runs only while serving (:data:`RUNTIME_FRAMES`: the V0 engine loop, V1's
    busy loop and output handler), a stats line, a failed step or output handler; "startup" for a
    start-up-only frame or an engine that failed to start; None: nothing."""
    fm = FRAME_RE.match(msg) if 'File "' in msg else None
    if fm:
        f = fm.group("f")
        if f in STARTUP_FRAMES:
            return "startup"
        if f in RUNTIME_FRAMES:
            return "runtime"
    for e in out:
        t = type(e)  # events are final classes
        if t is ev.SchedulerStats:
            return "runtime"
        if t is ev.EngineFailure:
            if e.kind in RUNTIME_FAILURES or RUNTIME_FAILURE_TEXT.search(e.message):
                return "runtime"
            if STARTUP_FAILURE_TEXT.search(e.message):
                return "startup"
        elif t is ev.ExceptionRaised and e.phase is not None:
            return "startup" if e.phase in STARTUP_PHASES else "runtime"
    return None


def _with_phase(e, phase: str | None, src: str | None, step_failed: bool):
    """An out-of-memory error's phase from its context: raised in a start-up phase of its
    traceback (:func:`classify_traceback`: loading, profiling, KV cache, graph capture) it is
    "startup"; in a serving phase (V0's engine loop, V1's busy loop, a model step, the output
    handler), logged by a request handler (``serving_chat.py`` ...), or together with a failed
    model step ("Error in model execution (input dumped ...)") it is "runtime"; else the state
    decides from what came before (None)."""
    if not isinstance(e, ev.OutOfMemory) or e.phase is not None:
        return e
    if phase in STARTUP_PHASES:
        return replace(e, phase="startup")
    if phase in RUNTIME_PHASES or phase == "serving-step" or src is not None and src.startswith("serving") or step_failed:
        return replace(e, phase="runtime")
    return e
