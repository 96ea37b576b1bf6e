"""Sample the host (container) memory in a background thread into
:class:`vllm_doctor.events.HostMemorySample` events (the host-memory-growth rule, VD019).

Where the sidecar runs in vLLM's container (or pod, sharing its cgroup): cgroup v2
``memory.current`` and ``memory.max`` (``max`` = no limit) at ``/sys/fs/cgroup``; without cgroup v2,
``/proc/meminfo`` (MemTotal - MemAvailable, limit MemTotal). Either way the resident memory (RSS,
``/proc/PID/status`` VmRSS) of the processes whose command line names vLLM is added where /proc
shows them. Reads a few small files per poll, never on the /metrics scrape path. ``root`` lets tests
point it at a stand-in tree (tests/fixtures/hostmem/).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_doctor.events import HostMemorySample, Meta

log = logging.getLogger(__name__)

#: At most this many /proc entries are read per poll for the vLLM processes' RSS (bounded work).
MAX_PIDS = 4096


@dataclass
class HostMemStats:
    up: bool = False
    polls: int = 0
    errors: int = 0
    last_ok_at: float | None = None  # time.monotonic()
    last_error: str | None = None
    source: str | None = None  # "cgroup" | "meminfo"


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_host_memory(root: str | os.PathLike[str] = "/", ts: float | None = None) -> HostMemorySample | None:
    """One sample from the files under ``root``; None when neither cgroup v2 nor /proc/meminfo is
    readable."""
    base = Path(root)
    cg = base / "sys/fs/cgroup"
    used = _read_int(cg / "memory.current")
    meta = Meta(source="host", ts=time.time() if ts is None else ts)
    rss = _vllm_rss(base / "proc")
    if used is not None:
        limit = _read_int(cg / "memory.max")
        return HostMemorySample(meta, used, limit, rss, "cgroup")
    try:
        info = dict(line.split(":", 1) for line in (base / "proc/meminfo").read_text().splitlines() if ":" in line)
        total = int(info["MemTotal"].split()[0]) * 1024
        avail = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return HostMemorySample(meta, max(0, total - avail), total, rss, "meminfo")


def _vllm_rss(proc: Path) -> int | None:
    """The summed VmRSS of the processes whose command line runs vLLM (not vllm-doctor)."""
    total, seen = 0, False
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()][:MAX_PIDS]
    except OSError:
        return None
    for e in entries:
        try:
            cmd = (Path(e.path) / "cmdline").read_bytes()
            if b"vllm" not in cmd or b"vllm_doctor" in cmd or b"vllm-doctor" in cmd:
                continue
            for line in (Path(e.path) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
                    break
        except (OSError, ValueError, IndexError):
            continue
    return total if seen else None


class HostMemoryPoller:
    """Sample the host memory every ``interval`` seconds and hand each sample to ``on_sample``."""

    def __init__(self, on_sample: Callable[[HostMemorySample], None] | None = None, *, interval: float = 15.0,
                 root: str | os.PathLike[str] = "/", clock: Callable[[], float] = time.time) -> None:
        self.on_sample = on_sample or (lambda s: None)
        self.interval = interval
        self.root = root
        self.clock = clock
        self.stats = HostMemStats()
        self.last: HostMemorySample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> HostMemorySample | None:
        """One sample, handed on; never raises."""
        self.stats.polls += 1
        try:
            s = read_host_memory(self.root, self.clock())
        except Exception as exc:  # noqa: BLE001 - a poll never takes the sidecar down
            s = None
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
        if s is None:
            self.stats.errors += 1
            self.stats.up = False
            self.stats.last_error = self.stats.last_error or "no cgroup v2 memory.current and no /proc/meminfo"
            return None
        self.stats.up = True
        self.stats.source = s.source
        self.stats.last_ok_at = time.monotonic()
        self.last = s
        self.on_sample(s)
        return s

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-hostmem", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
