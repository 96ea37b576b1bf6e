"""Typed events: what vllm-doctor's parsers and collectors observed.

Every event is a frozen dataclass. Units are normalised where the event is built:
``_bytes`` (bytes), ``_seconds`` (seconds), ``_ratio`` (0..1, never percent), ``_tps``
(tokens per second). ``None`` means "this vLLM version / line did not report it"; ``0``
means "reported as zero". The class name is the event kind that rules refer to
(``count("Preemption")``).

Each log event carries a :class:`Meta` giving the line numbers it came from (1-based,
``end_lineno`` >= ``lineno`` for records that span several lines, such as tracebacks),
its timestamp (``ts``: seconds since the epoch, the year inferred, see
:mod:`vllm_doctor.ingest.envelope`) and the vLLM process that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


#: The source of the events ``diagnose --prometheus`` builds from Prometheus' range queries
#: (``prometheus:<replica>``): their stats are counter deltas at the query's steps, and a step past a
#: replica's last sample repeats that sample for Prometheus' 5 min lookback (flat counters).
QUERIED_SOURCE_PREFIX = "prometheus:"


@dataclass(frozen=True, slots=True)
class Meta:
    """Where an event came from.

    source: file name (or "-" for stdin, "metrics" / "nvml" for collectors);
    lineno / end_lineno: 1-based line numbers in that source (0 for collectors);
    ts: epoch seconds or None when the line has no timestamp;
    process: vLLM process prefix such as "EngineCore_DP0" or None;
    level: log level ("INFO", "WARNING", "ERROR", ...) or None;
    text: the message text (truncated to a few hundred characters) for evidence.
    """

    source: str = ""
    lineno: int = 0
    end_lineno: int = 0
    ts: float | None = None
    process: str | None = None
    level: str | None = None
    text: str = ""


@dataclass(frozen=True, slots=True)
class VersionSeen:
    """vLLM's version, from the API server banner (``vLLM API server version X``, 0.4–0.13;
    ``vLLM server version X, serving model``, 0.15+; the ASCII banner ``version X``, 0.11+) or
    the engine init echo (``Initializing a V1 LLM engine (vX) with config``)."""

    meta: Meta
    version: str
    engine: Literal["v0", "v1"] | None = None


@dataclass(frozen=True, slots=True)
class EngineConfigObserved:
    """Engine configuration echoed at start-up.

    kind: "namespace" (``args: Namespace(...)``, vLLM 0.4.3–0.8.5, api_server.py: every arg),
    "non-default-args" (``non-default args: {...}``, 0.9+, entrypoints utils: only the changed
    args), "engine-init" (``Initializing a [V0|V1] LLM engine (vX) with config: ...``,
    llm_engine.py / v1/engine/core.py), "scheduler" (``Chunked prefill is enabled with
    max_num_batched_tokens=N`` and the tuning note's ``Initializing scheduler with
    max_num_seqs=N``), "model-len" (``Using max model len N``).
    values: (name, value) pairs with vLLM's own field names (max_model_len, max_num_seqs,
    gpu_memory_utilization, ...), values as Python scalars.
    unknown_flags: flag-like keys that no vLLM version has (``kv_cache``, ``chunked_prefill_size``).
    """

    meta: Meta
    kind: str
    values: tuple[tuple[str, object], ...] = ()
    unknown_flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KvCacheCapacity:
    """KV cache size found at start-up.

    V0 ``# GPU blocks: N, # CPU blocks: M`` (0.3–0.6 llm_engine.py / gpu_executor.py;
    ``# cuda blocks`` from executor_base.py 0.7–0.10), early V1 ``# GPU blocks: N``;
    V1 ``GPU KV cache size: N tokens`` (kv_cache_utils.py 0.8+, ``CPU`` on the CPU backend) and
    ``Maximum concurrency for N tokens per request: X.XXx`` (one line from 0.28);
    V1 0.8.5–0.11 ``vllm cache_config_info with initialization after num_gpu_blocks is: N``;
    the tuning note's ``GPU KV cache size: 512,000 tokens`` / ``CPU offload KV cache size``.
    Any field may be None: one line rarely carries them all.
    """

    meta: Meta
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    kv_cache_tokens: int | None = None
    device: str | None = None  # "GPU", "CPU", "XPU", ...
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None  # the "N tokens per request" (= max_model_len)
    cpu_offload_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """Memory budget lines.

    ``Available KV cache memory: X GiB`` (V1 gpu_worker.py 0.9.1+), the V0 profiling table
    (worker.py 0.6.5–0.10: ``total_gpu_memory (X GiB) x gpu_memory_utilization (U) = Y GiB`` and
    ``the rest of the memory reserved for KV Cache is Z GiB``), ``Model loading took X GiB``
    (gpu_model_runner.py), ``Loading model weights took X GB`` (model_runner.py 0.4–0.7),
    the CPU backend's ``Explicitly set (A/B) GiB for KV cache``.
    """

    meta: Meta
    available_kv_cache_bytes: int | None = None
    total_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    model_weights_bytes: int | None = None
    model_load_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """The periodic stats line (every ~5 s on V0, ~10 s on V1).

    V0 (llm_engine.py 0.1–0.3, engine/metrics.py 0.3.3–0.10.2): ``Running / Swapped / Pending``,
    GPU and CPU KV cache usage. V1 (v1/metrics/loggers.py 0.7.3+): ``Engine 000:`` prefix
    (0.8.3+), ``Running / Waiting``, ``Preemptions: N`` (per interval, 0.11.1+, only when > 0),
    ``GPU|CPU|XPU KV cache usage``, ``Prefix cache hit rate``. Also the tuning note's
    ``running=128 pending=512 gpu_cache=0%``.
    num_waiting is V0's Pending or V1's Waiting; num_swapped is V0 only (None on V1).
    preemptions: preemptions in this interval (V1 field) or None when the line has no such field.
    """

    meta: Meta
    prompt_tps: float | None
    generation_tps: float | None
    num_running: int
    num_waiting: int
    num_swapped: int | None = None
    kv_cache_usage_ratio: float | None = None
    cpu_kv_cache_usage_ratio: float | None = None
    prefix_cache_hit_ratio: float | None = None
    preemptions: int | None = None
    engine_index: int | None = None
    kv_device: str | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    """A preemption.

    V0 scheduler.py 0.4.3–0.10.2 WARNING ``Sequence group S is preempted by PreemptionMode.X mode
    because there is not enough KV cache space ... total_num_cumulative_preemption=N``: printed only
    for the 1st, 51st, 101st ... preemption, so ``cumulative`` (N) is the count, never the lines.
    The tuning note's ``Preempting seq_id=1021 (swap out, 512 blocks)`` has no cumulative count.
    """

    meta: Meta
    mode: Literal["RECOMPUTE", "SWAP"] | None
    cumulative: int | None = None
    seq_id: str | None = None
    blocks: int | None = None


@dataclass(frozen=True, slots=True)
class PreemptionCount:
    """A count of preemptions over a window (the tuning note's
    ``preemption count: 45 in last 5 minutes``)."""

    meta: Meta
    count: int
    window_seconds: float


@dataclass(frozen=True, slots=True)
class KvCacheTooSmall:
    """The KV cache cannot hold one max_model_len sequence.

    V0 (worker.py raise_if_cache_size_invalid, 0.3–0.10): ``The model's max seq len (L) is larger
    than the maximum number of tokens that can be stored in KV cache (T)``; V1
    (v1/core/kv_cache_utils.py 0.7.3+, kv_cache_planning.py 0.33): ``To serve at least one request
    with the model's max seq len (L), (X GiB KV cache is needed, which is larger than the
    available KV cache memory (Y GiB). Based on the available memory, the estimated maximum model
    length is E.`` (the estimate from 0.9.1).
    """

    meta: Meta
    max_model_len: int | None
    kv_cache_tokens: int | None = None
    needed_bytes: int | None = None
    available_bytes: int | None = None
    estimated_max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class NoCacheMemory:
    """``No available memory for the cache blocks`` (V0 worker.py, V1 kv_cache_utils.py).

    from_traceback: True when only the traceback of vLLM's start-up KV cache check shows it (V0
    ``raise_if_cache_size_invalid(``, V1 ``check_enough_kv_cache_memory(``), its ValueError cut
    off: no KV cache blocks, or too few for one max_model_len sequence (the two errors it raises).
    """

    meta: Meta
    from_traceback: bool = False


@dataclass(frozen=True, slots=True)
class InsufficientFreeMemory:
    """Free device memory below what was asked for.

    V1 gpu_worker.py 0.9+: ``Free memory on device (F/T GiB) on startup is less than desired GPU
    memory utilization (U, R GiB)``; CPU backend cpu_worker.py 0.3x: ``Available memory on node 0
    (F/T GiB) on kv cache allocation is less than requested memory for kv (R GiB)``.
    """

    meta: Meta
    free_bytes: int | None
    total_bytes: int | None
    requested_bytes: int | None
    gpu_memory_utilization: float | None = None
    device: str = "GPU"


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """A CUDA / torch out-of-memory error (``torch.OutOfMemoryError: CUDA out of memory. Tried to
    allocate X MiB. GPU N has a total capacity of T GiB of which F MiB is free ...``; older torch
    ``torch.cuda.OutOfMemoryError`` with the "total capacty" typo; ``RuntimeError: CUDA out of
    memory``; ``CUDA error: out of memory``).
    phase: "startup" or "runtime" when the traceback it closes says so (raised through
    start-up-only frames such as ``profile_run`` / ``load_model``, or serving-only frames such as
    ``step`` / ``output_handler``); None otherwise, and the state decides from what came before
    (the engine served: requests or stats lines seen).
    """

    meta: Meta
    tried_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    gpu_index: int | None = None
    in_use_bytes: int | None = None
    phase: Literal["startup", "runtime"] | None = None


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """The engine died or hung.

    kind: "engine-dead" (``EngineDeadError`` / ``AsyncEngineDeadError``), "background-task-failed"
    (V0 async_llm_engine.py ``Engine background task failed``), "iteration-timeout" (``Engine
    iteration timed out``), "core-failed" (``EngineCore failed to start``, ``EngineCore encountered
    a fatal error``, ``EngineCore hit an exception``, ``Engine core initialization failed``,
    ``Engine process failed to start``), "proc-died" (``Engine core proc X died unexpectedly``,
    ``Worker proc X died unexpectedly``), "output-handler" (``AsyncLLM output_handler failed``),
    "background-loop" (``Background loop has errored already`` / ``is not running``),
    "step-failed" (a failed model step's input dumped). "core-failed" also stands for a traceback
    through the KV cache allocation at start-up whose exception is cut off: the engine did not start.
    exit_code: the dead process's exit code where vLLM logs it (``Worker proc X died unexpectedly
    (exit code: -4)``, 0.30+; ``Process X (PID: N) died with exit code N``); negative = killed by
    that signal (-4 SIGILL, -9 SIGKILL).
    """

    meta: Meta
    kind: str
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class NcclError:
    """An NCCL failure.

    kind: "error" (``NCCL error: ...`` from pynccl_wrapper.py 0.4.3+, ``NCCL Error N``),
    "watchdog-timeout" (torch ProcessGroupNCCL.cpp ``Watchdog caught collective operation
    timeout: WorkNCCL(... OpType=ALLREDUCE ... Timeout(ms)=T) ran for M milliseconds``). The
    shared-memory broadcast queue's wait is not NCCL's: :class:`BroadcastWait`.
    """

    meta: Meta
    kind: str
    message: str = ""
    op_type: str | None = None
    timeout_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class BroadcastWait:
    """A vLLM process waited on the shared-memory broadcast queue between the engine and its
    workers (distributed/device_communicators/shm_broadcast.py ``MessageQueue``, 0.5+: ``No
    available [shared memory broadcast] block found in N second(s)``), logged once every N seconds
    (VLLM_RINGBUFFER_WARNING_INTERVAL, 60) of the same wait. The writer (the engine core, V0's
    driver) waits for workers that have not read its last message, a reader (the engine core for
    its workers' replies, a V0 worker for the next step) for a message that has not come: some
    process hangs or does time-consuming work (torch.compile, weight or KV cache quantization,
    vLLM's own wording). Shared memory, not NCCL: by itself no NCCL evidence. seconds: N."""

    meta: Meta
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ExceptionRaised:
    """The last line of a Python traceback (``SomeError: message``); the traceback, whose lines
    are joined into this one event, spans ``meta.lineno .. meta.end_lineno``.

    Where it was raised, known by the traceback's structure (its frames, its process prefix, the
    logger's file), not by its wording (:func:`vllm_doctor.parsers.records.classify_traceback`):
    raised_in: the process, "engine-core" (V1 EngineCore, V0's engine process or background loop), "worker"
    (VllmWorker / WorkerProc / a multiprocessing worker), "api-server" (the HTTP handlers),
    "ray-actor" (a Ray worker actor) or None; phase: "loading" (weights), "profiling" (the memory
    profiling run), "kv-cache" (KV cache sizing and allocation), "graph-capture" (CUDA graphs),
    "startup" (another start-up step), "serving-step" (a model step for requests),
    "output-handler" (V1's output handler) or None; ended: the traceback reached the top of its
    process (the module, the process entry, the engine's main loop) or is a ``SystemExit``: the
    process ended with it, it was not caught and logged by a handler that carried on.
    """

    meta: Meta
    exc_type: str
    message: str = ""
    frames: tuple[str, ...] = ()  # function names seen in the traceback ("load_model", ...)
    raised_in: str | None = None
    phase: str | None = None
    ended: bool = False


@dataclass(frozen=True, slots=True)
class UnreadLine:
    """A line that holds one of vLLM's wordings (a matcher's) after a prefix the envelope did not
    take off (a time, a date or a level of a wrapper or logger format it does not know), so that
    it was not read. matcher: the wording's matcher; prefix: the unknown text before it (the last
    80 characters)."""

    meta: Meta
    matcher: str
    prefix: str = ""


@dataclass(frozen=True, slots=True)
class ConfigRejected:
    """vLLM refused its configuration before start-up, e.g. ``User-specified max_model_len (L) is
    greater than the derived max_model_len (max_position_embeddings=D ...)`` (config validation,
    0.4+)."""

    meta: Meta
    setting: str
    value: int | None = None
    limit: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class ServerReady:
    """The server started serving (``Application startup complete``, ``Starting vLLM API
    server``, ``Uvicorn running on``) or the first request arrived. ``inferred``: no such line,
    the first periodic stats line stands for it (vLLM V1 prints one only once there is load, which
    may be long after it was ready)."""

    meta: Meta
    inferred: bool = False


@dataclass(frozen=True, slots=True)
class ServerShutdown:
    """An orderly shutdown was requested (``[shutdown] API server: shutdown triggered``,
    entrypoints launcher 0.3x; ``Received SIGTERM`` / ``SIGINT`` in the API server). Engine errors
    that follow it are part of the shutdown, not a death."""

    meta: Meta


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """A process of the deployment ended abnormally, as its supervisor or shell reports it:
    systemd ``Main process exited, code=exited, status=1/FAILURE`` / ``code=killed, status=9/KILL``,
    docker ``exited with code 137``, a shell's ``Killed``, ``Segmentation fault (core dumped)``,
    ``Fatal Python error: ...``. exit_code: the exit status (None when only a signal is known);
    signal: the signal that ended it (137 = 128 + 9: SIGKILL) or None."""

    meta: Meta
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class UnknownFlag:
    """A flag that no vLLM version has, seen in a command line or config echo (the tuning
    note's ``--kv-cache``, ``--chunked-prefill-size``, ``VLLM_USE_PREFILL``)."""

    meta: Meta
    flag: str
    real_flag: str | None = None
    value: str | None = None  # the value given to it, when the line shows one
    rejected: bool = False  # vLLM's argument parser refused it ("unrecognized arguments"): vLLM did not start


# ---- events from collectors (serve): one sample per scrape / poll ------------------------------


@dataclass(frozen=True, slots=True)
class VllmMetricsSample:
    """One scrape of vLLM's /metrics (v0 engine/metrics.py, v1/metrics/loggers.py), renames
    resolved (``vllm:gpu_cache_usage_perc`` before 0.9.2 -> kv_cache_usage_ratio).
    Values summed over the ``engine`` label; None when the scrape did not carry the series.
    ttft_buckets: cumulative histogram buckets ((le_seconds, count), ...) as scraped.
    """

    meta: Meta
    num_running: float | None = None
    num_waiting: float | None = None
    num_swapped: float | None = None
    kv_cache_usage_ratio: float | None = None
    num_preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    ttft_count: float | None = None
    ttft_sum: float | None = None
    cache_config: tuple[tuple[str, str], ...] = ()
    rejected_values: int = 0
    engines: tuple[EngineMetrics, ...] = ()  # per ``engine`` label (data parallel), when vLLM labels them
    # issue 25: overload, prefix cache and KV-connector series (None when the scrape lacks them)
    num_waiting_capacity: float | None = None  # vllm:num_requests_waiting_by_reason{reason="capacity"} (0.3x)
    num_waiting_deferred: float | None = None  # ... {reason="deferred"}: LoRA budget, KV transfer, blocked
    admission_rejections_total: float | None = None  # vllm:admission_rejections_total (0.3x, --max-num-queued-*)
    kv_transfer_failures_total: float | None = None  # vllm:nixl_num_failed_transfers_total, mooncake's
    prefix_cache_queries_total: float | None = None  # vllm:prefix_cache_queries_total (0.9.2+)
    prefix_cache_hits_total: float | None = None


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The per-engine part of one /metrics scrape (vLLM's ``engine`` label, V1 0.8+ with data
    parallel): the fields the rules judge per engine. engine_index: the label as an int."""

    meta: Meta
    engine_index: int | None
    num_running: float | None = None
    num_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML poll of one GPU (nvidia-ml-py). memory_used_bytes comes from memory info v2
    where the driver has it (matches nvidia-smi), else v1."""

    meta: Meta
    index: int
    uuid: str
    model: str
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_ratio: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    processes: tuple[tuple[int, str, int], ...] = field(default=())  # (pid, name, used_bytes)



# ---- issue 25 item 4: the incident classes of 2025-2026 (start-up, overload, length, KV
# transfer, GPU support, host memory)
@dataclass(frozen=True, slots=True)
class StartupPhase:
    """One timed phase of an engine's start-up, as vLLM logs it.

    phase: "download" (weight_utils.py ``Time spent downloading weights for M: X seconds``, 0.7+),
    "weights" (model_loader ``Loading weights took X seconds``, 0.7+), "model_load"
    (``Model loading took X GiB [memory] and Y seconds``, 0.7+: weights and model init),
    "dynamo" (``Dynamo bytecode transform time: X s``), "compile" (``torch.compile takes|took X s
    in total``, 0.6.5+), "profile" (``Memory profiling takes X seconds`` V0 0.6.x, ``Initial
    profiling/warmup run took X s`` 0.2x+), "graph_capture" (``Graph capturing finished in X secs``,
    0.3+), "init_engine" (``init engine (profile, create kv cache, warmup model) took X s``,
    0.6.4+: profiling, KV cache allocation, compilation and graph capture together).
    seconds: the duration vLLM measured.
    """

    meta: Meta
    phase: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RequestTooLong:
    """A request rejected because its prompt (plus requested output) exceeds max_model_len.

    Three wordings across versions: V0 scheduler ``Input prompt (N tokens) is too long and exceeds
    limit of L`` (WARNING, 0.2-0.10), the OpenAI server's ``This model's maximum context length is
    L tokens. However, you requested N tokens`` / ``your request has N input tokens`` / ``your
    prompt contains N input tokens`` (0.2+), and V1's ``The decoder prompt (length N) is longer
    than the maximum model length of L`` (0.7+; ``The prompt (total length N) is too long to fit
    into the model (context length L)``, V0 multimodal 0.6). prompt_tokens: N; limit_tokens: L."""

    meta: Meta
    prompt_tokens: int | None
    limit_tokens: int | None


@dataclass(frozen=True, slots=True)
class KvTransferFailure:
    """A disaggregated prefill/decode or KV-connector transfer failed or timed out.

    connector: "nixl", "lmcache", "p2pnccl", "mooncake", "offload" or "kv-connector" (the
    scheduler's connector-agnostic KV load failure). kind: "transfer-failed", "handshake-failed",
    "expired" (prefill blocks released because no decode worker fetched them in time),
    "load-failed" (the scheduler failed or rescheduled requests whose KV could not be loaded),
    "unavailable" (the connector's library is missing), "connector-error" (a traceback raised
    through the connector's own code, known by its frames' files)."""

    meta: Meta
    connector: str
    kind: str
    requests: int | None = None


@dataclass(frozen=True, slots=True)
class GpuUnsupported:
    """The GPU, its compute capability or a kernel is not supported by this build.

    kind: "no-kernel-image" (CUDA ``no kernel image is available for execution on the device``),
    "arch-not-compiled" (torch ``... with CUDA capability sm_NN is not compatible with the current
    PyTorch installation``), "ptx-toolchain" (``the provided PTX was compiled with an unsupported
    toolchain``), "jit-failed" (FlashInfer / Triton JIT: ``Ninja build failed``, ``FlashInfer JIT``
    compile errors), "capability" (vLLM's own capability checks: bfloat16 or FlashAttention need a
    newer GPU). arch: ``sm_120`` etc. when the line names it."""

    meta: Meta
    kind: str
    arch: str | None = None


@dataclass(frozen=True, slots=True)
class HostMemorySample:
    """One sample of the host (container) memory the vLLM deployment uses: cgroup v2
    ``memory.current`` / ``memory.max`` (limit_bytes None when "max"), else /proc/meminfo's
    MemTotal - MemAvailable and MemTotal, with the vLLM processes' RSS where known."""

    meta: Meta
    used_bytes: int
    limit_bytes: int | None = None
    rss_bytes: int | None = None
    source: str = "cgroup"


Event = (
    VersionSeen
    | EngineConfigObserved
    | KvCacheCapacity
    | MemoryProfile
    | SchedulerStats
    | Preemption
    | PreemptionCount
    | KvCacheTooSmall
    | NoCacheMemory
    | InsufficientFreeMemory
    | OutOfMemory
    | EngineFailure
    | NcclError
    | BroadcastWait
    | ExceptionRaised
    | ConfigRejected
    | ServerReady
    | ServerShutdown
    | UnknownFlag
    | VllmMetricsSample
    | GpuSample
    | StartupPhase
    | RequestTooLong
    | KvTransferFailure
    | GpuUnsupported
    | HostMemorySample
)

def _fast_init(cls: type) -> type:
    """Give a frozen, slotted dataclass an ``__init__`` that sets each field through its slot's
    descriptor: the same signature, defaults and result as the one ``dataclass`` writes (which
    calls ``object.__setattr__`` by name per field), about twice as fast. Events are built for
    every keyword-bearing line, so this is most of what building one costs."""
    import dataclasses

    fs = [f for f in dataclasses.fields(cls) if f.init]
    if any(f.default_factory is not dataclasses.MISSING for f in fs) or hasattr(cls, "__post_init__"):
        return cls  # not needed so far; dataclass's own __init__ stays
    ns: dict[str, object] = {"_new": object.__new__}
    params = []
    for i, f in enumerate(fs):
        ns[f"_s{i}"] = cls.__dict__[f.name].__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
    body = "".join(f"    _s{i}(self, {f.name})\n" for i, f in enumerate(fs)) or "    pass\n"
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", ns)  # noqa: S102 - built from field names only
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls


EVENT_KINDS: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        VersionSeen, EngineConfigObserved, KvCacheCapacity, MemoryProfile, SchedulerStats,
        Preemption, PreemptionCount, KvCacheTooSmall, NoCacheMemory, InsufficientFreeMemory,
        OutOfMemory, EngineFailure, NcclError, BroadcastWait, ExceptionRaised, ConfigRejected, ServerReady,
        ServerShutdown, UnknownFlag, UnreadLine, ProcessExited, VllmMetricsSample, GpuSample, StartupPhase, RequestTooLong,
        KvTransferFailure, GpuUnsupported, HostMemorySample,
    )
}

for _cls in (Meta, EngineMetrics, *EVENT_KINDS.values()):
    _fast_init(_cls)


def _phases(cls: type) -> tuple[str, ...]:
    """The values of ``cls``'s ``phase`` field when it is typed ``Literal[...] | None`` (else ())."""
    import typing

    hint = typing.get_type_hints(cls).get("phase")
    lits = [a for a in typing.get_args(hint) if typing.get_origin(a) is typing.Literal]
    return tuple(v for lit in lits for v in typing.get_args(lit))


#: Kind selectors by phase: ``OutOfMemory:startup`` names the OutOfMemory events whose ``phase``
#: field is "startup" (the state sets the field on every such event it applies, see
#: State.resolve_phase); rules read them like a kind (``exists('OutOfMemory:startup')``), and the
#: state counts and keeps them apart. Derived from the events' ``phase: Literal[...]`` fields.
PHASE_SELECTORS: frozenset[str] = frozenset(
    f"{name}:{phase}" for name, cls in EVENT_KINDS.items() for phase in _phases(cls))
