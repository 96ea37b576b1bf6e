"""What ``check`` knows beyond the flag/env tables of ``vllm_doctor/data/vllm_flags.json``: the
settings the widely copied tuning note invented (with the real one), the V0-only flags, and the
value choices that versions reject. Source: ../shared/reference/vllm-flags.md (read from the
``vllm serve`` parser of each released wheel)."""

from __future__ import annotations

# never a flag / variable / module in any examined release -> (the real setting, why)
INVENTED_FLAGS: dict[str, tuple[str, str]] = {
    "--kv-cache": ("--kv-cache-dtype", "--kv-cache is not a vLLM flag: argparse reads it as --kv-cache-dtype up to "
                   "0.10.1 and rejects it as ambiguous from 0.10.2; for the data type use --kv-cache-dtype, for "
                   "the size --kv-cache-memory-bytes (0.10.2+) or --gpu-memory-utilization"),
    "--chunked-prefill-size": ("--max-num-batched-tokens", "--chunked-prefill-size is SGLang's flag; vLLM's chunk "
                               "size is the per-step token budget --max-num-batched-tokens (with --enable-chunked-prefill)"),
}
GiB = 1 << 30


def kv_cache_size_advice(tokens: int, version: str, flags: set[str], block_size: int | None = None,
                         sized: dict | None = None) -> tuple[str, dict | None, str | None]:
    """``--kv-cache N``: the operator asked for a KV cache of N tokens. (what to write instead, with the
    arithmetic; the fix; "error" when it cannot fit, else None). ``flags``: the flags of ``version``;
    ``block_size``: the launch's --block-size (else 16, vLLM's CUDA default); ``sized``: from ``plan`` on the
    model (``bytes_per_block``, ``block_size``, and ``available``: the bytes vLLM leaves the KV cache on that
    GPU, None when the GPU memory is not given)."""
    bs = (sized or {}).get("block_size") or block_size or 16
    blocks = -(-tokens // bs)
    src = ("this model's block size" if sized else "--block-size" if block_size
           else "vLLM's CUDA default; MLA models use 64")
    blocks_flag = next((f for f in ("--num-gpu-blocks-override", "--forced-num-gpu-blocks") if f in flags), None)
    has_bytes = "--kv-cache-memory-bytes" in flags
    out = [f"{tokens} is a token count, and no --kv-cache* flag takes one; for a KV cache of {tokens:,} tokens"]
    fix: dict | None = None
    need = blocks * sized["bytes_per_block"] if sized else None
    if blocks_flag:
        out.append(f"{blocks_flag} {blocks} (ceil({tokens:,} / {bs} tokens per block, {src}) = {blocks:,} blocks; it "
                   "replaces the number of blocks vLLM profiles, and is not checked against free memory)")
        fix = {"setting": blocks_flag, "value": blocks, "alternatives": []}
    if has_bytes:
        if need is not None:
            alt = (f"--kv-cache-memory-bytes {need} ({blocks:,} blocks x {sized['bytes_per_block']:,} B per block "
                   f"= {need / GiB:.2f} GiB per GPU)")
            if fix:
                fix["alternatives"].append(f"--kv-cache-memory-bytes {need}")
            else:
                fix = {"setting": "--kv-cache-memory-bytes", "value": need}
        else:
            alt = (f"--kv-cache-memory-bytes = {tokens:,} x the model's KV bytes per token per GPU (give "
                   "--model-config to have it computed)")
        out.append(("or, instead: " if blocks_flag else "") + alt)
    if not blocks_flag and not has_bytes:
        fix = {"setting": "--gpu-memory-utilization", "value": None}
        out.append(f"vLLM {version} has no flag for it: --gpu-memory-utilization sizes the cache as a fraction of "
                   "GPU memory instead")
    said = out[0] + ": " + "; ".join(out[1:])
    level = None
    if not blocks_flag and not has_bytes:
        pass
    elif need is None:
        said += (f". Not checked: whether {blocks:,} blocks fit in GPU memory (no --model-config given: each block "
                 f"is {bs} tokens x the model's KV bytes per token)")
    elif sized.get("available") is None:
        said += (f". Not checked: whether {need / GiB:.2f} GiB of KV cache fits next to the weights (no "
                 "--gpu-memory given)")
    elif need > sized["available"]:
        fit = sized["available"] // sized["bytes_per_block"]
        said += (f". It does not fit: {need / GiB:.2f} GiB of KV cache, but this GPU leaves "
                 f"{sized['available'] / GiB:.2f} GiB for it ({sized['available_arithmetic']}): vLLM runs out of "
                 f"memory at start-up. Delete --kv-cache and let vLLM size the cache: about {fit:,} blocks = "
                 f"{fit * bs:,} tokens here ({sized['available']:,} B // {sized['bytes_per_block']:,} B per block); "
                 f"{tokens:,} tokens need more GPU memory, tensor parallelism"
                 + (" or --kv-cache-dtype fp8" if not sized.get("fp8") and blocks_flag == "--num-gpu-blocks-override" else ""))
        fix, level = {"setting": "--kv-cache", "value": None, "action": "delete"}, "error"
    else:
        said += f". It fits: {need / GiB:.2f} GiB of the {sized['available'] / GiB:.2f} GiB this GPU leaves the KV cache"
    return said, fix, level


INVENTED_ENV: dict[str, tuple[str | None, str]] = {
    # no real setting: what it would mean depends on the version and the launch (use_prefill_advice)
    "VLLM_USE_PREFILL": (None, "VLLM_USE_PREFILL is not read by any vLLM release: setting it does nothing "
                         "(vLLM has no 'prefill prefetch'); delete it"),
    "VLLM_LOG_LEVEL": ("VLLM_LOGGING_LEVEL", "VLLM_LOG_LEVEL is not read by any vLLM release; the real variable "
                       "is VLLM_LOGGING_LEVEL (0.4.3+)"),
}
_FALSY = ("false", "0", "no", "off", "")


def use_prefill_advice(value: str | None, version: str, enables: bool | None) -> tuple[str, dict | None]:
    """What vLLM ``version`` does about chunked prefill, for an operator who wrote ``VLLM_USE_PREFILL=value``
    (a variable no release reads): (the sentence, the real flag that has the meant effect in that version, or
    None where none does). ``enables``: the launch's own --enable-chunked-prefill (True), its disabling form
    (False), or neither (None). Per vllm-flags.md: no chunked prefill before 0.4.0; off by default on V0
    (0.4.0-0.7.x; from 0.5.4 turned on by itself for --max-model-len > 32768 on CUDA, kept off by
    --enable-chunked-prefill=false); forced on for generative models on V1 0.8.0-0.11.0 (the disabling flag is
    overridden); on by default from 0.12.0, --no-enable-chunked-prefill turns it off."""
    from packaging.version import Version

    from vllm_doctor.versions import parse_version

    pv = parse_version(version) or Version("0.33.0")
    off = (str(value or "").split() or [""])[0].strip("'\"").lower() in _FALSY    # "False  # comment" is False
    if pv < Version("0.4.0"):
        return f"vLLM {version} has no chunked prefill at all", None
    if enables:
        state = "this launch turns chunked prefill on with --enable-chunked-prefill, and the variable does not change that"
        if pv >= Version("0.8.0") and pv < Version("0.12.0"):
            state += f" (on vLLM {version}'s V1 engine it is always on for generative models anyway)"
        return state, None
    if Version("0.8.0") <= pv < Version("0.12.0"):
        return (f"on vLLM {version}'s V1 engine chunked prefill is always on for generative models: "
                + ("no flag turns it off (--no-enable-chunked-prefill is overridden)" if off else "nothing to set")), None
    if pv >= Version("0.12.0"):
        if not off:
            return f"vLLM {version} turns chunked prefill on by default for generative models: nothing to set", None
        if enables is False:
            return "this launch already turns chunked prefill off with its own flag", None
        return (f"chunked prefill is on by default in vLLM {version}; only if it must be off (long prompts then hold "
                "up decoding: TTFT and ITL spikes): --no-enable-chunked-prefill",
                {"setting": "--no-enable-chunked-prefill", "value": None})
    # V0: 0.4.0 - 0.7.x, off by default
    if not off:
        return (f"chunked prefill is off by default in vLLM {version}; to turn it on: --enable-chunked-prefill",
                {"setting": "--enable-chunked-prefill", "value": "True" if pv < Version("0.4.3") else None})
    if pv < Version("0.5.4"):
        return f"chunked prefill is off in vLLM {version} unless --enable-chunked-prefill is given: nothing to set", None
    return (f"chunked prefill is off by default in vLLM {version} but turns itself on for --max-model-len above 32768 "
            "(CUDA); only to keep it off there: --enable-chunked-prefill false",
            {"setting": "--enable-chunked-prefill", "value": "false"})


INVENTED_MODULES: dict[str, tuple[str, str]] = {
    "vllm.bench_serving": ("vllm bench serve", "no module vllm.bench_serving exists in any vLLM wheel; the "
                           "benchmark is `vllm bench serve` (0.8.0+)"),
}

# V0-engine-only flags: on V1 (0.8.0-0.10.2) a non-default value falls back to V0 (or raises with
# VLLM_USE_V1=1); gone from 0.11.0 (V1 only), where VC004 reports them.
V0_ONLY = {
    "--preemption-mode": "V1 always preempts by RECOMPUTE",
    "--scheduler-delay-factor": "not used by the V1 scheduler",
    "--num-scheduler-steps": "multi-step scheduling is V0 only",
    "--use-v2-block-manager": "V0 block manager only",
    "--swap-space": "CPU swap is V0's SWAP preemption; V1 never swaps",
    "--max-num-partial-prefills": "non-default value falls back to V0 in 0.8.0-0.10.2",
    "--max-long-partial-prefills": "non-default value falls back to V0 in 0.8.0-0.10.2",
}

DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}
KV_DTYPES = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "bfloat16", "float16", "int8",
             "nvfp4", "turboquant"}


