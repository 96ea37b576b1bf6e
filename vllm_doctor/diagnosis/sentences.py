"""Sentences of the rules' messages that are built in Python instead of long conditionals in YAML.

A rule's YAML keeps its conditions, values and short templates; a sentence that chooses among
many wordings (one per case of a flag table, one per cause of an engine's death) is a function
here, registered once with :func:`sentence` in :data:`SENTENCES`. Every rule expression can call
it by name (expr.py adds SENTENCES to its function table), with the values it needs as
arguments: a sentence reads nothing but its arguments, so what it says is what the rule passed.
The loader refuses an expression longer than ``loader.MAX_EXPRESSION_CHARS``: a longer one
belongs here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from vllm_doctor.units import thousands
from vllm_doctor.versions import flag_exists, flag_ranges_text

#: name -> function; the names rules call (``unknown_flag_notes(uniq, vllm_version)``)
SENTENCES: dict[str, Callable[..., Any]] = {}


def sentence(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn`` under its name (once: a second function of the same name is an error)."""
    if fn.__name__ in SENTENCES:
        raise ValueError(f"sentence {fn.__name__} is registered twice")
    SENTENCES[fn.__name__] = fn
    return fn


def _unknown_flag_note(flag: str, real_flag: str | None, vllm_version: str | None) -> str:
    """What is true of one unknown flag, from the flag table of the examined vLLM releases."""
    if real_flag and not flag_ranges_text(real_flag):
        return "no vLLM version has this; meant: " + real_flag
    if real_flag and vllm_version:
        return (f"not a vLLM flag in this form: vLLM {vllm_version}"
                f"{' has ' if flag_exists(real_flag, vllm_version) else ' lacks '}{real_flag} ({flag_ranges_text(real_flag)})")
    if real_flag:
        return f"not a vLLM flag in this form; vLLM has {real_flag} in {flag_ranges_text(real_flag)}"
    if not flag_ranges_text(flag):
        return ("no vLLM release has this flag (0.3.3-0.33.0 examined): a plugin or platform flag, accepted only "
                "where that plugin is installed, or a typo")
    if vllm_version and flag_exists(flag, vllm_version):
        return (f"vLLM {vllm_version} has this flag, but the command that printed the error does not take it "
                "(another entry point or subcommand)")
    if vllm_version:
        return f"not in vLLM {vllm_version}; vLLM has it in {flag_ranges_text(flag)}"
    return (f"vLLM has it only in {flag_ranges_text(flag)}, so the vLLM that rejected it is outside those versions "
            "(this log does not show which it is), or the command was another entry point")


@sentence
def unknown_flag_notes(flags: Iterable[Any], vllm_version: str | None) -> str:
    """``--flag: what is true of it; ...`` for each UnknownFlag event (rule unknown-flag)."""
    return "; ".join(f"{e.flag}: {_unknown_flag_note(e.flag, e.real_flag, vllm_version)}" for e in flags)


@sentence
def engine_death_cause(cause: str | None, sched_frame: str | None, connector: str | None) -> str | None:
    """The cause of an engine's death that its traceback tells (rule engine-dead), or None."""
    if cause is None:
        return None
    if cause == "illegal-memory-access":
        return ("Cause: a CUDA illegal memory access: a kernel read or wrote outside its memory (a kernel bug for "
                "this model, GPU, attention backend or quantization, more rarely faulty hardware); the CUDA context "
                "is lost and the engine cannot go on.")
    if cause == "device-assert":
        return ("Cause: a CUDA device-side assert: a kernel's own check failed, mostly an index out of range (a "
                "token id outside the vocabulary, a bad sampling parameter or a kernel bug); the CUDA context is lost.")
    if cause == "scheduler-assertion":
        return (f"Cause: an assertion in vLLM's scheduler ({sched_frame}) failed: its bookkeeping of requests or KV "
                "cache blocks broke, a bug of this vLLM version, not a capacity problem.")
    return (f"Cause: the KV connector ({connector}) failed in the engine: its set-up, or a KV transfer to or from "
            "the other instance or store, did not complete.")


