"""The NVML poller through an injected fake of the pynvml calls it uses, and the real pynvml
on this machine (which has no NVIDIA driver: the poller must report itself down, not crash)."""

from __future__ import annotations

import logging
import time

from fake_nvml import FakeGpu, FakeNvml, FakeNvmlError

from vllm_doctor.ingest.nvml import NvmlPoller

GiB = 1 << 30


def two_gpus() -> FakeNvml:
    return FakeNvml([
        FakeGpu(uuid="GPU-aaaa", used=120 * GiB, util=97, power_mw=612_345, temp=61,
                processes=[(4242, "/usr/bin/python3", 119 * GiB), (77, "other-job", 512 << 20)]),
        FakeGpu(uuid="GPU-bbbb", used=0, util=0, power_mw=74_000, temp=29),
    ])


def test_samples_every_gpu_with_memory_info_v2():
    fake = two_gpus()
    got = []
    p = NvmlPoller(got.append, nvml=fake)
    out = p.poll_once()
    assert [s.index for s in out] == [0, 1] and got == out
    g0 = out[0]
    assert (g0.uuid, g0.model) == ("GPU-aaaa", "NVIDIA H200")
    assert g0.memory_used_bytes == 120 * GiB  # v2: without the driver's reserved memory
    assert g0.memory_total_bytes == 150_754_820_096
    assert g0.utilization_ratio == 0.97 and g0.power_watts == 612.345
    assert g0.temperature_celsius == 61.0
    assert g0.processes == ((77, "other-job", 512 << 20), (4242, "python3", 119 * GiB))
    assert g0.meta.source == "nvml"
    assert p.stats.up and p.stats.memory_info_version == 2 and p.stats.device_count == 2
    assert p.samples[1].memory_used_bytes == 0 and p.samples[1].processes == ()


def test_old_driver_falls_back_to_memory_info_v1_once():
    fake = FakeNvml([FakeGpu(used=10 * GiB, supported={"util", "power", "temp", "procs"})])
    p = NvmlPoller(nvml=fake)
    for _ in range(3):
        s = p.poll_once()[0]
    assert s.memory_used_bytes == 10 * GiB + FakeGpu().reserved  # v1 counts reserved memory
    assert p.stats.memory_info_version == 1
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1 and fake.calls["nvmlDeviceGetMemoryInfo_v1"] == 3


def test_unsupported_fields_are_none_not_errors():
    fake = FakeNvml([FakeGpu(supported={"memory_v2"})])  # e.g. a MIG instance or a vGPU
    p = NvmlPoller(nvml=fake)
    s = p.poll_once()[0]
    assert (s.utilization_ratio, s.power_watts, s.temperature_celsius, s.processes) == (None, None, None, ())
    assert s.memory_used_bytes == 0 and p.stats.up and p.stats.errors == 0


def test_memory_growth_is_seen_between_polls():
    fake = two_gpus()
    p = NvmlPoller(nvml=fake)
    seen = []
    for step in range(4):
        fake.gpus[0].used = 100 * GiB + step * 256 * (1 << 20)
        seen.append(p.poll_once()[0].memory_used_bytes)
    assert [b - seen[0] for b in seen] == [0, 256 << 20, 512 << 20, 768 << 20]


def test_no_driver_reports_down_logs_once_and_retries(caplog):
    fake = FakeNvml(fail_init=FakeNvmlError(12))  # NVML_ERROR_LIBRARY_NOT_FOUND
    p = NvmlPoller(nvml=fake, retry_seconds=0.0)
    with caplog.at_level(logging.WARNING, logger="vllm_doctor.ingest.nvml"):
        for _ in range(3):
            assert p.poll_once() == []
    assert not p.stats.up and "NVML error 12" in p.stats.last_error
    assert len([r for r in caplog.records if "NVML unavailable" in r.message]) == 1
    fake.fail_init = None  # the driver came up later
    assert len(p.poll_once()) == 1 and p.stats.up


def test_gpu_lost_mid_run_marks_down_and_keeps_going():
    fake = two_gpus()
    p = NvmlPoller(nvml=fake)
    p.poll_once()
    fake.inited = False  # nvmlDeviceGetCount now raises (driver reloaded, GPU fell off the bus)
    assert p.poll_once() == [] and not p.stats.up and p.stats.errors == 1
    assert p.samples[0].memory_used_bytes == 120 * GiB  # the last good sample stays


def test_background_thread_and_shutdown():
    fake = two_gpus()
    got = []
    p = NvmlPoller(got.append, nvml=fake, interval=0.02)
    p.start()
    try:
        t0 = time.monotonic()
        while len(got) < 6 and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert len(got) >= 6
    finally:
        p.stop()
    assert fake.calls["nvmlShutdown"] == 1 and not fake.inited


def test_real_pynvml_without_a_driver_is_down_not_fatal():
    import pynvml

    p = NvmlPoller(nvml=pynvml, retry_seconds=3600)
    try:
        out = p.poll_once()
    finally:
        p.stop()
    if p.stats.up:  # a machine with a GPU: then it must have sampled it
        assert out and out[0].memory_total_bytes > 0
    else:
        assert out == [] and p.stats.last_error