_VALUES: dict | None = None


def _values() -> dict:
    """vllm_doctor/data/vllm_flag_values.json (tools/extract_flag_values.py): each flag's argparse type and
    choices as vLLM's own parser of the examined release holds them."""
    global _VALUES
    if _VALUES is None:
        import json
        from importlib import resources

        _VALUES = json.loads(resources.files("vllm_doctor.data").joinpath("vllm_flag_values.json").read_text())
    return _VALUES


def choices_ever(flag: str) -> tuple[tuple[str, ...], str | None]:
    """(sorted choices of ``flag`` in any examined release's parser, the newest release that lists
    them), or ((), None) where no release has choices for it. vLLM's --quantization lists its choices up to
    0.10.2 (later releases take a string checked at start-up)."""
    from packaging.version import Version

    names: set[str] = set()
    newest = None
    for ver, table in sorted(_values()["versions"].items(), key=lambda kv: Version(kv[0])):
        got = (table.get(flag) or {}).get("choices") or []
        if got:
            names |= {c for c in got if c != "None"}
            newest = ver
    return tuple(sorted(names)), newest


_HUMAN_INT_RE = __import__("re").compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def _parses(kind: str, v: str) -> bool:
    """Whether argparse's ``type`` callable of this kind accepts ``v`` (int(), float(), vLLM's
    ``human_readable_int``: ``25.6k``, ``1K``; decimals with a binary suffix are rejected)."""
    try:
        if kind == "int":
            int(v)
        elif kind == "float":
            float(v)
        elif kind == "human_int":
            m = _HUMAN_INT_RE.fullmatch(v.strip())
            if m:
                return m.group(2) in "kmgt" or "." not in m.group(1)
            int(v)
        return True
    except ValueError:
        return False


