#!/usr/bin/env python3
"""Benchmark the sidecar: append a request-heavy vLLM log at 10 MB/s while ``vllm-doctor serve``
follows it, and measure the sidecar process.

Two phases on one sidecar, the log written throughout:

1. ``--seconds`` (60) with /metrics polled every ``--poll`` s (0.1): the latency from a line
   written to it being counted in /metrics (``vllm_doctor_log_lines_total``), p50 / p99 / max,
   and the CPU at that polling rate (every poll is a full scrape: pessimistic, as a scraper
   that often does not exist);
2. ``--scrape-seconds`` (60) with /metrics scraped every ``--scrape-interval`` s (15, the
   interval Prometheus is set to in practice: 15-30 s): the CPU as deployed, and at each
   scrape how old the oldest line written but not yet counted was (0 when all were counted).

The CPU target (<= 2 % of one core at 10 MB/s, issue 26 item 10; issue 3 asked 5 %) is judged in
phase 2, at the realistic scrape interval; phase 1's figure is printed beside it. CPU: user +
system time of the sidecar process over the phase (/proc/PID/stat), as a percentage of one
core. Also: peak RSS (VmHWM), RSS over time, and a memory-flatness check (the RSS slope over the
second half of the run). The log's clock runs ``--speedup`` times faster than the wall clock
(default 180: one minute of writing replays three hours of vLLM log time), so the state's time
windows fill and roll over as they would in hours of serving.

The log lines come from bench/gen_log.py (vLLM 0.32 formats with --enable-log-requests: 1-4 KB
"Received request" lines, "Added request", uvicorn access lines, the stats line every 10 s),
restamped to the replay clock as they are written. ``--write lines`` (default) writes each line
with its own write(), as vLLM's logging handler does (it flushes every record); ``--write
chunks`` writes each tick's lines at once.

    python bench/bench_serve.py [--rate-mb 10] [--seconds 60] [--poll 0.1]
                                [--scrape-seconds 60] [--scrape-interval 15] [--write lines]

Targets: <= 2 % of one core at 10 MB/s with /metrics scraped every 15 s, <= 100 MB RSS, latency
p99 <= 1 s (phase 1), RSS flat, every line counted.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from vllm_doctor.ingest.replay import restamp  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
CPU_TARGET_PCT = 2.0  # of one core, at 10 MB/s of request-heavy log
LINES_RE = re.compile(rb"^vllm_doctor_log_lines_total\{[^}]*\} ([0-9.e+]+)$", re.M)
EVAL_RE = re.compile(rb"^vllm_doctor_last_evaluation_duration_seconds ([0-9.e+-]+)$", re.M)


def pool_of_lines(size: int) -> bytes:
    """About ``size`` bytes of request-heavy vLLM log (whole lines)."""
    try:
        from gen_log import generate  # bench/gen_log.py

        buf = io.StringIO()
        generate(size, buf, seed=7)
        data = buf.getvalue().encode()
    except ImportError:  # fall back to a real vLLM 0.32 log, repeated
        real = (ROOT / "tests/fixtures/logs/cpu-basic-serve-and-load.log").read_bytes()
        data = real * (size // len(real) + 1)
    return data[: data.rfind(b"\n", 0, size) + 1]


def proc_cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK


def proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def write_log(pool: bytes, log: Path, per_tick: int, tick: float, seconds: float, speedup: float,
              t_start: float, log_t0: float, conn, by_line: bool = True) -> None:
    """Append ``per_tick`` bytes of whole lines every ``tick`` s for ``seconds`` s, restamped to
    the replay clock, each line with its own write() (``by_line``, as vLLM's logging handler) or
    the tick's lines at once; send back ([(monotonic time written, cumulative lines)], bytes, lines)."""
    writes: list[tuple[float, int]] = []  # (time written, cumulative lines); CLOCK_MONOTONIC is system-wide
    pos = total_bytes = total_lines = k = 0
    with open(log, "ab", buffering=0) as fh:
        write = fh.write
        while True:
            now = time.monotonic()
            if now - t_start >= seconds:
                break
            end = pool.rfind(b"\n", pos, pos + per_tick) + 1
            if end <= pos:
                pos, end = 0, pool.rfind(b"\n", 0, per_tick) + 1
            chunk = restamp(pool[pos:end], log_t0 + (now - t_start) * speedup)
            pos = end if end < len(pool) - per_tick else 0
            if by_line:
                for line in chunk.splitlines(keepends=True):
                    write(line)
            else:
                write(chunk)
            total_bytes += len(chunk)
            total_lines += chunk.count(b"\n")
            writes.append((time.monotonic(), total_lines))
            k += 1
            delay = t_start + k * tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    conn.send((writes, total_bytes, total_lines))
    conn.close()


def staleness(writes: list[tuple[float, int]], scrapes: list[tuple[float, float]]) -> list[float]:
    """At each scrape (time, lines counted): how long ago the oldest line written by then but
    not yet counted was written (0 when every line written by then was counted)."""
    out = []
    for ts, counted in scrapes:
        age = 0.0
        for tw, n in writes:  # the first write that took the count past what was counted
            if tw > ts:
                break
            if n > counted:
                age = ts - tw
                break
        out.append(age)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rate-mb", type=float, default=10.0, help="MB/s appended (1 MB = 10^6 bytes)")
    ap.add_argument("--seconds", type=float, default=60.0, help="phase 1: /metrics polled every --poll s")
    ap.add_argument("--speedup", type=float, default=180.0, help="log time per wall second")
    ap.add_argument("--tick", type=float, default=0.05, help="seconds between the writer's batches")
    ap.add_argument("--poll", type=float, default=0.1, help="phase 1: seconds between /metrics polls")
    ap.add_argument("--scrape-seconds", type=float, default=60.0,
                    help="phase 2: /metrics scraped every --scrape-interval s (0: no phase 2)")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="phase 2: seconds between scrapes")
    ap.add_argument("--write", choices=("lines", "chunks"), default="lines",
                    help="one write() per line (vLLM's logging) or per batch")
    a = ap.parse_args()

    pool = pool_of_lines(32 << 20)
    tmp = Path(tempfile.mkdtemp(prefix="vllm-doctor-bench-"))
    log = tmp / "vllm.log"
    log.write_bytes(b"")
    port = free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--log", str(log), "--metrics-url", "none",
         "--no-nvml", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    client = httpx.Client(timeout=5)
    for _ in range(300):
        try:
            if client.get(url).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        print("sidecar did not start:", sidecar.stderr.read().decode()[-2000:])
        return 2

    seen: list[tuple[float, float]] = []  # (time polled, lines in /metrics)
    evals: list[float] = []  # the last rule evaluation's duration, as polled
    rss_series: list[tuple[float, int]] = []
    stop = threading.Event()
    cpu_at: dict[str, float] = {}
    phase1_end = a.seconds

    def scrape() -> None:
        try:
            body = client.get(url).content
        except httpx.HTTPError:
            return
        m = LINES_RE.search(body)
        if m:
            seen.append((time.monotonic(), float(m.group(1))))
        m = EVAL_RE.search(body)
        if m:
            evals.append(float(m.group(1)))

    def poller() -> None:
        """Phase 1: a poll every --poll s; phase 2: a scrape every --scrape-interval s."""
        while not stop.is_set():
            t0 = time.monotonic()
            if t0 - t_start >= phase1_end:
                break
            scrape()
            stop.wait(max(0.0, a.poll - (time.monotonic() - t0)))
        cpu_at["phase1"] = proc_cpu_seconds(sidecar.pid)
        cpu_at["phase1_t"] = time.monotonic()
        k = 0
        while not stop.is_set():
            k += 1
            if stop.wait(max(0.0, cpu_at["phase1_t"] + k * a.scrape_interval - time.monotonic())):
                break
            scrape()

    def rss_sampler() -> None:  # /proc only: costs the sidecar nothing
        while not stop.wait(0.5):
            try:
                rss_series.append((time.monotonic(), proc_mem(sidecar.pid)[0]))
            except OSError:
                pass

    per_tick = int(a.rate_mb * 1e6 * a.tick)
    total_seconds = a.seconds + a.scrape_seconds
    cpu0 = proc_cpu_seconds(sidecar.pid)
    log_t0 = time.time()
    th = threading.Thread(target=poller, daemon=True)
    th_rss = threading.Thread(target=rss_sampler, daemon=True)
    t_start = time.monotonic()
    # the writer is a process of its own: in this one its regex work would hold the GIL and
    # delay the poller, which would then blame the sidecar for the wait
    recv, send = multiprocessing.Pipe(duplex=False)
    writer = multiprocessing.get_context("fork").Process(
        target=write_log, args=(pool, log, per_tick, a.tick, total_seconds, a.speedup, t_start, log_t0, send,
                                a.write == "lines"))
    writer.start()
    th.start()
    th_rss.start()
    writes, total_bytes, total_lines = recv.recv()
    writer.join()
    wall = time.monotonic() - t_start
    cpu1 = proc_cpu_seconds(sidecar.pid)
    stop.set()
    th.join(5)
    # let the sidecar catch up, then stop it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not seen or seen[-1][1] < total_lines):
        scrape()
        time.sleep(0.05)
    th_rss.join(5)
    rss_end, hwm = proc_mem(sidecar.pid)
    sidecar.send_signal(signal.SIGTERM)
    try:
        sidecar.wait(20)
    except subprocess.TimeoutExpired:
        sidecar.kill()

    # latency (phase 1): for each write, the first poll whose count covers it; the writes of
    # phase 1's last 2 polls + 1 s may be covered by a phase-2 scrape only, so are left out (a
    # longer latency in phase 1 still shows: its write is then covered by a scrape seconds later)
    p1_writes = [(tw, n) for tw, n in writes if tw - t_start < a.seconds - 2 * a.poll - 1.0]
    lat, j = [], 0
    for tw, n in p1_writes:
        while j < len(seen) and (seen[j][1] < n or seen[j][0] < tw):
            j += 1
        if j == len(seen):
            break
        lat.append(seen[j][0] - tw)
    missing = len(p1_writes) - len(lat)
    half = [(t, r) for t, r in rss_series if t - t_start >= wall / 2 and t - t_start <= wall]
    slope = float("nan")
    if len(half) > 2:
        mt = sum(t for t, _ in half) / len(half)
        mr = sum(r for _, r in half) / len(half)
        slope = sum((t - mt) * (r - mr) for t, r in half) / sum((t - mt) ** 2 for t, _ in half)
    rss_first = [r for t, r in rss_series if 5 <= t - t_start <= 10]
    rss_last = [r for t, r in rss_series if wall - 5 <= t - t_start <= wall]

    mb = 1e6
    t1 = cpu_at.get("phase1_t", t_start + wall)
    c1 = cpu_at.get("phase1", cpu1)
    p1_secs = t1 - t_start
    p2_secs = t_start + wall - t1
    cpu_p1 = 100 * (c1 - cpu0) / p1_secs
    cpu_p2 = 100 * (cpu1 - c1) / p2_secs if a.scrape_seconds > 0 and p2_secs > 1 else float("nan")
    p2_scrapes = [(ts, n) for ts, n in seen if t1 < ts <= t_start + wall]
    stale = staleness(writes, p2_scrapes)
    print(f"written: {total_bytes / mb:.0f} MB, {total_lines:,} lines in {wall:.1f} s "
          f"({total_bytes / mb / wall:.1f} MB/s, {total_lines / wall:,.0f} lines/s, "
          f"{'one write() per line' if a.write == 'lines' else 'one write() per batch'}); log clock "
          f"x{a.speedup:g} ({wall * a.speedup / 3600:.2f} h of log time)")
    print(f"sidecar counted: {seen[-1][1]:,.0f} lines" if seen else "sidecar counted: nothing")
    print(f"sidecar CPU, phase 1, /metrics polled every {a.poll:g} s: {cpu_p1:.1f} % of one core "
          f"({c1 - cpu0:.2f} s user+system over {p1_secs:.1f} s)")
    if a.scrape_seconds > 0:
        print(f"sidecar CPU, phase 2, /metrics scraped every {a.scrape_interval:g} s (as Prometheus): "
              f"{cpu_p2:.1f} % of one core ({cpu1 - c1:.2f} s user+system over {p2_secs:.1f} s)")
    print(f"sidecar RSS: peak {hwm / (1 << 20):.1f} MiB, at end {rss_end / (1 << 20):.1f} MiB")
    print(f"line written -> in /metrics (phase 1): p50 {pct(lat, 0.5) * 1000:.0f} ms, p99 "
          f"{pct(lat, 0.99) * 1000:.0f} ms, max {max(lat) * 1000 if lat else float('nan'):.0f} ms over "
          f"{len(lat)} writes, measured to {a.poll * 1000:g} ms (the poll interval)"
          + (f" ({missing} never seen)" if missing else ""))
    if stale:
        print(f"at each phase-2 scrape, the oldest line not yet counted was written: max "
              f"{max(stale) * 1000:.0f} ms before ({len(stale)} scrapes)")
    filling = wall / 2 * a.speedup < 3660  # the state keeps the longest rule window (1 h) + 60 s
    flat_ok = abs(slope) * 60 < 2 * (1 << 20) or filling
    print(f"memory flatness: RSS {sum(rss_first) / max(1, len(rss_first)) / (1 << 20):.1f} MiB at 5-10 s, "
          f"{sum(rss_last) / max(1, len(rss_last)) / (1 << 20):.1f} MiB in the last 5 s; slope over the second "
          f"half {slope * 60 / (1 << 20):+.2f} MiB/min -> "
          + ("not judged: the 1 h windows were still filling in the first half (run longer)" if filling
             else ('flat' if flat_ok else 'GROWING')))
    cpu_judged = cpu_p2 if a.scrape_seconds > 0 else cpu_p1
    ok = (seen and seen[-1][1] == total_lines and pct(lat, 0.99) <= 1.0 and hwm <= 100 * (1 << 20) and flat_ok
          and cpu_judged <= CPU_TARGET_PCT)
    if evals:
        print(f"rule evaluation (every 5 s, pipeline locked meanwhile): longest seen {max(evals) * 1000:.0f} ms")
    print(f"machine: {os.cpu_count()} CPUs, load average at the end {os.getloadavg()[0]:.1f} "
          "(other work on the machine delays the sidecar's threads and shows in the latency)")
    where = (f"/metrics every {a.scrape_interval:g} s" if a.scrape_seconds > 0 else f"/metrics every {a.poll:g} s")
    print(f"targets (<={CPU_TARGET_PCT:g} % CPU with {where}, <=100 MB RSS, p99 <= 1 s, flat, every line counted):",
          "met" if ok else "NOT all met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
