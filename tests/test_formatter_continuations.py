"""Red team (issue 21, item 1): a client's value with newlines, written by vLLM's own
NewLineFormatter (tests/fixtures/vllm_formatter: the class from the 0.8.0 and 0.32.0 wheels, with
each version's format), repeats vLLM's genuine prefix on every line of the value. Those lines are
the value's: no event, fact or finding comes from them, in any wrapper, through the pipeline as
``diagnose`` and ``serve`` wire it and through ``vllm-doctor diagnose``; vLLM's own lines after
them are still read."""

from __future__ import annotations

import calendar
import json
import logging
from pathlib import Path

import pytest

from test_client_echo import REAL, _summary
from test_hostile_input import assert_nothing_from
from wrapping import diagnose_json, run, wrap

FIX = Path(__file__).parent / "fixtures" / "vllm_formatter"
FORMATS = {  # vllm/logger.py _FORMAT of each version (VLLM_LOGGING_PREFIX empty)
    "0.6.6": ("0.8.0", "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"),
    "0.8.0": ("0.8.0", "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"),
    "0.32.0": ("0.32.0", "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
                         "[%(fileinfo)s:%(lineno)d] %(message)s"),
}
WHEN = calendar.timegm((2026, 11, 30, 10, 0, 0))
OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.1 GiB of which 3.2 MiB is free."
# A client's value: a bare line (vLLM's prefix is added by the formatter) and a line with a
# logger prefix of its own, then an exception line and an engine's death.
VALUE = ("x\nGPU KV cache size: 16 tokens\n"
         "INFO 11-30 10:00:00 [kv_cache_utils.py:1] Maximum concurrency for 2048 tokens per request: 0.01x\n"
         f"torch.OutOfMemoryError: {OOM}\n"
         "(EngineCore_DP0 pid=1) ERROR 11-30 10:00:00 [core.py:1] EngineCore failed to start.\n"
         "RuntimeError: NCCL error: unhandled system error")


def _formatter(version: str) -> logging.Formatter:
    src, fmt = FORMATS[version]
    ns: dict = {"__name__": f"vllm_formatter_{src.replace('.', '_')}"}
    exec(compile((FIX / f"formatter-{src}.py.txt").read_text(), f"formatter-{src}.py", "exec"), ns)
    f = ns["NewLineFormatter"](fmt, "%m-%d %H:%M:%S")
    f.converter = time_gmtime
    return f


def time_gmtime(t):
    import time

    return time.gmtime(t)


def _line(version: str, path: str, lineno: int, level: int, msg: str, *args) -> list[str]:
    rec = logging.LogRecord("vllm.x", level, path, lineno, msg, args, None)
    rec.created, rec.msecs, rec.process, rec.vllm_process_name = WHEN, 0, 7, "APIServer"
    return _formatter(version).format(rec).split("\n")


# (version, vLLM source file, line, level, format, how many preemptions its own head counts)
MESSAGES = [
    ("0.6.6", "vllm/engine/async_llm_engine.py", 211, logging.INFO, "Added request %s.", 0),
    ("0.8.0", "vllm/v1/engine/async_llm.py", 204, logging.INFO, "Added request %s.", 0),
    ("0.32.0", "vllm/v1/engine/async_llm.py", 578, logging.INFO, "Added request %s.", 0),
    # entrypoints/openai/responses/harmony.py 0.32 (a harmony message's text, the model's output)
    ("0.32.0", "vllm/entrypoints/openai/responses/harmony.py", 279, logging.WARNING,
     "Invalid JSON in browser tool call, using error placeholder: %s", 0),
    # 0.32 v1/core/sched/scheduler.py: a request id in a DEBUG message of the scheduler
    ("0.32.0", "vllm/v1/core/sched/scheduler.py", 1, logging.DEBUG, "Finished sending KV transfer for request %s", 0),
]


def _hostile() -> list[str]:
    out = []
    for version, path, lineno, level, fmt, _ in MESSAGES:
        out += _line(version, path, lineno, level, fmt, VALUE)
    return out


def _preemption(version: str) -> list[str]:
    # core/scheduler.py 0.6.6-0.10.2, the request id holding the value: the head is vLLM's and counts
    return _line(version, "vllm/core/scheduler.py", 1770, logging.WARNING,
                 "Sequence group %s is preempted by %s mode because there is not enough KV cache space. This can affect the "
                 "end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache "
                 "memory. total_num_cumulative_preemption=%d", VALUE, "PreemptionMode.RECOMPUTE", 1)


WRAPPERS = ("plain", "cri", "cri-partial", "docker", "docker-partial", "kubectl", "process", "journald",
            "journald-iso", "blockquote", "compose")


def test_the_formatter_repeats_the_prefix_with_a_carriage_return():
    lines = _line("0.32.0", "vllm/v1/engine/async_llm.py", 578, logging.INFO, "Added request %s.", "a\nb")
    assert lines == ["(APIServer pid=7) INFO 11-30 10:00:00 [async_llm.py:578] Added request a\r",
                     "(APIServer pid=7) INFO 11-30 10:00:00 [async_llm.py:578] b."]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_no_event_from_a_client_value_written_by_vllms_formatter(wrapper, serve):
    pipe, events = run(wrap(wrapper, _hostile()), serve=serve, chunk=4096 if serve else 0)
    assert_nothing_from(pipe, events)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_genuine_lines_after_them_are_read(wrapper, serve):
    alone = _summary(*run(wrap(wrapper, REAL), serve=serve))
    assert _summary(*run(wrap(wrapper, _hostile() + REAL), serve=serve, chunk=4096 if serve else 0)) == alone


@pytest.mark.parametrize("version", ["0.6.6", "0.8.0"])
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_request_id_in_a_message_that_matchers_read(version, wrapper):
    """The request id's lines are the id's; the message's own words end up on its last line
    (after the id), so the preemption itself may go uncounted, never a fact from the id."""
    pipe, events = run(wrap(wrapper, _preemption(version)))
    assert {type(e).__name__ for e in events} <= {"Preemption"}
    assert pipe.state.preemptions_total <= 1 and pipe.state.oom_events_total == 0
    assert pipe.state.facts().get("kv_cache_tokens") is None
    assert {f.name for f in pipe.evaluate()} <= {"preemption-storm"}


@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_json_records_of_such_messages(serve):
    recs = [json.dumps({"levelname": logging.getLevelName(level), "filename": path.rsplit("/", 1)[1], "lineno": lineno,
                        "message": fmt % VALUE}) for _, path, lineno, level, fmt, _ in MESSAGES]
    pipe, events = run("\n".join(recs) + "\n", serve=serve)
    assert_nothing_from(pipe, events)


def test_diagnose_command(tmp_path):
    for wrapper in ("plain", "cri", "docker"):
        p = tmp_path / f"fmt-{wrapper}.log"
        p.write_text(wrap(wrapper, _hostile()))
        rep = diagnose_json(p)
        assert rep["findings"] == [] and rep["facts"].get("kv_cache_tokens") is None, (wrapper, rep["findings"])
