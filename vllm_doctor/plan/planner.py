"""``vllm-doctor plan``: capacity before launch, with the arithmetic shown.

Reads a model's ``config.json`` (a file, a model directory or a Hugging Face cache directory;
never downloads), takes the launch settings, and reports per GPU: weight bytes, KV bytes per
token per attention kind, the KV cache pool in blocks and tokens by the vLLM version's own
accounting (``vllm_doctor.plan.capacity``), max concurrency at ``max_model_len`` and at a mean
request length, whether start-up fails (in vLLM's own words) and the flags for a target.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace as _replace
from pathlib import Path

from packaging.version import Version

from vllm_doctor.plan import capacity as cap
from vllm_doctor.errors import InputError
from vllm_doctor.versions import defaults as version_defaults, flag_exists, newer_than_known, parse_version

_NEWEST = "0.33.0"


@dataclass
class PlanInputs:
    """Launch settings; None = vLLM's default for the version (where the arithmetic needs one)."""
    config: dict
    model: str = "?"
    gpu_memory_bytes: int | None = None
    gpu_name: str | None = None               # e.g. NVML's "NVIDIA A100-SXM4-80GB": vLLM's defaults differ by GPU
    vllm_version: str = _NEWEST
    device: str = "cuda"                      # cuda | cpu
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"           # conv state (and SSM state unless the next is set); auto: model dtype
    mamba_ssm_cache_dtype: str = "auto"       # temporal (SSM) state of Mamba1/2 and gated-delta-net layers
    enable_prefix_caching: bool | None = None # None: the version's default (hybrid models: on from 0.24)
    block_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    overhead_bytes: int | None = None         # activation peak + non-torch memory; None: estimated
    target_concurrency: int | None = None
    mean_request_tokens: int | None = None
    gpu_count: int | None = None              # GPUs the operator has: caps a recommended TP x PP; None: unknown
    engine: str | None = None                 # v0 | v1; None: from the version and VLLM_USE_V1
    sampler: str = "native"                   # V1's top-k/top-p profile: native (PyTorch) | flashinfer
    entrypoint: str = "server"                # server (vllm serve) | llm (the offline LLM() class): V1 defaults differ
    disable_custom_all_reduce: bool = False   # --disable-custom-all-reduce (or no P2P between the GPUs)
    vllm_use_v1: str | None = None            # the VLLM_USE_V1 the server runs with ("0" / "1"), when given
    enable_lora: bool = False                 # --enable-lora: LoRA slots in the weights, its profiling not sized
    max_loras: int = 1                        # --max-loras (vLLM's default 1)
    max_lora_rank: int = 16                   # --max-lora-rank (vLLM's default 16)


@dataclass
class Plan:
    model: str
    vllm_version: str
    engine: str
    settings: dict
    weights: dict
    kv_per_token: dict
    pool: dict
    concurrency: dict
    startup: dict
    fixes: list[dict] = field(default_factory=list)
    not_sized: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine_reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- inputs

def load_config(path: str) -> tuple[dict, str]:
    """config.json from a file, a model directory, or a Hugging Face cache directory
    (``models--org--name`` or the hub folder with it: the newest snapshot). Never downloads."""
    p = Path(path).expanduser()
    cands: list[Path] = []
    if p.is_file():
        cands = [p]
    elif p.is_dir():
        if (p / "config.json").is_file():
            cands = [p / "config.json"]
        else:
            snaps = sorted(p.glob("snapshots/*/config.json"), key=lambda f: f.stat().st_mtime, reverse=True)
            if not snaps:
                models = sorted({f.parts[-4] for f in p.glob("models--*/snapshots/*/config.json")})
                if len(models) > 1:
                    raise InputError(f"{path}: a Hugging Face cache with {len(models)} models; name one: "
                                     + ", ".join(str(p / m) for m in models[:5]))
                snaps = sorted(p.glob("models--*/snapshots/*/config.json"), key=lambda f: f.stat().st_mtime, reverse=True)
            cands = snaps[:1]
    if not cands:
        raise InputError(f"{path}: no config.json (a file, a model directory or a Hugging Face cache directory)")
    try:
        if cands[0].stat().st_size > 16 << 20:      # a config.json is kilobytes; memory stays bounded
            raise InputError(f"{cands[0]}: larger than 16 MiB: not a model's config.json")
        cfg = json.loads(cands[0].read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{cands[0]}: not a readable JSON config: {e}") from None
    validate_config(cfg, str(cands[0]))
    name = p.name
    hub = [part for part in cands[0].parts if part.startswith("models--")]
    if hub and not name.startswith("models--") and cands[0].parent.parent.name == "snapshots":
        name = hub[-1]                          # the hub folder: the model's own name, not the folder's
    if name.startswith("models--"):
        name = name[len("models--"):].replace("--", "/")
    elif name == "config.json":
        name = p.parent.name
    return cfg, name


# config.json fields the capacity arithmetic reads, with the range a real model has. A value outside it
# (0 layers, -8 heads, "32", 1e30, a list) gets one line naming the field, never a traceback from deep
# inside the arithmetic and never a plan sized on nonsense. (min, max); None: the field may be absent/null.
_K, _M = 1 << 10, 1 << 20
_COUNTS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 4 * _K), "num_layers": (1, 4 * _K), "n_layer": (1, 4 * _K),
    "hidden_size": (1, 1 * _M), "d_model": (1, 1 * _M), "n_embd": (1, 1 * _M),
    "num_attention_heads": (1, 64 * _K), "n_head": (1, 64 * _K), "num_key_value_heads": (1, 64 * _K),
    "head_dim": (1, 64 * _K), "vocab_size": (1, 64 * _M), "intermediate_size": (1, 16 * _M), "ffn_dim": (1, 16 * _M),
    "max_position_embeddings": (1, 1 << 34), "kv_lora_rank": (0, 1 * _M), "q_lora_rank": (0, 1 * _M),
    "qk_rope_head_dim": (0, 64 * _K), "qk_nope_head_dim": (0, 64 * _K), "v_head_dim": (0, 64 * _K),
    "moe_intermediate_size": (0, 16 * _M), "num_experts": (0, 64 * _K), "n_routed_experts": (0, 64 * _K),
    "num_local_experts": (0, 64 * _K), "moe_num_experts": (0, 64 * _K), "n_shared_experts": (0, 64 * _K),
    "shared_expert_intermediate_size": (0, 16 * _M), "first_k_dense_replace": (0, 4 * _K),
    "sliding_window": (0, 1 << 34), "sliding_window_pattern": (1, 4 * _K), "full_attention_interval": (1, 4 * _K),
    "attn_layer_period": (1, 4 * _K), "attn_layer_offset": (0, 4 * _K),
    "mamba_d_state": (1, 64 * _K), "mamba_d_conv": (1, 64 * _K), "mamba_n_heads": (1, 64 * _K),
    "mamba_num_heads": (1, 64 * _K), "mamba_head_dim": (1, 64 * _K), "mamba_d_head": (1, 64 * _K),
    "mamba_headdim": (1, 64 * _K), "mamba_n_groups": (1, 64 * _K), "mamba_ngroups": (1, 64 * _K),
    "mamba_d_ssm": (1, 16 * _M), "mamba_chunk_size": (1, 1 * _M), "chunk_size": (1, 1 * _M),
    "ssm_state_size": (1, 64 * _K), "conv_kernel": (1, 64 * _K), "n_groups": (1, 64 * _K), "state_size": (1, 64 * _K),
    "linear_num_key_heads": (1, 64 * _K), "linear_num_value_heads": (1, 64 * _K), "linear_key_head_dim": (1, 64 * _K),
    "linear_value_head_dim": (1, 64 * _K), "linear_conv_kernel_dim": (1, 64 * _K),
    "multi_query_group_num": (1, 64 * _K), "padded_vocab_size": (1, 64 * _M), "ffn_hidden_size": (1, 16 * _M),
    "seq_length": (1, 1 << 34), "kv_channels": (1, 64 * _K),
}
_NUMBERS = {"mamba_expand": (0.0, 64.0), "expand": (0.0, 64.0)}        # multipliers, may be fractional
_STRINGS = ("model_type", "torch_dtype", "dtype", "hybrid_override_pattern", "mamba_ssm_dtype")
_LISTS = ("architectures", "layer_types", "attn_layer_indices", "attn_type_list")
_OBJECTS = ("quantization_config", "text_config", "llm_config", "language_config")
_QUANT_COUNTS = {"bits": (1, 64), "w_bit": (1, 64), "weight_bits": (1, 64), "group_size": (-1, 1 * _M),
                 "q_group_size": (-1, 1 * _M)}


