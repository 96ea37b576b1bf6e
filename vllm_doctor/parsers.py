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
from typing import Any

from . import events as ev
from .envelope import REQUEST_LOG_RE, Record
from .textscan import top_level

GIB = 1 << 30
UNITS = {"B": 1, "KiB": 1 << 10, "KB": 1 << 10, "MiB": 1 << 20, "MB": 1 << 20, "GiB": GIB, "GB": GIB,
         "TiB": 1 << 40, "TB": 1 << 40}


def to_bytes(value: str | float, unit: str) -> int:
    """``"14.62", "GiB"`` -> bytes. vLLM's "GB" messages divide by 1024**3, so GB means GiB."""
    return int(round(float(value) * UNITS.get(unit, GIB)))


def _int(s: str | None) -> int | None:
    return None if s is None else int(s.replace(",", ""))


def _float(s: str | None) -> float | None:
    return None if s is None else float(s.replace(",", ""))


EXC_PREFIX = r"(?:[A-Za-z_][\w.]*(?:Error|Exception): )?"
Builder = Callable[[re.Match, ev.Meta], Any]
_MATCHERS: list[tuple[str, re.Pattern, Builder, bool]] = []


def matcher(name: str, pattern: str, search: bool = False, flags: int = 0):
    """Register a builder for messages matching ``pattern`` (anchored unless ``search``)."""

    def deco(fn: Builder) -> Builder:
        rx = re.compile(pattern if search else r"\s*" + EXC_PREFIX + pattern, flags)
        _MATCHERS.append((name, rx, fn, search))
        return fn

    return deco


# ---- periodic stats (engine/metrics.py V0 0.3.3-0.10.2, llm_engine.py 0.1-0.3, v1/metrics/loggers.py V1)
STATS_FIELD = re.compile(
    r"(Running|Swapped|Pending|Waiting|Preemptions|Prefix cache hit rate|"
    r"(?P<dev>[A-Z][A-Za-z]{0,15}(?: \+ \w{1,15})?) KV cache usage): (?P<val>\d{1,9}(?:\.\d{1,6})?)(?![\d.])"
)


@matcher("stats", r"(?:Engine (?P<eng>\d+): |(?P<agg>\d+) Engines Aggregated: )?Avg prompt throughput: (?P<p>[\d.]+) tokens/s, Avg generation throughput: (?P<g>[\d.]+) tokens/s,(?P<rest>.*)")
def _stats(m: re.Match, meta: ev.Meta):
    fields: dict[str, float] = {}
    devs: list[tuple[str, float]] = []
    for fm in STATS_FIELD.finditer(m.group("rest")):
        key = fm.group(1)
        val = float(fm.group("val"))
        if fm.group("dev"):
            devs.append((fm.group("dev"), val))
        else:
            fields.setdefault(key, val)
    if "Running" not in fields:
        return None
    if any(v > 100.0 for _, v in devs) or (fields.get("Prefix cache hit rate") or 0) > 100.0:
        return None  # a usage above 100 % cannot be true (a damaged line)
    v0 = "Pending" in fields or "Swapped" in fields
    waiting = fields.get("Pending", fields.get("Waiting", 0.0))
    kv = cpu = None
    kv_dev = None
    if v0:  # V0: GPU is the KV cache, CPU the swap space
        for dev, val in devs:
            if dev == "GPU":
                kv = round(val / 100, 6)
            elif dev == "CPU":
                cpu = round(val / 100, 6)
        kv_dev = "GPU"
    elif devs:  # V1: the one "<device> KV cache usage" is the KV cache (CPU on the CPU backend)
        kv_dev, val = devs[0]
        kv = round(val / 100, 6)
    hit = fields.get("Prefix cache hit rate")
    pre = fields.get("Preemptions")
    return ev.SchedulerStats(
        meta, float(m.group("p")), float(m.group("g")), int(fields["Running"]), int(waiting),
        int(fields["Swapped"]) if "Swapped" in fields else None, kv, cpu,
        None if hit is None else round(hit / 100, 6), None if pre is None else int(pre),
        int(m.group("eng")) if m.group("eng") else None, kv_dev,
    )


@matcher("stats-note", r"running=(?P<r>\d+),? (?:pending|waiting)=(?P<w>\d+),? gpu_cache=(?P<u>[\d.]+)%")
def _stats_note(m, meta):  # the tuning note's simplified stats line
    return ev.SchedulerStats(meta, None, None, int(m["r"]), int(m["w"]), None, round(float(m["u"]) / 100, 6), kv_device="GPU")


