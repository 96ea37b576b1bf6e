"""KV cache and weight arithmetic, per GPU, the way vLLM does it. Pure functions, no I/O.

Used by ``vllm-doctor plan`` (the report), ``vllm-doctor check`` (combinations that cannot
work) and the fixes ``diagnose`` computes, so the three never disagree. Every function takes
plain numbers (bytes, tokens, counts) and returns plain numbers; ``model_shape`` turns a
Hugging Face ``config.json`` dict into the few numbers the arithmetic needs.

What each formula mirrors in vLLM's released source (read from the wheels):

- KV bytes per token per layer: ``AttentionSpec.page_size_bytes / block_size`` =
  ``2 (K and V) * num_kv_heads_per_gpu * head_size * dtype_bytes``; ``num_kv_heads_per_gpu =
  max(1, num_key_value_heads // tensor_parallel_size)`` (``ModelConfig.get_num_kv_heads``).
  MLA (DeepSeek-V2/V3, ``kv_lora_rank`` in the config): one latent vector per token and layer,
  ``(kv_lora_rank + qk_rope_head_dim) * dtype_bytes``, the same on every TP rank (``MLAAttentionSpec``).
- Blocks: V1 ``get_kv_cache_config_from_groups``: ``num_blocks = available // bytes_per_block``
  with ``bytes_per_block = page_size * layers_per_group``; V0 ``determine_num_available_blocks``:
  ``num_gpu_blocks = int(available // cache_block_size)`` with ``cache_block_size = block_size *
  num_layers * kv_bytes_per_token_per_layer``.
- Available KV memory: V0 ``total * gpu_memory_utilization - peak_memory`` (``worker.py``); V1
  ``requested_memory - non_kv_cache_memory`` with ``requested_memory = total *
  gpu_memory_utilization`` (``gpu_worker.determine_available_memory``); with
  ``--kv-cache-memory-bytes`` (0.10.2+) or, on CPU, ``VLLM_CPU_KVCACHE_SPACE`` GiB: that value.
- Blocks a request needs (V1 ``max_memory_usage_bytes``): full attention ``cdiv(max_model_len,
  block_size)``; sliding window ``cdiv(min(sliding_window - 1 + max_num_batched_tokens,
  max_model_len), block_size) + 1``.
- Printed capacity (V1 ``get_kv_cache_capacity``): ``max_concurrency = num_blocks / sum(blocks a
  request needs per group)``; ``"KV cache size: N tokens"`` with ``N = int(max_concurrency *
  max_model_len)`` (0.11.0+) or ``num_blocks // num_groups * block_size`` (0.8-0.10);
  V0 prints ``# GPU blocks: N`` and ``N * block_size / max_model_len`` as its concurrency.
- Start-up check (V1 ``check_enough_kv_cache_memory``): fails when ``available <= 0`` ("No
  available memory for the cache blocks") or when the memory one request at ``max_model_len``
  needs exceeds ``available - bytes_per_block`` (0.32: one null block held back); the estimate is
  vLLM's own binary search for the longest length that fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GiB = 1 << 30
MiB = 1 << 20

#: bytes per element of the dtype names vLLM accepts (``--dtype``, ``--kv-cache-dtype``, config dtypes)
DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1, "uint8": 1,
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division, vLLM's ``cdiv``."""
    return -(-a // b)


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (``bfloat16`` -> 2, ``fp8`` -> 1). KeyError if unknown."""
    return DTYPE_BYTES[name.lower().replace("torch.", "")]


# ---------------------------------------------------------------- model shape from config.json

@dataclass
class ModelShape:
    """The numbers of a model's config.json that size its weights and KV cache."""
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    dtype: str
    layer_kinds: list[str]            # per layer: full | sliding_window | mla | mamba | linear_attention
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None
    attention_bias: bool = False
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    dense_layers: int = 0             # leading dense-MLP layers of a MoE model (first_k_dense_replace)
    quant_method: str | None = None
    quant_bits: float | None = None   # bits per quantized linear weight
    quant_group_size: int | None = None
    unsized: list[str] = field(default_factory=list)  # what cannot be sized, named
    mamba: MambaState | None = None   # the per-sequence state of the Mamba / linear-attention layers
    attn_output_gate: bool = False    # Qwen3.5 / Qwen3-Next gated attention: q_proj is twice as wide
    encoder_params: int = 0           # vision encoder + projector parameters (where sized)
    encoder_notes: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)


#: transformers' own defaults (``configuration_<model_type>.py``, transformers 4.46.3) for the sizing fields,
#: which a multimodal config's ``text_config`` may leave out (LLaVA-v1.6-Mistral's names only what differs
#: from MistralConfig). ``num_key_value_heads`` None: LlamaConfig sets it to ``num_attention_heads``.
TRANSFORMERS_TEXT_DEFAULTS: dict[str, dict] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "sliding_window": 4096, "tie_word_embeddings": False},
}
#: A multimodal config whose text_config names no model_type: LlavaConfig / LlavaNextConfig build a LlamaConfig
TEXT_MODEL_TYPE_DEFAULT = {"llava": "llama", "llava_next": "llama", "llava_next_video": "llama", "llava_onevision": "qwen2"}


