"""The rules of diagnose, live, on evidence only the sidecar has: GPU memory growth from NVML
(gpu-memory-leak) and preemptions from vLLM's /metrics (preemption-storm on a V1 engine, whose
log prints none). Through the real sidecar: sources -> pipeline -> rules -> /metrics."""

from __future__ import annotations

import time
from pathlib import Path

from fake_nvml import FakeGpu, FakeNvml
from serve_helpers import Pages, live_sidecar, timeline_pages, value, wait_for

MiB = 1 << 20


def test_gpu_memory_leak_from_nvml_growth(tmp_path):
    gpu = FakeGpu(uuid="GPU-leak", used=100_000 * MiB)
    fake = FakeNvml([gpu])
    with live_sidecar({"logs": [str(tmp_path / "vllm.log")], "nvml_interval": 3600}, nvml=fake) as s:
        poller = s.sidecar.nvml  # polled once at start; now replay the next hour, a poll a minute
        clock = [time.time()]
        poller.clock = lambda: clock[0]
        for _ in range(61):  # one hour, a sample a minute, +12 MiB a minute = 720 MiB/h
            poller.poll_once()
            gpu.used += 12 * MiB
            clock[0] += 60
        s.sidecar.evaluate()
        f = {x["name"]: x for x in s.get("/api/findings").json()["findings"]}
        leak = f["gpu-memory-leak"]
        assert leak["active"]
        assert "720 MiB per hour" in leak["message"] and "GPU is full in" in leak["message"]
        assert s.metric("vllm_doctor_finding_active", rule_id="VD005", name="gpu-memory-leak",
                        severity="warning") == 1.0
        assert s.metric("gpu_memory_used_bytes", gpu="0", uuid="GPU-leak", model="NVIDIA H200") == (
            100_000 + 60 * 12) * MiB


def test_flat_gpu_memory_is_not_a_leak(tmp_path):
    fake = FakeNvml([FakeGpu(used=100_000 * MiB)])
    with live_sidecar({"logs": [str(tmp_path / "vllm.log")], "nvml_interval": 3600}, nvml=fake) as s:
        clock = [time.time()]
        s.sidecar.nvml.clock = lambda: clock[0]
        for _ in range(61):
            s.sidecar.nvml.poll_once()
            clock[0] += 60
        s.sidecar.evaluate()
        assert "VD005" not in s.get("/api/findings").json()["active"]