# ---- KV cache capacity
@matcher("blocks", r"# (?P<dev>GPU|cuda|[A-Za-z]+) blocks: (?P<g>\d+)(?:, # CPU blocks: (?P<c>\d+))?")
def _blocks(m, meta):  # V0 llm_engine.py / gpu_executor.py / executor_base.py, early V1 kv_cache_utils.py
    return ev.KvCacheCapacity(meta, num_gpu_blocks=int(m["g"]), num_cpu_blocks=_int(m["c"]),
                              device="GPU" if m["dev"] in ("GPU", "cuda") else m["dev"].upper())


@matcher("kv-size", r"(?P<dev>GPU \+ host|[A-Z][A-Za-z]*) KV cache size: (?P<t>[\d,]+) tokens(?:, Maximum concurrency for (?P<n>[\d,]+) tokens per request: (?P<x>[\d.]+)x)?")
def _kv_size(m, meta):  # V1 kv_cache_utils.py 0.8+ (one line from 0.28)
    return ev.KvCacheCapacity(meta, kv_cache_tokens=_int(m["t"]), device=m["dev"],
                              max_concurrency=_float(m["x"]), concurrency_tokens=_int(m["n"]))


@matcher("kv-offload", r"CPU offload KV cache size: (?P<t>[\d,]+) tokens")
def _kv_offload(m, meta):  # the tuning note
    return ev.KvCacheCapacity(meta, cpu_offload_tokens=_int(m["t"]))


@matcher("concurrency", r"Maximum concurrency for (?P<n>[\d,]+) tokens(?: per request)?: (?P<x>[\d.,]+)(?:x| sequences)")
def _concurrency(m, meta):  # V0 gpu_executor.py 0.6.3+, V1 kv_cache_utils.py 0.8-0.27, tuning note
    return ev.KvCacheCapacity(meta, max_concurrency=_float(m["x"]), concurrency_tokens=_int(m["n"]))


@matcher("cache-config-info", r"(?:Engine \d+: )?vllm cache_config_info with initialization after num_gpu_blocks is: (?P<g>\d+)")
def _cache_info(m, meta):  # V1 v1/metrics/loggers.py 0.8.5-0.11
    return ev.KvCacheCapacity(meta, num_gpu_blocks=int(m["g"]))


# ---- memory budget
@matcher("kv-memory", r"Available KV cache memory: (?P<v>[\d.]+) (?P<u>GiB|GB)")
def _kv_mem(m, meta):  # V1 gpu_worker.py 0.9.1+
    return ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["v"], m["u"]))


@matcher("profile-total", r"the current vLLM instance can use total_gpu_memory \((?P<t>[\d.]+)GiB\) x gpu_memory_utilization \((?P<u>[\d.]+)\)")
def _profile_total(m, meta):  # V0 worker.py 0.6.5-0.10
    return ev.MemoryProfile(meta, total_memory_bytes=to_bytes(m["t"], "GiB"), gpu_memory_utilization=float(m["u"]))


@matcher("profile-kv", r"model weights take (?P<w>[\d.]+)GiB;.*the rest of the memory reserved for KV Cache is (?P<k>[\d.]+)GiB")
def _profile_kv(m, meta):  # V0 worker.py 0.6.5-0.10
    return ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["k"], "GiB"), model_weights_bytes=to_bytes(m["w"], "GiB"))


@matcher("model-loading", r"(?:Model loading|Loading model weights) took (?P<v>[\d.]+) (?P<u>GiB|GB)(?: memory)?(?: and (?P<s>[\d.]+) seconds)?")
def _model_loading(m, meta):  # model_runner.py 0.4-0.7, gpu_model_runner.py 0.6.6+
    return ev.MemoryProfile(meta, model_weights_bytes=to_bytes(m["v"], m["u"]), model_load_seconds=_float(m["s"]))


@matcher("cpu-kv-space", r"Explicitly set \((?P<v>[\d.]+)/(?P<t>[\d.]+)\) GiB for KV cache")
def _cpu_kv(m, meta):  # CPU backend cpu_worker.py (0.3x)
    return [ev.MemoryProfile(meta, available_kv_cache_bytes=to_bytes(m["v"], "GiB"), total_memory_bytes=to_bytes(m["t"], "GiB")),
            ev.KvCacheCapacity(meta, device="CPU")]


# ---- preemption
@matcher("preempted", r"Sequence group (?P<s>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode(?:.*?total_num_cumulative_preemption=(?P<c>\d+))?")
def _preempted(m, meta):  # V0 core/scheduler.py 0.4.3-0.10.2 (logged for the 1st, 51st, 101st ...)
    return ev.Preemption(meta, m["mode"].upper() if m["mode"].upper() in ("RECOMPUTE", "SWAP") else None,
                         _int(m["c"]), m["s"])


