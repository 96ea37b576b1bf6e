"""The sidecar over real HTTP (uvicorn on 127.0.0.1): /metrics, /healthz, /readyz, /api/*, the
HTML page (escaping), configuration precedence, and ``vllm-doctor serve`` as a real process
stopped by SIGTERM with its checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fake_nvml import FakeGpu, FakeNvml
from serve_helpers import FIXTURES, Pages, end_process, free_port, live_sidecar, samples, value, wait_for

from vllm_doctor.export.serve import ConfigError, load_config
from vllm_doctor.ingest.replay import restamp

V0_STORM = (FIXTURES / "logs" / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()
V1_RUN = (FIXTURES / "logs" / "cpu-preemption-tiny-kv-cache.log").read_bytes()
PREEMPT_METRICS = (FIXTURES / "metrics" / "vllm-0.32-cpu-preemption.txt").read_text()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_metrics_from_a_live_v0_preemption_storm(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    gpu = FakeGpu(uuid="GPU-1234", used=70 << 30, util=88,
                  processes=[(31337, "python3", 69 << 30)])
    with live_sidecar({"logs": [str(log)]}, nvml=FakeNvml([gpu])) as s:
        append(log, restamp(V0_STORM))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 3.0, what="3 lines")
        s.sidecar.evaluate()
        text = s.get("/metrics").text
        assert value(text, "vllm_preemptions_total") == 151.0  # from total_num_cumulative_preemption
        assert value(text, "vllm_running_sequences", engine="0") == 37.0
        assert value(text, "vllm_pending_sequences", engine="0") == 9779.0
        assert value(text, "vllm_swapped_sequences", engine="0") == 137.0
        assert value(text, "vllm_kv_cache_usage_ratio", engine="0") == pytest.approx(0.766)
        assert value(text, "vllm_prompt_throughput_tokens_per_second", engine="0") == 3737.0
        assert value(text, "vllm_generation_throughput_tokens_per_second", engine="0") == 8906.6
        assert value(text, "vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                     severity="warning") == 1.0
        assert value(text, "vllm_doctor_finding_active", rule_id="VD002", name="startup-oom",
                     severity="critical") == 0.0
        assert value(text, "gpu_memory_used_bytes", gpu="0", uuid="GPU-1234", model="NVIDIA H200") == 70 << 30
        assert value(text, "gpu_utilization_ratio", gpu="0", uuid="GPU-1234", model="NVIDIA H200") == 0.88
        assert value(text, "gpu_process_memory_used_bytes", gpu="0", uuid="GPU-1234", pid="31337",
                     process="python3") == 69 << 30
        assert value(text, "vllm_doctor_source_up", source="nvml") == 1.0
        assert value(text, "vllm_doctor_build_info", version="0.1.0") == 1.0
        assert value(text, "vllm_doctor_collector_errors_total") == 0.0
        assert "process_resident_memory_bytes" in text
        # labels are bounded: only these keys, and no value comes from a log line
        allowed = {"source", "gpu", "uuid", "model", "pid", "process", "rule_id", "name", "severity",
                   "quantile", "version", "engine"}
        for _, labels in samples(text):
            assert {k for k, _ in labels} <= allowed
            # engine: vLLM's data-parallel index, a number (at most 256 kept), never free log text
            assert all(v.isdigit() for k, v in labels if k == "engine")
            assert not any("preempted" in v or "Sequence" in v for _, v in labels)

        f = s.get("/api/findings").json()
        assert "VD001" in f["active"] and set(f["active"]) <= {"VD001", "VD004"}  # README: may kv-capacity-bound
        storm = next(x for x in f["findings"] if x["rule_id"] == "VD001")
        assert storm["name"] == "preemption-storm" and storm["active"]
        assert any(e["lineno"] == 2 for e in storm["evidence"])
        st = s.get("/api/state").json()
        assert st["facts"]["preemptions_total"] == 151 and st["engine"] == "v0"
        assert st["last_stats"]["num_running"] == 37
        assert st["gpus"][0]["processes"] == [{"pid": 31337, "name": "python3", "used_bytes": 69 << 30}]


def test_finding_clears_when_condition_ends(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with live_sidecar({"logs": [str(log)]}) as s:
        then = time.time() - 3600  # an hour ago: outside the 5-minute window now
        append(log, restamp(V0_STORM, now=then))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 3.0)
        s.sidecar.evaluate()
        # lines an hour old when read: an old log, judged on its own clock (issue 11)
        assert s.get("/api/state").json()["clock"]["mode"] == "replay"
        assert s.metric("vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                        severity="warning") == 1.0
        # a fresh, healthy stats line: the log is live again, the storm an hour behind the window
        append(log, restamp(b"INFO 06-16 21:24:25 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, "
                            b"Avg generation throughput: 12.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, "
                            b"Pending: 0 reqs, GPU KV cache usage: 1.0%, CPU KV cache usage: 0.0%.\n"))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 4.0)
        s.sidecar.evaluate()
        assert s.get("/api/state").json()["clock"]["mode"] == "live"
        assert s.metric("vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                        severity="warning") == 0.0
        assert s.metric("vllm_preemptions_total") == 151.0  # the counter still counts them


def test_metrics_source_wins_over_log_and_ttft(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    busy = PREEMPT_METRICS.replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                   'vllm:num_requests_running{engine="0",model_name="tiny"} 6.0')
    with Pages([busy]) as vllm:
        with live_sidecar({"logs": [str(log)], "metrics_url": vllm.url, "scrape_interval": 0.2}) as s:
            append(log, restamp(V1_RUN))
            wait_for(lambda: s.metric("vllm_doctor_source_up", source="metrics") == 1.0, what="scrape")
            wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 235.0)
            text = s.get("/metrics").text
            assert value(text, "vllm_running_sequences", engine="0") == 6.0  # /metrics, not the log's last 0
            assert value(text, "vllm_preemptions_total") == 105.0  # V1: only /metrics knows
            assert value(text, "vllm_kv_cache_tokens") == 4096.0
            assert value(text, "vllm_max_num_seqs") == 32.0
            assert value(text, "vllm_max_model_len") == 2048.0
            assert value(text, "vllm_max_concurrency") == 2.0
            assert value(text, "vllm_time_to_first_token_seconds", quantile="0.99") == pytest.approx(
                10.0 + 10.0 * (31.68 - 15) / 17)
            vllm.status = 503
            wait_for(lambda: s.metric("vllm_doctor_source_up", source="metrics") == 0.0, what="scrape down")
            assert s.metric("vllm_doctor_scrape_errors_total") >= 1.0
            assert s.metric("vllm_running_sequences", engine="0") == 0.0  # back to the log's stats line


def test_health_and_readiness(tmp_path):
    missing = tmp_path / "not-yet.log"
    with live_sidecar({"logs": [str(missing)]}) as s:
        assert s.get("/healthz").json()["status"] == "ok"
        r = s.get("/readyz")
        assert r.status_code == 200 and r.json()["degraded"]  # up, answering, one source down
        assert r.json()["sources"][0] == {"source": str(missing), "kind": "log", "up": False,
                                          "status": "down", "age_seconds": None, "detail": "file not found"}
        missing.write_bytes(b"INFO 11-30 09:10:22 [api_utils.py:347] hello\n")
        wait_for(lambda: not s.get("/readyz").json()["degraded"], what="the log to appear")
        src = s.get("/readyz").json()["sources"][0]
        assert src["status"] == "live" and src["up"]
        # "live" comes when the file opens; the line is counted by the pipeline a moment later
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(missing)) == 1.0,
                 what="the log's first line counted")
        s.sidecar.stop()
        assert s.get("/readyz").status_code == 503 and s.get("/healthz").status_code == 200
        s.sidecar.stop()  # again (as the app's shutdown will): nothing happens


def test_page_escapes_log_text(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    evil = "<script>alert(1)</script>"
    lines = (
        f"(APIServer pid=1) INFO 11-30 09:10:22 [api_utils.py:286] non-default args: "
        f"{{'model': '{evil}', 'max_model_len': 2048, 'enable_prefix_caching': True}}\n"
        f"(APIServer pid=1) ERROR 11-30 09:10:23 [core.py:1] EngineCore encountered a fatal error.\n"
        f"(APIServer pid=1) ERROR 11-30 09:10:23 [async_llm.py:1] vllm.v1.engine.exceptions."
        f"EngineDeadError: {evil} prompt='<img src=x onerror=alert(2)>'\n").encode()
    with live_sidecar({"logs": [str(log)]}) as s:
        append(log, restamp(lines))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 3.0)
        s.sidecar.evaluate()
        assert "VD008" in s.get("/api/findings").json()["active"]  # engine-dead, with the evil text
        page = s.get("/").text
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "engine-dead" in page
        assert "http://" not in page and "https://" not in page  # no external assets
        # facts read as in diagnose's report: in words with their unit, thousands separators, on/off
        assert ('<th title="max_model_len">Longest request, prompt + output (max_model_len)</th>'
                '<td class="num">2,048 tokens</td>') in page
        assert '<th title="enable_prefix_caching">Prefix caching</th><td class="num">on</td>' in page


def test_page_marks_fix_alternatives_as_diagnose_does(tmp_path):
    """The Fix list of the page is diagnose -f html's (one template macro, the same FlagFix data): the
    fixes say how they relate and their evidence ("option N of 2: pick one; evidence: counted"), and a command never wraps
    mid-flag (the old table broke --kv-cache-/memory-bytes)."""
    import re

    from vllm_doctor.ingest.oneshot import diagnose
    from vllm_doctor.report.render import to_html

    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with live_sidecar({"logs": [str(log)]}) as s:
        append(log, V1_RUN)
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 235.0)
        s.sidecar.evaluate()
        page = s.get("/").text
    fixes = re.findall(r'<ul class="fixes">.*?</ul>', page, re.S)
    assert len(fixes) == 1
    # the log alone counts no preemption (V1 prints none): no --max-num-seqs cut, one fix with its
    # evidence grade (issue 20), as diagnose shows it
    assert '<li><code class="fix">--kv-cache-memory-bytes 16777216</code> (16 MiB) <em>(evidence: counted)</em>' in fixes[0]
    assert "--max-num-seqs" not in fixes[0]
    assert "code.fix{white-space:nowrap;" in page
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "vllm.log").write_bytes(V1_RUN)       # the same name in the arithmetic's line reference
    report = to_html(diagnose([str(tmp_path / "d" / "vllm.log")]))
    # the sidecar names a log by the path it follows, diagnose by its file name
    assert re.findall(r'<ul class="fixes">.*?</ul>', report, re.S) == [x.replace(str(log), "vllm.log") for x in fixes]


def test_collector_never_raises(tmp_path):
    with live_sidecar({"logs": [str(tmp_path / "x.log")]}) as s:
        st = s.sidecar.pipeline.state

        def boom():
            raise RuntimeError("broken facts")

        st.facts = boom
        r = s.get("/metrics")
        assert r.status_code == 200
        assert value(r.text, "vllm_doctor_collector_errors_total") == 1.0
        assert value(r.text, "vllm_doctor_build_info", version="0.1.0") == 1.0  # other parts still there


def test_bad_rules_dir_degrades_to_builtin_rules(tmp_path):
    bad = tmp_path / "rules"
    bad.mkdir()
    (bad / "VD999-x.yaml").write_text("id: VD999\nname: NotKebab\n")
    with live_sidecar({"logs": [str(tmp_path / "x.log")], "rules": [str(bad)]}) as s:
        h = s.get("/healthz").json()
        assert h["status"] == "ok" and "VD999" in h["rule_load_error"]
        assert s.metric("vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                        severity="warning") == 0.0


def test_config_precedence_flags_env_file(tmp_path):
    cfg_file = tmp_path / "doctor.yaml"
    cfg_file.write_text("port: 9500\nmetrics-url: http://vllm:8000/metrics\nlog: [/a.log]\nnvml: false\n"
                        "from_start: true\n")
    env = {"VLLM_DOCTOR_PORT": "9600", "VLLM_DOCTOR_LOGS": "/b.log,/c.log"}
    c = load_config({}, env=env, config_file=cfg_file)
    assert (c.port, c.logs, c.metrics_url, c.nvml, c.from_start) == (
        9600, ["/b.log", "/c.log"], "http://vllm:8000/metrics", False, True)
    c = load_config({"port": 9700, "metrics_url": "none"}, env={**env, "VLLM_DOCTOR_CONFIG": str(cfg_file)})
    assert (c.port, c.metrics_url) == (9700, None)
    d = load_config({}, env={})
    assert (d.port, d.metrics_url, d.nvml, d.host) == (9401, "http://127.0.0.1:8000/metrics", True, "0.0.0.0")
    with pytest.raises(ConfigError, match="port"):
        load_config({}, env={"VLLM_DOCTOR_PORT": "http"})
    with pytest.raises(ConfigError, match="NVML"):
        load_config({}, env={"VLLM_DOCTOR_NVML": "maybe"})
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config({}, env={}, config_file=tmp_path / "missing.yaml")


def _serve(log: Path, state: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--log", str(log), "--metrics-url", "none",
         "--no-nvml", "--host", "127.0.0.1", "--port", str(port), "--state-file", str(state),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_DOCTOR_CONFIG": ""})


def _lines_metric(port: int, log: Path) -> float | None:
    try:
        return value(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text,
                     "vllm_doctor_log_lines_total", source=str(log))
    except httpx.HTTPError:
        return None


def test_cli_serve_sigterm_writes_checkpoint_and_restart_does_not_double_count(tmp_path):
    log, state = tmp_path / "vllm.log", tmp_path / "state.json"
    log.write_bytes(V1_RUN[:5000])  # present at start: read from its end
    first = restamp(V1_RUN[5000:15000])
    first = first[: first.rfind(b"\n") + 1]
    port = free_port()
    p = _serve(log, state, port)
    try:
        wait_for(lambda: _lines_metric(port, log) == 0.0, 30, "the sidecar to answer")
        append(log, first)
        n_first = first.count(b"\n")
        wait_for(lambda: _lines_metric(port, log) == n_first, 10, f"{n_first} lines")
        p.send_signal(signal.SIGTERM)
        p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert state.exists()
    import json
    ck = json.loads(state.read_text())["files"][str(log)]
    assert ck["offset"] == log.stat().st_size
    second = restamp(V1_RUN[15000:])
    append(log, second)  # written while the sidecar is down
    port = free_port()
    p = _serve(log, state, port)
    try:
        n_second = second.count(b"\n")
        # the counters continue from the checkpoint: the first run's lines plus the new ones
        wait_for(lambda: _lines_metric(port, log) == n_first + n_second, 30, f"{n_second} lines after restart")
        time.sleep(0.3)  # nothing more may arrive (a double count would show here)
        assert _lines_metric(port, log) == n_first + n_second
        # the KV cache size was logged at start-up, read by the first run, kept in the state file
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        assert value(text, "vllm_kv_cache_tokens") == 4096.0
    finally:
        end_process(p)
    assert n_first + n_second == V1_RUN[5000:].count(b"\n")


def test_cli_serve_reads_a_pipe(tmp_path):
    """``vllm serve ... 2>&1 | tee vllm.log | vllm-doctor serve --log -``"""
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--log", "-", "--metrics-url", "none", "--no-nvml",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "VLLM_DOCTOR_CONFIG": ""})
    base = f"http://127.0.0.1:{port}"

    def lines() -> float | None:
        try:
            return value(httpx.get(base + "/metrics", timeout=2).text, "vllm_doctor_log_lines_total", source="-")
        except httpx.HTTPError:
            return None

    try:
        wait_for(lambda: lines() == 0.0, 30, "the sidecar to answer")
        p.stdin.write(restamp(V0_STORM))
        p.stdin.flush()
        wait_for(lambda: lines() == 3.0, 10, "3 lines from the pipe")
        assert value(httpx.get(base + "/metrics").text, "vllm_preemptions_total") == 151.0
        p.stdin.close()  # vLLM exited: end of input
        wait_for(lambda: httpx.get(base + "/readyz").json()["sources"][0]["status"] == "down", 10, "EOF")
        assert httpx.get(base + "/readyz").json()["sources"][0]["detail"] == "end of input"
        assert httpx.get(base + "/healthz").status_code == 200  # still serving what it learned
    finally:
        end_process(p)


def test_cli_serve_on_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = _serve(tmp_path / "vllm.log", tmp_path / "state.json", port)
        out, _ = p.communicate(timeout=60)
    lines = out.decode().strip().splitlines()
    assert p.returncode == 2, out   # uvicorn's own exit 3 is not one of ours
    assert lines[-1] == f"vllm-doctor: cannot serve on 127.0.0.1:{port} (the port is in use or the address is not " \
                        "this host's: see uvicorn's error above)"
    assert "Traceback" not in out.decode()


def test_serve_freezes_what_lives_as_long_as_the_process(monkeypatch, tmp_path):
    """run() hands the objects built at start-up (modules, rules, the app) to gc.freeze() before
    serving: the full collections that a busy log triggers no longer walk them."""
    import gc

    import uvicorn

    from vllm_doctor.export.serve import run

    frozen: list[int] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: frozen.append(gc.get_freeze_count()))
    cfg = load_config({"logs": [str(tmp_path / "vllm.log")], "metrics_url": "none", "nvml": False,
                       "host_memory": False, "host": "127.0.0.1", "port": 0}, env={})
    try:
        assert run(cfg) == 0
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 10_000


def test_serve_housekeeping_wakes_once_a_second(monkeypatch):
    """The HTTP server's housekeeping loop (stop signal, Date header) sleeps a second between
    ticks (uvicorn's own: 0.1 s), and each tick still refreshes the Date header (uvicorn does
    that when the tick counter is a multiple of 10)."""
    import asyncio

    import uvicorn

    from vllm_doctor.export.serve import SERVER_TICK_SECONDS, _server

    server = _server(uvicorn.Config(lambda *a: None))
    sleeps: list[float] = []
    ticks: list[int] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    async def on_tick(counter: int) -> bool:
        ticks.append(counter)
        return len(ticks) == 3  # a stop was asked for at the third tick

    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(server, "on_tick", on_tick)
    asyncio.run(server.main_loop())
    assert SERVER_TICK_SECONDS == 1.0
    assert sleeps == [1.0, 1.0]
    assert ticks == [0, 10, 20]


_LARGE_BUFFERS = r"""
import random, resource, sys, threading
if sys.argv[1] == "tuned":
    from vllm_doctor.export.serve import keep_freed_memory
    if not keep_freed_memory():
        print("no-mallopt"); sys.exit(0)
out = []
def work():  # in a thread, as the follow thread: reads of the log, a line joined across two of them
    rnd = random.Random(7)
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(300):
        a = bytes(rnd.randrange(200_000, 1_100_000))
        b = a[: len(a) // 2] + bytes(300_000)
        del a
        c = bytes(rnd.randrange(500_000, 2_000_000))
        del b, c
    out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
t = threading.Thread(target=work); t.start(); t.join()
print(out[0])
"""


def test_serve_keeps_freed_memory_instead_of_faulting_it_in_again():
    """keep_freed_memory() (called by run()) makes glibc keep freed large blocks in the heap: the
    sidecar's flow of buffers of up to 2 MB, allocated and freed in a thread, page-faults a
    tenth as often (a fresh process each, so malloc starts from its defaults)."""
    def faults(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", _LARGE_BUFFERS, mode], capture_output=True, text=True,
                              timeout=120, check=True, cwd=Path(__file__).parent.parent).stdout.strip()

    tuned = faults("tuned")
    if tuned == "no-mallopt":
        pytest.skip("the C library has no mallopt (not glibc)")
    untuned = int(faults("default"))
    assert int(tuned) * 4 < untuned, (tuned, untuned)
