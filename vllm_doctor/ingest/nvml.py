"""Poll NVML (nvidia-ml-py, module ``pynvml``) in a background thread into
:class:`vllm_doctor.events.GpuSample` events.

Per GPU: memory used / total in bytes (``nvmlDeviceGetMemoryInfo`` version 2 where the
driver has it: its ``used`` excludes the driver-reserved memory, as nvidia-smi shows since
R510; version 1 otherwise), utilization (``nvmlDeviceGetUtilizationRates().gpu`` / 100),
power (``nvmlDeviceGetPowerUsage`` milliwatts / 1000), temperature
(``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``, °C), and per compute process its pid,
name and used bytes (``nvmlDeviceGetComputeRunningProcesses``), so that vLLM's own processes
can be told apart from others on the same GPU.

No NVML call runs on the /metrics scrape path: the collector reads the newest samples. Every
field that one GPU does not support (``NVMLError_NotSupported``) is None, not an error. When
the library or the driver is missing, one clear line is logged, :attr:`NvmlStats.up` stays
False (exported as ``vllm_doctor_source_up{source="nvml"} 0``) and initialisation is retried
every ``retry_seconds``; the sidecar keeps running.

Without a GPU (no library, no driver: the CLI and CI machines) this is that same "NVML
unavailable" path, never a stand-in; tests inject a stand-in of the pynvml calls
(``tests/fake_nvml.py``) through ``nvml=``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_doctor.events import GpuSample, Meta

log = logging.getLogger(__name__)


@dataclass
class NvmlStats:
    """Health of the NVML poller."""

    up: bool = False
    polls: int = 0
    errors: int = 0
    device_count: int = 0
    driver_version: str | None = None
    memory_info_version: int | None = None  # 2 or 1, once known
    last_ok_at: float | None = None  # time.monotonic()
    last_error: str | None = None


def load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class NvmlPoller:
    """Sample every GPU every ``interval`` seconds and hand each :class:`GpuSample` to
    ``on_sample`` (from the poller thread).

    nvml: the pynvml module (default) or a stand-in with the same calls (tests/fake_nvml.py).
    clock: the epoch-seconds clock stamped on samples (time.time; tests replay hours with it).
    The newest samples are also kept in :attr:`samples` (gpu index -> GpuSample).
    """

    def __init__(self, on_sample: Callable[[GpuSample], None] | None = None, *,
                 interval: float = 5.0, nvml: Any = None, retry_seconds: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.on_sample = on_sample or (lambda s: None)
        self.clock = clock
        self.interval = interval
        self.retry_seconds = retry_seconds
        self.stats = NvmlStats()
        self.samples: dict[int, GpuSample] = {}
        self._nvml = nvml
        self._inited = False
        self._next_init = 0.0
        self._said_down = False
        self._v2: bool | None = None
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def init(self) -> bool:
        """Load and initialise NVML. Returns False (logged once) when there is no library,
        driver or GPU; never raises."""
        now = time.monotonic()
        if self._inited:
            return True
        if now < self._next_init:
            return False
        self._next_init = now + self.retry_seconds
        try:
            if self._nvml is None:
                self._nvml = load_pynvml()
            self._nvml.nvmlInit()
            self.stats.device_count = int(self._nvml.nvmlDeviceGetCount())
            try:
                self.stats.driver_version = _text(self._nvml.nvmlSystemGetDriverVersion())
            except Exception:  # noqa: BLE001 - optional
                pass
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, ...
            self.stats.up = False
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            if not self._said_down:
                log.warning("NVML unavailable (%s): no GPU metrics; vllm_doctor_source_up"
                            "{source=\"nvml\"} is 0 and the sidecar keeps running", self.stats.last_error)
                self._said_down = True
            return False
        self._inited = True
        log.info("NVML: %d GPU(s), driver %s", self.stats.device_count, self.stats.driver_version)
        return True

    def start(self) -> None:
        """Start the background thread (first poll immediately)."""
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-nvml", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._inited:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._inited = False

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    # -- polling ----------------------------------------------------------------------------

    def poll_once(self) -> list[GpuSample]:
        """Sample every GPU once; returns the samples (empty when NVML is down). Never raises."""
        if not self.init():
            return []
        self.stats.polls += 1
        out = []
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            self.stats.device_count = count
            for i in range(count):
                out.append(self._sample(i))
        except Exception as exc:  # noqa: BLE001 - GPU lost, driver reloaded, ...
            self.stats.errors += 1
            self.stats.up = False
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("NVML poll failed: %s", self.stats.last_error)
            return []
        self.stats.up = True
        self.stats.last_ok_at = time.monotonic()
        for s in out:
            self.samples[s.index] = s
            try:
                self.on_sample(s)
            except Exception:  # noqa: BLE001 - a sink failure must not stop polling
                log.exception("on_sample failed")
        return out

    def _opt(self, fn: Callable[[], Any]) -> Any:
        """A field this GPU may not support: None on any NVMLError."""
        try:
            return fn()
        except self._nvml.NVMLError:
            return None

    def _memory(self, h: Any) -> tuple[int | None, int | None]:
        nv = self._nvml
        if self._v2 is not False and hasattr(nv, "nvmlMemory_v2"):
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                self._v2 = True
                self.stats.memory_info_version = 2
                return int(m.used), int(m.total)
            except (nv.NVMLError, TypeError, AttributeError) as exc:
                log.info("NVML memory info v2 unavailable (%s); using v1", exc)
                self._v2 = False
        m = self._opt(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if m is None:
            return None, None
        self.stats.memory_info_version = 1
        return int(m.used), int(m.total)

    def _process_name(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            name = ""
            try:
                name = _text(self._nvml.nvmlSystemGetProcessName(pid))
            except Exception:  # noqa: BLE001 - other pid namespace, gone, not permitted
                try:
                    with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                        name = fh.read().strip()
                except OSError:
                    name = ""
            name = name.rsplit("/", 1)[-1][:64]
            if len(self._names) > 1024:
                self._names.clear()
            self._names[pid] = name
        return name

    def _sample(self, i: int) -> GpuSample:
        nv = self._nvml
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = self._opt(lambda: _text(nv.nvmlDeviceGetUUID(h))) or ""
        model = self._opt(lambda: _text(nv.nvmlDeviceGetName(h))) or ""
        used, total = self._memory(h)
        util = self._opt(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        power = self._opt(lambda: nv.nvmlDeviceGetPowerUsage(h))
        temp = self._opt(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        procs = self._opt(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
        processes = tuple(sorted(
            (int(p.pid), self._process_name(int(p.pid)), int(p.usedGpuMemory))
            for p in procs if getattr(p, "usedGpuMemory", None) is not None))
        return GpuSample(
            meta=Meta(source="nvml", ts=self.clock()),
            index=i, uuid=uuid, model=model,
            memory_used_bytes=used, memory_total_bytes=total,
            utilization_ratio=None if util is None else float(util.gpu) / 100.0,
            power_watts=None if power is None else float(power) / 1000.0,
            temperature_celsius=None if temp is None else float(temp),
            processes=processes,
        )