# What an exception's message holds that is one request's or one machine's, never the failure's:
# left out of a search (a client's request id finds nothing, and it is the client's data).
_SEARCH_NOISE = re.compile(
    r"\b(?:chat)?cmpl-[\w-]+"  # OpenAI request ids (cmpl-..., chatcmpl-...)
    r"|\b[A-Za-z]+-(?=[\w-]*\d)[0-9a-fA-F]{8,}[\w-]*"  # other prefixed ids (req-<hex>, embd-<uuid>)
    r"|\b(?=[0-9a-fA-F-]*\d)[0-9a-fA-F]{8,}(?:-[0-9a-fA-F]+)*\b"  # UUIDs (cut ones too), long hex
    r"|\b0[xX][0-9a-fA-F]+\b"  # addresses
    r"|(?:[A-Za-z]:\\|~|\.{1,2})?(?:[\\/][\w.@+~-]+){2,}[\\/]?"  # paths (two parts or more)
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"  # IPv4 addresses, with a port
    r"|\b[A-Za-z]+:\d+\b"  # a device (cuda:1) or host:port
    r"|(?<![\w.])[-+]?\d+(?:\.\d+)?(?:/\d+(?:\.\d+)?)?(?![\w.]\w)"  # numbers (a fraction: 1.5/22.05)
    r"|\^M|\r"  # a pasted carriage return
)
_PHRASE_TIDY = (
    (re.compile(r"^\s*(?:[KMGTP]i?B|[kMG]?bytes)\b"), ""),  # the unit of a number left out before it
    (re.compile(r"(?<!\w)['\"`]|['\"`](?!\w)|[(){}\[\]]"), " "),  # quotes and brackets (an apostrophe stays)
    (re.compile(r"\b\w+=\s*$|^\s*[,;:]?\s*\w+=(?=\s*$)"), ""),  # a key whose value was left out (pid=)
    (re.compile(r"\s+"), " "),
)
SEARCH_MESSAGE_CHARS = 80  # of the message's phrases, the last cut at a word
# a phrase between two left-out parts of a message tells something from 3 words or 16 characters on
# ("of which", "is free": too common to search; "User-specified max_model_len")
PHRASE_WORDS, PHRASE_CHARS = 3, 16


def _phrase_tells(phrase: str) -> bool:
    return len(phrase) >= PHRASE_CHARS or len(phrase.split()) >= PHRASE_WORDS


def _search_phrases(message: str) -> tuple[bool, list[str]]:
    """(the first phrase begins the message, the message's phrases between what
    :data:`_SEARCH_NOISE` leaves out: the first one, and each other one that :func:`_phrase_tells` something)."""
    phrases: list[str] = []
    first_at_start = False
    pieces, start = [], 0
    for m in _SEARCH_NOISE.finditer(message):
        pieces.append((start, message[start:m.start()]))
        start = m.end()
    pieces.append((start, message[start:]))
    for at, piece in pieces:
        for rx, by in _PHRASE_TIDY:
            piece = rx.sub(by, piece)
        piece = piece.strip(" .,;:-=")
        if at == 0 and piece:
            first_at_start = True
            phrases.append(piece)
        elif _phrase_tells(piece) and piece not in phrases:
            phrases.append(piece)
    return first_at_start, phrases


@sentence
def issue_search_term(exc_type: str, message: str | None) -> str:
    """What to search vLLM's issues for, for an exception (rules engine-dead and
    unexplained-error): quoted phrases, each worded as in the log (punctuation aside): its type
    (the last dotted part) with the message's words, leaving out what is one request's or one
    machine's (request ids, UUIDs, long hex, addresses, paths, numbers: a client's id finds
    nothing and is the client's data), at most :data:`SEARCH_MESSAGE_CHARS` of the message, the
    last phrase cut at a word. ``"KeyError: 'chatcmpl-2fd...'"`` gives ``"KeyError"``."""
    name = exc_type.rpartition(".")[2]
    first_at_start, phrases = _search_phrases(message or "")
    out = [name]
    budget = SEARCH_MESSAGE_CHARS
    for i, ph in enumerate(phrases):
        if len(ph) > budget:
            ph = ph[: budget + 1].rpartition(" ")[0].rstrip(" .,;:-")
            if not ph or not (_phrase_tells(ph) or i == 0 and first_at_start):
                break
        budget -= len(ph)
        if i == 0 and first_at_start:
            out[0] = f"{name}: {ph}"
        else:
            out.append(ph)
        if budget <= 0:
            break
    return " ".join(f'"{p}"' for p in out)


