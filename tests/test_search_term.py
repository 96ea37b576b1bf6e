"""The search term that rules engine-dead and unexplained-error give for an exception
(diagnosis/sentences.issue_search_term), on the real exceptions of the corpus: the exception
messages the parser reads from tests/fixtures/corpus/logs (their golden event dumps,
tests/fixtures/events/corpus, checked against the logs by test_golden_events)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.diagnosis.sentences import SENTENCES, issue_search_term
from vllm_doctor.pipeline import Pipeline

FIX = Path(__file__).resolve().parent / "fixtures"
DUMPS = FIX / "events" / "corpus"


def _exceptions() -> list[tuple[str, str, str]]:
    """(log, exception type, message) of every ExceptionRaised with a message in the corpus."""
    out = []
    for f in sorted(DUMPS.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            if d["event"] == "ExceptionRaised" and d["message"]:
                out.append((d["source"], d["exc_type"], d["message"]))
    return out


EXCEPTIONS = _exceptions()


def _message_of(prefix: str, index: int = 0) -> tuple[str, str]:
    got = [(t, m) for s, t, m in EXCEPTIONS if s.startswith(prefix)]
    return got[index]


@pytest.mark.parametrize("log, term", [
    # a client's request id is the whole message: nothing of it is searched for
    ("265-", '"KeyError"'),
    # numbers, a device and the sizes left out; the type only on the phrase that begins the message
    ("010-", '"OutOfMemoryError: CUDA out of memory. Tried to allocate" "has a total capacty of" "is free. Process"'),
    ("069-", '"ValueError: Free memory on device" "on startup is less than desired GPU memory utilization"'),
    # a wrapper's address and pid before vLLM's words: the type stands alone
    ("050-", '"ValueError" "User-specified max_model_len" "is greater than the derived max_model_len"'),
    # a cut UUID (an engine id)
    ("272-", '"RuntimeError: Remote NIXL agent engine ID mismatch. Expected"'),
    # cut at a word
    ("228-", '"AsyncEngineDeadError: Task finished unexpectedly. This should never happen! Please open an issue on"'),
    ("200-", '"RuntimeError: CUDA error: no kernel image is available for execution on the device"'),
])
def test_search_term_of_real_corpus_exceptions(log, term):
    assert issue_search_term(*_message_of(log)) == term


def test_search_term_leaves_out_ids_addresses_paths_and_numbers():
    assert issue_search_term("KeyError", "'cmpl-8e2b1f0c9d6a4f3e8b7a6c5d4e3f2a1b-0'") == '"KeyError"'
    assert issue_search_term("vllm.v1.engine.exceptions.EngineDeadError", "") == '"EngineDeadError"'
    assert issue_search_term(
        "RuntimeError", "request 3f2504e0-4f89-11d3-9a0c-0305e82c3301 of tensor at 0x7f3a2c001000 in "
        "/home/user/vllm/worker.py failed after 12 steps") == '"RuntimeError: request" "of tensor at"'  # "failed after": too common
    assert issue_search_term("FileNotFoundError", "No such file or directory: "
                             "'/models/llama/model-00002-of-00004.safetensors'") == '"FileNotFoundError: No such file or directory"'


# what a search term never holds: a request id, a UUID or long hex, an address, a path, a number
_NOISE = re.compile(r"cmpl-|\b[0-9a-f]{8,}\b|0x[0-9a-f]|/\w+/|(?<![\w.])\d")


@pytest.mark.parametrize("source, exc_type, message", EXCEPTIONS, ids=[f"{s[:4]}{i}" for i, (s, _, _) in enumerate(EXCEPTIONS)])
def test_every_corpus_search_term_is_the_logs_words_without_noise(source, exc_type, message):
    term = issue_search_term(exc_type, message)
    assert not _NOISE.search(term), term
    phrases = re.findall(r'"([^"]*)"', term)
    assert phrases and " ".join(f'"{p}"' for p in phrases) == term
    name = exc_type.rpartition(".")[2]
    assert phrases[0] == name or phrases[0].startswith(name + ": ")
    # each phrase is the log's own words, in their order (punctuation aside): a search finds it
    words = re.findall(r"\w+", name + " " + message)
    for i, p in enumerate(phrases):
        pw = re.findall(r"\w+", p)
        if i == 0 and p != name:  # the type, then the message's first words
            assert words[: len(pw)] == pw, (p, message)
        else:
            assert any(words[k: k + len(pw)] == pw for k in range(len(words))), (p, message)
    assert sum(len(p) for p in phrases[1:]) + len(phrases[0]) - len(name) <= 80 + 2


def test_engine_dead_next_step_searches_without_the_request_id():
    """Corpus 265: the V0 engine loop's KeyError of an aborted request's id (client data)."""
    assert SENTENCES["issue_search_term"] is issue_search_term
    log = next((FIX / "corpus" / "logs").glob("265-*.log"))
    p = Pipeline(load_rules(), follow=False, base_year=2025)
    p.run_files([(log.name, [log.read_bytes()])])
    (f,) = [f for f in p.report().findings if f.name == "engine-dead"]
    (step,) = [c for c in f.checks if "search vLLM's issues" in c]
    assert step.endswith('search vLLM\'s issues for "KeyError".')
    assert "chatcmpl" not in " ".join(f.checks)
