"""A stand-in of the few pynvml calls that :class:`vllm_doctor.ingest.nvml.NvmlPoller` uses, for
tests on machines without a GPU (the package itself has no fake: without NVML it takes its real
"NVML unavailable" path)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class FakeNvmlError(Exception):
    """pynvml.NVMLError stand-in: ``value`` is the NVML return code."""

    def __init__(self, value: int = 3) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    """One fake GPU: memory in bytes, utilization in percent, power in milliwatts.
    ``supported``: the calls it answers (others raise NotSupported, code 3).
    ``processes``: (pid, name, used bytes)."""

    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 150_754_820_096
    used: int = 0
    reserved: int = 597_229_568  # v1 "used" = v2 used + reserved, as the driver reports
    util: int = 0
    power_mw: int = 75_000
    temp: int = 30
    processes: list[tuple[int, str, int]] = field(default_factory=list)
    supported: set[str] = field(default_factory=lambda: {"memory_v2", "util", "power", "temp", "procs"})


class FakeNvml:
    """The pynvml calls :class:`NvmlPoller` uses, answered from :class:`FakeGpu` objects.

    fail_init: an exception instance raised by nvmlInit (e.g. FakeNvmlError(12), library
    not found); ``calls`` counts each call by name.
    """

    NVMLError = FakeNvmlError
    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus: list[FakeGpu] | None = None, fail_init: Exception | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.fail_init = fail_init
        self.calls: dict[str, int] = {}
        self.inited = False

    def _c(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _need(self, g: FakeGpu, what: str) -> None:
        if what not in g.supported:
            raise FakeNvmlError(3)  # NVML_ERROR_NOT_SUPPORTED

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._c("nvmlInit")
        if self.fail_init is not None:
            raise self.fail_init
        self.inited = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._c("nvmlShutdown")
        self.inited = False

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "570.00-fake"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._c("nvmlDeviceGetCount")
        if not self.inited:
            raise FakeNvmlError(1)  # UNINITIALIZED
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:  # noqa: N802
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:  # noqa: N802
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:  # noqa: N802
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> SimpleNamespace:  # noqa: N802
        self._c(f"nvmlDeviceGetMemoryInfo_v{2 if version else 1}")
        if version:
            if "memory_v2" not in h.supported:
                raise FakeNvmlError(13)  # FUNCTION_NOT_FOUND (old driver)
            return SimpleNamespace(total=h.total, reserved=h.reserved, used=h.used,
                                   free=h.total - h.reserved - h.used)
        return SimpleNamespace(total=h.total, used=h.used + h.reserved, free=h.total - h.reserved - h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:  # noqa: N802
        self._need(h, "util")
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:  # noqa: N802
        self._need(h, "power")
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:  # noqa: N802
        self._need(h, "temp")
        return h.temp

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:  # noqa: N802
        self._need(h, "procs")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, _, used in h.processes]

    def nvmlSystemGetProcessName(self, pid: int) -> str:  # noqa: N802
        for g in self.gpus:
            for p, name, _ in g.processes:
                if p == pid:
                    return name
        raise FakeNvmlError(6)  # NOT_FOUND
