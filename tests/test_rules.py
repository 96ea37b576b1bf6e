"""Each rule fires on real logs that show its incident, with the values and fixes computed from
what the log shows, and stays silent on real logs that do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import LOGS, METRICS, diagnose_file, log


def findings(rep):
    return {f.name: f for f in rep.findings}


def fixes(f):
    return {fx.flag: fx.value for fx in f.fixes}


# ---- VD001 preemption-storm -------------------------------------------------------------------
def test_preemption_storm_v0_counts_from_cumulative_counter_not_lines():
    rep = diagnose_file(log("014"))
    f = findings(rep)["preemption-storm"]
    assert rep.facts["preemptions_total"] == 151  # one warning line, cumulative 151
    assert f.values["preempted"] == 151
    assert f.values["kv_peak"] == pytest.approx(0.992)
    # vLLM preempted with 34 running at 99.2 % (lines 1-2): --max-num-seqs 34 changes nothing, and the
    # KV cache size is not in the log (no never-preempt bound): no --max-num-seqs at all
    assert f.values["c"] is not None
    assert "--max-num-seqs" not in fixes(f) and "--max-num-seqs" not in fixes(findings(rep)["kv-capacity-bound"])
    assert fixes(f)["--gpu-memory-utilization"] == "0.95"
    assert [e.lineno for e in f.evidence][:2] == [1, 2]


def test_preemption_storm_unprefixed_v0_line():
    rep = diagnose_file(log("019"))
    assert rep.facts["preemptions_total"] == 101
    assert rep.engine == "v0"
    assert "preemption-storm" in findings(rep)


def test_preemption_storm_v1_from_metrics_capture():
    # The V1 log prints no preemption line; vLLM's own counter in /metrics says 105.
    rep = diagnose_file(log("cpu-preemption"), metrics_files=[str(METRICS / "vllm-0.32-cpu-preemption.txt")])
    f = findings(rep)["preemption-storm"]
    assert rep.facts["preemptions_total"] == 105
    assert f.values["preempted"] == 105
    # vLLM never ran more than 4 and preempted 105 times (4 ran at 100 %, line 138): 4 is no fix;
    # the never-preempt bound 4,096 / 2,048 = 2 (32 blocks of 128 / 16 per sequence) stops it, and leads
    assert fixes(f)["--max-num-seqs"] == "2"
    # requests really grew to 1,585 of the 2,048 tokens (line 125): at that length the cache holds 2,
    # the never-preempt bound too; counted (vLLM's counter), so the cut is given
    assert f.fixes[0].arithmetic == (
        "77.4% x 4,096 KV cache tokens / 2 running = 1,585 tokens per sequence at most (engine 0, "
        "cpu-preemption-tiny-kv-cache.log:125); 4,096 / 1,585 = 2 sequences, in whole blocks of 128 tokens; "
        "never-preempt bound: 4,096 KV cache tokens / max_model_len 2,048 = 2 (32 blocks of 128 tokens / 16 "
        "blocks per sequence); 4 were running when the KV cache was full (100.0%, engine 0, "
        "cpu-preemption-tiny-kv-cache.log:138) (max_num_seqs was 32)")
    assert f.fixes[0].why.startswith("The KV cache holds 2 sequences even if every one grows to max_model_len")
    assert f.fixes[0].grade == "counted"
    # kv-capacity-bound computes the same value with the same calculation: it is listed once
    kv = findings(rep)["kv-capacity-bound"]
    assert kv.values["c"] is not None and "--max-num-seqs" not in fixes(kv)
    assert "--max-num-seqs 2 also fixes this; it is listed under preemption-storm (VD001)" in kv.notes
    assert f.fixes[0].also_for == ["kv-capacity-bound"]
    # vllm:cache_config_info gives what vLLM resolved: block_size 128 on CPU, not the default 16
    assert rep.facts["block_size"] == 128 and "block_size" not in rep.facts_defaulted
    assert rep.facts["num_gpu_blocks"] == 32


@pytest.mark.parametrize("name", ["026", "052", "025", "cpu-basic", "039"])
def test_preemption_storm_silent_on_healthy(name):
    assert "preemption-storm" not in findings(diagnose_file(log(name)))


def test_v1_log_alone_reports_preemption_as_inferred():
    rep = diagnose_file(log("cpu-preemption"))
    assert rep.facts["preemptions_total"] is None
    assert rep.facts["preemptions_inferred"] is True
    f = findings(rep)["kv-capacity-bound"]
    assert "inferred" in f.message


# ---- VD002 startup-oom ------------------------------------------------------------------------
@pytest.mark.parametrize("name,flag,value", [
    ("004", "--max-model-len", "79392"),  # KV cache holds 79,392 tokens
    ("011", "--max-model-len", "435584"),  # 1,048,576 x 9.97/24.00, down to a multiple of 16
    ("cpu-startup-error-max-seq-len", "--max-model-len", "130944"),  # vLLM's own estimate
    ("cpu-startup-error-kv-cache-bigger", "--kv-cache-memory-bytes", "9769582592"),  # 90 % of 10.11 GiB, down to MiB
])
def test_startup_oom_fix_values(name, flag, value):
    f = findings(diagnose_file(log(name)))["startup-oom"]
    assert f.severity == "critical"
    assert fixes(f)[flag] == value


def test_startup_oom_another_process_holds_the_gpu_stop_it_first():
    # 008: 7.34 of 139.72 GiB free. 0.04 x 139.72 = 5.6 GiB holds no model whose weights the log
    # does not show: no such fraction; the first step is to find and stop what holds the rest
    f = findings(diagnose_file(log("008")))["startup-oom"]
    assert "--gpu-memory-utilization" not in fixes(f)
    assert f.checks_first and f.checks[0].startswith("Find what holds the other 132.4 GiB of this GPU (nvidia-smi")


def test_startup_oom_smaller_fraction_only_where_it_holds_the_weights(tmp_path):
    # the same refusal with the weights' size logged (vLLM's "Model loading took 3.2 GiB"): 0.04 x
    # 139.72 = 5.59 GiB >= 1.1 x 3.2 GiB, so the fraction is given, after stopping the other process
    text = log("008").read_text()
    loaded = "(EngineCore_0 pid=1810465) INFO 09-03 11:03:30 [gpu_model_runner.py:1892] Model loading took 3.2000 GiB and 2.1 seconds\n"
    p = tmp_path / "v.log"
    p.write_text(loaded + text)
    rep = diagnose_file(p)
    f = findings(rep)["startup-oom"]
    assert fixes(f)["--gpu-memory-utilization"] == "0.04"
    from vllm_doctor.report.render import verdict
    assert verdict(rep)["first"].startswith("Find what holds the other 132.4 GiB")
    assert "only if that cannot be done, restart vLLM with --gpu-memory-utilization 0.04" in verdict(rep)["first"]


def test_startup_oom_parallel_size_from_worker_processes():
    # 006 shows no configuration but two VllmWorkerProcess pids beside the driver: TP >= 3, in
    # practice 4, so "--tensor-parallel-size 2" (double the default) would be wrong: 8, as an assumption
    f = findings(diagnose_file(log("006")))["startup-oom"]
    assert fixes(f)["--tensor-parallel-size"] == "8"
    assert {x.flag: x.grade for x in f.fixes}["--tensor-parallel-size"] == "assumed"
    assert ("The worker processes in this log show the model already sharded over at least 3 GPUs (in practice 4: "
            "tensor-parallel sizes are powers of two)") in f.message
    assert rep_facts_parallel(log("006")) == 3  # V0: the driver (rank 0) beside two VllmWorkerProcess
    assert f.values["oom_tried_mib"] == pytest.approx(20.0)


def rep_facts_parallel(path) -> int | None:
    return diagnose_file(path).facts["parallel_size_seen"]


def test_startup_oom_not_engine_dead_when_explained():
    found = findings(diagnose_file(log("cpu-startup-error-max-seq-len")))
    assert "startup-oom" in found and "engine-dead" not in found


@pytest.mark.parametrize("name", ["039", "041", "066", "cpu-basic", "028"])
def test_startup_oom_silent_on_healthy_startups(name):
    assert not findings(diagnose_file(log(name)))


# ---- VD003 prefill-blocking -------------------------------------------------------------------
def test_prefill_blocking_v02():
    rep = diagnose_file(log("033"))
    f = findings(rep)["prefill-blocking"]
    assert f.values["n_stalled"] == 2
    assert f.values["gen_peak"] == pytest.approx(122.2)
    # 0.2 has no chunked prefill: --enable-chunked-prefill is named with the version that has it, and
    # a smaller --max-num-batched-tokens is not offered (without chunked prefill it must be >= max_model_len)
    # one fix: upgrade to the newest version any of them needs, and set them (a set, not notes)
    assert fixes(f) == {"vllm": ">=0.7.3", "--enable-chunked-prefill": "", "--long-prefill-token-threshold": "512",
                        "--max-num-partial-prefills": "2"}
    assert {x.relation for x in f.fixes} == {"set"} and {x.option for x in f.fixes} == {1}
    assert f.fixes[0].command() == "pip install -U 'vllm>=0.7.3'" and not f.notes
    assert [e.lineno for e in f.evidence] == [2, 3]


def test_prefill_blocking_fixes_on_v0_with_chunked_prefill(tmp_path):
    # the same stats on a 0.5.4 V0 server: chunked prefill exists and is recommended with a small budget
    lines = log("033").read_text().replace("llm_engine.py:624", "metrics.py:406").splitlines()
    p = tmp_path / "v054.log"
    p.write_text("\n".join(["INFO 11-21 00:12:00 api_server.py:148] vLLM API server version 0.5.4"] + lines) + "\n")
    f = findings(diagnose_file(p))["prefill-blocking"]
    got = {x.flag: (x.value, x.option, x.relation) for x in f.fixes}
    # what 0.5.4 has, and as an alternative the upgrade that brings the partial-prefill flags
    assert got == {"--enable-chunked-prefill": ("", 1, "alternative"), "--max-num-batched-tokens": ("2048", 2, "alternative"),
                   "vllm": (">=0.7.3", 3, "set"), "--long-prefill-token-threshold": ("512", 3, "set"),
                   "--max-num-partial-prefills": ("2", 3, "set")}


@pytest.mark.parametrize("name", ["026", "054", "014", "cpu-basic"])
def test_prefill_blocking_silent(name):
    assert "prefill-blocking" not in findings(diagnose_file(log(name)))


# ---- VD004 kv-capacity-bound ------------------------------------------------------------------
def test_kv_capacity_bound_cpu_run_max_num_seqs_from_capacity():
    rep = diagnose_file(log("cpu-preemption"))
    f = findings(rep)["kv-capacity-bound"]
    # the message says "full (95 % or more) with up to N waiting": N comes from the full lines only
    # (the 14-waiting line 125 is at 77.4 %), and only those lines are quoted
    assert f.values["running"] == 4 and f.values["waiting_peak"] == 12
    assert "full (95% or more) with up to 12 requests waiting while only 4 ran" in f.message
    assert [e.lineno for e in f.evidence] == [138]
    # the log alone counts no preemption (V1 prints none; running fell under the full cache:
    # inferred): no --max-num-seqs cut, and the verdict names the /metrics capture that would decide
    assert "--max-num-seqs" not in fixes(f) and f.values["harmed"] is False
    assert f.collect.startswith("a /metrics capture of this server while it is busy")
    # the explicitly sized KV cache for the 16 requests running or waiting at once: 4 MiB x 16 / 4
    assert fixes(f)["--kv-cache-memory-bytes"] == str(4194304 * 4)
    assert [(x.flag, x.relation, x.grade) for x in f.fixes] == [("--kv-cache-memory-bytes", "only", "counted")]


@pytest.mark.parametrize("name", ["034", "054"])
def test_kv_capacity_bound_pastes(name):
    assert "kv-capacity-bound" in findings(diagnose_file(log(name)))


@pytest.mark.parametrize("name", ["052", "026", "033", "037"])
def test_kv_capacity_bound_silent(name):
    assert "kv-capacity-bound" not in findings(diagnose_file(log(name)))


# ---- VD005 gpu-memory-leak --------------------------------------------------------------------
def _idle_log(tmp_path: Path, kv_start: float, kv_step: float, running: int = 0) -> Path:
    """The real 0.5.4 idle stats line (fixture 025) repeated every 5 minutes for 2 hours, with
    KV cache usage changed to a rising series."""
    line = (LOGS / "025-v0.5.4-idle-healthy-zero-load.log").read_text().splitlines()[0]
    out = []
    for i in range(25):
        h, m = divmod(20 * 60 + 52 + i * 5, 60)
        ln = line.replace("20:52:46", f"{h:02d}:{m:02d}:46").replace("Running: 0 reqs", f"Running: {running} reqs")
        ln = ln.replace("GPU KV cache usage: 0.0%", f"GPU KV cache usage: {kv_start + i * kv_step:.1f}%")
        out.append(ln)
    p = tmp_path / "idle.log"
    p.write_text("\n".join(out) + "\n")
    return p


def test_gpu_memory_leak_idle_kv_growth(tmp_path):
    f = findings(diagnose_file(_idle_log(tmp_path, 5.0, 0.5)))["gpu-memory-leak"]
    assert f.values["idle_slope"] == pytest.approx(0.06, rel=0.01)  # 0.5 % per 5 min = 6 %/h


def test_gpu_memory_leak_silent_when_a_request_runs(tmp_path):
    # one long request filling its own blocks is not a leak (fixture 052's shape)
    assert "gpu-memory-leak" not in findings(diagnose_file(_idle_log(tmp_path, 5.0, 0.5, running=1)))
    assert "gpu-memory-leak" not in findings(diagnose_file(log("052")))
    assert "gpu-memory-leak" not in findings(diagnose_file(log("025")))


def test_gpu_memory_leak_from_gpu_samples(builtin_rules):
    from vllm_doctor.events import GpuSample, Meta
    from vllm_doctor.pipeline import Pipeline

    p = Pipeline(builtin_rules, follow=True)
    t0 = 1_800_000_000.0
    gib = 1 << 30
    for i in range(61):  # one sample a minute for an hour, +1 GiB per hour
        p.observe(GpuSample(Meta("nvml", ts=t0 + 60 * i), 0, "GPU-x", "NVIDIA H200",
                            memory_used_bytes=int(100 * gib + i * gib / 60), memory_total_bytes=140 * gib))
    active = {f.name: f for f in p.evaluate(t0 + 3600)}
    f = active["gpu-memory-leak"]
    assert f.values["gpu_slope"] == pytest.approx(gib, rel=0.01)
    assert f.values["hours_to_full"] == pytest.approx(39.0, rel=0.02)  # 39 GiB left at 1 GiB/h
    # flat memory: no finding
    p2 = Pipeline(builtin_rules, follow=True)
    for i in range(61):
        p2.observe(GpuSample(Meta("nvml", ts=t0 + 60 * i), 0, "GPU-x", "NVIDIA H200",
                             memory_used_bytes=100 * gib, memory_total_bytes=140 * gib))
    assert not p2.evaluate(t0 + 3600)


# ---- VD006 nccl-failure -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["044", "048", "064"])
def test_nccl_failure(name):
    assert "nccl-failure" in findings(diagnose_file(log(name)))


def test_nccl_watchdog_values():
    f = findings(diagnose_file(log("044")))["nccl-failure"]
    assert f.values["op"] == "ALLREDUCE" and f.values["timeout_s"] == 1800


@pytest.mark.parametrize("name", ["017", "043", "cpu-basic"])
def test_nccl_failure_silent(name):
    assert "nccl-failure" not in findings(diagnose_file(log(name)))


# ---- VD007 runtime-oom ------------------------------------------------------------------------
def test_runtime_oom_after_serving(tmp_path):
    # A real serving log, then the real OOM line of fixture 006 re-timed after it.
    served = log("cpu-basic").read_text().splitlines()[:580]
    oom = log("006").read_text().splitlines()[0].replace("03-02 19:49:43", "11-30 09:08:50")
    p = tmp_path / "served-then-oom.log"
    p.write_text("\n".join(served + [oom]) + "\n")
    rep = diagnose_file(p)
    found = findings(rep)
    assert "runtime-oom" in found and "startup-oom" not in found
    f = found["runtime-oom"]
    assert f.values["tried_mib"] == pytest.approx(20.0)
    assert fixes(f)["--max-num-batched-tokens"] == "4096"  # default 8192 / 2
    assert rep.facts["oom_events_total"] == 1


def test_runtime_oom_silent_at_startup():
    assert "runtime-oom" not in findings(diagnose_file(log("006")))


# ---- VD008 engine-dead ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["017", "043", "cpu-request-errors"])
def test_engine_dead(name):
    assert "engine-dead" in findings(diagnose_file(log(name)))


def test_engine_dead_names_first_error():
    f = findings(diagnose_file(log("017")))["engine-dead"]
    assert "background-task-failed" in f.values["kinds"]


def test_engine_dead_silent_on_orderly_shutdown():
    # the log ends with an EngineDeadError printed during a requested shutdown
    assert "EngineDeadError" in log("cpu-preemption").read_text()
    assert "engine-dead" not in findings(diagnose_file(log("cpu-preemption")))
    assert "engine-dead" not in findings(diagnose_file(log("cpu-basic")))


# A worker killed by a signal: the real log of one (vLLM 0.32 on CPU, the worker sent SIGILL) logged
# "(exit code: None)" (its monitor read the code before the worker was reaped); the same crash
# raised by the CPU on an AVX-512+AMX Xeon logged "(exit code: -4)". The other wordings with the
# exit code: multiproc_executor.py 0.30+ and v1/utils.py "Process X (PID: N) died with exit code N".
@pytest.mark.parametrize("line, code, words", [
    ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor.", -4, "SIGILL"),
    ("Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.", -9, "OOM killer"),
    ("Worker proc VllmWorker-0 died unexpectedly (exit code: -11), shutting down executor.", -11, "signal 11"),
])
def test_engine_dead_worker_killed_by_signal(tmp_path, line, code, words):
    real = log("cpu-worker-killed-sigill").read_bytes()  # bytes: its progress bars end in \r
    said = b"Worker proc VllmWorker-0 died unexpectedly (exit code: None), shutting down executor."
    assert real.count(said) == 1
    p = tmp_path / "worker-killed.log"
    p.write_bytes(real.replace(said, line.encode()))
    f = findings(diagnose_file(p))["engine-dead"]
    assert f.values["killed_code"] == code
    assert f"exit code {code}, line 105" in f.message and words in f.message, f.message


def test_engine_dead_process_died_with_exit_code(tmp_path):
    # v1/utils.py (0.20+, several API servers): the RuntimeError, logged by logger.exception
    p = tmp_path / "api-servers.log"
    p.write_text("ERROR 12-01 01:10:39 [utils.py:598] Exception occurred while running API servers: "
                 "Process EngineCore_DP0 (PID: 4058) died with exit code -9\n")
    f = findings(diagnose_file(p))["engine-dead"]
    assert f.values["killed_code"] == -9 and "OOM killer" in f.message, f.message


def test_engine_dead_exit_code_unknown_is_not_a_signal():
    f = findings(diagnose_file(log("cpu-worker-killed-sigill")))["engine-dead"]
    assert f.values["killed_code"] is None
    assert "RuntimeError: Executor failed." in f.message


# ---- VD009 / VD010 ----------------------------------------------------------------------------
def test_max_model_len_exceeds_model():
    f = findings(diagnose_file(log("cpu-startup-error-max-model-len")))["max-model-len-exceeds-model"]
    assert fixes(f) == {"--max-model-len": "4096"}


TUNING_NOTE = """\
vllm serve meta-llama/Llama-3-8B --kv-cache fp8 --chunked-prefill-size 4096 --max-num-seqs 512
INFO 07-10 10:23:40 Initializing scheduler with max_num_seqs=512
INFO 07-10 10:23:45 GPU KV cache size: 512,000 tokens
INFO 07-10 10:23:45 CPU offload KV cache size: 128,000 tokens
INFO 07-10 10:23:45 Maximum concurrency for 16,384 tokens: 128 sequences
WARNING 07-10 10:30:01 Preempting seq_id=1021 (swap out, 512 blocks)
INFO 07-10 10:30:05 running=128 pending=512 gpu_cache=0%
WARNING 07-10 10:35:00 preemption count: 45 in last 5 minutes
"""


def test_tuning_note_lines_and_fake_flags(tmp_path):
    p = tmp_path / "note.log"
    p.write_text(TUNING_NOTE)
    rep = diagnose_file(p)
    assert rep.facts["kv_cache_tokens"] == 512000
    assert rep.facts["max_num_seqs"] == 512
    assert rep.facts["max_concurrency"] == 128
    assert rep.facts["cpu_offload_kv_tokens"] == 128000
    assert rep.facts["peak_num_running"] == 128 and rep.facts["peak_num_waiting"] == 512
    f = findings(rep)["unknown-flag"]
    # the value given to the fake flag goes to the real one
    assert fixes(f) == {"--max-num-batched-tokens": "4096"}
    # --kv-cache-dtype fp8 is also preemption-storm's fix: listed once, there, and said here
    assert "--kv-cache-dtype fp8 also fixes this; it is listed under preemption-storm (VD001)" in f.notes
    assert set(rep.unknown_flags) == {"--kv-cache", "--chunked-prefill-size"}


def test_kv_capacity_bound_plateau_with_short_queue_near_full():
    # A real 0.32 CPU run: Running 4 (= 2 x max_concurrency 2.0), Waiting 12 then 2, KV usage 93.5 %
    # (sampled below the 95 % "full" mark): the plateau counts when the cache is nearly full.
    p = Path(__file__).parent / "fixtures" / "regressions" / "cpu-0.32-storm-long-short-queue.log"
    f = findings(diagnose_file(p))["kv-capacity-bound"]
    # never full: the cache held 4 (93.5 % x 4,096 / 4 = 957 tokens each), but 4 is what ran: no fix;
    # 2 (4,096 / 2,048) is the never-preempt bound, yet this log shows no preemption (none counted,
    # running never fell under a full cache): admitting fewer buys nothing seen here, so no such fix
    assert f.values["running"] == 4 and f.values["c"]["value"] == 4
    assert (f.values["c"]["method"], f.values["c"]["never_preempt"]) == ("tokens-per-sequence", 2)
    assert "--max-num-seqs" not in fixes(f)
    assert len(f.evidence) == 2


def test_kv_capacity_bound_silent_on_a_busy_healthy_server(tmp_path):
    # bench/gen_log.py: running 20-120 of max_num_seqs 256, 0-3 waiting, KV 20-80 %, 61.8x concurrency
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_log import generate

    p = tmp_path / "busy.log"
    with open(p, "w") as fh:
        generate(30 << 20, fh, seed=3)  # about 10 minutes of log time, 60 stats lines
    assert not findings(diagnose_file(p))


def test_two_saturated_engines_beside_six_with_room_is_imbalance_not_capacity(tmp_path):
    """bench/gen_log.py --shape stats8: for an hour engines 000 and 001 sit at 98-100 % KV cache
    with 100-400 waiting while 002-007 run at 20-70 % with 0-2 waiting. Six engines have KV cache
    to spare: the routing is the fault (data-parallel-imbalance), not the KV cache size
    (kv-capacity-bound, whose --gpu-memory-utilization led the report), also in the storm's last
    minutes, while its saturated lines are still in the window."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from gen_log import generate_stats8

    p = tmp_path / "dp8.log"
    with open(p, "w") as fh:
        generate_stats8(0, fh, seed=1, storm_at=0.4, span=3 * 3600)  # storm from 1:12 to 2:12, quiet after
    rep = diagnose_file(p)
    assert [f.name for f in rep.findings] == ["data-parallel-imbalance"]
    f = rep.findings[0]
    assert "engine 0 (" in f.message and "engine 1 (" in f.message
    assert "while engines 2, 3, 4, 5, 6 and 7 had room (KV cache 20-70 %, at most 2 waiting)" in f.message
    assert "idled" not in f.message and not f.fixes
    # the log goes on healthy for 48 min after the storm: the headline says it is over, not current
    from vllm_doctor.report.render import verdict

    assert not f.active
    head = verdict(rep)["headline"]
    assert head.startswith("WARNING data-parallel-imbalance: ")
    assert "; ended 48 min before the log's newest line, " in head, head