_KIND_WORDS = {"int": "an integer", "float": "a number", "human_int": "an integer (or 32k, 1M: vLLM's human-readable form)"}


def _value_spec(flag: str, version: str) -> tuple[dict | None, bool, str | None]:
    """(the flag's type/choices as the table of the nearest examined release at or below ``version``
    holds them, whether its choices apply, that release). Each release's table is vLLM's own argparse
    (``how: argparse``, 0.26+) or its ``add_argument`` calls read with ast from the wheel (``how: ast``,
    0.2.7-0.25.1). Before the oldest examined release: its types, no choices. Choices apply when
    ``version`` is that release itself (or in the newest release's X.Y line), or the next examined
    release has the same choices (they did not change in between; a patch release can add one:
    0.4.2 added gptq_marlin to 0.4.1's --quantization)."""
    from packaging.version import Version

    from vllm_doctor.versions import parse_version

    vers = _values()["versions"]
    keys = sorted(vers, key=Version)
    pv = parse_version(version) or Version(keys[-1])
    below = [k for k in keys if Version(k) <= pv]
    if not below:
        spec = vers[keys[0]].get(flag)
        return ({k: v for k, v in spec.items() if k != "choices"} if spec else None), False, keys[0]
    at = below[-1]
    spec = vers[at].get(flag)
    if not spec or not spec.get("choices"):
        return spec, False, at
    nxt = next((k for k in keys if Version(k) > Version(at)), None)
    own = Version(at) == pv or (nxt is None and Version(at).release[:2] == pv.release[:2])
    stable = nxt is not None and set((vers[nxt].get(flag) or {}).get("choices") or ()) == set(spec["choices"])
    return spec, own or stable, at