def text_config(cfg: dict) -> dict:
    """Multimodal configs keep the language model under ``text_config`` / ``llm_config``; the fields a
    ``text_config`` leaves out are transformers' defaults for its ``model_type`` (as transformers builds it)."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if not isinstance(sub, dict):
            continue
        mt = sub.get("model_type") or TEXT_MODEL_TYPE_DEFAULT.get(str(cfg.get("model_type")))
        if not sub.get("num_hidden_layers") and mt in TRANSFORMERS_TEXT_DEFAULTS:
            sub = {**TRANSFORMERS_TEXT_DEFAULTS[mt], "model_type": mt, **sub}
        if sub.get("num_hidden_layers"):
            merged = dict(sub)
            for k in ("quantization_config", "torch_dtype", "dtype", "architectures"):
                merged.setdefault(k, cfg.get(k))
            return _dialect(merged)
    return _dialect(cfg)


def _dialect(c: dict) -> dict:
    """ChatGLM / GLM-4 (``model_type`` chatglm) names its sizes its own way; vLLM's ``ChatGLMForCausalLM``
    (model_executor/models/chatglm.py, 0.4-0.33) and ``ModelConfig`` read: KV heads
    ``multi_query_group_num`` when ``multi_query_attention`` (else every attention head), head size
    ``kv_channels`` (= hidden_size / heads), vocabulary ``padded_vocab_size``, MLP ``ffn_hidden_size``
    (gated: dense_h_to_4h is 2 x ffn_hidden_size), max length ``seq_length``, QKV bias ``add_qkv_bias``.
    The standard names are filled from them where absent."""
    if "multi_query_group_num" not in c and "padded_vocab_size" not in c and "ffn_hidden_size" not in c:
        return c
    out = dict(c)
    if out.get("num_key_value_heads") is None and out.get("multi_query_group_num"):
        out["num_key_value_heads"] = (out["multi_query_group_num"] if out.get("multi_query_attention")
                                      else out.get("num_attention_heads"))
    for std, own in (("vocab_size", "padded_vocab_size"), ("intermediate_size", "ffn_hidden_size"),
                     ("max_position_embeddings", "seq_length"), ("head_dim", "kv_channels"),
                     ("attention_bias", "add_qkv_bias")):
        if out.get(own) is not None and (std == "vocab_size" or out.get(std) is None):
            out[std] = out[own]          # padded_vocab_size is what the embedding and output layer hold
    return out


ENCODER_CONFIGS = ("vision_config", "audio_config", "visual", "vision_tower_config", "audio_encoder_config")


def _qwen_vl_vision_params(v: dict, model_type: str, text_hidden: int) -> int | None:
    """Qwen2-VL / Qwen2.5-VL vision tower and patch merger, as vLLM builds them (``qwen2_vl.py``,
    ``qwen2_5_vl.py``, read in 0.11.0): a Conv3d patch embedding without bias (in_chans x temporal_patch
    x patch^2 x hidden); per block two norms, qkv and proj with biases, and the MLP (Qwen2.5-VL: gated,
    gate_up + down with biases; Qwen2-VL: fc1 / fc2 of mlp_ratio x hidden, LayerNorms with biases);
    the merger: a norm, then Linear(hidden x merge^2, same) and Linear(hidden x merge^2, text hidden)."""
    h = v.get("hidden_size") if model_type == "qwen2_5_vl" else v.get("embed_dim")
    depth, patch = v.get("depth"), v.get("patch_size") or v.get("spatial_patch_size")
    if not (isinstance(h, int) and isinstance(depth, int) and isinstance(patch, int) and min(h, depth, patch) > 0):
        return None
    t, m = int(v.get("temporal_patch_size") or 2), int(v.get("spatial_merge_size") or 2)
    c = int(v.get("in_chans") or v.get("in_channels") or 3)
    out = int(v.get("out_hidden_size") or text_hidden)
    attn = 3 * h * h + 3 * h + h * h + h
    if model_type == "qwen2_5_vl":
        inter = int(v.get("intermediate_size") or 0)
        block = 2 * h + attn + 2 * h * inter + 2 * inter + inter * h + h
        merger = h
    else:
        inter = int(h * float(v.get("mlp_ratio") or 4))
        block = 4 * h + attn + h * inter + inter + inter * h + h
        merger = 2 * h
    wide = h * m * m
    return c * t * patch * patch * h + depth * block + merger + wide * wide + wide + wide * out + out


def _clip_vision_params(v: dict, text_hidden: int, projector_layers: int = 2) -> int | None:
    """A CLIP / SigLIP vision tower (LLaVA, LLaVA-NeXT) and LLaVA's projector, as transformers lays
    them out and vLLM loads them (``clip.py``, ``siglip.py``, ``llava.py``): patch and position
    embeddings (CLIP: a class token, no patch bias, a pre-layernorm), per layer two LayerNorms, q/k/v/o
    with biases and fc1 / fc2 with biases; the projector Linear(vision, text) + GELU + Linear(text, text).
    vLLM drops the CLIP tower's last layer where ``vision_feature_layer`` is -2 (LLaVA's default)."""
    h, inter, n = v.get("hidden_size"), v.get("intermediate_size"), v.get("num_hidden_layers")
    patch, image = v.get("patch_size"), v.get("image_size")
    if not (isinstance(h, int) and isinstance(inter, int) and isinstance(n, int) and isinstance(patch, int)
            and isinstance(image, int) and min(h, inter, n, patch, image) > 0):
        return None
    clip = "clip" in str(v.get("model_type", ""))
    positions = (image // patch) ** 2 + (1 if clip else 0)
    embed = int(v.get("num_channels") or 3) * patch * patch * h + (0 if clip else h) + positions * h + (h if clip else 0)
    layer = 2 * 2 * h + 4 * (h * h + h) + h * inter + inter + inter * h + h
    projector = h * text_hidden + text_hidden + (projector_layers - 1) * (text_hidden * text_hidden + text_hidden)
    return embed + 2 * h + n * layer + projector      # + the pre- (CLIP) or post-layernorm (SigLIP)


def _pixtral_vision_params(v: dict, text_hidden: int, merge: int, projector_bias: bool) -> int | None:
    """Mistral 3's Pixtral vision tower and projector, as vLLM builds them (``pixtral.py``
    ``PixtralHFVisionModel``, ``mistral3.py`` ``Mistral3MultiModalProjector``, read in 0.11.0): a Conv2d
    patch embedding without bias and an RMSNorm; per layer two RMSNorms, q/k/v/o and the gated MLP
    (gate_up + down), no biases; the projector: an RMSNorm, the patch merger Linear(hidden x merge^2,
    hidden) without bias, then Linear(hidden, text) and Linear(text, text) (biases where
    ``multimodal_projector_bias``)."""
    h, inter, n, patch = v.get("hidden_size"), v.get("intermediate_size"), v.get("num_hidden_layers"), v.get("patch_size")
    if not (isinstance(h, int) and isinstance(inter, int) and isinstance(n, int) and isinstance(patch, int)
            and min(h, inter, n, patch) > 0):
        return None
    heads, head_dim = v.get("num_attention_heads"), v.get("head_dim")
    hd = heads * head_dim if isinstance(heads, int) and isinstance(head_dim, int) and heads * head_dim > 0 else h
    embed = int(v.get("num_channels") or 3) * patch * patch * h + h
    layer = 2 * h + 4 * h * hd + 3 * h * inter
    projector = h + h * merge * merge * h + h * text_hidden + text_hidden * text_hidden + (2 * text_hidden if projector_bias else 0)
    return embed + n * layer + projector


def _feature_layers(cfg: dict, v: dict, default: int) -> dict:
    """The vision config with the layers vLLM builds: up to ``vision_feature_layer`` where it is negative."""
    layer = cfg.get("vision_feature_layer", default)
    vv = dict(v)
    if isinstance(layer, int) and layer < 0 and isinstance(v.get("num_hidden_layers"), int):
        vv["num_hidden_layers"] = v["num_hidden_layers"] + layer + 1
    return vv


def encoder_params(cfg: dict, text_hidden: int) -> tuple[int, list[str]]:
    """Parameters of the vision encoders and projectors vllm-doctor sizes, and a note for each
    (their profiling run, one image of the largest size, stays out of the overhead estimate)."""
    mt = str(cfg.get("model_type", ""))
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        return 0, []
    if mt in ("qwen2_vl", "qwen2_5_vl"):
        n = _qwen_vl_vision_params(v, mt, text_hidden)
    elif mt in TEXT_MODEL_TYPE_DEFAULT and str(v.get("model_type", "")) in ("clip_vision_model", "siglip_vision_model"):
        tower = _clip_vision_params(_feature_layers(cfg, v, -2), text_hidden)
        n = None if tower is None else tower + (text_hidden if mt != "llava" else 0)   # LLaVA-NeXT: image_newline
    elif mt == "mistral3" and str(v.get("model_type", "")) == "pixtral":
        n = _pixtral_vision_params(_feature_layers(cfg, v, -1), text_hidden, int(cfg.get("spatial_merge_size") or 2),
                                   bool(cfg.get("multimodal_projector_bias", False)))
    else:
        n = None
    return (n or 0), ([] if n is None else [
        f"vision encoder and its projector (vision_config: {n:,} parameters, sized in the weights): the "
        "encoder's profiling run (one image of the largest size) is not in the overhead estimate; pass "
        "--overhead with the figures of a real start-up to correct the pool"])


def _encoders_not_sized(cfg: dict) -> list[str]:
    """The vision / audio encoders and projectors of a multimodal config, named: their weights and the
    encoder's profiling run are not counted."""
    out = []
    sized = bool(encoder_params(cfg, 1)[1])
    for key in ENCODER_CONFIGS:
        sub = cfg.get(key)
        if not isinstance(sub, dict) or (key == "vision_config" and sized):
            continue
        layers = sub.get("num_hidden_layers") or sub.get("depth") or sub.get("encoder_layers") or sub.get("num_layers")
        hidden = sub.get("hidden_size") or sub.get("embed_dim") or sub.get("d_model")
        shape = ", ".join(x for x in (f"model_type {sub['model_type']}" if sub.get("model_type") else "",
                                      f"{layers} layers" if layers else "", f"hidden {hidden}" if hidden else "") if x)
        what = "audio encoder" if "audio" in key else "vision encoder"
        out.append(f"{what} and its projector ({key}" + (f": {shape}" if shape else "") + "): their weights and the "
                   "encoder's profiling run are not counted, so the weights come out low and the KV cache high; "
                   "pass --overhead with the figures of a real start-up to correct the pool")
    return out


