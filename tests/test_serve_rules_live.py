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
