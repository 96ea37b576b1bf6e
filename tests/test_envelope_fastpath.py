"""The envelope's fast paths (a line with vLLM's head, a plain line) and the keyword scan give what
the general path gives: every line of the real logs, in every wrapper, and those lines damaged
(client text, glued prefixes, escapes, carriage returns, bad bytes, CRI and docker pieces)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vllm_doctor.ingest.envelope import Envelope, LineSplitter, LogClock, Record, candidate_spans
from vllm_doctor.parsers.records import keyword_scanner

from wrapping import wrap

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = sorted((FIXTURES / "logs").glob("*.log")) + sorted((FIXTURES / "corpus" / "logs").glob("*.log"))
WRAPPERS = ("plain", "cri", "cri-partial", "docker", "docker-partial", "kubectl", "json", "process",
            "journald", "journald-iso", "blockquote", "compose")
# What a line may hold that a fast path must hand to the general path (or handle as it would).
DAMAGE = [b"] ", b"]", b"\r", b"\x1b[36m", b"\x1b]0;t\x07", b"INFO 11-30 10:00:00 [a.py:1] ", b"(EngineCore pid=3) ",
          b"Received request x: prompt: 'CUDA out of memory', ", b"Request ", b"Request  x aborted. ",
          b' - "GET /v1/models?cudaErrorMemoryAllocation HTTP/1.1" 200', b"request_id=", b"kv_request_id=", b"| ",
          b"{", b"> ", b"  ", b"\t", b"\xff\xfe", b"\xc2\x85", b"\xc2\xa0", b"WARN 01-02 03:04:05 b.py:9] ",
          b"Nov 30 10:00:00 host vllm[1]: ", b"2026-11-30T10:00:00Z stdout P ", b"[dump_input.py:3] ",
          b"Dumping input data for V1 LLM engine", b"ERROR 12-31 23:59:59 [x.py:2]", b"INFO 02-30 10:00:00 [a.py:1] ",
          b"DEBUG 01-01 00:00:00.123 [v1/core/x.py:5] ", b"INFO:     ", b"(RayWorkerWrapper pid=5, ip=10.0.0.1] x) ",
          b"(", b")", b"pid=1)", b"CUDA out of memory", b"Traceback (most recent call last):"]


def _lines() -> list[bytes]:
    lines = [ln for p in LOGS for ln in p.read_bytes().split(b"\n")]
    rnd = random.Random(10)
    damaged = []
    for ln in rnd.choices(lines, k=6000):
        b = bytearray(ln)
        for _ in range(rnd.randint(1, 3)):
            i = 0 if rnd.random() < 0.3 else rnd.randint(0, len(b))
            b[i:i] = rnd.choice(DAMAGE)
        damaged.append(bytes(b))
    return lines + damaged


LINES = _lines()


def test_fast_paths_give_what_the_general_path_gives():
    fast, general = Envelope(LogClock(2026, 11)), Envelope(LogClock(2026, 11))
    taken = 0
    for n, raw in enumerate(LINES, 1):
        want = general._unwrap(n, raw.decode("utf-8", "replace"))
        got = fast.records(n, raw)
        assert got == want, raw
        assert all(type(r) is Record for r in got)
        taken += len(got)
    assert taken >= len(LINES)
    assert len(fast._heads) <= 1024  # the head cache is bounded


def test_fast_path_keeps_client_text_data():
    env = Envelope(LogClock(2026))
    head = "(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:43] "
    (rec,) = env.records(1, (head + "Received request cmpl-1: prompt: 'INFO 11-30 10:00:01 [a.py:1] CUDA out of memory'").encode())
    assert (rec.client, rec.msg, rec.src) == ("request-log", "Received request", "logger.py:43")
    (rec,) = env.records(2, (head + "Request chatcmpl-EngineDeadError aborted.").encode())
    assert (rec.client, rec.msg) == ("request-id", "Request")
    (rec,) = env.records(3, (head + '127.0.0.1:5000 - "GET /ncclSystemError HTTP/1.1" 404').encode())
    assert (rec.client, rec.msg) == ("access-log", "access log")
    (rec,) = env.records(4, (head + "rejecting new request request_id=x preempted 99999").encode())
    assert rec.client is None and rec.msg == "rejecting new request request_id="
    # the same head again (cached): the same treatment
    (rec,) = env.records(5, (head + "Received request cmpl-2: prompt: 'x'").encode())
    assert rec.client == "request-log" and rec.ts == env.clock.to_epoch(11, 30, "10:00:00")


@pytest.mark.parametrize("kind", WRAPPERS)
def test_scan_backends_agree_in_every_wrapper(kind):
    """Hyperscan and the re fallback select the same lines, whatever the block size."""
    hs = keyword_scanner()
    if hs.backend != "hyperscan":
        pytest.skip("Hyperscan is not available here")
    fallback = keyword_scanner()
    fallback._db = None
    text = "".join(wrap(kind, p.read_text(errors="replace").splitlines()) for p in LOGS[::4]).encode()

    def select(scanner, chunk):
        split, carry, out = LineSplitter(), False, []
        spans = [sp for i in range(0, len(text), chunk) for sp in split.feed(text[i:i + chunk])] + split.flush()
        for buf, a, b in spans:
            starts, ends, idxs, n, carry = candidate_spans(scanner, buf, a, b, carry=carry)
            out.append(([buf[s:e] for s, e in zip(starts, ends)], list(idxs), n, carry))
        return out

    for chunk in (1 << 20, 4099):
        got = select(hs, chunk)
        assert got == select(fallback, chunk)
        assert sum(len(c[0]) for c in got) > 0