@matcher("preempting-note", r"Preempting seq_id=(?P<s>\S+?) \((?P<how>swap out|swap|recompute)(?:, (?P<b>\d+) blocks)?\)")
def _preempting(m, meta):  # the tuning note
    return ev.Preemption(meta, "SWAP" if m["how"].startswith("swap") else "RECOMPUTE", None, m["s"], _int(m["b"]))


@matcher("preemption-count-note", r"preemption count: (?P<n>\d+) in (?:the )?last (?P<k>\d+) ?(?P<u>s|sec|seconds?|m|min|minutes?|h|hours?)\b", flags=re.I)
def _preemption_count(m, meta):  # the tuning note
    unit = m["u"].lower()[0]
    return ev.PreemptionCount(meta, int(m["n"]), int(m["k"]) * {"s": 1, "m": 60, "h": 3600}[unit])


# ---- KV cache too small / no memory / free memory
@matcher("maxlen-gt-kv-v0", r"The model's max seq len \((?P<l>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((?P<t>\d+)\)", search=True)
def _too_small_v0(m, meta):  # V0 worker.py raise_if_cache_size_invalid 0.3-0.10
    return ev.KvCacheTooSmall(meta, int(m["l"]), int(m["t"]))


@matcher("maxlen-gt-kv-v1", r"To serve at least one request with the models?'s max seq len \((?P<l>\d+)\),? \((?P<n>[\d.]+) (?P<nu>GiB|GB) KV cache is needed, which is larger than the available KV cache memory \((?P<a>[\d.]+) (?P<au>GiB|GB)\)\.(?: Based on the available memory,(?: the estimated maximum model length is (?P<e>\d+))?)?", search=True)
def _too_small_v1(m, meta):  # V1 kv_cache_utils.py 0.7.3+ ("models's" typo until 0.25), kv_cache_planning.py 0.33
    return ev.KvCacheTooSmall(meta, int(m["l"]), None, to_bytes(m["n"], m["nu"]), to_bytes(m["a"], m["au"]), _int(m["e"]))


@matcher("no-cache-memory", r"No available memory for the cache blocks", search=True)
def _no_mem(m, meta):  # V0 worker.py, V1 kv_cache_utils.py / kv_cache_planning.py
    return ev.NoCacheMemory(meta)


@matcher("free-memory", r"Free memory on device(?: \w+)? \((?P<f>[\d.]+)/(?P<t>[\d.]+) GiB\) on startup is less than desired GPU memory utilization \((?P<u>[\d.]+), (?P<r>[\d.]+) GiB\)", search=True)
def _free_mem(m, meta):  # V1 gpu_worker.py 0.9+
    return ev.InsufficientFreeMemory(meta, to_bytes(m["f"], "GiB"), to_bytes(m["t"], "GiB"), to_bytes(m["r"], "GiB"), float(m["u"]), "GPU")


@matcher("cpu-free-memory", r"Available memory on node \d+ \((?P<f>[\d.]+)/(?P<t>[\d.]+) GiB\) on kv cache allocation is less than requested memory for kv \((?P<r>[\d.]+) GiB\)", search=True)
def _cpu_free_mem(m, meta):  # CPU backend cpu_worker.py 0.3x
    return ev.InsufficientFreeMemory(meta, to_bytes(m["f"], "GiB"), to_bytes(m["t"], "GiB"), to_bytes(m["r"], "GiB"), None, "CPU")


# ---- out of memory (torch caching allocator messages, all torch versions in use)
@matcher("cuda-oom", r"(?P<dev>CUDA|XPU|HIP|NPU) out of memory\.(?: Tried to allocate (?P<a>[\d.]+) (?P<au>[KMGT]?i?B)\.)?(?: GPU (?P<i>\d+) has a total capac(?:i)?ty of (?P<t>[\d.]+) (?P<tu>[KMGT]?i?B) of which (?P<f>[\d.]+) (?P<fu>[KMGT]?i?B) is free\.)?(?: Including non-PyTorch memory, this process has (?P<u>[\d.]+) (?P<uu>[KMGT]?i?B) memory in use)?", search=True)
def _oom(m, meta):
    return ev.OutOfMemory(
        meta,
        to_bytes(m["a"], m["au"]) if m["a"] else None,
        to_bytes(m["t"], m["tu"]) if m["t"] else None,
        to_bytes(m["f"], m["fu"]) if m["f"] else None,
        _int(m["i"]),
        to_bytes(m["u"], m["uu"]) if m["u"] else None,
    )


