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

import re
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