@sentence
def request_too_long_text(n: int, longest: int | None, limit: int | None, batched_bound: bool) -> str:
    """What happened to the requests too long to serve (rule request-too-long): ignored by V0's
    scheduler at its prompt limit (``batched_bound``), or rejected with HTTP 400."""
    plural = "request" if n == 1 else "requests"
    longest_text = "" if longest is None else f" (the longest {thousands(longest)} tokens"
    if batched_bound:
        if limit is None:
            limit_text = ""
        else:
            limit_text = f", limit {thousands(limit)})" if longest is not None else f" of {thousands(limit)}"
        return (f"vLLM's scheduler ignored {int(n)} {plural} whose prompt alone was over its prompt limit{longest_text}"
                f"{limit_text}: each finished with no output. With chunked prefill off that limit is min(max_model_len, "
                "max_num_batched_tokens), so a limit below the model's context is max_num_batched_tokens.")
    if longest is None:
        limit_text = ""
    else:
        limit_text = f", max_model_len {thousands(limit)})" if limit is not None else ")"
    return f"vLLM rejected {int(n)} {plural} for length{longest_text}{limit_text}: each got an error (HTTP 400) instead of an answer."


@sentence
def startup_oom_after_weights(graphs: bool, in_capture: bool, fit_ratio: float | None, oom_free_gib: float | None,
                              oom_tried_gib: float | None, oom_len: int | None, oom_mnbt: int | None) -> str:
    """Which start-up step ran out of memory after the weights loaded (rule startup-oom): CUDA
    graph capture, or the profiling run and how much of its batch fits."""
    if graphs:
        if in_capture:
            return "The traceback runs through CUDA graph capture: the graphs did not fit next to the weights and the KV cache."
        return ("The KV cache had been sized before it, so this is what comes after the profiling run: CUDA graph "
                "capture or warm-up.")
    text = ("No KV cache size was logged before it, so this is the profiling run of the longest batch (vLLM sizes the "
            "KV cache after it and captures CUDA graphs after that), not the weights nor CUDA graphs: its activations "
            "grow with the batch vLLM profiles (--max-num-batched-tokens, or --max-model-len where chunked prefill is "
            "off).")
    if fit_ratio is None:
        return text
    unsized = "" if oom_len or oom_mnbt else ": this log shows neither value, so no size can be computed"
    return text + (f" At most {math.floor(fit_ratio * 100):.0f}% of that batch fits in what was free "
                   f"({oom_free_gib:.2f} / {oom_tried_gib:.2f} GiB){unsized}.")


@sentence
def tensor_parallel_arithmetic(w_gib: float | None, tp_now: int, tp_need: int | None, max_ratio: float,
                               dev_gib: float | None, tensor_parallel_size: int | None,
                               parallel_size_seen: int | None) -> str:
    """How the tensor-parallel size that fits the weights was found (rule startup-oom)."""
    if tp_need is not None and w_gib is not None:
        return (f"{w_gib:.2f} GiB of weights per GPU x {int(tp_now)} GPUs / {int(tp_need)} GPUs = "
                f"{w_gib * tp_now / tp_need:.2f} GiB each, at most {int(max_ratio * 100)}% of the {dev_gib:.2f} GiB device")
    if tensor_parallel_size is not None:
        base = f"the next power of two above tensor_parallel_size {tensor_parallel_size}"
    elif parallel_size_seen:
        base = f"the next power of two above the {int(tp_now)} GPUs the worker processes show (at least {int(parallel_size_seen)})"
    else:
        base = "tensor_parallel_size 1 (the default; this log does not show it) x 2"
    return base + " (the size of the weights is not in this log)"


