"""Every matcher's real example lines, through the whole pipeline (``Pipeline.feed``) under every
wrapper a vLLM log arrives in, give the same events; the prefilter is derived from the matcher
table, so a matcher whose examples pass here fires in ``diagnose`` and ``serve`` alike."""

from __future__ import annotations

import pytest

from vllm_doctor.ingest.envelope import Envelope, LogClock
from vllm_doctor.parsers.records import MATCHERS, keyword_scanner, prefilter_keywords

from wrapping import WRAPPERS, run, shape

EXAMPLES = [(m.name, i, line) for m in MATCHERS for i, line in enumerate(m.examples)]


def test_every_matcher_declares_keywords_versions_source_and_examples():
    assert len(MATCHERS) >= 35
    for m in MATCHERS:
        assert m.keywords and m.versions and m.source and m.examples, m.name
    assert len({m.name for m in MATCHERS}) == len(MATCHERS)


@pytest.mark.parametrize("name,i,line", EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_example_is_matched_by_its_matcher_and_prefiltered(name, i, line):
    mt = next(m for m in MATCHERS if m.name == name)
    assert any(k in line for k in mt.keywords), "an example holds one of its matcher's keywords"
    assert keyword_scanner().regex.search(line.encode())
    recs = Envelope(LogClock(2026)).records(1, line.encode())
    assert any((mt.regex.search(r.msg) if mt.search else mt.regex.match(r.msg)) for r in recs)
    assert all(k in prefilter_keywords() for k in mt.keywords)


@pytest.mark.parametrize("name,i,line", EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_example_gives_the_same_events_under_every_wrapper(name, i, line):
    _, plain = run(line + "\n")
    assert plain, f"{name}: its example gives no event through the pipeline"
    want = sorted(map(repr, map(shape, plain)))
    for kind in WRAPPERS:
        for serve in (False, True):
            _, got = run(__import__("wrapping").wrap(kind, [line]), serve=serve, chunk=7 if serve else 0)
            assert sorted(map(repr, map(shape, got))) == want, (kind, serve)


def test_all_examples_together_under_every_wrapper():
    lines = [line for _, _, line in EXAMPLES]
    _, plain = run("\n".join(lines) + "\n")
    want = [shape(e) for e in plain]
    from wrapping import wrap

    for kind in WRAPPERS:
        pipe, got = run(wrap(kind, lines))
        assert [shape(e) for e in got] == want, kind
        n = len(lines) * (2 if kind.endswith("partial") else 1)
        assert pipe.state.lines_total["vllm.log"] == n