def _layer_kinds(c: dict, n: int) -> tuple[list[str], list[str]]:
    """Per-layer attention kind from the config's own layout fields; what is unknown is named."""
    unsized: list[str] = []
    lin = c.get("linear_attn_config")
    if isinstance(lin, dict) and isinstance(lin.get("kda_layers"), list) and lin["kda_layers"]:
        # Kimi-Linear (vLLM 0.11.2 KimiLinearConfig.is_kda_layer): the 1-indexed kda_layers are Kimi
        # delta attention (a fixed-size state per sequence), every other layer KimiMLAAttention
        kda = {int(i) for i in lin["kda_layers"]}
        other = "mla" if c.get("kv_lora_rank") else "full"
        return ["linear_attention" if i + 1 in kda else other for i in range(n)], unsized
    if c.get("kv_lora_rank"):
        return ["mla"] * n, unsized
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        kinds = []
        for t in types:
            t = str(t)
            if t in ("full_attention", "attention", "global_attention"):
                kinds.append("full")
            elif t in ("sliding_attention", "sliding_window", "local_attention"):
                kinds.append("sliding_window")
            elif t in ("mamba", "mamba2", "ssm"):
                kinds.append("mamba")
            elif t in ("linear_attention", "linear"):
                kinds.append("linear_attention")
            else:
                kinds.append(t)
                unsized.append(f"layer type {t!r}")
        return kinds, sorted(set(unsized))
    if isinstance(c.get("hybrid_override_pattern"), str):  # Nemotron-H: M mamba, * attention, - MLP
        pat = c["hybrid_override_pattern"]
        return ["full" if ch == "*" else "mamba" if ch == "M" else "mlp_only" for ch in pat], unsized
    if c.get("full_attention_interval"):                     # Qwen3-Next style
        k = int(c["full_attention_interval"])
        return ["full" if (i + 1) % k == 0 else "linear_attention" for i in range(n)], unsized
    if isinstance(c.get("attn_layer_indices"), list):        # Bamba
        idx = {int(i) for i in c["attn_layer_indices"]}
        return ["full" if i in idx else "mamba" for i in range(n)], unsized
    if isinstance(c.get("attn_type_list"), list) and len(c["attn_type_list"]) == n:  # MiniMax-Text-01: 0 linear, 1 softmax
        return ["full" if int(t) == 1 else "linear_attention" for t in c["attn_type_list"]], unsized
    if c.get("model_type") == "falcon_h1":                   # every layer runs attention and Mamba2 side by side
        return ["full"] * n + ["mamba"] * n, unsized
    if c.get("attn_layer_period"):                           # Jamba
        p, o = int(c["attn_layer_period"]), int(c.get("attn_layer_offset", 0))
        return ["full" if i % p == o else "mamba" for i in range(n)], unsized
    sw = c.get("sliding_window")
    use_sw = c.get("use_sliding_window", True) and sw
    mt = c.get("model_type", "")
    if use_sw and mt == "gemma2":                            # even layers slide (vLLM Gemma2)
        return ["sliding_window" if i % 2 == 0 else "full" for i in range(n)], unsized
    if use_sw and c.get("sliding_window_pattern"):           # Gemma3: every Nth layer global
        p = int(c["sliding_window_pattern"])
        return ["full" if (i + 1) % p == 0 else "sliding_window" for i in range(n)], unsized
    if use_sw and mt in ("mistral", "mixtral"):
        return ["sliding_window"] * n, unsized
    if mt in ("mamba", "mamba2", "falcon_mamba"):
        return ["mamba"] * n, unsized
    return ["full"] * n, unsized


def _quant(c: dict) -> tuple[str | None, float | None, int | None]:
    q = c.get("quantization_config") or {}
    if not isinstance(q, dict) or not q:
        return None, None, None
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower() or None
    bits = q.get("bits") or q.get("w_bit") or q.get("weight_bits")
    group = q.get("group_size") or q.get("q_group_size")
    if method in ("fp8", "fbgemm_fp8") and not bits:
        bits = 8
    if method == "compressed-tensors":
        for g in (q.get("config_groups") or {}).values():
            w = (g or {}).get("weights") or {}
            bits = bits or w.get("num_bits")
            group = group or w.get("group_size")
    if method in ("modelopt", "nvfp4") or "fp4" in str(q.get("quant_algo", "")).lower():
        bits, group = bits or 4, group or 16
    if method == "mxfp4":
        bits, group = 4, 32
    return method, (float(bits) if bits else None), (int(group) if group and int(group) > 0 else None)


# ---------------------------------------------------------------- Mamba / linear-attention state

@dataclass(frozen=True)
class MambaState:
    """What sizes one sequence's state in one Mamba / linear-attention layer, read from the config the
    way each vLLM model's ``get_mamba_state_shape_from_config`` reads it."""
    kind: str                 # mamba1 | mamba2 | gated_delta_net | linear_attention
    intermediate_size: int = 0
    n_groups: int = 0
    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    conv_kernel: int = 0
    num_k_heads: int = 0
    num_v_heads: int = 0
    head_k_dim: int = 0
    head_v_dim: int = 0
    dt_rank: int = 0                  # Mamba1
    ssm_dtype: str | None = None      # the config's own SSM state dtype (Qwen3.5 ``mamba_ssm_dtype``)
    chunk_size: int = 2048            # ``mamba_chunk_size`` / ``chunk_size`` (vLLM ``get_mamba_chunk_size``)
    prefix_caching_all: bool = False  # vLLM 0.24 lists the model as supporting Mamba cache mode "all"


#: model_types whose vLLM model class supports Mamba prefix caching in mode "all" (vLLM 0.24
#: ``supports_mamba_prefix_caching``: falcon_h1, granitemoehybrid, jamba, mamba, mamba2, nemotron_h, zamba2)
MAMBA_PREFIX_CACHING_ALL = {"falcon_h1", "granitemoehybrid", "jamba", "mamba", "mamba2", "nemotron_h", "zamba2",
                            "falcon_mamba"}


#: model_types whose vLLM attention class gates its output unless the config says otherwise
#: (``Qwen3NextAttention``: ``attn_output_gate = getattr(config, "attn_output_gate", True)``, reused by
#: Qwen3.5): q_proj is twice as wide. Qwen3-Next's config.json has no such field; Qwen3.5's states it.
GATED_ATTENTION_BY_DEFAULT = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}