def test_gpu_memory_utilization_fix_shows_the_cap_in_its_arithmetic(tmp_path):
    # 0.92 + 0.05 is 0.97, but the fix stops at 0.95: the arithmetic shown must give the value recommended
    p = tmp_path / "vllm.log"
    p.write_text("INFO 02-01 06:36:00 api_server.py:177] args: Namespace(host=None, port=8000, model='m', "
                 "max_model_len=4096, gpu_memory_utilization=0.92, max_num_seqs=256)\n" + log("034").read_text())
    f = findings(diagnose_file(p))["kv-capacity-bound"]
    fx = {x.flag: x for x in f.fixes}["--gpu-memory-utilization"]
    assert (fx.value, fx.arithmetic) == ("0.95", "min(0.92 + 0.05, 0.95) = 0.95")
    fx = {x.flag: x for x in findings(diagnose_file(log("034")))["kv-capacity-bound"].fixes}["--gpu-memory-utilization"]
    assert (fx.value, fx.arithmetic) == ("0.95", "min(0.9 + 0.05, 0.95) = 0.95")   # the version's default 0.9


@pytest.mark.parametrize("labels,want", [
    # the real 0.32 capture: kv_cache_size_tokens 4096, kv_cache_max_concurrency 2.0 (max_model_len 2048)
    ({"kv_cache_size_tokens": "4096", "kv_cache_max_concurrency": "2.0", "num_gpu_blocks": "32", "block_size": "128"}, 2048),
    # vLLM's own arithmetic: int(max_concurrency * max_model_len) tokens, the concurrency a float
    ({"kv_cache_size_tokens": str(int(7.03125 * 131072)), "kv_cache_max_concurrency": "7.03125"}, 131072),
    ({"kv_cache_size_tokens": str(int((922496 / 40000) * 40000)), "kv_cache_max_concurrency": str(922496 / 40000)}, 40000),
    # before 0.24 (no kv_cache_max_concurrency label), or labels that do not agree: not known
    ({"num_gpu_blocks": "32", "block_size": "128"}, None),
    ({"kv_cache_size_tokens": "4096", "kv_cache_max_concurrency": "None"}, None),
    ({"kv_cache_size_tokens": "4097", "kv_cache_max_concurrency": "2.0"}, None),
])
def test_max_model_len_from_cache_config_info_alone(labels, want):
    """Prometheus holds no max_model_len, but vLLM 0.24+ labels vllm:cache_config_info with
    kv_cache_size_tokens = int(kv_cache_max_concurrency x max_model_len): the fleet reads it back."""
    from vllm_doctor.events import Meta, VllmMetricsSample
    from vllm_doctor.state.core import State

    st = State()
    st.apply(VllmMetricsSample(Meta(source="prometheus:x", ts=1.0, text="vllm:cache_config_info"),
                               cache_config=tuple(sorted(labels.items()))))
    assert st.facts()["max_model_len"] == want
