"""Exactly-once across ``kill -9`` at any moment (issue 10, item 3).

A writer appends V0 and V1 lines (vLLM's own wordings: the V0 scheduler's preemption warning
with its cumulative count, the V1 stats line with ``Preemptions: N`` per interval, a worker's
CUDA OOM) to a log it rotates the way vLLM's RotatingFileHandler does (rename ``.1`` -> ``.2``
..., the log -> ``.1``, a new log). ``vllm-doctor serve --state-file`` is killed with SIGKILL 20
times at random moments (mid-read, and some during start-up, before its first periodic
checkpoint); after each restart, once it has caught up, the exported counters must equal the
truth: what one uninterrupted pipeline makes of every byte written. The writer keeps BACKUPS
rotated files, more than it rotates between two checks (asserted), so no line is deleted
before the sidecar could read it and the truth is every line written. (The follower's own
tests, ``test_follow_killpoints.py``, drive the same kill points without timing, and the case
of more rotations than backups.)
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serve_helpers import end_process, free_port, value, wait_for
from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.pipeline import Pipeline

KILLS = 20
ROTATE_LINES = 4000
BACKUPS = 8

V0_PREEMPT = ("WARNING {md} {hms} scheduler.py:1089] Sequence group {g} is preempted by PreemptionMode.SWAP "
              "mode because there is not enough KV cache space. This can affect the end-to-end performance. "
              "Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
              "total_num_cumulative_preemption={c}\n")
V1_STATS = ("(APIServer pid=7) INFO {md} {hms} [loggers.py:335] Engine 000: Avg prompt throughput: 356.7 "
            "tokens/s, Avg generation throughput: 844.5 tokens/s, Running: 3 reqs, Waiting: {w} reqs, "
            "Preemptions: {p}, GPU KV cache usage: 97.4%, Prefix cache hit rate: 0.0%\n")
OOM = ("(VllmWorkerProcess pid=195295) ERROR {md} {hms} [multiproc_worker_utils.py:242] torch.OutOfMemoryError: "
       "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a total capacity of 14.62 GiB of which "
       "3.31 MiB is free. Including non-PyTorch memory, this process has 14.61 GiB memory in use.\n")
PLAIN = "(APIServer pid=7) INFO {md} {hms} [launcher.py:29] Route: /v1/models, Methods: GET\n"


class Writer(threading.Thread):
    """Appends lines in small random batches and rotates every ROTATE_LINES lines; ``hold()``
    stops it between two batches (a context manager). Everything written is kept in order."""

    def __init__(self, log: Path, seed: int) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.written: list[bytes] = []
        self.n = 0
        self.in_file = 0
        self.cum = 0
        self.rotations = 0

    def line(self) -> str:
        i = self.n
        t = time.gmtime(1764460800 + i)  # one line per second of log time
        md, hms = time.strftime("%m-%d", t), time.strftime("%H:%M:%S", t)
        r = self.rng.random()
        if r < 0.15:
            self.cum += 50  # V0 prints its warning for every 50th preemption
            return V0_PREEMPT.format(md=md, hms=hms, g=i, c=self.cum)
        if r < 0.55:
            return V1_STATS.format(md=md, hms=hms, w=i % 7, p=self.rng.randint(0, 9))
        if r < 0.65:
            return OOM.format(md=md, hms=hms)
        return PLAIN.format(md=md, hms=hms)

    def rotate(self) -> None:
        for k in range(BACKUPS - 1, 0, -1):
            src = self.log.with_name(f"{self.log.name}.{k}")
            if src.exists():
                os.replace(src, self.log.with_name(f"{self.log.name}.{k + 1}"))
        os.replace(self.log, self.log.with_name(self.log.name + ".1"))
        self.log.write_bytes(b"")
        self.in_file = 0
        self.rotations += 1

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                batch = "".join(self.line_and_count() for _ in range(self.rng.randint(1, 40))).encode()
                with open(self.log, "ab") as fh:
                    fh.write(batch)
                self.written.append(batch)
                if self.in_file >= ROTATE_LINES:
                    self.rotate()
            time.sleep(0.004)

    def line_and_count(self) -> str:
        s = self.line()
        self.n += 1
        self.in_file += 1
        return s


class Truth:
    """What one uninterrupted pipeline makes of every byte written: fed what was written since
    the last look (its counters equal a fresh pipeline's over all of it, ended: every line is
    a whole record)."""

    def __init__(self) -> None:
        self.p = Pipeline(load_rules(), follow=True, base_year=2025)
        self.fed = 0

    def __call__(self, written: list[bytes]) -> tuple[int, int, int]:
        for batch in written[self.fed:]:
            self.p.feed("vllm.log", batch)
        self.fed = len(written)
        st = self.p.state
        return st.lines_total["vllm.log"], st.preemptions_total, st.oom_events_total


def spawn(log: Path, state: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--log", str(log), "--metrics-url", "none",
         "--no-nvml", "--host", "127.0.0.1", "--port", str(port), "--state-file", str(state),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "VLLM_DOCTOR_CONFIG": "", "VLLM_DOCTOR_EVAL_INTERVAL": "60"})


def scrape(port: int, log: Path) -> tuple[float | None, float | None, float | None] | None:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return (value(text, "vllm_doctor_log_lines_total", source=str(log)),
            value(text, "vllm_preemptions_total"), value(text, "vllm_oom_events_total"))


@pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL and inode rotation semantics")
def test_kill_9_loop_counts_exactly_once(tmp_path):
    log, state = tmp_path / "vllm.log", tmp_path / "state.json"
    log.write_bytes(b"")
    rng = random.Random(10)
    writer = Writer(log, seed=11)
    port = free_port()
    proc = spawn(log, state, port)
    wait_for(lambda: scrape(port, log), 30, "the first sidecar")
    writer.start()
    truth = Truth()
    kills = startup_kills = checks = rotations_checked = 0
    try:
        while kills < KILLS:
            time.sleep(rng.uniform(0.05, 1.2))  # the writer runs; the sidecar reads
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            if kills < KILLS and rng.random() < 0.35:  # killed again while starting up
                proc = spawn(log, state, port)
                time.sleep(rng.uniform(0.3, 2.5))  # before, during or just after its first read
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                kills += 1
                startup_kills += 1
            with writer.lock:  # the writer stops between two batches while we check
                # every file the sidecar may not have finished still exists (the writer keeps
                # BACKUPS rotated files; the sidecar was caught up at the last check)
                assert writer.rotations - rotations_checked < BACKUPS, "too few backups for the truth"
                rotations_checked = writer.rotations
                want = truth(writer.written)
                proc = spawn(log, state, port)

                def caught_up():
                    got = scrape(port, log)
                    return got if got is not None and got[0] == want[0] else None

                got = wait_for(caught_up, 90, f"the restarted sidecar to read {want[0]} lines (kill {kills})")
                time.sleep(0.2)  # a line read twice would show now
                got = scrape(port, log)
                assert got == (float(want[0]), float(want[1]), float(want[2])), (kills, got, want)
                checks += 1
    finally:
        writer.stop.set()
        end_process(proc)
    assert kills == KILLS and checks >= KILLS // 2 and startup_kills >= 1
    assert writer.rotations >= 2, "the writer must have rotated while the sidecar was killed"