def _first(c: dict, *keys):
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    return None


def mamba_state(c: dict, hidden: int) -> MambaState | None:
    """The state shape fields of a hybrid / state-space config, per vLLM 0.11's models: Mamba2
    (Bamba, GraniteMoeHybrid, Falcon-H1, Zamba2: ``mamba_*``; NemotronH: ``mamba_num_heads``,
    ``mamba_head_dim``, ``n_groups``, ``ssm_state_size``, ``conv_kernel``; Mamba2: ``expand``,
    ``num_heads``, ``head_dim``, ``state_size``), Mamba1 (Jamba: ``mamba_expand``, ``mamba_d_state``,
    ``mamba_d_conv``; Mamba: ``intermediate_size``, ``state_size``, ``conv_kernel``), gated delta net
    (Qwen3-Next: ``linear_*``) and MiniMax's linear attention. None when the fields are absent."""
    mt = str(c.get("model_type", ""))
    st = _mamba_state_fields(c, hidden, mt)
    if st is None:
        return None
    chunk = _first(c, "mamba_chunk_size", "chunk_size") or 2048
    return replace(st, ssm_dtype=st.ssm_dtype or c.get("mamba_ssm_dtype"), chunk_size=int(chunk),
                   prefix_caching_all=mt in MAMBA_PREFIX_CACHING_ALL)


def _mamba_state_fields(c: dict, hidden: int, mt: str) -> MambaState | None:
    try:
        lin = c.get("linear_attn_config")
        if isinstance(lin, dict) and lin.get("kda_layers"):                   # Kimi-Linear's Kimi delta attention
            return MambaState("kda", num_heads=int(lin["num_heads"]), head_dim=int(lin["head_dim"]),
                              conv_kernel=int(lin.get("short_conv_kernel_size") or 4), ssm_dtype="float32")
        if c.get("linear_num_value_heads"):                                  # Qwen3-Next gated delta net
            return MambaState("gated_delta_net", num_k_heads=int(c["linear_num_key_heads"]),
                              num_v_heads=int(c["linear_num_value_heads"]), head_k_dim=int(c["linear_key_head_dim"]),
                              head_v_dim=int(c["linear_value_head_dim"]), conv_kernel=int(c["linear_conv_kernel_dim"]))
        if mt.startswith("minimax") and c.get("attn_type_list"):             # MiniMax-Text-01 lightning attention
            return MambaState("linear_attention", num_heads=int(c["num_attention_heads"]), head_dim=int(c["head_dim"]))
        if c.get("mamba_num_heads"):                                          # NemotronH
            return MambaState("mamba2", intermediate_size=int(c["mamba_num_heads"]) * int(c["mamba_head_dim"]),
                              n_groups=int(c["n_groups"]), num_heads=int(c["mamba_num_heads"]),
                              head_dim=int(c["mamba_head_dim"]), state_size=int(c["ssm_state_size"]),
                              conv_kernel=int(c["conv_kernel"]))
        heads = _first(c, "mamba_n_heads", "n_mamba_heads")
        if heads:                                                             # Bamba, Granite-4.0-H, Falcon-H1, Zamba2
            inter = c.get("mamba_d_ssm") or int(c["mamba_expand"] * hidden)
            return MambaState("mamba2", intermediate_size=int(inter), n_groups=int(_first(c, "mamba_n_groups", "mamba_ngroups")),
                              num_heads=int(heads), head_dim=int(_first(c, "mamba_d_head", "mamba_headdim")),
                              state_size=int(c["mamba_d_state"]), conv_kernel=int(c["mamba_d_conv"]))
        if mt == "mamba2":
            return MambaState("mamba2", intermediate_size=int(c["expand"] * hidden), n_groups=int(c["n_groups"]),
                              num_heads=int(c["num_heads"]), head_dim=int(c["head_dim"]),
                              state_size=int(c["state_size"]), conv_kernel=int(c["conv_kernel"]))
        if c.get("mamba_d_state"):                                            # Jamba (Mamba1)
            return MambaState("mamba1", intermediate_size=int(c["mamba_expand"] * hidden),
                              state_size=int(c["mamba_d_state"]), conv_kernel=int(c["mamba_d_conv"]),
                              dt_rank=int(c.get("mamba_dt_rank") or math.ceil(hidden / 16)))
        if mt in ("mamba", "falcon_mamba"):
            return MambaState("mamba1", intermediate_size=int(c["intermediate_size"]),
                              state_size=int(c["state_size"]), conv_kernel=int(c["conv_kernel"]),
                              dt_rank=int(c.get("time_step_rank") or math.ceil(hidden / 16)))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _divide(a: int, b: int) -> int:
    if a % b:
        raise ValueError(f"{a} is not divisible by tensor_parallel_size {b}")
    return a // b