def _field_error(where: str, key: str, v: object, want: str) -> InputError:
    return InputError(f"{where}: {key} is {json.dumps(v)[:40] if not isinstance(v, float) or math.isfinite(v) else v}, "
                      f"not {want}")


def validate_config(cfg: object, where: str = "config.json", depth: int = 0) -> None:
    """Raise InputError (one line naming the field) unless ``cfg`` is a JSON object whose sizing fields are
    what a real Hugging Face config holds: counts in range, strings, lists, objects."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: not a JSON object (a model's config.json is one)")
    for k, (lo, hi) in _COUNTS.items():
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise _field_error(where, k, v, "an integer")
        if not lo <= v <= hi:
            raise _field_error(where, k, v, f"a count in {lo}..{hi:,}" if lo else f"a count in 0..{hi:,}")
    for k, (lo, hi) in _NUMBERS.items():
        v = cfg.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v <= hi):
            raise _field_error(where, k, v, f"a number in ({lo:g}, {hi:g}]")
    for k in _STRINGS:
        if cfg.get(k) is not None and not isinstance(cfg[k], str):
            raise _field_error(where, k, cfg[k], "a string")
    for k in _LISTS:
        v = cfg.get(k)
        if v is not None and not isinstance(v, list):
            raise _field_error(where, k, v, "a list")
    for k in ("attn_layer_indices", "attn_type_list"):
        for x in cfg.get(k) or []:
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 1 << 20:
                raise _field_error(where, k, x, "a list of layer numbers")
    for x in cfg.get("architectures") or []:
        if not isinstance(x, str):
            raise _field_error(where, "architectures", x, "a list of class names")
    for k in _OBJECTS:
        if cfg.get(k) is not None and not isinstance(cfg[k], dict):
            raise _field_error(where, k, cfg[k], "an object")
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        for k, (lo, hi) in _QUANT_COUNTS.items():
            v = q.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
                raise _field_error(where, f"quantization_config.{k}", v, f"an integer in {lo}..{hi:,}")
    if depth < 2:
        for sub in ("text_config", "llm_config", "language_config"):
            if isinstance(cfg.get(sub), dict):
                validate_config(cfg[sub], f"{where} {sub}", depth + 1)
    if depth == 0:
        from vllm_doctor.plan.capacity import text_config

        c = text_config(cfg)
        if not any(c.get(k) for k in ("num_hidden_layers", "n_layer", "num_layers")):
            raise InputError(f"{where}: no num_hidden_layers (nor n_layer / num_layers): not a transformer model's config.json")
        if not any(c.get(k) for k in ("hidden_size", "d_model", "n_embd")):
            raise InputError(f"{where}: no hidden_size (nor d_model / n_embd): not a transformer model's config.json")
        heads = c.get("num_attention_heads") or c.get("n_head")
        hidden = c.get("hidden_size") or c.get("d_model") or c.get("n_embd")
        if heads and not c.get("head_dim") and hidden % heads:
            raise InputError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                             "(and no head_dim is given)")
        kv = c.get("num_key_value_heads")
        if heads and kv and kv > heads:
            raise InputError(f"{where}: num_key_value_heads {kv} is more than num_attention_heads {heads}")


def nvml_total_memory(index: int = 0) -> int:
    """Total memory of GPU ``index`` as CUDA reports it to vLLM (``torch.cuda.mem_get_info``'s total,
    which vLLM multiplies by gpu_memory_utilization), through NVML (the project's NVML source's loader):
    NVML's total less the memory the driver reserves (``nvmlDeviceGetMemoryInfo`` version 2; on an
    H200, 150,754,820,096 - 644,939,776 B = 150,109,880,320 B, torch's figure exactly, measured). Drivers without
    version 2: NVML's total."""
    from vllm_doctor.ingest.nvml import load_pynvml

    try:
        nv = load_pynvml()
        nv.nvmlInit()
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            if hasattr(nv, "nvmlMemory_v2"):
                try:
                    m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                    return int(m.total) - int(m.reserved)
                except (nv.NVMLError, TypeError, AttributeError):
                    pass
            return int(nv.nvmlDeviceGetMemoryInfo(h).total)
        finally:
            nv.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no driver, no library, no GPU: one line for the user
        raise InputError(f"cannot read GPU memory through NVML ({type(e).__name__}: {e}); give --gpu-memory") from None


def nvml_gpu_name(index: int = 0) -> str | None:
    """Name of GPU ``index`` through NVML ("NVIDIA A100-SXM4-80GB"), or None where NVML cannot say."""
    from vllm_doctor.ingest.nvml import load_pynvml

    try:
        nv = load_pynvml()
        nv.nvmlInit()
        try:
            name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(index))
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            nv.nvmlShutdown()
    except Exception:  # noqa: BLE001 - the name only refines a default; plan goes on without it
        return None


def parse_size(text: str) -> int:
    """``80GiB``, ``24G``, ``81559MiB``, ``4194304`` -> bytes (G/GB read as GiB, as nvidia-smi's MiB)."""
    t = text.strip().lower().replace(" ", "")
    units = {"kib": 1 << 10, "kb": 1 << 10, "k": 1 << 10, "mib": cap.MiB, "mb": cap.MiB, "m": cap.MiB,
             "gib": cap.GiB, "gb": cap.GiB, "g": cap.GiB, "tib": 1 << 40, "tb": 1 << 40, "b": 1, "": 1}
    for u in sorted(units, key=len, reverse=True):
        if u and t.endswith(u):
            num, mult = t[: -len(u)], units[u]
            break
    else:
        num, mult = t, 1
    try:
        v = float(num)
    except ValueError:
        raise InputError(f"not a size: {text!r} (e.g. 80GiB, 24G, 81559MiB, 4194304)") from None
    if not math.isfinite(v) or v * mult >= 1 << 60:
        raise InputError(f"not a size: {text!r} (e.g. 80GiB, 24G, 81559MiB, 4194304)")
    if v <= 0:
        raise InputError(f"size must be positive: {text!r}")
    return int(v * mult)


# ---------------------------------------------------------------- the plan

#: V1 as an opt-in (VLLM_USE_V1=1) from 0.7.0, the default from 0.8.0; 0.10.2 is V0's last release
V1_FROM, V1_DEFAULT_FROM, V0_REMOVED = Version("0.7.0"), Version("0.8.0"), Version("0.11.0")


def choose_engine(version: str, engine: str | None = None, vllm_use_v1: str | None = None) -> tuple[str, str]:
    """(engine, why): ``--engine`` first, then ``VLLM_USE_V1``, then the version's default. An engine the
    version does not have is an InputError (one line)."""
    pv = parse_version(version) or Version(_NEWEST)
    if engine is not None and engine not in ("v0", "v1"):
        raise InputError(f"unknown engine {engine!r}: v0 or v1")
    if vllm_use_v1 is not None and vllm_use_v1 not in ("0", "1"):
        raise InputError(f"VLLM_USE_V1={vllm_use_v1!r}: 0 or 1")
    env = {"0": "v0", "1": "v1"}.get(vllm_use_v1 or "")
    if engine is not None:
        chosen, why = engine, "--engine " + engine
        if env and env != engine:
            why += f" (VLLM_USE_V1={vllm_use_v1} says {env}; --engine is taken)"
    elif env is not None:
        chosen, why = env, f"VLLM_USE_V1={vllm_use_v1}"
    elif pv < V1_DEFAULT_FROM:
        chosen, why = "v0", "V0 is the default engine before 0.8.0"
    elif pv < V0_REMOVED:
        chosen, why = "v1", (f"V1 is the default engine from 0.8.0; vLLM {version} still falls back to V0 on GPUs of compute "
                             "capability below 8.0, with LoRA before 0.8.3 or VLLM_USE_V1=0: if its log shows the V0 "
                             "engine, plan with --engine v0")
    else:
        chosen, why = "v1", "vLLM 0.11.0 removed the V0 engine: V1 is the only one"
    if chosen == "v0" and pv >= V0_REMOVED:
        raise InputError(f"vLLM {version} has no V0 engine (0.10.2 was its last release): --engine v1, or an older version")
    if chosen == "v1" and pv < V1_FROM:
        raise InputError(f"vLLM {version} has no V1 engine (opt-in from 0.7.0 with VLLM_USE_V1=1): --engine v0")
    return chosen, why