@matcher("cuda-error-oom", r"(?:CUDA error: out of memory|OutOfMemoryError: (?!\w+ out of memory\.)|cudaErrorMemoryAllocation)", search=True)
def _oom2(m, meta):
    return ev.OutOfMemory(meta)


# ---- engine death / hangs
_ENGINE_FAILURES = [
    ("engine-dead", r"(?:MQ|Async)?EngineDeadError\b"),
    ("background-task-failed", r"Engine background task failed"),
    ("iteration-timeout", r"Engine iteration timed out"),
    ("core-failed", r"EngineCore failed to start|EngineCore encountered a fatal error|EngineCore hit an exception|Engine core initialization failed|Engine process failed to start"),
    ("proc-died", r"(?:Engine core proc|Worker proc|Engine core process) \S+ died unexpectedly|Process \S+ \(PID: \d+\) died with exit code"),
    ("output-handler", r"AsyncLLM output_handler failed"),
    ("background-loop", r"Background loop (?:has errored already|is not running|is stopped)|Task finished unexpectedly"),
]
_ENGINE_RE = re.compile("|".join(f"(?P<k{i}>{p})" for i, (_, p) in enumerate(_ENGINE_FAILURES)))
_EXIT_CODE_RE = re.compile(r"died unexpectedly \(exit code: (?P<c>-?\d+)\)|died with exit code (?P<d>-?\d+)")


@matcher("engine-failure", _ENGINE_RE.pattern, search=True)
def _engine_failure(m, meta):  # V0 async_llm_engine.py, V1 v1/engine/core.py, core_client.py, multiproc_executor.py
    for i, (kind, _) in enumerate(_ENGINE_FAILURES):
        if m.group(f"k{i}"):
            # multiproc_executor.py 0.30+ "... died unexpectedly (exit code: %s)", v1/utils.py "... died with exit code N"
            code = _EXIT_CODE_RE.search(meta.text, m.start()) if kind == "proc-died" else None
            return ev.EngineFailure(meta, kind, meta.text[:300], int(code["c"] or code["d"]) if code else None)
    return None


# ---- NCCL (vLLM pynccl_wrapper.py 0.4.3+; torch ProcessGroupNCCL.cpp)
@matcher("nccl-watchdog", r"Watchdog caught collective operation timeout: WorkNCCL\((?:.*?OpType=(?P<op>\w+))?(?:.*?Timeout\(ms\)=(?P<t>\d+))?", search=True)
def _nccl_watchdog(m, meta):
    return ev.NcclError(meta, "watchdog-timeout", meta.text[:300], m["op"], int(m["t"]) / 1000 if m["t"] else None)


@matcher("nccl-error", r"pynccl_wrapper\.py\", line \d+, in \w+|NCCL [Ee]rror(?: \d+)?: |Some NCCL operations have failed or timed out|NCCL watchdog thread terminated|ncclCommInitRank failed|ncclSystemError|ncclInternalError|ncclUnhandledCudaError", search=True)
def _nccl_error(m, meta):
    return ev.NcclError(meta, "error", meta.text[:300])


@matcher("shm-stall", r"No available (?:shared memory broadcast )?block found in (?P<s>\d+) seconds?")
def _shm(m, meta):  # shm_broadcast.py 0.5+ (WARNING until 0.7, DEBUG 0.8-0.10, INFO 0.33)
    return ev.NcclError(meta, "shm-broadcast-stall", meta.text[:300], None, float(m["s"]))


# ---- configuration and version
@matcher("namespace", r"args: Namespace\((?P<a>.*)\)\s*$")
def _namespace(m, meta):  # entrypoints/openai/api_server.py 0.4.3-0.8.5 (every arg)
    values = _kv_pairs(m["a"])
    return _config(meta, "namespace", values)


@matcher("non-default-args", r"non-default args: (?P<a>\{.*)$")
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


@matcher("engine-init", r"Initializing an? (?:(?P<eng>V[01]) )?LLM engine(?: \(v(?P<v>[^)\s]+)\))? with config: (?P<c>.*)")
def _engine_init(m, meta):  # llm_engine.py 0.2-0.10 (V0), v1/engine/core.py 0.7.3+ (V1)
    values: dict[str, object] = {}
    for k, v in re.findall(r"(?:^|, )(\w+)=('[^']*'|[^,]*)", m["c"]):
        if k in ENGINE_INIT_KEYS and ENGINE_INIT_KEYS[k] not in values:
            values[ENGINE_INIT_KEYS[k]] = _literal(v)
    engine = (m["eng"] or "").lower() or ("v0" if m["v"] else None)
    out = list(_config(meta, "engine-init", values))
    if m["v"]:
        out.append(ev.VersionSeen(meta, m["v"], engine))
    elif engine:
        out.append(ev.VersionSeen(meta, "", engine))
    return out