def mamba_state_shapes(m: MambaState, tp: int = 1, num_spec: int = 0) -> list[tuple[int, ...]]:
    """vLLM's ``MambaStateShapeCalculator``: the (conv, temporal) state tensors of one layer, one sequence,
    one GPU (linear attention: one tensor)."""
    if m.kind == "mamba1":
        return [(m.conv_kernel - 1, _divide(m.intermediate_size, tp)), (_divide(m.intermediate_size, tp), m.state_size)]
    if m.kind == "mamba2":
        groups = m.n_groups + (0 if m.n_groups % tp == 0 else tp - m.n_groups)   # extra_groups_for_head_shards
        conv_dim = m.intermediate_size + 2 * groups * m.state_size
        return [(m.conv_kernel - 1, _divide(conv_dim, tp)), (_divide(m.num_heads, tp), m.head_dim, m.state_size)]
    if m.kind == "gated_delta_net":
        conv_dim = m.head_k_dim * m.num_k_heads * 2 + m.head_v_dim * m.num_v_heads
        return [(m.conv_kernel - 1 + num_spec, _divide(conv_dim, tp)), (_divide(m.num_v_heads, tp), m.head_k_dim, m.head_v_dim)]
    if m.kind == "kda":   # kda_state_shape (0.11.2): q, k, v short-conv states and the recurrent state
        conv = (m.conv_kernel - 1, _divide(m.num_heads * m.head_dim, tp))
        return [conv, conv, conv, (_divide(m.num_heads, tp), m.head_dim, m.head_dim)]
    return [(m.num_heads // tp, m.head_dim, m.head_dim)]                       # linear attention


def mamba_state_bytes(m: MambaState, state_dtype_bytes: int, tp: int = 1, ssm_dtype_bytes: int | None = None,
                      num_spec: int = 0) -> int:
    """``MambaSpec.page_size_bytes`` before padding: one sequence's state in one layer on one GPU. The conv
    state is in the model dtype (``--mamba-cache-dtype auto``); the temporal (SSM) state too unless
    ``--mamba-ssm-cache-dtype`` (or, for Qwen3.5, the config's ``mamba_ssm_dtype``) says otherwise."""
    shapes = mamba_state_shapes(m, tp, num_spec)
    sizes = [math.prod(s) for s in shapes]
    if len(sizes) >= 2:   # conv state(s) in the state dtype, the temporal / recurrent state last
        return sum(sizes[:-1]) * state_dtype_bytes + sizes[-1] * (ssm_dtype_bytes or state_dtype_bytes)
    return sum(sizes) * state_dtype_bytes


def hybrid_attention_block_size(attn_bytes_per_token_per_layer: int, mamba_page_bytes: int,
                                block_size: int | None = None, mamba_cache_mode: str = "none",
                                chunk_size: int = 2048, alignment: int = 16) -> int:
    """``HybridAttentionMambaModelConfig`` (0.10-0.2x) / ``Platform._align_hybrid_block_size`` (0.24): the
    attention block size is raised to ``alignment * cdiv(mamba_page, alignment * attention bytes per
    token)`` unless the user set a larger one, so that one attention page holds one Mamba state; the
    Mamba page is then padded to the attention page. Mamba cache mode "all" (prefix caching on a model
    that supports it, 0.24) rounds to ``lcm(mamba chunk size, alignment)`` instead."""
    if mamba_cache_mode == "all":
        chunk = math.lcm(chunk_size, alignment)
        need = chunk * cdiv(cdiv(mamba_page_bytes, attn_bytes_per_token_per_layer), chunk)
    else:
        need = alignment * cdiv(mamba_page_bytes, alignment * attn_bytes_per_token_per_layer)
    return block_size if block_size is not None and block_size >= need else need


def state_blocks_per_request(mamba_cache_mode: str, max_model_len: int, mamba_block_size: int) -> int:
    """``MambaSpec.max_memory_usage_bytes`` in pages: one state per request (mode "none", every version
    before 0.20), two in mode "align" (prefix caching), one per ``mamba_block_size`` tokens in mode "all"."""
    if mamba_cache_mode == "align":
        return 2
    if mamba_cache_mode == "all":
        return cdiv(max_model_len, mamba_block_size)
    return 1


def model_shape(config: dict) -> ModelShape:
    """A ``ModelShape`` from a Hugging Face ``config.json`` dict. ValueError if it has no layers."""
    c = text_config(config)
    n = c.get("num_hidden_layers") or c.get("n_layer") or c.get("num_layers")
    hidden = c.get("hidden_size") or c.get("d_model") or c.get("n_embd")
    if not n or not hidden:
        raise ValueError("config.json has no num_hidden_layers / hidden_size")
    heads = c.get("num_attention_heads") or c.get("n_head") or 0
    kv = c.get("num_key_value_heads")
    if kv is None:
        kv = 1 if c.get("multi_query") else heads
    head_dim = c.get("head_dim") or (hidden // heads if heads else 0)
    kinds, unsized = _layer_kinds(c, int(n))
    enc, enc_notes = encoder_params(config, int(hidden))
    unsized = unsized + enc_notes + _encoders_not_sized(config)
    method, bits, group = _quant(c)
    experts = (c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts")
               or c.get("moe_num_experts") or 0)
    moe_inter = c.get("moe_intermediate_size") or (c.get("intermediate_size") if experts else 0) or 0
    shared = c.get("shared_expert_intermediate_size") or 0
    if not shared and (c.get("n_shared_experts") or c.get("num_shared_experts")):
        shared = int(c.get("n_shared_experts") or c["num_shared_experts"]) * int(moe_inter)
    dense = int(c.get("first_k_dense_replace") or 0)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    mamba = None
    if "mamba" in kinds or "linear_attention" in kinds:
        mamba = mamba_state(c, hidden)
        if mamba is None:
            what = "Mamba" if "mamba" in kinds else "linear-attention"
            unsized.append(f"{what} state of model_type {c.get('model_type')!r} (one fixed-size state per sequence; "
                           "its shape fields are not known to vllm-doctor)")
    return ModelShape(
        architecture=(c.get("architectures") or ["?"])[0], model_type=str(c.get("model_type", "")),
        num_layers=int(n), hidden_size=int(hidden), num_heads=int(heads), num_kv_heads=int(kv),
        head_dim=int(head_dim), vocab_size=int(c.get("vocab_size") or 0),
        intermediate_size=int(c.get("intermediate_size") or c.get("ffn_dim") or 4 * hidden),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position_embeddings=c.get("max_position_embeddings"), dtype=dtype, layer_kinds=kinds,
        sliding_window=c.get("sliding_window") if any(k == "sliding_window" for k in kinds) else None,
        kv_lora_rank=c.get("kv_lora_rank"), qk_rope_head_dim=c.get("qk_rope_head_dim"),
        qk_nope_head_dim=c.get("qk_nope_head_dim"), v_head_dim=c.get("v_head_dim"),
        q_lora_rank=c.get("q_lora_rank"),
        attention_bias=bool(c.get("attention_bias") or c.get("qkv_bias")
                            or c.get("model_type") in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")),
        num_experts=int(experts), moe_intermediate_size=int(moe_inter),
        shared_expert_intermediate_size=int(shared), dense_layers=dense,
        quant_method=method, quant_bits=bits, quant_group_size=group, unsized=unsized, mamba=mamba,
        attn_output_gate=bool(c.get("attn_output_gate", c.get("model_type") in GATED_ATTENTION_BY_DEFAULT)),
        encoder_params=enc, encoder_notes=enc_notes,
    )


# ---------------------------------------------------------------- KV bytes per token

def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """vLLM ``get_num_kv_heads``: KV heads are split over TP ranks, replicated when fewer than TP."""
    return max(1, num_kv_heads // tp)


def attention_kv_bytes_per_token(num_kv_heads: int, head_dim: int, kv_dtype_bytes: int, tp: int = 1) -> int:
    """MHA/GQA/MQA (full or sliding window), one layer, one GPU: 2 (K, V) * heads * head_dim * bytes."""
    return 2 * kv_heads_per_gpu(num_kv_heads, tp) * head_dim * kv_dtype_bytes


def mla_kv_bytes_per_token(kv_lora_rank: int, qk_rope_head_dim: int, kv_dtype_bytes: int) -> int:
    """MLA, one layer, any TP rank: the compressed latent plus the rotary key, stored once."""
    return (kv_lora_rank + qk_rope_head_dim) * kv_dtype_bytes


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one kind on one GPU, with their KV bytes per token per layer (None: not per token) or,
    for Mamba / linear-attention layers, the bytes of one sequence's fixed-size state per layer."""
    kind: str
    layers: int
    bytes_per_token_per_layer: int | None
    formula: str
    state_bytes_per_layer: int | None = None


STATE_KINDS = ("mamba", "linear_attention")


def kv_layer_groups(shape: ModelShape, kv_dtype_bytes: int, tp: int = 1, pp: int = 1,
                    state_dtype_bytes: int | None = None, ssm_dtype_bytes: int | None = None) -> list[LayerGroup]:
    """The model's layers on one GPU (PP rank 0), grouped by kind, each with its per-token cost (attention)
    or its per-sequence state (Mamba / linear attention, in ``state_dtype_bytes``, default the KV dtype)."""
    out = []
    for kind in dict.fromkeys(shape.layer_kinds):
        n = cdiv(shape.count(kind), pp)
        if kind == "mla":
            b = mla_kv_bytes_per_token(shape.kv_lora_rank or 0, shape.qk_rope_head_dim or 0, kv_dtype_bytes)
            f = f"({shape.kv_lora_rank} kv_lora_rank + {shape.qk_rope_head_dim} qk_rope_head_dim) x {kv_dtype_bytes} B"
        elif kind in ("full", "sliding_window"):
            h = kv_heads_per_gpu(shape.num_kv_heads, tp)
            b = attention_kv_bytes_per_token(shape.num_kv_heads, shape.head_dim, kv_dtype_bytes, tp)
            f = f"2 (K,V) x {h} KV heads/GPU x {shape.head_dim} head_dim x {kv_dtype_bytes} B"
        elif kind == "mlp_only":
            continue
        elif kind in STATE_KINDS and shape.mamba is not None:
            sb = state_dtype_bytes or kv_dtype_bytes
            st = mamba_state_bytes(shape.mamba, sb, tp, ssm_dtype_bytes)
            shapes = mamba_state_shapes(shape.mamba, tp)
            widths = [sb, ssm_dtype_bytes or sb][:len(shapes)]
            parts = " + ".join(f"{'x'.join(str(d) for d in t)} x {w} B" for t, w in zip(shapes, widths))
            out.append(LayerGroup(kind, n, None, f"{shape.mamba.kind} state ({parts} = {st:,} B per sequence per layer)", st))
            continue
        else:
            b, f = None, "fixed-size state per sequence: not sized"
        out.append(LayerGroup(kind, n, b, f))
    return out


def kv_bytes_per_token(groups: list[LayerGroup]) -> int:
    """KV bytes one token costs on one GPU, summed over the layers that store per-token KV."""
    return sum(g.layers * g.bytes_per_token_per_layer for g in groups if g.bytes_per_token_per_layer)


def state_bytes_per_sequence(groups: list[LayerGroup]) -> int:
    """Bytes of one sequence's Mamba / linear-attention state on one GPU (unpadded), summed over layers."""
    return sum(g.layers * g.state_bytes_per_layer for g in groups if g.state_bytes_per_layer)


# ---------------------------------------------------------------- weights

def _linear_bytes(params: float, shape: ModelShape, weight_bytes: float) -> float:
    """Bytes of quantizable linear weights: packed bits plus one 16-bit scale per group."""
    if shape.quant_bits:
        b = params * shape.quant_bits / 8
        if shape.quant_group_size:
            b += params / shape.quant_group_size * (1 if shape.quant_method in ("modelopt", "nvfp4", "mxfp4") else 2)
        return b
    return params * weight_bytes


def weight_params(shape: ModelShape) -> dict[str, int]:
    """Parameter counts by part (whole model, all GPUs): embedding, lm_head, attention, mlp, norms."""
    h = shape.hidden_size
    if shape.kv_lora_rank:
        nope, rope = shape.qk_nope_head_dim or 0, shape.qk_rope_head_dim or 0
        v = shape.v_head_dim or shape.head_dim
        q = (h * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * shape.num_heads * (nope + rope)
             if shape.q_lora_rank else h * shape.num_heads * (nope + rope))
        attn = (q + h * (shape.kv_lora_rank + rope) + shape.kv_lora_rank
                + shape.kv_lora_rank * shape.num_heads * (nope + v) + shape.num_heads * v * h)
    else:
        qd, kvd = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        attn = (h * qd * (2 if shape.attn_output_gate else 1) + 2 * h * kvd + qd * h
                + ((qd + 2 * kvd) if shape.attention_bias else 0))
    n_attn = sum(1 for k in shape.layer_kinds if k in ("full", "sliding_window", "mla"))
    dense_mlp = 3 * h * shape.intermediate_size
    if shape.num_experts:
        moe = shape.num_experts * 3 * h * shape.moe_intermediate_size + h * shape.num_experts
        moe += 3 * h * shape.shared_expert_intermediate_size
        mlp = shape.dense_layers * dense_mlp + (shape.num_layers - shape.dense_layers) * moe
    else:
        mlp = shape.num_layers * dense_mlp
    n_state = sum(1 for k in shape.layer_kinds if k in STATE_KINDS)
    return {
        "embedding": shape.vocab_size * h,
        "lm_head": 0 if shape.tie_word_embeddings else shape.vocab_size * h,
        "attention": n_attn * attn + (n_state * state_mixer_params(shape.mamba, h) if shape.mamba else 0),
        "mlp": mlp,
        "norms": (2 * shape.num_layers + 1) * h,
        **({"vision_encoder": shape.encoder_params} if shape.encoder_params else {}),
    }


def state_mixer_params(m: MambaState, h: int) -> int:
    """Parameters of one Mamba / gated-delta-net mixer (the layer that keeps the state), as the
    checkpoints lay them out: projections in and out, the causal conv1d, per-head A / D / dt, the norm."""
    if m.kind == "gated_delta_net":
        qkv = 2 * m.num_k_heads * m.head_k_dim + m.num_v_heads * m.head_v_dim
        return (h * (qkv + m.num_v_heads * m.head_v_dim + 2 * m.num_v_heads) + qkv * m.conv_kernel
                + 2 * m.num_v_heads + m.head_v_dim + m.num_v_heads * m.head_v_dim * h)
    if m.kind == "kda":   # KimiDeltaAttention: q/k/v projections and short convs, the f and g low-rank
        p = m.num_heads * m.head_dim      # gates (rank = head_dim), b_proj, A_log, dt_bias, o_norm, o_proj
        return (3 * h * p + 3 * p * m.conv_kernel + 2 * (m.head_dim * h + p * m.head_dim) + m.num_heads * h
                + m.num_heads + p + m.head_dim + p * h)
    if m.kind == "mamba2":
        conv = m.intermediate_size + 2 * m.n_groups * m.state_size
        return (h * (m.intermediate_size + conv + m.num_heads) + conv * (m.conv_kernel + 1)
                + 3 * m.num_heads + m.intermediate_size + m.intermediate_size * h)
    if m.kind == "mamba1":
        i = m.intermediate_size
        return (h * 2 * i + i * (m.conv_kernel + 1) + i * (m.dt_rank + 2 * m.state_size)
                + m.dt_rank * i + i + i * m.state_size + i + i * h)
    return 4 * h * m.num_heads * m.head_dim          # linear attention: q, k, v, o projections


def mxfp4_expert_bytes(hidden: int, intermediate: int) -> int:
    """Bytes of one MXFP4 expert on one GPU as vLLM holds it for the fused-MoE kernel on Hopper, its
    default CUDA path (vLLM 0.11 ``get_mxfp4_backend``: the Triton backend on capability 9.x):
    ``Mxfp4MoEMethod.create_weights`` rounds the intermediate size per GPU up to 64, then
    ``process_weights_after_loading`` swizzles the experts into triton_kernels' Hopper value layout,
    which pads the packed 4-bit values (two per byte) to 64 along K and 256 along N, the e8m0 scales
    (one per 32 values) to 256 rows, and keeps the expert biases in fp32. gpt-oss-20b: 14,030,080 B per
    expert against the checkpoint's 13,236,480 (+0.57 GiB over its 768 experts). Other backends pad
    differently (Marlin on Ampere / Ada to 128 / 256: about 2 % more in all; FlashInfer on Blackwell
    to 128: about 1 % less)."""
    inter = round_up(intermediate, 64)

    def values(k: int, n: int) -> int:      # a K x N weight: K/2 packed bytes per row of N
        return round_up(k // 2, 64) * round_up(n, 256)

    def scales(k: int, n: int) -> int:
        return round_up(n, 256) * cdiv(k, 32)
    w13, w2 = (hidden, 2 * inter), (inter, hidden)
    return values(*w13) + values(*w2) + scales(*w13) + scales(*w2) + (2 * inter + hidden) * 4


def round_up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def weight_bytes_per_gpu(shape: ModelShape, weight_dtype_bytes: int, tp: int = 1, pp: int = 1) -> int:
    """Weight bytes on the busiest GPU (PP rank 0, which also holds the embedding; with pp=1 the
    lm_head too). Linear layers and the vocabulary are split over TP; norms are replicated.
    Quantized checkpoints: linear weights at their bit width plus group scales; embedding and
    lm_head stay in the model dtype."""
    p = weight_params(shape)
    layers_share = 1 / pp
    if shape.quant_method == "mxfp4" and shape.num_experts:
        # vLLM's Mxfp4Config quantizes the fused MoE experts only; attention (and the checkpoints'
        # modules_to_not_convert: self_attn, router, embed_tokens, lm_head) stay in the model dtype.
        # The experts are held in the layout the MoE kernel needs, larger than the checkpoint's
        moe_layers = (shape.num_layers - shape.dense_layers) * layers_share
        b = moe_layers * shape.num_experts * mxfp4_expert_bytes(shape.hidden_size, shape.moe_intermediate_size // tp)
        b += moe_layers * shape.hidden_size * shape.num_experts * weight_dtype_bytes        # router
        b += (p["mlp"] * layers_share - moe_layers * (shape.num_experts * 3 * shape.hidden_size
              * shape.moe_intermediate_size + shape.hidden_size * shape.num_experts)) / tp * weight_dtype_bytes
        b += p["attention"] * layers_share / tp * weight_dtype_bytes
    else:
        b = _linear_bytes((p["attention"] + p["mlp"]) * layers_share / tp, shape, weight_dtype_bytes)
    b += p["embedding"] / tp * weight_dtype_bytes
    if pp == 1:
        b += p["lm_head"] / tp * weight_dtype_bytes
    b += p["norms"] * layers_share * weight_dtype_bytes
    b += p.get("vision_encoder", 0) / tp * weight_dtype_bytes   # on the first stage, its linears split over TP
    return int(b)


def lora_slot_params(shape: ModelShape, max_loras: int, max_lora_rank: int, tp: int = 1, pp: int = 1) -> int | None:
    """Elements of the LoRA slots vLLM allocates with ``--enable-lora`` on the busiest GPU, before any
    adapter is loaded (read in 0.27.1: ``lora/layers``; every linear layer and the models'
    ``embedding_modules`` are wrapped, in the model dtype, ``max_loras`` slots of ``max_lora_rank``):
    a column-parallel layer holds A (rank x input) per slice and B (output per GPU x rank), a
    row-parallel one A (rank x input per GPU) and B (output x rank); the embedding A (vocabulary x rank)
    and B (hidden x rank), lm_head A (rank x hidden) and B (vocabulary x rank). None where the layers
    are not plain attention with a dense MLP (MoE, MLA, linear attention / Mamba): not sized."""
    if (shape.num_experts or shape.kv_lora_rank or shape.mamba or shape.attn_output_gate
            or any(k not in ("full", "sliding_window") for k in shape.layer_kinds)):
        return None
    h, r, inter = shape.hidden_size, max_lora_rank, shape.intermediate_size
    qd, kvd = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    layer = (3 * r * h + r * (qd + 2 * kvd) // tp        # qkv_proj: three A, B per GPU
             + r * qd // tp + h * r                       # o_proj
             + 2 * r * h + r * 2 * inter // tp            # gate_up_proj: two A, B per GPU
             + r * inter // tp + h * r)                   # down_proj
    vocab = shape.vocab_size * r + h * r                  # embed_tokens
    head = (r * h + shape.vocab_size * r) if pp == 1 else 0
    return max_loras * (shape.num_layers * layer // pp + vocab + head)


# ---------------------------------------------------------------- memory accounting and blocks

def available_kv_memory(total_bytes: int, gpu_memory_utilization: float, weights_bytes: int,
                        activation_peak_bytes: int, non_torch_bytes: int,
                        kv_cache_memory_bytes: int | None = None) -> int:
    """Bytes vLLM gives the KV cache on one GPU: ``--kv-cache-memory-bytes`` when set, otherwise
    ``total * gpu_memory_utilization - (weights + activation peak + non-torch memory)``."""
    if kv_cache_memory_bytes is not None:
        return int(kv_cache_memory_bytes)
    return int(total_bytes * gpu_memory_utilization) - weights_bytes - activation_peak_bytes - non_torch_bytes


def _pooled(groups: list[LayerGroup]) -> list[LayerGroup]:
    return [g for g in groups if g.bytes_per_token_per_layer or g.state_bytes_per_layer]


def group_layout(groups: list[LayerGroup]) -> tuple[int, dict[str, int]]:
    """V1 hybrid allocator (``_get_kv_cache_groups_uniform_page_size``): layers of each kind are cut into
    groups of ``group_size`` layers (the smallest kind's layer count) that share one block pool; Mamba /
    linear-attention layers are a kind of their own there (``MambaSpec``). Returns (group_size, groups
    per kind). A model with one kind has one group of all its layers. Pass only the groups that live in
    the pool (V0 keeps the Mamba state outside the KV cache)."""
    sized = _pooled(groups)
    if not sized:
        return 0, {}
    size = min(g.layers for g in sized)
    return size, {g.kind: cdiv(g.layers, size) for g in sized}


def page_bytes(groups: list[LayerGroup], block_size: int) -> int:
    """Bytes of one page (one block of one layer): attention ``block_size x bytes/token/layer``; the Mamba
    page is padded to it (``mamba_page_size_padded``). Without attention layers: the Mamba state."""
    attn = max((g.bytes_per_token_per_layer or 0) for g in groups) * block_size if groups else 0
    return attn or max((g.state_bytes_per_layer or 0) for g in groups)


def bytes_per_block(groups: list[LayerGroup], block_size: int) -> int:
    """Bytes one block id costs in the shared pool: page size x layers per group (V1); for a model
    with one kind of layer that is ``block_size x num_layers x bytes/token/layer`` (V0's
    ``cache_block_size``)."""
    size, _ = group_layout(groups)
    return page_bytes(groups, block_size) * size


def blocks_per_request(kind: str, max_model_len: int, block_size: int, sliding_window: int | None = None,
                       max_num_batched_tokens: int = 0, mamba_cache_mode: str = "none") -> int:
    """Blocks one request at ``max_model_len`` holds in a group of this kind (V1). A Mamba / linear-
    attention group holds its state: one block, or more with prefix caching (``state_blocks_per_request``;
    the Mamba block size is the attention one)."""
    if kind in STATE_KINDS:
        return state_blocks_per_request(mamba_cache_mode, max_model_len, block_size)
    if kind == "sliding_window" and sliding_window:
        return cdiv(min(sliding_window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1
    return cdiv(max_model_len, block_size)


def request_blocks(groups: list[LayerGroup], max_model_len: int, block_size: int,
                   sliding_window: int | None = None, max_num_batched_tokens: int = 0,
                   mamba_cache_mode: str = "none") -> int:
    """Block ids one request at ``max_model_len`` takes from the pool, summed over the groups."""
    _, per_kind = group_layout(groups)
    return sum(n * blocks_per_request(k, max_model_len, block_size, sliding_window, max_num_batched_tokens,
                                      mamba_cache_mode)
               for k, n in per_kind.items())


def num_blocks(available_bytes: int, block_bytes: int) -> int:
    """``available // bytes_per_block`` (never negative)."""
    return max(0, available_bytes // block_bytes) if block_bytes else 0


def max_concurrency(blocks: int, blocks_per_req: int) -> float:
    """Requests of ``max_model_len`` tokens the pool holds at once (vLLM's printed ``x`` figure)."""
    return blocks / blocks_per_req if blocks_per_req else 0.0


def printed_kv_cache_tokens(blocks: int, block_size: int, max_model_len: int, concurrency: float,
                            num_groups: int, v1_token_formula: str) -> int:
    """The ``KV cache size: N tokens`` vLLM prints. ``v1_token_formula``: ``"concurrency"`` (0.11+:
    ``int(concurrency * max_model_len)``), ``"blocks"`` (0.8-0.10 and V0: blocks per group x block_size)."""
    if v1_token_formula == "concurrency":
        return int(concurrency * max_model_len)
    return blocks // max(1, num_groups) * block_size


def needed_bytes_one_request(groups: list[LayerGroup], max_model_len: int, block_size: int,
                             sliding_window: int | None = None, max_num_batched_tokens: int = 0,
                             mamba_cache_mode: str = "none") -> int:
    """V1 ``max_memory_usage_bytes``: KV bytes one request at ``max_model_len`` needs, per layer (a
    Mamba / linear-attention layer: one padded page)."""
    page = page_bytes(groups, block_size)
    total = 0
    for g in _pooled(groups):
        total += g.layers * page * blocks_per_request(g.kind, max_model_len, block_size, sliding_window,
                                                      max_num_batched_tokens, mamba_cache_mode)
    return total


def estimate_max_model_len(groups: list[LayerGroup], available_bytes: int, max_model_len: int, block_size: int,
                           sliding_window: int | None = None, max_num_batched_tokens: int = 0,
                           mamba_cache_mode: str = "none") -> int:
    """vLLM's binary search: the longest ``max_model_len`` whose one request fits (0 if none)."""
    def fits(n: int) -> bool:
        return needed_bytes_one_request(groups, n, block_size, sliding_window, max_num_batched_tokens,
                                        mamba_cache_mode) <= available_bytes
    if not fits(1):
        return 0
    lo, hi, best = 1, max_model_len, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def format_gib(n: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, printed as Python prints a float."""
    return str(round(n / GiB, 2))


def concurrency_at_length(blocks: int, tokens_per_request: int, block_size: int) -> int:
    """Whole requests of ``tokens_per_request`` (prompt + output) that fit the pool at once."""
    return blocks // cdiv(tokens_per_request, block_size) if tokens_per_request > 0 else 0


def utilization_for_blocks(total_bytes: int, weights_bytes: int, activation_peak_bytes: int,
                           non_torch_bytes: int, blocks: int, block_bytes: int) -> float:
    """The ``gpu_memory_utilization`` that leaves ``blocks`` KV blocks, rounded up to 0.01."""
    need = weights_bytes + activation_peak_bytes + non_torch_bytes + blocks * block_bytes
    return math.ceil(need / total_bytes * 100) / 100


def utilization_for_more_blocks(gpu_memory_utilization: float, total_bytes: int, have_blocks: int,
                                need_blocks: int, block_bytes: int) -> float:
    """From an OBSERVED pool (a log's ``num_gpu_blocks`` at a known ``gpu_memory_utilization``):
    the utilization that gives ``need_blocks``, rounded up to 0.01. Every extra block costs
    ``block_bytes`` of ``total * gpu_memory_utilization`` (weights and activations do not change)."""
    extra = max(0, need_blocks - have_blocks) * block_bytes
    return math.ceil((gpu_memory_utilization + extra / total_bytes) * 100 - 1e-9) / 100


def max_num_seqs_that_fit(blocks: int, max_model_len: int, block_size: int) -> int:
    """Sequences of ``max_model_len`` tokens the pool holds at once, whole (the ``--max-num-seqs``
    that never preempts at full length); at least 1."""
    return max(1, blocks // cdiv(max_model_len, block_size))


SAMPLER_BYTES_PER_ENTRY = {"native": 38, "flashinfer": 12}


def activation_peak_estimate(shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int,
                             act_dtype_bytes: int, tp: int = 1, engine: str = "v1", sampler: str = "native") -> int:
    """An ESTIMATE of the profiling run's activation peak (vLLM measures it; we cannot).

    - the forward pass of one step: the MLP intermediate (gate+up, ``2 x intermediate/TP``, alive while
      ``SiluAndMul`` writes its ``intermediate/TP`` output) and the hidden states it keeps, per batched
      token (a real V0 log, vLLM 0.6.4, one 20,000-token prefill of Llama-3.1-8B: 2.07 GiB, 111 KB per
      token; this gives 2.21 GiB);
    - the profiling run also samples ``max_num_seqs`` rows of full-vocabulary fp32 logits (logits,
      probabilities, sorted values, int64 indices: about 38 bytes per row and vocabulary entry; real
      H100 logs show 4.76 GiB for Llama-3.1-8B, 5.56 GiB for Qwen3-0.6B, 7.38 GiB for gpt-oss-20b at
      1,024 sequences). That is PyTorch's top-k / top-p path (``forward_native``: it sorts the
      logits). With FlashInfer installed (the vllm/vllm-openai image; ``pip install vllm[flashinfer]``)
      and ``VLLM_USE_FLASHINFER_SAMPLER`` not 0, V1's ``TopKTopPSampler`` samples without the sort
      (read in 0.10.1.1 and 0.11.0): about 12 bytes per entry (real A100 logs of vLLM 0.10.1.1 show
      0.5 GiB in all for 256 x 152,064 entries). The peak is the larger of the two.
    """
    inter = shape.moe_intermediate_size * 8 if shape.num_experts else shape.intermediate_size
    forward = max_num_batched_tokens * (3 * inter // tp + 4 * shape.hidden_size) * act_dtype_bytes
    # V0 samples on the driver worker (rank 0), over the logits gathered there, and its profile run
    # asks for top_p 0.99 and top_k vocab-1 (worker/model_runner.py profile_run), which its sampler
    # applies by sorting: PyTorch's cost whatever is installed (a real V0 T4 log: 0.90 GiB for
    # 192 x 128,256 entries, 37 B each)
    sampled = max_num_seqs * shape.vocab_size * SAMPLER_BYTES_PER_ENTRY[sampler if engine == "v1" else "native"]
    return max(forward, sampled)


def non_torch_estimate(world_size: int, custom_all_reduce: bool = True) -> int:
    """An ESTIMATE of non-torch memory (NCCL buffers, cuBLAS workspaces): 0.13-0.35 GiB on one GPU,
    0.55 GiB with tensor parallelism in real logs where vLLM's custom all-reduce keeps its IPC buffers
    (llm-d's TP 2 H100 run), about 0.2 GiB where it is off (two real A100 TP 2 logs that print "Custom
    allreduce is disabled": no P2P, or nodes apart; ``--disable-custom-all-reduce``)."""
    if world_size == 1:
        return int(0.3 * GiB)
    return int((0.55 if custom_all_reduce else 0.2) * GiB)