def _judged_by(at: str | None, version: str) -> str:
    """Where the verdict comes from, when not from ``version``'s own table: '; judged by vLLM 0.4.3's
    parser, read from its source with ast'."""
    from packaging.version import Version

    from vllm_doctor.versions import parse_version

    pv = parse_version(version)
    if at is None or (pv is not None and Version(at) == pv):
        return ""
    how = _values().get("how", {}).get(at, "argparse")
    src = "its own argparse" if how == "argparse" else "its add_argument calls, read from its source with ast"
    return f"; judged by vLLM {_values().get('wheel', {}).get(at, at)}'s parser ({src})"


def argparse_problem(flag: str, value: str, version: str) -> tuple[str, object] | None:
    """What vLLM's argparse says about ``flag value``: ``invalid int value`` / ``invalid choice``, per the
    type and choices of that flag in the parser of the release (``vllm_flag_values.json``)."""
    spec, choices_apply, at = _value_spec(flag, version)
    if not spec:
        return None
    v = value.strip()
    if spec.get("none") and v in ("", "None"):
        return None
    if spec.get("auto") and (v.lower() == "auto" or v == "-1"):
        return None
    kind = spec.get("type")
    if kind and not _parses(kind, v):
        word = _KIND_WORDS[kind] + (" or auto" if spec.get("auto") else "") + (" or None" if spec.get("none") else "")
        argp = {"int": "int", "float": "float", "human_int": "human_readable_int"}[kind]
        return (f"{flag} {value}: argument {flag}: invalid {argp} value: {value!r} (vLLM's argparse exits at "
                f"start-up; it takes {word}{_judged_by(at, version)})", None)
    ch = spec.get("choices")
    if ch and choices_apply and v not in ch:
        shown = ", ".join(repr(c) for c in ch[:12]) + (", ..." if len(ch) > 12 else "")
        return (f"{flag} {value}: argument {flag}: invalid choice: {value!r} (choose from {shown}"
                f"{_judged_by(at, version)})", None)
    return None


def value_problem(flag: str, value: str, version: str) -> tuple[str, object] | None:
    """(message, suggested value) when ``version`` rejects ``value`` for ``flag``; None when fine."""
    from packaging.version import Version

    from vllm_doctor.versions import parse_version

    pv = parse_version(version) or Version("0.33.0")
    v = value.strip().strip("'\"")
    if "$" in v:
        return None
    if flag == "--kv-cache-dtype":
        prob = argparse_problem(flag, v, version)
        if prob:                              # suggest the fp8 spelling this release's choices have
            ch = _value_spec(flag, version)[0]["choices"]
            return prob[0], next((c for c in ("fp8", "fp8_e5m2", "fp8_e4m3") if c in ch and v.startswith("fp8")), "auto")
        if v not in KV_DTYPES and pv < Version("0.33.0") and not _value_spec(flag, version)[1]:
            return (f"--kv-cache-dtype {v}: not a KV cache dtype vLLM knows", "fp8")
    if flag == "--dtype" and v not in DTYPES:
        return (f"--dtype {v}: invalid choice (choose from {', '.join(sorted(DTYPES))})", "auto")
    if flag == "--preemption-mode" and v not in ("recompute", "swap"):
        return (f"--preemption-mode {v}: vLLM accepts recompute or swap", "recompute")
    if flag == "--gpu-memory-utilization":
        try:
            f = float(v)
        except ValueError:
            return (f"--gpu-memory-utilization {v}: not a number", 0.9)
        if not 0 < f <= 1:
            return (f"--gpu-memory-utilization {v}: must be in (0, 1] (a fraction, not a percentage)",
                    round(f / 100, 2) if 10 <= f <= 100 else 0.9)
    if flag == "--port" and not v.isdigit():
        extra = " (a missing space: the next flag was glued to the value)" if "--" in v else ""
        return (f"--port {v}: argument --port: invalid int value{extra}", int(v.split("--")[0]) if v.split("--")[0].isdigit() else 8000)
    if flag in ("--max-num-seqs", "--tensor-parallel-size", "--pipeline-parallel-size", "--block-size"):
        if not v.isdigit() or int(v) < 1:
            return (f"{flag} {v}: must be a positive integer", None)
    return argparse_problem(flag, v, version)
