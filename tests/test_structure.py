"""Issue 25 items 1-3: a traceback is known by its structure (the process that raised it, the
phase, whether the run ended), never a silent all-clear, host logging formats read, numbers of
every sign and facts stated in the log. The frames are those of vLLM's released sources (0.6.3
engine/async_llm_engine.py, engine/multiprocessing/engine.py; 0.11.0 v1/engine/core.py,
v1/executor/multiproc_executor.py, v1/worker/gpu_worker.py, gpu_model_runner.py)."""

from __future__ import annotations

import pytest

from vllm_doctor.diagnosis import load_rules
from vllm_doctor.pipeline import Pipeline

RULES = load_rules()
SITE = "/usr/local/lib/python3.12/dist-packages/vllm"


def run(text: str):
    evs: list = []
    p = Pipeline(RULES, follow=False, base_year=2025)
    p.on_event = evs.append
    p.run([("x.log", [text.encode()])])
    return p.report(), evs


def excs(evs):
    return [e for e in evs if type(e).__name__ == "ExceptionRaised"]


def names(rep):
    return {f.name for f in rep.findings}


V1_WORKER_STEP = "\n".join([
    "(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671] WorkerProc hit an exception.",
    "(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671] Traceback (most recent call last):",
    f'(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671]   File "{SITE}/v1/executor/multiproc_executor.py", line 666, in worker_busy_loop',
    "(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671]     output = func(*args, **kwargs)",
    f'(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671]   File "{SITE}/v1/worker/gpu_worker.py", line 447, in execute_model',
    "(VllmWorker TP0 pid=3310) ERROR 10-02 11:20:01 [multiproc_executor.py:671] torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
])
V1_STARTUP_PROFILE = "\n".join([
    "(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708] Traceback (most recent call last):",
    f'(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708]   File "{SITE}/v1/engine/core.py", line 699, in run_engine_core',
    f'(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708]   File "{SITE}/v1/engine/core.py", line 199, in _initialize_kv_caches',
    f'(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708]   File "{SITE}/v1/worker/gpu_worker.py", line 263, in determine_available_memory',
    f'(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708]   File "{SITE}/v1/worker/gpu_model_runner.py", line 3417, in profile_run',
    f'(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708]   File "{SITE}/v1/worker/gpu_model_runner.py", line 3011, in _dummy_run',
    "(EngineCore_DP0 pid=81) ERROR 10-02 11:20:01 [core.py:708] RuntimeError: shape mismatch",
])
# V1's busy loop runs a dummy batch on an idle data-parallel rank: a serving loop decides over _dummy_run
V1_BUSY_LOOP_DUMMY = "\n".join([
    "Traceback (most recent call last):",
    f'  File "{SITE}/v1/engine/core.py", line 711, in run_engine_core',
    f'  File "{SITE}/v1/engine/core.py", line 738, in run_busy_loop',
    f'  File "{SITE}/v1/engine/core.py", line 1101, in execute_dummy_batch',
    f'  File "{SITE}/v1/worker/gpu_model_runner.py", line 3011, in _dummy_run',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.19 GiB is free.",
])


C14 = "(EngineCore_DP0 pid=412) ERROR 03-02 08:10:11 [core.py:938]"
C25 = "(EngineCore pid=51) ERROR 08-01 09:00:02 [core.py:1233]"
U14 = "(EngineCore_DP0 pid=412) ERROR 03-02 08:10:11 [core.py:1023]"
# vLLM 0.14 v1/engine/core.py: run_engine_core's handler logs the error at ERROR (line 938,
# "EngineCore encountered a fatal error.") and re-raises it; an excerpt often keeps only the last lines.
CORE_FATAL_EXC_ONLY = "\n".join([
    f"{C14}     raise RuntimeError(\"CUDA driver error: unknown error\")",
    f"{C14} RuntimeError: CUDA driver error: unknown error",
])
# the engine core's multiproc executor waiting for its workers' reply (0.25 multiproc_executor.py
# FutureWrapper._wait_for_response, collective_rpc's get_response), the excerpt cut at both ends
CORE_FATAL_RPC_WAIT_CUT = "\n".join([
    f'{C25}   File "{SITE}/v1/executor/multiproc_executor.py", line 380, in collective_rpc',
    f"{C25}     result = get_response()",
    f'{C25}   File "{SITE}/v1/executor/multiproc_executor.py", line 95, in _wait_for_response',
    f"{C25}     response = self.aggregate(self.get_response())",
])
# the same module's handler of a utility call ("Invocation of %s method failed") carries on
CORE_UTILITY_FAILED = "\n".join([
    f"{U14} Invocation of reset_prefix_cache method failed",
    f"{U14} Traceback (most recent call last):",
    f'{U14}   File "{SITE}/v1/engine/core.py", line 1017, in _handle_client_request',
    f"{U14} ValueError: bad argument",
])