def _engine(version: str) -> str:
    return choose_engine(version)[0]


def _state_in_pool(version: str, engine: str) -> bool:
    """V1 holds Mamba / linear-attention state in the KV cache pool (``MambaSpec``) from 0.10.0 (vLLM
    PR#20016); before, hybrid models ran on V0, whose ``MambaCacheManager`` keeps ``max_num_seqs``
    states outside the KV cache (inside the profiled peak)."""
    pv = parse_version(version)
    return engine == "v1" and (pv is None or pv >= Version("0.10.0"))


def _token_formula(version: str) -> str:
    """``GPU KV cache size: N tokens``: ``int(max_concurrency * max_model_len)`` from 0.21.0 (read in
    0.21.0, 0.22.0, 0.24.0); ``num_blocks // num_groups * block_size`` before (read in 0.11.0-0.20.0)."""
    pv = parse_version(version)
    return "concurrency" if pv is None or pv >= Version("0.21.0") else "blocks"


def _mamba_cache_mode(version: str, shape, prefix_caching: bool | None) -> tuple[str, str | None]:
    """vLLM's ``cache_config.mamba_cache_mode`` for a hybrid model (``MambaModelConfig``): "none" without
    prefix caching; with it "all" for models that support Mamba prefix caching, else "align". The
    modes exist from 0.20 (read in 0.20.0, 0.22.0, 0.24.0; absent in 0.11.0 / 0.12.0); prefix caching
    is on by default for generative models in 0.24. Returns (mode, note)."""
    pv = parse_version(version)
    if pv is not None and pv < Version("0.20.0"):
        return "none", None
    on = prefix_caching if prefix_caching is not None else (pv is None or pv >= Version("0.24.0"))
    if not on:
        return "none", None
    mode = "all" if shape.mamba is not None and shape.mamba.prefix_caching_all else "align"
    return mode, (f"prefix caching on: Mamba cache mode {mode!r} (" + (
        "two state blocks per request" if mode == "align" else "one state block per Mamba block of tokens") + ")")


def _default_batched_tokens(version: str, engine: str, mml: int, gpu_bytes: int | None, cpu: bool,
                            a100: bool = False, entrypoint: str = "server") -> int:
    """vLLM's default max_num_batched_tokens (vllm-flags.md, defaults table): V0 max(max_model_len,
    2048), or 2048 when chunked prefill is on (auto-enabled from 0.5.4 when max_model_len > 32768);
    V1 by usage context (``EngineArgs._set_default_args``, read in 0.10.1.1 and 0.11.0): the server
    8192 on GPUs of >= 70 GiB other than an A100, else 2048; the offline ``LLM()`` class 16384 and
    8192 (the CPU backend: 4096)."""
    if engine == "v0":
        pv = parse_version(version)
        if pv is not None and pv >= Version("0.5.4") and mml > 32768:
            return 2048
        return max(mml, 2048)
    if cpu:
        return 4096
    big = bool(gpu_bytes and gpu_bytes >= 70 * cap.GiB) and not a100
    if entrypoint == "llm":
        return 16384 if big else 8192
    return 8192 if big else 2048


def _a100_defaults(version: str, engine: str, gpu_name: str | None, cpu: bool) -> bool:
    """V1 from 0.9: ``EngineArgs._set_default_args`` gives GPUs of >= 70 GiB max_num_seqs 1024 and
    max_num_batched_tokens 8192 (the server) "and 'a100' not in device_name": an A100 80GB keeps 256 and
    2048 (read in 0.10.1.1 and 0.11.0; vllm-project/vllm#17885: larger batches cut an A100's throughput)."""
    pv = parse_version(version)
    return (not cpu and engine == "v1" and bool(gpu_name) and "a100" in str(gpu_name).lower()
            and pv is not None and pv >= Version("0.9.0"))


@functools.cache
def utilization_max() -> float:
    """The highest gpu_memory_utilization a fix recommends: ``gpu_memory_utilization_max`` of
    rules/thresholds.yaml, the cap the rules of ``diagnose`` apply (``t.gpu_memory_utilization_max``)."""
    from vllm_doctor.diagnosis.loader import builtin_rules_dir, load_thresholds

    return float(load_thresholds(builtin_rules_dir() / "thresholds.yaml")["gpu_memory_utilization_max"])


def _gib(n: float) -> str:
    return f"{n / cap.GiB:.2f} GiB"


#: --quantization methods whose weight width plan knows (bits per weight)
_QUANT_BITS = {"fp8": 8, "awq": 4, "gptq": 4, "bitsandbytes": 4, "mxfp4": 4, "nvfp4": 4}