def test_preemption_storm_from_vllm_metrics_on_a_v1_engine(tmp_path):
    """The real run behind cpu-preemption-tiny-kv-cache.log: its V1 log shows no preemption, its
    /metrics counted 59 in 28 s."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with Pages(timeline_pages()) as vllm:
        with live_sidecar({"logs": [str(log)], "metrics_url": vllm.url, "scrape_interval": 3600}) as s:
            for _ in range(15):
                s.sidecar.scraper.scrape_once()
            s.sidecar.evaluate()
            text = s.get("/metrics").text
            assert value(text, "vllm_preemptions_total") == 59.0
            assert value(text, "vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                         severity="warning") == 1.0
            storm = next(f for f in s.get("/api/findings").json()["findings"] if f["rule_id"] == "VD001")
            assert storm["message"].startswith("59 preemptions")


def test_templates_dir_is_package_data():
    assert (Path(__file__).parent.parent / "vllm_doctor" / "templates" / "serve.html.j2").exists()


def test_log_in_another_time_zone_and_metrics_share_one_clock(tmp_path):
    """vLLM run with TZ=UTC+2 logs two hours "ahead"; /metrics samples must land in the same
    windows, or V1 preemptions from /metrics would look two hours old."""
    from vllm_doctor.ingest.replay import restamp

    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    line = (b"(APIServer pid=7) INFO 11-30 09:11:19 [loggers.py:335] Engine 000: Avg prompt throughput: "
            b"356.7 tokens/s, Avg generation throughput: 844.5 tokens/s, Running: 3 reqs, Waiting: 13 reqs, "
            b"GPU KV cache usage: 97.4%, Prefix cache hit rate: 0.0%\n")
    with Pages(timeline_pages()) as vllm:
        with live_sidecar({"logs": [str(log)], "metrics_url": vllm.url, "scrape_interval": 3600}) as s:
            s.sidecar.clock_sync_gap = 0.1
            for i in range(2):
                with open(log, "ab") as fh:
                    fh.write(restamp(line, time.time() + 7200))
                wait_for(lambda n=i + 1: s.metric("vllm_doctor_log_lines_total", source=str(log)) == n)
                wait_for(lambda: s.sidecar._clock_seen is not None
                         and s.sidecar._clock_seen.meta.lineno == i + 1, what="the clock check")
                time.sleep(0.15)  # the second stats line must come later in wall time, as live ones do
            wait_for(lambda: s.sidecar.clock_offset == 7200.0, what="the +2 h offset")
            for _ in range(15):
                s.sidecar.scraper.scrape_once()
            s.sidecar.evaluate()
            assert s.metric("vllm_doctor_finding_active", rule_id="VD001", name="preemption-storm",
                            severity="warning") == 1.0


def shifted(data: bytes, last: float) -> bytes:
    """``data`` with its vLLM timestamps moved as one, so that its newest line is at ``last``."""
    import calendar
    import re

    ts_re = re.compile(rb"(INFO|WARNING|ERROR|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d)")
    year = time.gmtime(last).tm_year

    def epoch(b: bytes) -> float:
        return calendar.timegm(time.strptime(f"{year}-{b.decode()}", "%Y-%m-%d %H:%M:%S"))

    newest = max(epoch(m.group(2)) for m in ts_re.finditer(data))
    return ts_re.sub(lambda m: m.group(1) + b" " + time.strftime(
        "%m-%d %H:%M:%S", time.gmtime(epoch(m.group(2)) + last - newest)).encode(), data)


def test_a_finding_clears_when_the_log_shows_the_load_stopped(tmp_path):
    """The real vLLM 0.32 run: the KV cache full with requests waiting (09:11:19-09:11:49), then two
    stats lines with nothing running or waiting (09:11:59, 09:12:09), then silence. Followed live,
    kv-capacity-bound is over at the log's idle lines, not when its 5 min window ages out on the
    wall clock, and its last seen is the last line that showed it (log clock), not the evaluation."""
    demo = (Path(__file__).parent / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log").read_bytes()
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    now = time.time()
    with live_sidecar({"logs": [str(log)]}) as s:
        lines = shifted(demo, now - 1).split(b"\n")
        busy, idle = b"\n".join(lines[:160]) + b"\n", b"\n".join(lines[160:])
        with log.open("ab") as fh:  # the load, as vLLM wrote it: judged live, the finding is active
            fh.write(busy)
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 160.0)
        s.sidecar.evaluate()
        f = {x["name"]: x for x in s.get("/api/findings").json()["findings"]}
        assert s.sidecar.clock_status()["mode"] == "live" and f["kv-capacity-bound"]["active"]
        # active, its last seen is the log's time of its last evidence line (09:11:49 of the run,
        # 20 s before the run's newest line), not the evaluation's wall clock time
        busy_kv = f["kv-capacity-bound"]
        assert busy_kv["last_seen"] == max(e["ts"] for e in busy_kv["evidence"]) <= now - 1 - 15
        with log.open("ab") as fh:  # the load stopped: nothing running or waiting
            fh.write(idle)
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 235.0)
        s.sidecar.evaluate()
        f = {x["name"]: x for x in s.get("/api/findings").json()["findings"]}
        kv = f["kv-capacity-bound"]
        assert not kv["active"] and "VD004" not in s.get("/api/findings").json()["active"]
        assert s.metric("vllm_doctor_finding_active", rule_id="VD004", name="kv-capacity-bound",
                        severity="warning") == 0.0
        assert kv["last_seen"] == max(e["ts"] for e in kv["evidence"]) <= now - 1 - 40  # 09:11:29 of 09:12:09


def test_the_page_says_vllm_recovered_after_a_crash_before_its_restart(tmp_path):
    """Real vLLM 0.32 lines followed live: an EngineDeadError, then vLLM started again and served
    with no incident. The page opens with the recovery, not with the crash nor with "no incident"."""
    logs = Path(__file__).parent / "fixtures" / "logs"
    dead = (logs / "cpu-request-errors-then-enginecore-killed.log").read_bytes()
    served = (logs / "cpu-basic-serve-and-load.log").read_bytes().replace(b"11-30 09:0", b"11-30 10:1")
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with live_sidecar({"logs": [str(log)]}) as s:
        with log.open("ab") as fh:
            fh.write(shifted(dead + served, time.time() - 1))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 817.0)
        s.sidecar.evaluate()
        assert s.sidecar.clock_status()["mode"] == "live"
        assert s.get("/api/findings").json()["active"] == []
        from html import unescape

        page = unescape(s.get("/").text)
        assert "Recovered: vLLM restarted at " in page and " after CRITICAL engine-dead (" in page
        assert "healthy for 2 min since" in page


def test_a_traceback_the_followed_log_ends_inside_is_reported_once_the_log_is_quiet(tmp_path):
    """Real lines (corpus 185, KServe's vLLM image): the log ends inside a traceback, cut before its
    exception line. Followed live, the traceback may still go on at first; once the log has been
    quiet for TRACEBACK_QUIET_SECONDS it is over, and the sidecar reports it as diagnose does."""
    from vllm_doctor.export import serve

    data = (Path(__file__).parent / "fixtures" / "corpus" / "logs" /
            "185-v0.10-kserve-container-prefix-no-platform-detected-import-error.log").read_bytes()
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with live_sidecar({"logs": [str(log)]}) as s:
        # the sidecar reads the lines after they are written: its last read, where the quiet time starts,
        # is at or after t_write (the moment the lines were counted is after it, so no bound on it)
        t_write = time.monotonic()
        with log.open("ab") as fh:
            fh.write(shifted(data, time.time() - 1))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 11.0)
        s.sidecar.evaluate()
        if time.monotonic() - t_write < serve.TRACEBACK_QUIET_SECONDS:  # still open: nothing said yet
            assert "VD030" not in s.get("/api/findings").json()["active"]

        def reported() -> bool:
            s.sidecar.evaluate()
            return "VD030" in s.get("/api/findings").json()["active"]

        wait_for(reported, 10, "unexplained-error once the log is quiet")
        assert time.monotonic() - t_write >= serve.TRACEBACK_QUIET_SECONDS