@matcher("api-version", r"vLLM (?:API )?server version (?P<v>[\w.+-]+)")
def _api_version(m, meta):  # entrypoints/openai/api_server.py 0.4-0.13, 0.15+
    return ev.VersionSeen(meta, m["v"].rstrip(","))


@matcher("banner-version", r".*█.*\bversion (?P<v>\d+\.\d+[\w.+-]*)")
def _banner(m, meta):  # the ASCII banner (0.11+)
    return ev.VersionSeen(meta, m["v"])


@matcher("chunked-prefill", r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)")
def _chunked(m, meta):  # config.py / core/sched/scheduler.py 0.5+
    return _config(meta, "scheduler", {"enable_chunked_prefill": True, "max_num_batched_tokens": int(m["n"])})


@matcher("model-len", r"Using max model len (?P<n>\d+)")
def _model_len(m, meta):  # config 0.10+
    return _config(meta, "model-len", {"max_model_len": int(m["n"])})


@matcher("scheduler-note", r"Initializing scheduler with max_num_seqs=(?P<n>\d+)")
def _sched_note(m, meta):  # the tuning note
    return _config(meta, "scheduler", {"max_num_seqs": int(m["n"])})


@matcher("config-rejected", r"User-specified max_model_len \((?P<v>\d+)\) is greater than the derived max_model_len \((?:\w+)=(?P<l>[\d.]+)", search=True)
def _rejected(m, meta):  # config/model.py validation
    return ev.ConfigRejected(meta, "max_model_len", int(m["v"]), int(float(m["l"])), meta.text[:300])


@matcher("server-ready", r"(?:Application startup complete|Starting vLLM API server|Uvicorn running on|Available routes are)")
def _ready(m, meta):
    return ev.ServerReady(meta)


@matcher("shutdown", r"(?:\[shutdown\] API server: shutdown triggered|Received (?:SIGTERM|SIGINT|signal SIGTERM|signal SIGINT)\b)")
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


# ---- tracebacks: the exception line closes the traceback opened by "Traceback (most recent call last):"
EXC_LINE_RE = re.compile(r"^(?P<t>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?:: (?P<m>.*))?$")
FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+, in (?P<f>\w+)')


class RecordParser:
    """Records -> events, for one log source (tracebacks are tracked per process).

    ``parse(record, source) -> list[Event]``; an empty list means the record matched nothing.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._tb: dict[object, tuple[int, list[str]]] = {}  # process key -> (start line, frames)

    MAX_MESSAGE = 32768  # longer messages are matched on their first 32 KiB

    def parse(self, rec: Record) -> list:
        msg = rec.msg if len(rec.msg) <= self.MAX_MESSAGE else rec.msg[: self.MAX_MESSAGE]
        if not msg or REQUEST_LOG_RE.match(msg):
            return []
        meta = ev.Meta(self.source, rec.lineno, rec.lineno, rec.ts, rec.process, rec.level, msg[:400])
        out: list = []
        key = rec.pid or rec.process
        stripped = msg.strip()
        if stripped.startswith("Traceback (most recent call last)"):
            self._tb[key] = (rec.lineno, [])
            return [None]  # consumed: part of a traceback event
        fm = FRAME_RE.match(msg)
        if fm and key in self._tb:
            self._tb[key][1].append(fm.group("f"))
        em = EXC_LINE_RE.match(stripped) if msg[:1] not in " \t" else None
        if em:
            start, frames = self._tb.pop(key, (rec.lineno, []))
            tmeta = ev.Meta(self.source, start, rec.lineno, rec.ts, rec.process, rec.level, msg[:400])
            out.append(ev.ExceptionRaised(tmeta, em.group("t"), (em.group("m") or "")[:400], tuple(frames[-12:])))
        for name, rx, build, search in _MATCHERS:
            m = rx.search(msg) if search else rx.match(msg)
            if m:
                res = build(m, meta)
                if res is None:
                    continue
                if isinstance(res, list):
                    out.extend(res)
                else:
                    out.append(res)
        if ("--" in msg or "VLLM_" in msg) and not any(isinstance(e, ev.UnknownFlag) for e in out):
            for m in _FAKE_RE.finditer(msg):
                out.append(ev.UnknownFlag(meta, m.group(1), FAKE_FLAGS[m.group(1)], m.group(2)))
        return out

