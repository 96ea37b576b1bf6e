"""Red team (issue 21, item 2): one line far ahead of the lines around it (a minute, an hour, a
month in vLLM's year-less prefix, a year in a container's or a JSON record's timestamp) is
flagged (``sources[].clock_jumps``) and does not move the windows: the report is the one of the
log without it, through ``diagnose`` and ``serve`` and the ``vllm-doctor diagnose`` command."""

from __future__ import annotations

from pathlib import Path

import pytest

from wrapping import diagnose_json, run, wrap

LOG = (Path(__file__).parent / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log").read_text().splitlines()
AT = 100  # the line it is put after (11-30 09:10:38)
KV = next(ln for ln in LOG if "CPU KV cache size: 4,096 tokens" in ln)  # 11-30 09:10:38 [kv_cache_utils.py:2327]
AHEAD = {"minute": "11-30 09:11:38", "hour": "11-30 10:10:38", "month": "12-29 09:10:38"}


def _with(line: str) -> list[str]:
    return LOG[:AT] + [line] + LOG[AT:]


def _summary(pipe) -> tuple:
    pipe.evaluate()
    rep = pipe.report()
    return (sorted(f.name for f in rep.findings), rep.facts.get("kv_cache_tokens"), rep.facts.get("max_num_seqs"))


@pytest.mark.parametrize("ahead", sorted(AHEAD))
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_a_line_ahead_does_not_move_the_windows(ahead, serve):
    alone, _ = run(wrap("plain", LOG))
    pipe, _ = run(wrap("plain", _with(KV.replace("11-30 09:10:38", AHEAD[ahead]))), serve=serve, chunk=4096 if serve else 0)
    if not serve:
        assert "kv-capacity-bound" in _summary(alone)[0]
        assert _summary(pipe) == _summary(alone)
    rep = pipe.report().to_dict()
    assert rep["sources"][0]["clock_jumps"] == 1
    assert rep["sources"][0]["clock_jump_lines"] == [AT + 1]
    assert pipe.state.now < 1796030000  # 2026-11-30 10:33 UTC: the log's own end, not the jump


@pytest.mark.parametrize("wrapper", ["cri", "docker", "json"])
def test_a_year_ahead_in_a_wrapper_timestamp(wrapper):
    text = wrap(wrapper, LOG)
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if "KV cache size" in ln)
    fwd = lines[i].replace("2026-11-30T09:10:38", "2027-11-30T09:10:38")
    assert fwd != lines[i]
    alone, _ = run(text)
    k = AT + 1
    pipe, _ = run("\n".join(lines[:k] + [fwd] + lines[k:]) + "\n")
    assert _summary(pipe) == _summary(alone)
    # (the wrapper stamps uvicorn's lines, which have no time, at 10:00: a jump of its own)
    before = alone.report().to_dict()["sources"][0].get("clock_jumps", 0)
    assert pipe.report().to_dict()["sources"][0]["clock_jumps"] == before + 1


def test_a_real_quiet_stretch_is_no_jump():
    """Lines an hour later that go on at that time: the step is real, nothing is flagged."""
    later = [ln.replace("11-30 09:1", "11-30 10:1") for ln in LOG[AT:]]
    pipe, _ = run(wrap("plain", LOG[:AT] + later))
    assert "clock_jumps" not in pipe.report().to_dict()["sources"][0]
    assert pipe.state.now > 1796029000


def test_serve_a_line_a_year_ahead_of_the_wall_clock_is_flagged_at_evaluation():
    from wrapping import pipeline

    pipe = pipeline(serve=True)
    pipe.feed("vllm.log", ("\n".join(LOG[:AT]) + "\n").encode())
    pipe.feed("vllm.log", (KV.replace("11-30 09:10:38", "12-29 09:10:38") + "\n").encode())
    pipe.evaluate(now=1796029000.0)  # the wall clock: the log's time
    assert pipe.report().to_dict()["sources"][0]["clock_jumps"] == 1
    assert pipe.state.now < 1796030000


def test_diagnose_command(tmp_path):
    p = tmp_path / "ahead.log"
    p.write_text("\n".join(_with(KV.replace("11-30 09:10:38", AHEAD["month"]))) + "\n")
    rep = diagnose_json(p)
    assert "kv-capacity-bound" in [f["name"] for f in rep["findings"]]
    assert rep["sources"][0]["clock_jumps"] == 1
