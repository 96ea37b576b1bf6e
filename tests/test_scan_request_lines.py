"""What vLLM <= 0.9 writes per request stays in C (issue 26 item 10): V0's ``Received request %s:
prompt: %r, params: SamplingParams(..., seed=None, ...)`` holds Namespace's ``=None, ``, which the
continuation pieces of a hard-wrapped args echo are found by. Scanned for in every line, it made
every request line of a V0 log a candidate of the keyword scan (36,417 of 144,184 lines of a 100 MiB
log of bench/gen_log.py --shape v0, against 1,616 now). Those literals count only in the lines right
after an ``args: Namespace(`` (parsers.records.NEAR_KEYWORDS), and are looked for only there."""

from __future__ import annotations

from conftest import FIXTURES
from vllm_doctor.ingest.envelope import candidate_spans
from vllm_doctor.parsers.records import keyword_scanner

CORPUS = FIXTURES / "corpus" / "logs"


def _request_lines() -> list[bytes]:
    """Real V0 request lines (corpus 113: 0.4.1, corpus 164: 0.8.5) holding ``seed=None, ``."""
    out = []
    for name in ("113-v0.4.1-received-request-cjk-prompt-slow-healthy.log",
                 "164-v0.8.5-cpu-v0-received-request-chatml-prompt-prefix-cache-hit-rate.log"):
        out += [ln for ln in (CORPUS / name).read_bytes().splitlines() if b"Received request" in ln]
    assert len(out) == 2 and all(b"seed=None, " in ln for ln in out)
    return out


def test_v0_request_lines_are_no_candidates_of_the_scan():
    block = b"\n".join(_request_lines() * 50)
    assert keyword_scanner().line_ends(block)[0] == []
    starts, _ends, _idx, n, _carry = candidate_spans(keyword_scanner(), block, 0, len(block))
    assert (len(starts), n) == (0, 100)


def test_the_pieces_of_a_hard_wrapped_args_echo_still_are():
    # corpus 048 (0.5.4): the echo hard-wrapped over two lines, after request lines
    echo = (CORPUS / "048-v0.5.4-startup-args-namespace-hardwrap-hang.log").read_bytes().splitlines()
    piece = next(i for i, ln in enumerate(echo) if b"args: Namespace(" in ln)
    assert b"args: Namespace(" not in echo[piece + 1] and b"=None, " in echo[piece + 1]
    lines = [*_request_lines() * 10, echo[piece], echo[piece + 1]]
    block = b"\n".join(lines)
    ends = keyword_scanner().line_ends(block)[0]
    got = [block[block.rfind(b"\n", 0, e) + 1:e] for e in ends]
    assert got == [echo[piece], echo[piece + 1]]
    # the 16th line after the echo is one (8 pieces, each at most 2 lines after the one before), the 21st is not
    far = b"\n".join([echo[piece], *[b"x"] * 15, echo[piece + 1], *[b"x"] * 4, echo[piece + 1]])
    assert len(keyword_scanner().line_ends(far)[0]) == 2