@pytest.mark.parametrize("text,raised_in,phase,ended", [
    (V1_WORKER_STEP, "worker", "serving-step", False),
    (V1_STARTUP_PROFILE, "engine-core", "profiling", True),
    (V1_BUSY_LOOP_DUMMY, "engine-core", "serving-step", True),
    # the engine core's module logging at ERROR is its fatal handler, unless a frame shows one that carries on
    (CORE_FATAL_EXC_ONLY, "engine-core", None, True),
    (CORE_FATAL_RPC_WAIT_CUT, "engine-core", "worker-rpc", True),
    (CORE_UTILITY_FAILED, "engine-core", None, False),
])
def test_a_traceback_is_classified_by_its_frames(text, raised_in, phase, ended):
    _, evs = run(text)
    (e,) = excs(evs)
    assert (e.raised_in, e.phase, e.ended) == (raised_in, phase, ended)


def test_workerproc_exception_while_serving_is_engine_death_with_its_cause():
    rep, _ = run(V1_WORKER_STEP)
    (f,) = [f for f in rep.findings if f.name == "engine-dead"]
    assert f.values["cause"] == "illegal-memory-access"
    assert "a worker during a model step while serving" in f.message
    assert any("CUDA_LAUNCH_BLOCKING=1" in c for c in f.checks)


def test_oom_in_a_serving_loop_is_runtime_even_through_dummy_run():
    rep, _ = run(V1_BUSY_LOOP_DUMMY)
    assert "runtime-oom" in names(rep) and "startup-oom" not in names(rep)


def test_a_wrapped_exception_line_without_prefix_closes_the_open_traceback():
    _, evs = run("\n".join([
        "(EngineCore_DP0 pid=7) ERROR 05-01 14:39:06 [core.py:720] Traceback (most recent call last):",
        f'(EngineCore_DP0 pid=7) ERROR 05-01 14:39:06 [core.py:720]   File "{SITE}/v1/engine/core.py", line 738, in run_busy_loop',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.",
    ]))
    (e,) = excs(evs)
    assert e.phase == "serving-step" and e.raised_in == "engine-core"
    (oom,) = [x for x in evs if type(x).__name__ == "OutOfMemory"]
    assert oom.phase == "runtime"


def test_old_background_loop_callback_is_engine_death():
    rep, _ = run("\n".join([
        "Exception in callback functools.partial(<function _log_task_completion at 0x7f>, error_callback=<bound method AsyncLLMEngine._error_callback of <vllm.engine.async_llm_engine.AsyncLLMEngine object at 0x7f>>)",
        "Traceback (most recent call last):",
        f'  File "{SITE}/engine/async_llm_engine.py", line 58, in _log_task_completion',
        f'  File "{SITE}/engine/async_llm_engine.py", line 930, in run_engine_loop',
        "KeyError: 17",
    ]))
    assert "engine-dead" in names(rep)


def test_an_engine_core_error_with_its_traceback_cut_off_is_engine_death():
    rep, _ = run(CORE_FATAL_EXC_ONLY)
    assert names(rep) == {"engine-dead"}
    rep, _ = run(CORE_UTILITY_FAILED)
    assert names(rep) == {"unexplained-error"}