def make_plan(inp: PlanInputs) -> Plan:
    """The whole plan from the inputs. Raises InputError on a config it cannot read."""
    validate_config(inp.config)
    try:
        shape = cap.model_shape(inp.config)
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as e:
        # validate_config covers the fields the arithmetic reads; this is the last line for what it cannot
        raise InputError(f"config.json: cannot size the model: {type(e).__name__}: {str(e)[:80]}") from None
    version = inp.vllm_version
    engine, engine_reason = choose_engine(version, inp.engine, inp.vllm_use_v1)
    tp, pp = inp.tensor_parallel_size, inp.pipeline_parallel_size
    cpu = inp.device == "cpu"
    dflt = version_defaults(version, engine, inp.gpu_memory_bytes, device="CPU" if cpu else None, world_size=tp * pp)
    notes: list[str] = []
    if (newer := newer_than_known(version)) is not None:
        notes.append(f"{newer}'s accounting and defaults")

    model_dtype = shape.dtype if inp.dtype == "auto" else inp.dtype
    if model_dtype in ("float32", "float") and inp.dtype == "auto" and not cpu:
        model_dtype = "bfloat16"
        notes.append("config dtype float32: vLLM's dtype auto serves it in bfloat16 on GPU")
    try:
        wbytes = cap.dtype_bytes(model_dtype)
        kv_dtype = model_dtype if inp.kv_cache_dtype == "auto" else inp.kv_cache_dtype
        kvbytes = cap.dtype_bytes(kv_dtype)
    except KeyError as e:
        raise InputError(f"unknown dtype {e.args[0]!r} (from --dtype, --kv-cache-dtype, --mamba-*-cache-dtype or the "
                         "config's torch_dtype / mamba_ssm_dtype)") from None
    if inp.quantization:
        from vllm_doctor.check.knowledge import choices_ever

        methods, newest = choices_ever("--quantization")
        known = sorted(set(methods) | set(_QUANT_BITS))
        if inp.quantization not in known:
            raise InputError(f"unknown --quantization {inp.quantization!r}: the methods vLLM's parser knows (up to "
                             f"{newest}) are {', '.join(known)}; plan sizes the weights of {', '.join(_QUANT_BITS)}")
    if inp.quantization and not shape.quant_method:
        shape.quant_method = inp.quantization
        shape.quant_bits = _QUANT_BITS.get(inp.quantization)
        shape.quant_group_size = {"awq": 128, "gptq": 128, "mxfp4": 32, "nvfp4": 16}.get(inp.quantization)
        if shape.quant_bits is None:
            notes.append(f"quantization {inp.quantization!r}: weight width unknown, weights sized as {model_dtype}")

    block_size = inp.block_size or (128 if cpu else int(dflt.get("block_size") or 16))
    mml = inp.max_model_len or shape.max_position_embeddings or 2048
    util = inp.gpu_memory_utilization if inp.gpu_memory_utilization is not None else float(dflt.get("gpu_memory_utilization") or 0.9)
    if inp.entrypoint not in ("server", "llm"):
        raise InputError(f"unknown entrypoint {inp.entrypoint!r}: server or llm")
    a100 = _a100_defaults(version, engine, inp.gpu_name, cpu)
    max_num_seqs = inp.max_num_seqs or (256 if a100 else int(dflt.get("max_num_seqs") or 256))
    mnbt = inp.max_num_batched_tokens or _default_batched_tokens(version, engine, mml, inp.gpu_memory_bytes, cpu,
                                                                 a100, inp.entrypoint)
    if a100 and not (inp.max_num_seqs and inp.max_num_batched_tokens):
        notes.append(f"{inp.gpu_name}: vLLM {version} keeps an A100's defaults at max_num_seqs 256 and "
                     f"max_num_batched_tokens {2048 if inp.entrypoint == 'server' else 8192} whatever its memory "
                     "(EngineArgs, vllm-project/vllm#17885)")
    settings = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "dtype": model_dtype,
                "kv_cache_dtype": kv_dtype, "quantization": shape.quant_method, "block_size": block_size,
                "max_model_len": mml, "gpu_memory_utilization": util, "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": mnbt, "kv_cache_memory_bytes": inp.kv_cache_memory_bytes,
                "gpu_memory_bytes": inp.gpu_memory_bytes, "device": inp.device}

    # weights
    params = cap.weight_params(shape)
    w = cap.weight_bytes_per_gpu(shape, wbytes, tp, pp)
    qdesc = (f"linear layers at {shape.quant_bits:g} bits" + (f" + a scale per {shape.quant_group_size}" if shape.quant_group_size else "")
             if shape.quant_bits else f"{wbytes} B/param ({model_dtype})")
    lora_notes = []
    lora_elems = cap.lora_slot_params(shape, inp.max_loras, inp.max_lora_rank, tp, pp) if inp.enable_lora else None
    lora_bytes = (lora_elems or 0) * cap.dtype_bytes(model_dtype)
    w += lora_bytes
    weights = {"params_total": sum(params.values()), "params_by_part": params, "bytes_per_gpu": w,
               "arithmetic": f"{sum(params.values()):,} params; {qdesc}; linear+vocab / TP {tp}, layers / PP {pp}"
                             + (f" + LoRA slots {lora_elems:,} x {cap.dtype_bytes(model_dtype)} B ({inp.max_loras} x rank "
                                f"{inp.max_lora_rank}, every linear layer, embedding and lm_head)" if lora_elems else "")
                             + f" = {w:,} B = {_gib(w)} per GPU"}
    if lora_elems:
        weights["lora_slots_bytes"] = lora_bytes
    if inp.enable_lora:
        lora_notes.append(("" if lora_elems else "LoRA slots (--enable-lora: MoE, MLA or state layers) and ")
                          + "LoRA's share of the profiling run (--enable-lora): the dummy adapters' activations and, "
                          "where vLLM profiles CUDA-graph memory (0.21+), the graphs it captures with and without "
                          "LoRA (cudagraph_specialize_lora) are not in the overhead estimate: a real Qwen3-8B start-up "
                          "on an RTX 4090 lost 1.06 GiB more than its LoRA slots (21 % of its KV cache tokens); pass "
                          "--overhead with the figures of a real start-up")
    if inp.gpu_memory_bytes and not cpu:
        weights["budget_arithmetic"] = (f"{_gib(w)} weights vs GPU total {_gib(inp.gpu_memory_bytes)} and gpu_memory_utilization "
                                        f"{util} x {_gib(inp.gpu_memory_bytes)} = {_gib(inp.gpu_memory_bytes * util)}"
                                        + ("" if w <= inp.gpu_memory_bytes * util else
                                           ": the weights alone exceed the budget" if w <= inp.gpu_memory_bytes else
                                           ": the weights do not fit the GPU (CUDA out of memory while loading)"))

    # KV per token
    try:
        state_bytes = cap.dtype_bytes(model_dtype if inp.mamba_cache_dtype == "auto" else inp.mamba_cache_dtype)
        ssm_name = inp.mamba_ssm_cache_dtype
        if ssm_name == "auto" and shape.mamba is not None and shape.mamba.ssm_dtype:
            ssm_name = shape.mamba.ssm_dtype      # Qwen3.5: the config's mamba_ssm_dtype
        ssm_bytes = None if ssm_name == "auto" else cap.dtype_bytes(ssm_name)
        groups = cap.kv_layer_groups(shape, kvbytes, tp, pp, state_bytes, ssm_bytes)
    except KeyError as e:
        raise InputError(f"unknown dtype {e.args[0]!r} (from --dtype, --kv-cache-dtype, --mamba-*-cache-dtype or the "
                         "config's torch_dtype / mamba_ssm_dtype)") from None
    except ValueError as e:   # a Mamba dimension not divisible by TP: vLLM refuses it too
        raise InputError(f"Mamba state: {e}") from None
    per_tok = cap.kv_bytes_per_token(groups)
    state_seq = cap.state_bytes_per_sequence(groups)
    kv = {"bytes_per_token": per_tok, "kv_cache_dtype": kv_dtype,
          "by_kind": [{"kind": g.kind, "layers_per_gpu": g.layers, "bytes_per_token_per_layer": g.bytes_per_token_per_layer,
                       "state_bytes_per_sequence_per_layer": g.state_bytes_per_layer,
                       "arithmetic": f"{g.layers} layers x {g.formula}"
                       + (f" = {g.layers * g.bytes_per_token_per_layer:,} B/token" if g.bytes_per_token_per_layer else "")
                       + (f" = {g.layers * g.state_bytes_per_layer:,} B per sequence, not per token" if g.state_bytes_per_layer else "")}
                      for g in groups],
          "arithmetic": " + ".join(f"{g.layers} x {g.bytes_per_token_per_layer:,}" for g in groups if g.bytes_per_token_per_layer)
                        + f" = {per_tok:,} B per token per GPU ({per_tok / 1024:.1f} KiB)"}
    pool_groups = groups
    block_note = None
    mamba_mode = "none"
    if state_seq:
        kv["state_bytes_per_sequence"] = state_seq
        attn = max((g.bytes_per_token_per_layer or 0) for g in groups)
        mamba_page = max(g.state_bytes_per_layer or 0 for g in groups)
        if _state_in_pool(version, engine):
            mamba_mode, mode_note = _mamba_cache_mode(version, shape, inp.enable_prefix_caching)
            if mode_note:
                notes.append(mode_note)
        if _state_in_pool(version, engine) and attn:
            raised = cap.hybrid_attention_block_size(attn, mamba_page, inp.block_size, mamba_mode,
                                                     shape.mamba.chunk_size if shape.mamba else 2048)
            if raised != block_size:
                block_note = (f"attention block_size raised to {raised} tokens (16 x cdiv({mamba_page:,} B Mamba page, "
                              f"16 x {attn:,} B/token)) so that one attention page holds one Mamba state"
                              if mamba_mode != "all" else
                              f"attention block_size raised to {raised} tokens (a multiple of the Mamba chunk size "
                              f"holding one {mamba_page:,} B Mamba page)")
                block_size = raised
                settings["block_size"] = block_size
            pad = attn * block_size - mamba_page
            if pad:
                block_note = ((block_note + "; ") if block_note else "") + (
                    f"Mamba page padded by {100 * pad / mamba_page:.2f}% to {attn * block_size:,} B")
        elif not _state_in_pool(version, engine):
            pool_groups = [g for g in groups if not g.state_bytes_per_layer]
            notes.append(f"vLLM {version} runs hybrid models on V0: its Mamba cache ({state_seq:,} B per sequence x "
                         f"max_num_seqs {max_num_seqs} = {_gib(state_seq * max_num_seqs)}) is allocated outside the KV cache "
                         "and counted in the profiled peak")
    if shape.sliding_window:
        kv["sliding_window"] = shape.sliding_window

    # memory accounting
    if inp.kv_cache_memory_bytes is None and inp.gpu_memory_bytes is None:
        raise InputError("give --gpu-memory (or let NVML read it), or --kv-cache-memory-bytes")
    if inp.kv_cache_memory_bytes is not None:
        overhead, overhead_src = 0, "not used: the KV cache size is given"
    elif inp.overhead_bytes is not None:
        overhead, overhead_src = inp.overhead_bytes, "given"
    else:
        if inp.sampler not in cap.SAMPLER_BYTES_PER_ENTRY:
            raise InputError(f"unknown sampler {inp.sampler!r}: native or flashinfer")
        act = cap.activation_peak_estimate(shape, mnbt, max_num_seqs, wbytes, tp, engine, inp.sampler)
        non_torch = cap.non_torch_estimate(tp * pp, not inp.disable_custom_all_reduce)
        sampler_note = (f" (the larger of one step's MLP activations over {mnbt:,} batched tokens and the {inp.sampler} "
                        f"sampler's profile: {max_num_seqs:,} sequences x {shape.vocab_size:,} vocabulary x "
                        f"{cap.SAMPLER_BYTES_PER_ENTRY[inp.sampler]} B)" if engine == "v1" else "")
        overhead, overhead_src = act + non_torch, (f"ESTIMATE: activation peak {_gib(act)}{sampler_note} + non-torch "
                                                   f"{_gib(non_torch)}; vLLM measures this in its profiling run; pass "
                                                   "--overhead to use a measured value")
    avail = cap.available_kv_memory(inp.gpu_memory_bytes or 0, util, w, overhead, 0, inp.kv_cache_memory_bytes)
    if inp.kv_cache_memory_bytes is not None:
        avail_arith = f"--kv-cache-memory-bytes {inp.kv_cache_memory_bytes:,} B (the profiling formula is skipped)"
    else:
        avail_arith = (f"{inp.gpu_memory_bytes / cap.GiB:.2f} GiB x {util} gpu_memory_utilization - {_gib(w)} weights - "
                       f"{_gib(overhead)} activation/non-torch = {_gib(avail)}")
    block_bytes = cap.bytes_per_block(pool_groups, block_size)
    gsize, per_kind = cap.group_layout(pool_groups)
    blocks = cap.num_blocks(avail, block_bytes)
    req_blocks = cap.request_blocks(pool_groups, mml, block_size, shape.sliding_window, mnbt, mamba_mode)
    conc = cap.max_concurrency(blocks, req_blocks)
    n_groups = sum(per_kind.values()) or 1
    # the smallest block size of the groups: attention's; a model of state layers only has max_model_len
    token_block = block_size if any(g.bytes_per_token_per_layer for g in pool_groups) else mml
    tokens = cap.printed_kv_cache_tokens(blocks, token_block, mml, conc, n_groups,
                                         _token_formula(version) if engine == "v1" else "blocks")
    pool = {"available_kv_cache_bytes": avail, "available_arithmetic": avail_arith, "overhead_bytes": overhead,
            "overhead_source": overhead_src, "bytes_per_block": block_bytes,
            "block_arithmetic": f"{cap.page_bytes(pool_groups, block_size):,} B page ({block_size} tokens x "
                                f"{max((g.bytes_per_token_per_layer or 0) for g in groups):,} B) x {gsize} layers/group = {block_bytes:,} B",
            "bytes_per_printed_token": (block_bytes * req_blocks / mml if engine == "v1" and _token_formula(version) == "concurrency"
                                        else block_bytes * n_groups / token_block) if token_block and mml else 0,
            "num_gpu_blocks": blocks, "kv_cache_tokens": tokens, "groups": per_kind,
            "blocks_arithmetic": f"{avail:,} B // {block_bytes:,} B = {blocks:,} blocks",
            "tokens_arithmetic": (f"int({conc:.4f} x {mml:,}) = {tokens:,} tokens" if engine == "v1" and _token_formula(version) == "concurrency"
                                  else f"{blocks:,} blocks // {n_groups} groups x {token_block} = {tokens:,} tokens")}
    if block_note:
        pool["block_size_arithmetic"] = block_note
    if state_seq and pool_groups is groups:
        pool["groups_arithmetic"] = (" + ".join(f"{n} {k} group{'s' if n > 1 else ''}" for k, n in per_kind.items())
                                     + f" of {gsize} layers; a request holds {cap.cdiv(mml, block_size) if token_block == block_size else 0:,} "
                                     f"blocks per attention group and {cap.state_blocks_per_request(mamba_mode, mml, block_size)} "
                                     "(its state) per Mamba group")
    device_word = "CPU" if cpu else "GPU"
    pool["vllm_prints"] = (f"{device_word} KV cache size: {tokens:,} tokens, Maximum concurrency for {mml:,} tokens per request: {conc:.2f}x"
                           if engine == "v1" else f"# GPU blocks: {blocks}")
    concurrency = {"at_max_model_len": round(conc, 2), "blocks_per_request": req_blocks,
                   "arithmetic": f"{blocks:,} blocks / {req_blocks:,} blocks per {mml:,}-token request = {conc:.2f}x",
                   "max_num_seqs": max_num_seqs}
    if inp.mean_request_tokens:
        mean_blocks = cap.request_blocks(pool_groups, inp.mean_request_tokens, block_size, shape.sliding_window, mnbt,
                                         mamba_mode)
        at_mean = (cap.concurrency_at_length(blocks, inp.mean_request_tokens, block_size) if n_groups == 1
                   else blocks // mean_blocks if mean_blocks else None)
        concurrency["mean_request_tokens"] = inp.mean_request_tokens
        concurrency["at_mean_request_length"] = at_mean
        if at_mean is not None and n_groups == 1:
            concurrency["mean_arithmetic"] = (f"{blocks:,} blocks // ceil({inp.mean_request_tokens:,} / {block_size}) "
                                              f"= {at_mean:,} requests at once")
        elif at_mean is not None:
            concurrency["mean_arithmetic"] = (f"{blocks:,} blocks // {mean_blocks:,} blocks per {inp.mean_request_tokens:,}-token "
                                              f"request = {at_mean:,} requests at once")

    # start-up
    startup = _startup(inp, shape, pool_groups, avail, block_bytes, mml, block_size, mnbt, engine, version, blocks,
                       mamba_mode, wbytes)
    if (startup["fails"] and startup["stage"] == "kv_cache" and engine == "v1" and inp.sampler == "native"
            and inp.overhead_bytes is None and inp.kv_cache_memory_bytes is None):
        lean = make_plan(_replace(inp, sampler="flashinfer", target_concurrency=None))
        if not lean.startup["fails"]:   # the verdict hangs on an estimate: say which install it holds for
            startup["messages"].append(
                f"This failure rests on the ESTIMATED profile of PyTorch's sampler ({_gib(overhead)} overhead). With "
                f"FlashInfer installed (the vllm/vllm-openai image), its sampler profiles about a third of that "
                f"({_gib(lean.pool['overhead_bytes'])}) and vLLM starts with {lean.pool['kv_cache_tokens']:,} KV cache "
                "tokens (--sampler flashinfer); pass --overhead with a measured value to decide.")
    fixes = _fixes(inp, shape, pool_groups, w, overhead, block_bytes, blocks, req_blocks, mml, block_size, max_num_seqs,
                   startup, version, util, wbytes)
    if shape.quant_method and not shape.quant_bits:
        notes.append(f"quantization {shape.quant_method}: bit width not in the config, weights sized unquantized")
    return Plan(model=inp.model, vllm_version=version, engine=engine, settings=settings, weights=weights,
                kv_per_token=kv, pool=pool, concurrency=concurrency, startup=startup, fixes=fixes,
                not_sized=list(shape.unsized) + lora_notes, notes=notes, engine_reason=engine_reason)


def _util_of(inp, version, engine) -> float:
    if inp.gpu_memory_utilization is not None:
        return inp.gpu_memory_utilization
    d = version_defaults(version, engine, inp.gpu_memory_bytes, device="CPU" if inp.device == "cpu" else None,
                         world_size=inp.tensor_parallel_size * inp.pipeline_parallel_size)
    return float(d.get("gpu_memory_utilization") or 0.9)


def _startup(inp, shape, groups, avail, block_bytes, mml, block_size, mnbt, engine, version, blocks,
             mamba_mode="none", wbytes: int = 2) -> dict:
    reasons = []
    tp = inp.tensor_parallel_size
    if shape.num_heads and tp > 1 and shape.num_heads % tp:
        # vLLM's ModelConfig.verify_with_parallel_config (every release), before any memory is touched
        reasons.append(f"Total number of attention heads ({shape.num_heads}) must be divisible by tensor "
                       f"parallel size ({tp}).")
    mpe = shape.max_position_embeddings
    if inp.max_model_len and mpe and inp.max_model_len > mpe:
        reasons.append(f"User-specified max_model_len ({inp.max_model_len}) is greater than the derived max_model_len "
                       f"(max_position_embeddings={mpe} or model_max_length=None in model's config.json).")
    total, util = inp.gpu_memory_bytes, _util_of(inp, version, engine)
    w = cap.weight_bytes_per_gpu(shape, wbytes, tp, inp.pipeline_parallel_size)
    if not reasons and total and inp.device != "cpu" and w > total:
        # the weights alone do not fit the GPU: model loading dies before any profiling or KV cache check
        reasons.append(f"Loading the weights fails: torch.OutOfMemoryError: CUDA out of memory. The weights need "
                       f"{_gib(w)} per GPU (TP {tp} x PP {inp.pipeline_parallel_size}), more than the GPU's "
                       f"{_gib(total)} total (and its budget gpu_memory_utilization {util} x {_gib(total)} = "
                       f"{_gib(total * util)}).")
        return {"fails": True, "stage": "load", "messages": reasons, "checked": True}
    if shape.unsized and not any(g.bytes_per_token_per_layer or g.state_bytes_per_layer for g in groups):
        return {"fails": bool(reasons), "stage": "config" if reasons else None, "messages": reasons, "checked": False}
    stage = "config" if reasons else None
    weights_over_budget = bool(total and inp.kv_cache_memory_bytes is None and w > total * util)
    if engine == "v0":
        if blocks <= 0:
            reasons.append("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                           "initializing the engine.")
        elif blocks * block_size < mml:
            reasons.append(f"The model's max seq len ({mml}) is larger than the maximum number of tokens that can be "
                           f"stored in KV cache ({blocks * block_size}). Try increasing `gpu_memory_utilization` or "
                           f"decreasing `max_model_len` when initializing the engine.")
    else:
        pv = parse_version(version)
        check = avail - block_bytes if pv is None or pv >= Version("0.30.0") else avail  # 0.32 holds the null block back
        if avail <= 0:
            reasons.append("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                           "initializing the engine.")
        else:
            need = cap.needed_bytes_one_request(groups, mml, block_size, shape.sliding_window, mnbt, mamba_mode)
            if need > check:
                est = cap.estimate_max_model_len(groups, check, mml, block_size, shape.sliding_window, mnbt, mamba_mode)
                reasons.append(f"To serve at least one request with the model's max seq len ({mml}), "
                               f"({cap.format_gib(need)} GiB KV cache is needed, which is larger than the available KV "
                               f"cache memory ({cap.format_gib(check)} GiB). "
                               + (f"Based on the available memory, the estimated maximum model length is {est}. " if est else "")
                               + "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    if reasons and stage is None:
        stage = "kv_cache"
    if weights_over_budget and any(m.startswith("No available memory") for m in reasons):
        reasons[reasons.index(next(m for m in reasons if m.startswith("No available memory")))] += (
            f" (The weights, {_gib(w)} per GPU, load, but they alone exceed gpu_memory_utilization {util} x "
            f"{_gib(total)} = {_gib(total * util)}: nothing is left for activations and the KV cache.)")
    return {"fails": bool(reasons), "stage": stage, "messages": reasons, "checked": True}


def _fixes(inp, shape, groups, w, overhead, block_bytes, blocks, req_blocks, mml, block_size, max_num_seqs,
           startup, version, util, wbytes: int = 2) -> list[dict]:
    """Flags for the target (or for a start-up failure), values computed, only flags of that version.
    Each fix belongs to an option (``_number_options``): the options are alternatives, the fixes of
    one option are applied together; a fix of option ``"*"`` goes with every option."""
    out: list[tuple[str | None, dict]] = []

    def add(option: str | None, flag: str, value: object, why: str) -> None:
        if flag_exists(flag, version):
            out.append((option, {"flag": flag, "value": value, "why": why}))

    target = inp.target_concurrency
    per_req = max(1, req_blocks)
    if target and not _SEARCHING:
        out += _target_fixes(inp, shape, w, overhead, block_bytes, blocks, per_req, mml, block_size, version)
        if any(n not in (None, "*") for n, _ in out):
            add("*", "--max-num-seqs", target, "admit no more sequences than the target")
            return _number_options(out)     # each option reaches the target, so it starts too
        out = [(None, f) for _, f in out]   # what was tried, informational
    cap_seqs = int(blocks // per_req) if per_req else 0
    if not target and blocks and max_num_seqs > cap_seqs and cap_seqs >= 1 and inp.mean_request_tokens is None:
        out.append((None, {"flag": "--max-num-seqs", "value": max_num_seqs, "why":
                    f"informational: {max_num_seqs} sequences admitted but only {cap_seqs} fit at {mml} tokens each; "
                    "longer ones are preempted (RECOMPUTE) when the cache fills", "informational": True}))
    if startup.get("stage") == "load":
        wf = _weight_fixes(inp, shape, w, overhead, (per_req + 1) * block_bytes, util, wbytes, version, mml)
        return _number_options(out + [(f"weights {i}", f) for i, f in enumerate(wf)])
    if startup.get("fails") and startup.get("checked"):
        size_option = "kv-cache-memory-bytes" if inp.kv_cache_memory_bytes is not None else "utilization"
        mpe, capped = shape.max_position_embeddings, False
        if mpe and mml > mpe:
            # config validation refuses a max_model_len above the model's: the cap is the model's, whatever memory holds
            fit = (blocks - 1) * block_size if blocks > 1 else block_size
            value = min(fit, mpe) if blocks * block_size >= block_size else mpe
            capped = value == mpe                    # the model's cap, needed with every option
            add("*" if capped else "max-model-len", "--max-model-len", value,
                f"the model's max_position_embeddings ({mpe:,})"
                + (", and what the KV cache holds" if blocks > 1 and fit < mpe else ""))
            if not any(not m.startswith("User-specified max_model_len") for m in startup.get("messages", ())):
                return _number_options(out)   # memory is not the problem: no KV cache fix
        elif blocks * block_size >= block_size:
            fit = (blocks - 1) * block_size if blocks > 1 else block_size
            add("max-model-len", "--max-model-len", min(fit, mml), "the longest request the KV cache holds")
        if inp.kv_cache_memory_bytes is not None:
            need = (per_req + 1) * block_bytes   # one request at max_model_len plus the null block
            add(size_option, "--kv-cache-memory-bytes", need, f"({per_req} blocks per {mml}-token request + 1 null "
                f"block) x {block_bytes:,} B")
        if inp.kv_cache_memory_bytes is None and inp.gpu_memory_bytes:
            u = cap.utilization_for_blocks(inp.gpu_memory_bytes, w, overhead, 0, per_req + 1, block_bytes)
            if util < u <= utilization_max():
                add(size_option, "--gpu-memory-utilization", u, f"one {mml}-token request: {per_req} blocks x "
                    f"{block_bytes:,} B + weights + overhead = {u} of {_gib(inp.gpu_memory_bytes)}")
        no_memory = any(m.startswith("No available memory") for m in startup.get("messages", ()))
        if no_memory and inp.gpu_memory_bytes and inp.kv_cache_memory_bytes is None:
            # weights + overhead exceed the budget: a smaller KV cache dtype cannot help; more GPUs split the weights
            wf = (_weight_fixes(inp, shape, w, overhead, (per_req + 1) * block_bytes, util, wbytes, version, mml)
                  if not capped else   # sized at the model's own max_model_len
                  _weight_fixes(_replace(inp, max_model_len=mpe), shape, w, overhead,
                                (cap.cdiv(mpe, block_size) + 1) * block_bytes, util, wbytes, version, mpe))
            out += [(f"weights {i}", f) for i, f in enumerate(wf)]
        elif shape.dtype != "fp8" and inp.kv_cache_dtype == "auto" and flag_exists("--kv-cache-dtype", version):
            at = mpe if mpe and mml > mpe else mml
            p8 = _replan(inp, kv_cache_dtype="fp8", max_model_len=at)
            if p8 is not None and not p8.startup["fails"]:
                if at != mml and not capped:
                    add("fp8", "--max-model-len", at, f"the model's max_position_embeddings ({mpe:,})")
                add("fp8", "--kv-cache-dtype", "fp8", f"halves KV bytes per token (check the model's accuracy): "
                    f"{_conc_arith(p8)} at {at:,} tokens, so it starts")
    return _number_options(out)


def _conc_arith(p: Plan) -> str:
    c = p.concurrency
    return f"{p.pool['num_gpu_blocks']:,} blocks / {c['blocks_per_request']:,} blocks per request = {_conc(p):.2f}x"


def _conc(p: Plan) -> float:
    """Max concurrency at max_model_len, unrounded (the figure the plan prints, to 2 decimals)."""
    return cap.max_concurrency(p.pool["num_gpu_blocks"], p.concurrency["blocks_per_request"])


def _target_fixes(inp, shape, w, overhead, block_bytes, blocks, per_req, mml, block_size, version) -> list:
    """The options that hold ``target_concurrency`` requests of max_model_len, each tried by planning again
    (it must start and its concurrency, ``cap.max_concurrency``, must reach the target): a
    gpu_memory_utilization up to ``utilization_max()``, else the smallest tensor_parallel_size that does;
    the longest max_model_len that does; an fp8 KV cache (with the smallest TP it needs). ``--kv-cache-memory-bytes``
    given: the size that does. Nothing reaching it: said, with what was tried."""
    target, tp = inp.target_concurrency, inp.tensor_parallel_size
    need_blocks = target * per_req
    out: list[tuple[str | None, dict]] = []

    def opt(name, flag, value, why):
        if flag_exists(flag, version):
            out.append((name, {"flag": flag, "value": value, "why": why}))

    def reaches(p):
        return p is not None and not p.startup["fails"] and _conc(p) >= target

    now = f"{blocks:,} blocks / {per_req:,} blocks per {mml:,}-token request = {blocks / per_req:.2f}x"
    tp_plan = None
    if inp.kv_cache_memory_bytes is not None:
        opt("kv-cache-memory-bytes", "--kv-cache-memory-bytes", need_blocks * block_bytes,
            f"{target} requests x {per_req:,} blocks = {need_blocks:,} blocks x {block_bytes:,} B")
    elif inp.gpu_memory_bytes:
        u = cap.utilization_for_blocks(inp.gpu_memory_bytes, w, overhead, 0, need_blocks, block_bytes)
        umax = utilization_max()
        if u <= umax and reaches(_replan(inp, gpu_memory_utilization=u)):
            opt("utilization", "--gpu-memory-utilization", u, f"{target} requests x {per_req:,} blocks = {need_blocks:,} "
                f"blocks x {block_bytes:,} B + {_gib(w)} weights + {_gib(overhead)} overhead = {u} of "
                f"{_gib(inp.gpu_memory_bytes)}")
        else:
            tried = []
            for t in _tp_candidates(inp, shape):
                p = _replan(inp, tensor_parallel_size=t)
                if p is None or p.startup["fails"]:
                    continue
                if reaches(p):
                    tp_plan = p
                    break
                tried.append(f"TP {t}: {_conc(p):.2f}x")
            why_more = (f"at TP {tp}: {now} < {target}, and {target} requests x {per_req:,} blocks x {block_bytes:,} B "
                        f"+ weights + overhead need gpu_memory_utilization {u} ({_gib(u * inp.gpu_memory_bytes)} of the "
                        f"{_gib(inp.gpu_memory_bytes)} GPU), above the {umax} recommended at most")
            if tp_plan is not None:
                t = tp_plan.settings["tensor_parallel_size"]
                opt("tensor-parallel-size", "--tensor-parallel-size", t,
                    f"{why_more}; at TP {t}: {_conc_arith(tp_plan)} >= {target} "
                    + (f"({'; '.join(tried)}); " if tried else "")
                    + f"{t * inp.pipeline_parallel_size} GPUs")
            else:
                top = max(_tp_candidates(inp, shape), default=tp)
                out.append((None, {"flag": None, "value": None, "informational": True,
                                   "summary": f"no --tensor-parallel-size up to {top} reaches {target} requests of "
                                              f"{mml:,} tokens",
                                   "why": f"{why_more}; " + (f"{'; '.join(tried)}; " if tried else "")
                                          + f"TP must divide the {shape.num_heads} attention heads{_gpu_limit(inp)}"}))
    if blocks < need_blocks:
        fit_len = (blocks // target) * block_size
        p = _replan(inp, max_model_len=fit_len) if fit_len >= block_size else None
        if reaches(p):
            opt("max-model-len", "--max-model-len", fit_len, f"at TP {tp}: {blocks:,} blocks // {target} requests x "
                f"{block_size} tokens = {fit_len:,} tokens; {_conc_arith(p)} >= {target}")
    if (shape.dtype != "fp8" and inp.kv_cache_dtype == "auto" and inp.kv_cache_memory_bytes is None
            and flag_exists("--kv-cache-dtype", version)):
        limit = tp_plan.settings["tensor_parallel_size"] if tp_plan is not None else None
        for t in [tp] + _tp_candidates(inp, shape):
            if limit is not None and t >= limit:
                break                              # no fewer GPUs than TP alone: not an option of its own
            p = _replan(inp, kv_cache_dtype="fp8", tensor_parallel_size=t)
            if reaches(p):
                if t != tp:
                    opt("fp8", "--tensor-parallel-size", t, f"{t * inp.pipeline_parallel_size} GPUs, with an fp8 KV cache")
                opt("fp8", "--kv-cache-dtype", "fp8", f"halves KV bytes per token (check the model's accuracy): at TP {t}, "
                    f"{_conc_arith(p)} >= {target}")
                break
    return out


_TP_MAX = 16   # the largest tensor_parallel_size tried when the GPU count is not known


def _tp_candidates(inp: PlanInputs, shape) -> list[int]:
    """Tensor-parallel sizes above the current one that vLLM accepts for the model: the attention heads
    divide by TP (``verify_with_parallel_config``), and the KV heads divide by it or it by them
    (``QKVParallelLinear``: fewer KV heads than TP are replicated, ``capacity.kv_heads_per_gpu``; MLA has
    no KV heads to split); TP x PP no more than the GPUs given (``gpu_count``), else up to 16."""
    top = inp.gpu_count // inp.pipeline_parallel_size if inp.gpu_count else _TP_MAX
    heads, kv = shape.num_heads, shape.num_kv_heads
    return [t for t in range(inp.tensor_parallel_size + 1, top + 1)
            if (not heads or heads % t == 0)
            and (shape.kv_lora_rank or not kv or (kv % t == 0 if t < kv else t % kv == 0))]


def _gpu_limit(inp: PlanInputs) -> str:
    return (f", and TP x PP {inp.pipeline_parallel_size} within the {inp.gpu_count} GPUs given" if inp.gpu_count
            else f"; tried up to {_TP_MAX}: give --gpus to cap it at the GPUs there are")


def _number_options(out: list[tuple[str | None, dict]]) -> list[dict]:
    """Number the options as ``diagnose`` does (``advice.relate_fixes``): each fix gets ``option`` (1-based)
    and ``relation`` (``only``, ``alternative``: pick one option, ``set``: applied with the rest of its
    option). A fix of option ``"*"`` is listed in every option; None: informational, no option."""
    from vllm_doctor.diagnosis.advice import relate_fixes
    from vllm_doctor.findings import FlagFix

    names = list(dict.fromkeys(n for n, _ in out if n not in (None, "*"))) or (["*"] if any(n == "*" for n, _ in out) else [])
    fixes, options = [], []
    for name in names:
        for n, f in out:
            if n == name or n == "*":
                fixes.append(dict(f))
                options.append(name)
    proxies = [FlagFix(str(f["flag"]), str(f["value"]), f["why"]) for f in fixes]
    relate_fixes(proxies, options)
    for f, p in zip(fixes, proxies):
        f["option"], f["relation"] = p.option, p.relation
    return [dict(f, informational=True) for n, f in out if n is None] + fixes


_SEARCHING = False   # a plan made to test a fix computes no fixes of its own


def _replan(inp: PlanInputs, **change) -> Plan | None:
    """The plan with ``change`` applied and no target (the fixes are tried, never guessed); None when the
    change is not a plan (an InputError: a Mamba dimension TP does not divide, ...)."""
    global _SEARCHING
    was, _SEARCHING = _SEARCHING, True
    try:
        return make_plan(_replace(inp, target_concurrency=None, **change))
    except InputError:
        return None
    finally:
        _SEARCHING = was


def _starts(inp: PlanInputs, **change) -> bool:
    """Whether the plan with ``change`` applied starts."""
    p = _replan(inp, **change)
    return p is not None and not p.startup["fails"]


def _weight_fixes(inp, shape, w, overhead, one_request_kv, util, wbytes, version, mml) -> list[dict]:
    """The weights (with the overhead and one request's KV cache) do not fit ``gpu_memory_utilization x
    total``: the fixes that shrink the weights per GPU, as alternatives to one another. Each is the smallest
    with which the plan starts (tried by planning again): a larger TP size (the attention heads must
    divide), a PP size, fp8 weights (``--quantization fp8``, an unquantized checkpoint only), a GPU with
    more memory (whole GiB; the version's defaults for that GPU, e.g. max_num_seqs, apply)."""
    if _SEARCHING:
        return []
    total, tp, pp = inp.gpu_memory_bytes, inp.tensor_parallel_size, inp.pipeline_parallel_size
    out: list[dict] = []

    def add(flag, value, why):
        if flag_exists(flag, version):
            out.append({"flag": flag, "value": value, "why": why})
    now = (f"weights {_gib(w)} per GPU at TP {tp} x PP {pp} + {_gib(overhead)} overhead + one {mml:,}-token "
           f"request exceed {_gib(total)} x {util} = {_gib(total * util)}")
    for tp2 in _tp_candidates(inp, shape):
        if _starts(inp, tensor_parallel_size=tp2):
            add("--tensor-parallel-size", tp2, f"{now}; at TP {tp2}: "
                f"{_gib(cap.weight_bytes_per_gpu(shape, wbytes, tp2, pp))} weights per GPU ({tp2 * pp} GPUs)")
            break
    for t in (2, 4, 8, 16):
        pp2 = pp * t
        if pp2 > shape.num_layers:
            break
        if _starts(inp, pipeline_parallel_size=pp2):
            add("--pipeline-parallel-size", pp2, f"at PP {pp2}: {_gib(cap.weight_bytes_per_gpu(shape, wbytes, tp, pp2))} "
                f"weights on the busiest GPU ({cap.cdiv(shape.num_layers, pp2)} of {shape.num_layers} layers; {tp * pp2} GPUs)")
            break
    if not shape.quant_method and wbytes > 1 and _starts(inp, quantization="fp8"):
        from dataclasses import replace as _replace

        w8 = cap.weight_bytes_per_gpu(_replace(shape, quant_method="fp8", quant_bits=8, quant_group_size=None), wbytes, tp, pp)
        add("--quantization", "fp8", f"fp8 weights: {_gib(w8)} per GPU (linear layers at 1 B/param; check the "
            "model's accuracy, or serve a pre-quantized checkpoint)")
    lo = math.ceil((w + overhead + one_request_kv) / util / cap.GiB)
    need = next((g for g in range(max(lo, 1), 4 * max(lo, 1) + 1) if _starts(inp, gpu_memory_bytes=g * cap.GiB)), None)
    if need:
        out.append({"flag": None, "value": None, "hardware": f"a GPU with at least {need} GiB",
                    "why": f"{_gib(w)} weights + activations, non-torch memory and one {mml:,}-token request's KV "
                           f"cache within gpu_memory_utilization {util} x {need} GiB"})
    return out


# ---------------------------------------------------------------- rendering

def to_json(p: Plan) -> str:
    return json.dumps(p.to_dict(), indent=2) + "\n"


def verdict(p: Plan) -> list[str]:
    """The answer first: whether start-up fails and why, else the max concurrency (at max_model_len and at
    the mean request length)."""
    c, st = p.concurrency, p.startup
    if st["fails"]:
        where = {"load": "while loading the weights", "config": "at config validation, before loading",
                 "kv_cache": "at the KV cache check, after loading and profiling"}.get(st.get("stage") or "", "")
        return [f"start-up FAILS {where}".rstrip() + ":"] + [f"  {m}" for m in st["messages"]]
    out = [f"starts; max concurrency {c['at_max_model_len']:.2f}x requests of {p.settings['max_model_len']:,} tokens "
           f"({p.pool['kv_cache_tokens']:,} KV cache tokens, {p.pool['num_gpu_blocks']:,} blocks per GPU)"
           + ("" if st.get("checked", True) else " (KV check skipped: nothing sized)")]
    if c.get("at_mean_request_length") is not None:
        out.append(f"  at a mean request of {c['mean_request_tokens']:,} tokens: {c['at_mean_request_length']:,} requests at once")
    if c["max_num_seqs"] > c["at_max_model_len"] and c["at_max_model_len"] >= 1:
        out.append(f"  max_num_seqs {c['max_num_seqs']} admits more than fit at max_model_len: long requests are "
                   "preempted (RECOMPUTE) when the cache fills")
    return out


def _fix_line(f: dict, fixes: list[dict], code) -> str:
    """A fix as ``diagnose`` labels it (``advice.fix_label``): "(option 1 of 3: pick one)", "(option 2 of 3,
    applied together)", "(apply together)", nothing for the only fix."""
    from types import SimpleNamespace

    from vllm_doctor.diagnosis.advice import fix_label

    numbered = [SimpleNamespace(**g) for g in fixes if not g.get("informational")]
    label = "" if f.get("informational") else fix_label(SimpleNamespace(**f), numbered)
    what = code(str(f["flag"]) + " " + str(f["value"])) if f.get("flag") else f.get("hardware") or f.get("summary", "")
    return f"{what}{f' ({label})' if label else ''}: {f['why']}"


def _lines(p: Plan, md: bool) -> list[str]:
    h = (lambda s: f"## {s}") if md else (lambda s: f"{s}")
    b = "- " if md else "  "
    code = (lambda s: f"`{s}`") if md else (lambda s: s)
    s = p.settings
    v = verdict(p)
    out = [f"# vllm-doctor plan: {p.model}" if md else f"vllm-doctor plan: {p.model}", "",
           h("Verdict"), f"{b}{v[0]}"]
    out += [(f"  {x.strip()}" if md else f"{b}{x}") for x in v[1:]]
    if p.fixes:
        n = len({f["option"] for f in p.fixes if not f.get("informational")})
        out += ["", h("Flags" + (f" ({n} options: pick one)" if n > 1 else ""))]
        out += [f"{b}{_fix_line(f, p.fixes, code)}" for f in p.fixes]
    out += ["", h("Settings"),
            f"{b}vLLM {p.vllm_version} ({p.engine.upper()} engine), {s['device']}, TP {s['tensor_parallel_size']} x PP {s['pipeline_parallel_size']}, "
            f"dtype {s['dtype']}, kv_cache_dtype {s['kv_cache_dtype']}, block_size {s['block_size']}, max_model_len {s['max_model_len']:,}, "
            f"gpu_memory_utilization {s['gpu_memory_utilization']}, max_num_seqs {s['max_num_seqs']}",
            *([f"{b}engine: {p.engine.upper()} ({p.engine_reason})"] if p.engine_reason else []), ""]
    out += [h("Weights (per GPU)"), f"{b}{p.weights['arithmetic']}"]
    if p.startup.get("stage") == "load" or p.weights.get("budget_arithmetic"):
        out.append(f"{b}{p.weights['budget_arithmetic']}")
    out += ["", h("KV cache bytes per token (per GPU)")]
    for g in p.kv_per_token["by_kind"]:
        out.append(f"{b}{g['kind']}: {g['arithmetic']}")
    out.append(f"{b}total: {p.kv_per_token['arithmetic']}")
    if p.kv_per_token.get("state_bytes_per_sequence"):
        out.append(f"{b}state: {p.kv_per_token['state_bytes_per_sequence']:,} B per sequence per GPU (Mamba / linear-attention layers)")
    for u in p.not_sized:
        out.append(f"{b}NOT SIZED: {u}")
    out += ["", h("KV cache pool (per GPU)"),
            f"{b}available: {p.pool['available_arithmetic']}",
            f"{b}overhead: {p.pool['overhead_bytes'] / cap.GiB:.2f} GiB ({p.pool['overhead_source']})",
            *([f"{b}block_size: {p.pool['block_size_arithmetic']}"] if p.pool.get("block_size_arithmetic") else []),
            f"{b}block: {p.pool['block_arithmetic']}",
            *([f"{b}groups: {p.pool['groups_arithmetic']}"] if p.pool.get("groups_arithmetic") else []),
            f"{b}blocks: {p.pool['blocks_arithmetic']}",
            f"{b}tokens: {p.pool['tokens_arithmetic']}",
            f"{b}vLLM prints: {code(p.pool['vllm_prints'])}", ""]
    c = p.concurrency
    out += [h("Concurrency"), f"{b}at max_model_len: {c['arithmetic']}"]
    if c.get("mean_arithmetic"):
        out.append(f"{b}at a mean request of {c['mean_request_tokens']:,} tokens: {c['mean_arithmetic']}")
    if p.notes:
        out += ["", h("Notes")] + [f"{b}{n}" for n in p.notes]
    return out + [""]


def to_text(p: Plan) -> str:
    return "\n".join(_lines(p, md=False))


def to_markdown(p: Plan) -> str:
    return "\n".join(_lines(p, md=True))


FORMATS = {"text": to_text, "json": to_json, "markdown": to_markdown}