@sentence
def kv_capacity_buys(kv_cache_memory_bytes: int | None, gpu_memory_utilization: float | None, gmu_max: float,
                     kv_device: str | None, gmu_tokens: int | None, kv_cache_dtype: str | None,
                     kv_cache_tokens: int | None, seqs_each: str) -> str:
    """What each way of adding KV cache capacity buys (rule kv-capacity-bound), each ``;``-ended."""
    out = ""
    if not (kv_cache_memory_bytes is not None or gpu_memory_utilization is None or gpu_memory_utilization >= gmu_max
            or kv_device == "CPU"):
        gained = f"about {thousands(gmu_tokens)} KV cache tokens" if gmu_tokens else "5% of the device's memory for KV cache blocks"
        out += f" --gpu-memory-utilization +0.05 buys {gained};"
    if not (kv_cache_dtype not in (None, "auto") or kv_device == "CPU" or kv_cache_tokens is None):
        out += f" --kv-cache-dtype fp8 about doubles the {thousands(kv_cache_tokens)} tokens;"
    if kv_device != "CPU":
        out += " a larger --tensor-parallel-size leaves each GPU less of the weights, the rest goes to KV cache blocks;"
    if kv_cache_tokens is not None:
        out += f" another replica behind the load balancer adds its own {thousands(kv_cache_tokens)} tokens{seqs_each}."
    return out


@sentence
def kv_running_shrank(shrank: bool, counted_n: int | None, running_max: int | None, running_min: int | None,
                      waiting_max: int | None) -> str:
    """Running fell while the KV cache stayed full (rule kv-capacity-bound): what vLLM's preemption
    counter (``counted_n``: None where no source counts) says of it; ``""`` when it did not fall."""
    if not shrank:
        return ""
    fell = f"from {thousands(running_max)} to {thousands(running_min)} while the cache stayed full"
    if counted_n == 0:
        return (f" Running dipped {fell}, but vLLM counted no preemption in this window: requests finished, none "
                "was preempted.")
    if counted_n is None:
        return (f" Running fell {fell} and up to {thousands(waiting_max)} requests waited: running requests were "
                "probably preempted to make room (inferred: no source here counts preemptions).")
    return f" Running fell {fell}."


_RAISED_IN = {"engine-core": "the engine core", "worker": "a worker", "ray-actor": "a Ray worker actor",
              "api-server": "the API server"}
_PHASE = {"serving-step": "a model step while serving", "output-handler": "the output handler while serving",
          "loading": "weight loading", "profiling": "the memory profiling run", "kv-cache": "KV cache allocation",
          "graph-capture": "CUDA graph capture", "startup": "start-up", "worker-rpc": "its wait for a worker's step"}


@sentence
def exception_origin(raised_in: str | None, phase: str | None, ended: bool) -> str | None:
    """``raised in a worker during weight loading, which ended that process`` (rule engine-dead);
    None when neither the process nor the phase is known."""
    if raised_in is None and phase is None:
        return None
    return ("raised in " + _RAISED_IN.get(raised_in or "", "a vLLM process")
            + ("" if phase is None else " during " + _PHASE.get(phase, phase))
            + (", which ended that process" if ended else ""))


@sentence
def killed_by_signal(code: int | None) -> str | None:
    """What killed a vLLM process that exited with ``code`` < 0 (rule engine-dead), or None."""
    if code is None:
        return None
    if code == -4:
        return ("signal 4, SIGILL (illegal instruction): the CPU lacks an instruction this vLLM build or one of its "
                "kernels uses (a wheel built for newer CPU features, e.g. AVX-512 or AMX, than this CPU has, or a "
                "kernel that trips on this CPU model); run a vLLM build made for this CPU")
    if code == -9:
        return ('signal 9, SIGKILL: usually the kernel OOM killer (check `dmesg` or `journalctl -k` for "Out of '
                'memory: Killed process"; in Kubernetes the container is OOMKilled): give vLLM more memory or make it '
                "take less (fewer concurrent sequences, a smaller KV cache)")
    return "signal " + str(-code) + " (see `kill -l " + str(-code) + "`)"