def test_engine_death_on_a_cut_traceback_says_so_without_an_empty_message():
    rep, _ = run(CORE_FATAL_RPC_WAIT_CUT)
    (f,) = rep.findings
    assert f.name == "engine-dead"
    assert ("the first error raised was a traceback cut before its exception line (line 1, raised in the engine core"
            " during its wait for a worker's step, which ended that process)") in f.message
    assert "  " not in f.message and ": (" not in f.message
    assert "worker processes' own output" in f.checks[0]
    assert not any('search vLLM\'s issues for "(traceback cut' in c for c in f.checks)


# V0 MQLLMEngine (0.6.3 engine/multiprocessing/engine.py start(): logger.exception(repr(e))) logs the
# exception's repr at ERROR when its engine loop ends; AsyncLLMEngine's only ERROR traceback is
# _log_task_completion's "Engine background task failed"
@pytest.mark.parametrize("text", [
    "ERROR 03-02 08:10:11 [engine.py:160] KeyError('seq-17')",
    "\n".join([
        "ERROR 03-02 08:10:11 [async_llm_engine.py:66]   File \"/opt/vllm/worker/model_runner.py\", line 1650, in execute_model",
        "ERROR 03-02 08:10:11 [async_llm_engine.py:66] RuntimeError: CUDA error: unspecified launch failure",
    ]),
    # a hard wrap inside the frame line cuts its function name off; the excerpt ends in the traceback
    "\n".join([
        "(EngineCore_0 pid=9) ERROR 09-08 09:02:44 [core.py:718]   File \"/usr/lib/vllm/executor/uniproc_executor.py\", line 4",
        "9, in _init_executor",
    ]),
])
def test_the_v0_engine_modules_and_a_cut_core_traceback_are_the_engine_ending(text):
    rep, evs = run(text)
    (e,) = excs(evs)
    assert (e.raised_in, e.ended) == ("engine-core", True)
    assert names(rep) == {"engine-dead"}


def test_a_logging_config_format_with_level_pid_and_file_is_read():
    rep, evs = run("\n".join([
        "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64]   File \"/opt/vllm/worker/worker_base.py\", line 327, in execute_model",
        "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: Error in model execution: "
        "CUDA error: an illegal memory access was encountered",
    ]))
    (e,) = excs(evs)
    assert (e.meta.level, e.raised_in, e.phase, e.ended) == ("ERROR", "engine-core", "serving-step", True)
    (f,) = rep.findings
    assert f.name == "engine-dead" and f.values["cause"] == "illegal-memory-access"


def test_the_model_length_a_rejection_states_is_a_fact():
    rep, _ = run("vllm.exceptions.VLLMValidationError: This model's maximum context length is 131072 tokens. However, you requested 0 "
                 "output tokens and your prompt contains at least 131073 input tokens, for a total of at least 131073 tokens.")
    assert names(rep) == {"request-too-long"} and rep.facts["max_model_len"] == 131072
    # V0's scheduler limit may be max_num_batched_tokens: not the model's length
    rep, _ = run("WARNING 02-13 07:19:11 scheduler.py:949] Input prompt (32889 tokens) is too long and exceeds limit of 2048")
    assert rep.facts["max_model_len"] != 2048


def test_an_error_no_rule_explains_is_never_an_all_clear():
    rep, _ = run("\n".join([
        "INFO 09-02 06:44:03 [__init__.py:245] No platform detected, vLLM is running on UnspecifiedPlatform",
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "/app/server/__main__.py", line 164, in <module>',
        "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
    ]))
    (f,) = rep.findings
    assert f.name == "unexplained-error" and f.severity == "warning"
    assert "ImportError" in f.message and "ended that process" in f.message
    assert f.checks


def test_fallback_is_silent_when_another_rule_explains():
    rep, _ = run("(EngineCore_DP0 pid=972) ERROR 01-28 15:59:42 [core.py:935] ValueError: Free memory on device cuda:0 "
                 "(20.53/22.05 GiB) on startup is less than desired GPU memory utilization (0.95, 20.95 GiB). Decrease "
                 "GPU memory utilization or reduce GPU memory used by other processes.")
    assert names(rep) == {"startup-oom"}
    # the utilization the error states is a fact of the log, not the version's default
    assert rep.facts["gpu_memory_utilization"] == 0.95


