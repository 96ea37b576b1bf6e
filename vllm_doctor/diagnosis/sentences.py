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

from collections.abc import Callable, Iterable
from typing import Any

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
