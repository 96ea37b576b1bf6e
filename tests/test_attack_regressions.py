"""Defects found by attacking the speed changes of the envelope, the parser's shape table and
the stats batch (issue 10): each test fails on the code before its fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wrapping import WRAPPERS, run, wrap

# V0's preemption warning (core/scheduler.py 0.4.3-0.10.2) names the sequence group by its
# request id, which from 0.6.4 is the client's X-Request-Id header verbatim, spaces included.
HOSTILE_ID = ("chatcmpl-x is preempted by PreemptionMode.SWAP mode because there is not enough KV cache space. "
              "total_num_cumulative_preemption=99999 y")
V0_PREEMPTED = ("WARNING 11-30 10:00:01 scheduler.py:1089] Sequence group {} is preempted by PreemptionMode.RECOMPUTE "
                "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
                "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
                "total_num_cumulative_preemption={}")
BANNER = "INFO 11-30 10:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.4) with config: model='m'"


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_v0_preemption_count_and_mode_are_vllms_not_the_request_ids(wrapper, serve):
    lines = [BANNER, V0_PREEMPTED.format(HOSTILE_ID, 1), V0_PREEMPTED.format("cmpl-2", 51)]
    pipe, events = run(wrap(wrapper, lines), serve=serve, chunk=4096 if serve else 0)
    pre = [e for e in events if type(e).__name__ == "Preemption"]
    assert [(e.mode, e.cumulative) for e in pre] == [("RECOMPUTE", 1), ("RECOMPUTE", 51)]
    assert pre[0].seq_id == HOSTILE_ID and pre[1].seq_id == "cmpl-2"
    assert pipe.state.preemptions_total == 51


DAMAGED = [
    "INFO 11-30 10:00:00 [loggers.py:1] Avg prompt throughput: 1.2.3 tokens/s, Avg generation throughput: 1.0 tokens/s, "
    "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%",
    "INFO 11-30 10:00:00 [loggers.py:1] Avg prompt throughput: . tokens/s, Avg generation throughput: 1.0 tokens/s, "
    "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%",
    "ERROR 11-30 10:00:01 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + "9" * 400
    + " GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free.",
]
REAL = ("(EngineCore_0 pid=1810465) ERROR 11-30 10:00:02 [core.py:712] ValueError: Free memory on device "
        "(7.34/139.72 GiB) on startup is less than desired GPU memory utilization (0.9, 125.75 GiB).")


@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_a_damaged_number_skips_its_matcher_not_the_log(serve):
    # float("1.2.3") / round(inf) in a builder used to raise out of the pipeline: diagnose
    # stopped with "internal error" and judged nothing
    pipe, events = run("\n".join(DAMAGED + [REAL]) + "\n", serve=serve)
    kinds = [type(e).__name__ for e in events]
    assert "SchedulerStats" not in kinds and "InsufficientFreeMemory" in kinds


def test_diagnose_command_reads_past_a_damaged_number(tmp_path):
    p = tmp_path / "damaged.log"
    p.write_text("\n".join(DAMAGED + [REAL]) + "\n")
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "json", "--fail-on", "never", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [f["name"] for f in json.loads(r.stdout)["findings"]] == ["startup-oom"]


# Prefixes that no wrapper of the envelope knows, put before every line by the tools that
# gather a pod's logs: ``kubectl logs --prefix`` and stern. uvicorn's access line (no vLLM
# logger prefix of its own) was then not known by its head: its path was parsed as vLLM's text.
UNKNOWN_PREFIXES = {"kubectl-prefix": "[pod/vllm-0/vllm] ", "stern": "vllm-0 vllm ", "labels": "{app=\"vllm\", pod=\"vllm-0\"} ",
                    "kubectl-prefix-timestamps": "[pod/vllm-0/vllm] 2026-11-30T10:00:00.123456789Z "}


@pytest.mark.parametrize("prefix", sorted(UNKNOWN_PREFIXES))
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_access_line_after_an_unknown_prefix_is_client_text(prefix, serve):
    from test_hostile_input import assert_nothing_from, hostile_lines

    pre = UNKNOWN_PREFIXES[prefix]
    pipe, events = run("".join(pre + ln + "\n" for ln in hostile_lines()), serve=serve, chunk=4096 if serve else 0)
    assert_nothing_from(pipe, events)
    # vLLM's own lines under the same prefix are still read
    pipe, events = run("".join(pre + ln + "\n" for ln in hostile_lines() + [REAL]), serve=serve)
    assert [type(e).__name__ for e in events] == ["ExceptionRaised", "InsufficientFreeMemory"]


@pytest.mark.parametrize("terms", [1500, 20000])
def test_a_too_deep_line_expression_is_a_rule_error_not_an_internal_error(terms):
    from vllm_doctor.diagnosis.expr import compile_line
    from vllm_doctor.errors import RuleLoadError

    with pytest.raises(RuleLoadError, match="nested too deeply"):
        compile_line(" + ".join(["num_running"] * terms) + " > 1", {"num_running"}, {})
    assert compile_line(" + ".join(["num_running"] * 50) + " > 60", {"num_running"}, {})(
        type("Line", (), {"num_running": 1})()) is False


@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_json_record_time_no_clock_gives_is_no_time(serve):
    # "timestamp": Infinity / NaN / 1e400 (json reads them) became the state's clock and the
    # windows' arithmetic raised: diagnose stopped with an internal error
    st = ("Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 5 reqs, "
          "Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%")
    rec = '{"timestamp": %s, "levelname": "INFO", "filename": "loggers.py", "lineno": 1, "message": "%s"}'
    times = ["1796032800.0", "Infinity", "-Infinity", "NaN", "1e400", "1" + "0" * 400, "true", "1e300", "1796032801.5"]
    pipe, events = run("".join(rec % (t, st) + "\n" for t in times), serve=serve)
    stats = [e for e in events if type(e).__name__ == "SchedulerStats"]
    assert [e.meta.ts for e in stats] == [1796032800.0] * 8 + [1796032801.5]
    pipe.evaluate()