@pytest.mark.parametrize("line", [
    "[2025-03-01 12:00:05,123] [ WARNING]: Sequence group 5 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. total_num_cumulative_preemption=51 (scheduler.py:1560)",
    "2025-07-08 17:24:00 - vllm.core.scheduler - WARNING - Sequence group 5 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. total_num_cumulative_preemption=51",
    "2023-12-27 11:25:36 | WARNING | stderr | Sequence group 5 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. total_num_cumulative_preemption=51",
])
def test_host_logging_formats_are_read(line):
    rep, evs = run(line)
    (e,) = [x for x in evs if type(x).__name__ == "Preemption"]
    assert e.cumulative == 51 and e.meta.level == "WARNING"
    assert "log-unread" not in names(rep)


def test_vllm_lines_behind_an_unknown_prefix_are_reported_unread():
    rep, evs = run("2025/03/01 12:00:00.123 | WARN | Sequence group 5 is preempted by PreemptionMode.RECOMPUTE mode "
                   "because there is not enough KV cache space. total_num_cumulative_preemption=51")
    assert [type(e).__name__ for e in evs] == ["UnreadLine"]
    (f,) = rep.findings
    assert f.name == "log-unread" and "2025/03/01 12:00:00.123 | WARN |" in f.message


def test_a_label_before_the_logger_prefix_is_taken_off_the_traceback_lines():
    _, evs = run("\n".join([
        "kserve-container WARNING 09-02 06:44:03 [_custom_ops.py:20] Failed to import from vllm._C with ImportError('libcuda.so.1: cannot open shared object file')",
        "kserve-container Traceback (most recent call last):",
        f'kserve-container   File "{SITE}/v1/engine/core.py", line 711, in run_engine_core',
        "kserve-container RuntimeError: boom",
    ]))
    (e,) = excs(evs)
    assert e.exc_type == "RuntimeError" and e.frames == ("run_engine_core",) and e.ended


def test_k9s_box_borders_are_a_wrapper():
    _, evs = run("│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error: an illegal memory access was encountered          │")
    (e,) = excs(evs)
    assert e.exc_type == "RuntimeError" and e.message.endswith("was encountered")


@pytest.mark.parametrize("text,avail", [
    ("(VllmWorker rank=0 pid=5521) INFO 03-03 10:12:40 [gpu_worker.py:276] Available KV cache memory: -2.57 GiB", -2.57),
    ("INFO 02-11 10:17:54 [worker.py:294] model weights take 60.10GiB; non_torch_memory takes 0.16GiB; PyTorch activation "
     "peak memory takes 4.50GiB; the rest of the memory reserved for KV Cache is -1.41GiB.", -1.41),
])
def test_a_negative_kv_cache_budget_is_read_and_is_a_startup_oom(text, avail):
    rep, _ = run(text)
    assert rep.facts["available_kv_cache_bytes"] == round(avail * 2**30)
    assert "startup-oom" in names(rep)


@pytest.mark.parametrize("line,code,signal", [
    ("Jan 28 10:40:10 localhost systemd[1]: vllm.service: Main process exited, code=exited, status=1/FAILURE", 1, None),
    ("Jan 28 10:40:10 localhost systemd[1]: vllm.service: Main process exited, code=killed, status=9/KILL", None, 9),
    ("vllm-1 exited with code 137", 137, 9),
    ("Killed", None, 9),
    ("Segmentation fault (core dumped)", None, 11),
])
def test_an_abnormal_exit_is_never_an_all_clear(line, code, signal):
    rep, evs = run(line)
    (e,) = [x for x in evs if type(x).__name__ == "ProcessExited"]
    assert (e.exit_code, e.signal) == (code, signal)
    (f,) = rep.findings
    assert f.name == "unexplained-error" and "ended abnormally" in f.message
