#!/usr/bin/env python3
"""Benchmark: peak memory of ``diagnose`` on hostile inputs and of the sidecar under an OOM flood.

Workloads (issue 10, item 2); each prints its peak RSS and the target:

1. ``diagnose`` on 10 M keyword-bearing lines (every line passes the keyword prefilter: one in
   ten is a stats line, preemption warning, OOM or KV cache line, the rest short lines with a
   keyword that no parser takes);
2. ``diagnose`` on 3 M traceback lines (one traceback of 1.5 M frames, each frame two lines);
3. ``diagnose`` on a 1 GiB request-heavy log (bench/gen_log.py);
4. ``serve --log`` while 2,000 OOM lines/s are appended for 5 minutes: RSS sampled every second,
   peak and growth over the second half (flat means bounded).

Targets: ``diagnose`` <= 150 MB whatever the input (main process, and the whole process tree
with the parallel scan's workers), the sidecar <= 100 MB and flat (its RSS grows by at most
2 MB over the second half of the flood). Exit status 1 when a target is missed.

Peak RSS of ``diagnose``: the child's ``ru_maxrss`` from os.wait4 (main process) and, sampled every
50 ms over the process tree (workers included), the largest sum of PSS (proportional set size:
pages shared between processes, such as the interpreter and Hyperscan's library, counted once in
all, which is what the tree really occupies; the target is judged on it) and, for reference, the
largest sum of VmRSS (shared pages counted once per process).

    python bench/bench_memory.py            # full sizes (10 M / 3 M lines, 1 GiB, 5 min): long
    python bench/bench_memory.py --quick    # 1 M / 300 k lines, 100 MiB, 30 s
    python bench/bench_memory.py --only sidecar
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gen_log import generate, size_arg  # noqa: E402

MB = 1_000_000
DIAGNOSE_TARGET = 150 * MB
SIDECAR_TARGET = 100 * MB

# vLLM's own wordings (tests/fixtures/logs): V1 stats, V0 stats, V0 preemption warning, OOM, KV cache
KEYWORD_LINES = (
    "(APIServer pid=7) INFO {md} {hms} [loggers.py:335] Engine 000: Avg prompt throughput: {a}.7 tokens/s, "
    "Avg generation throughput: 844.5 tokens/s, Running: {r} reqs, Waiting: {w} reqs, Preemptions: {p}, "
    "GPU KV cache usage: 97.4%, Prefix cache hit rate: 0.0%\n",
    "INFO {md} {hms} metrics.py:351] Avg prompt throughput: {a}.0 tokens/s, Avg generation throughput: 250.1 "
    "tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: 99.1%, CPU KV cache "
    "usage: 0.0%.\n",
    "WARNING {md} {hms} scheduler.py:1089] Sequence group {r} is preempted by PreemptionMode.RECOMPUTE mode "
    "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
    "total_num_cumulative_preemption={p}\n",
    "(VllmWorkerProcess pid=195295) ERROR {md} {hms} [multiproc_worker_utils.py:242] torch.OutOfMemoryError: "
    "CUDA out of memory. Tried to allocate {a}.00 MiB. GPU 2 has a total capacity of 14.62 GiB of which 3.31 "
    "MiB is free.\n",
    "(EngineCore pid=16486) INFO {md} {hms} [kv_cache_utils.py:2327] GPU KV cache size: {a}06,400 tokens, "
    "Maximum concurrency for 8,192 tokens per request: 61.82x\n",
)
OOM_LINE = KEYWORD_LINES[3]
# Short lines that carry a keyword but match no parser (what a client can make vLLM print, or a
# noisy library): the prefilter passes them, the parsers reject them. (Each holds a keyword of the
# scan, keyword_scanner().patterns: tests/test_bench.py checks that the scan passes every line.)
SHORT_LINES = ("WARNING {md} {hms} x.py:1] Error {i}\n", "INFO {md} {hms} x.py:2] Exception {i}\n",
               "INFO {md} {hms} x.py:3] LLM engine {i}\n")


def stamp(i: int, per_second: int = 100) -> tuple[str, str]:
    t = time.gmtime(1764460800 + i // per_second)
    return time.strftime("%m-%d", t), time.strftime("%H:%M:%S", t)


def write_keyword_log(path: Path, lines: int) -> None:
    with open(path, "w") as fh:
        buf = []
        for i in range(lines):
            md, hms = stamp(i)
            if i % 10 == 0:  # one line in ten is a real incident or stats line, the rest short
                k = i // 10
                buf.append(KEYWORD_LINES[k % len(KEYWORD_LINES)].format(md=md, hms=hms, a=k % 997, r=k % 301,
                                                                        w=k % 53, p=k // 50))
            else:
                buf.append(SHORT_LINES[i % 3].format(md=md, hms=hms, i=i))
            if len(buf) >= 20000:
                fh.write("".join(buf))
                buf.clear()
        fh.write("".join(buf))


def write_traceback_log(path: Path, lines: int) -> None:
    with open(path, "w") as fh:
        fh.write("(EngineCore pid=9) ERROR 11-30 09:00:00 [core.py:710] EngineCore failed to start.\n")
        fh.write("Traceback (most recent call last):\n")
        frames = (lines - 3) // 2
        chunk = []
        for i in range(frames):
            chunk.append(f'  File "/usr/lib/python3/site-packages/vllm/model_executor/layer_{i % 97}.py", '
                         f"line {i % 4000}, in forward\n    hidden = self.mlp(hidden_states)  # {i}\n")
            if len(chunk) >= 10000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("".join(chunk))
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
                 "capacity of 14.62 GiB of which 3.31 MiB is free.\n")


def _tree_sum(pid: int, proc_file: str, field: str) -> int:
    """Sum of ``field`` (kB) in /proc/PID/``proc_file`` over ``pid`` and its descendants (bytes)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/{proc_file}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
                    break
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def tree_rss(pid: int) -> int:
    """Sum of VmRSS of ``pid`` and its descendants (bytes)."""
    return _tree_sum(pid, "status", "VmRSS:")


def tree_pss(pid: int) -> int:
    """Sum of Pss (/proc/PID/smaps_rollup) of ``pid`` and its descendants (bytes)."""
    return _tree_sum(pid, "smaps_rollup", "Pss:")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def diagnose_peak(path: Path, workers: int | None = None) -> tuple[int, int, int, float, int, float]:
    """(main process peak RSS, process tree peak RSS, process tree peak PSS, seconds, exit code, CPU
    seconds of the process tree) of one diagnose run (``workers``: VLLM_DOCTOR_WORKERS, 1 = no
    parallel scan; None = diagnose's default). The CPU seconds are user + system time from
    os.wait4, which on Linux include the workers diagnose waited for."""
    t0 = time.perf_counter()
    env = dict(os.environ)
    if workers is not None:
        env["VLLM_DOCTOR_WORKERS"] = str(workers)
    p = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "diagnose", str(path), "--format", "json"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peak_tree = peak_pss = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree, peak_pss
        while not stop.is_set():
            peak_tree = max(peak_tree, tree_rss(p.pid))
            peak_pss = max(peak_pss, tree_pss(p.pid))
            stop.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, ru = os.wait4(p.pid, 0)
    stop.set()
    th.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    return (ru.ru_maxrss * 1024, max(peak_tree, ru.ru_maxrss * 1024), peak_pss, time.perf_counter() - t0,
            p.returncode, ru.ru_utime + ru.ru_stime)


def free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def sidecar(tmp: Path, rate: int, seconds: float) -> tuple[list[tuple[float, int]], int]:
    """RSS samples [(seconds since the flood began, bytes)] of ``serve`` while ``rate`` OOM lines/s
    are appended for ``seconds`` s; and the lines written."""
    import httpx

    log = tmp / "flood.log"
    log.write_text("")
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "serve", "--log", str(log), "--metrics-url", "none",
                          "--no-nvml", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        samples: list[tuple[float, int]] = []
        written = 0
        t0 = time.monotonic()
        next_sample = 0.0
        tick = 0.05
        with open(log, "a") as fh:
            while (el := time.monotonic() - t0) < seconds:
                due = int(el * rate) - written
                if due > 0:
                    fh.write("".join(OOM_LINE.format(md=md, hms=hms, a=(written + k) % 997)
                                     for k in range(due) for md, hms in [stamp(written + k, rate)]))
                    fh.flush()
                    written += due
                if el >= next_sample:
                    samples.append((el, rss(p.pid)))
                    next_sample += 1.0
                time.sleep(tick)
        time.sleep(2)
        samples.append((time.monotonic() - t0, rss(p.pid)))
        try:  # how far it got (it may still be working through a backlog on a busy machine)
            got = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
            lines = next((float(x.split()[-1]) for x in got.splitlines()
                          if x.startswith("vllm_doctor_log_lines_total{")), 0.0)
            print(f"    the sidecar had read {lines:,.0f} of {written:,} lines", flush=True)
        except httpx.HTTPError as exc:
            print(f"    /metrics did not answer ({type(exc).__name__})", flush=True)
        return samples, written
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def verdict(value: int, target: int) -> str:
    return f"{value / MB:7.1f} MB  (target <= {target / MB:.0f} MB: {'ok' if value <= target else 'OVER'})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs and a 30 s flood")
    ap.add_argument("--only", choices=("keywords", "tracebacks", "requests", "sidecar"), action="append")
    ap.add_argument("--dir", default=os.environ.get("VLLM_DOCTOR_BENCH_DIR", tempfile.gettempdir()))
    ap.add_argument("--flood-seconds", type=float, default=None)
    ap.add_argument("--rate", type=int, default=2000, help="OOM lines per second appended to the sidecar's log")
    ap.add_argument("--workers", type=int, default=None,
                    help="VLLM_DOCTOR_WORKERS for diagnose (1: no parallel scan; default: diagnose's own choice)")
    args = ap.parse_args()
    only = set(args.only or ("keywords", "tracebacks", "requests", "sidecar"))
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    kw_lines = 1_000_000 if args.quick else 10_000_000
    tb_lines = 300_000 if args.quick else 3_000_000
    req_size = size_arg("100MiB" if args.quick else "1GiB")
    flood = args.flood_seconds or (30.0 if args.quick else 300.0)
    over = 0
    print(f"vllm-doctor memory benchmark ({os.cpu_count()} CPUs){' --quick' if args.quick else ''}", flush=True)
    cases = []
    if "keywords" in only:
        cases.append((f"{kw_lines:,} keyword-bearing lines", d / f"vd-mem-keywords-{kw_lines}.log",
                      lambda p: write_keyword_log(p, kw_lines)))
    if "tracebacks" in only:
        cases.append((f"{tb_lines:,} traceback lines", d / f"vd-mem-traceback-{tb_lines}.log",
                      lambda p: write_traceback_log(p, tb_lines)))
    if "requests" in only:
        cases.append((f"{req_size / (1 << 20):,.0f} MiB request-heavy log", d / f"vd-mem-requests-{req_size}.log",
                      lambda p: generate(req_size, open(p, "w"), seed=1)))
    for label, path, make in cases:
        if not path.exists():
            tmp = path.with_suffix(".part")
            make(tmp)
            tmp.rename(path)
        load = os.getloadavg()[0]
        main_peak, tree_peak, tree_pss_peak, secs, rc, cpu = diagnose_peak(path, args.workers)
        n = sum(1 for _ in open(path, "rb"))
        how = "" if args.workers is None else f", VLLM_DOCTOR_WORKERS={args.workers}"
        print(f"diagnose, {label} ({path.stat().st_size / MB:,.0f} MB{how}, exit {rc}): {n / secs:,.0f} lines/s wall, "
              f"{n / max(cpu, 1e-9):,.0f} lines/s per core (lines / CPU seconds of the process tree; load average "
              f"{load:.1f} at start)", flush=True)
        print(f"    peak RSS main process {verdict(main_peak, DIAGNOSE_TARGET)}", flush=True)
        print(f"    peak PSS process tree {verdict(tree_pss_peak, DIAGNOSE_TARGET)}", flush=True)
        print(f"    peak RSS process tree {tree_peak / MB:.1f} MB (shared pages counted once per process)", flush=True)
        over += main_peak > DIAGNOSE_TARGET or tree_pss_peak > DIAGNOSE_TARGET
    if "sidecar" in only:
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            samples, written = sidecar(Path(tmp), args.rate, flood)
        peak = max(b for _, b in samples)
        half = [b for t, b in samples if t >= flood / 2]
        growth = (half[-1] - half[0]) if len(half) >= 2 else 0
        per_min = growth / max(1e-9, (flood / 2) / 60)
        print(f"serve --log under {args.rate:,} OOM lines/s for {flood:.0f} s ({written:,} lines):", flush=True)
        print(f"    RSS at start {samples[0][1] / MB:.1f} MB, end {samples[-1][1] / MB:.1f} MB", flush=True)
        print(f"    peak RSS {verdict(peak, SIDECAR_TARGET)}", flush=True)
        flat = growth <= 2 * MB  # bounded: the second half adds no more than allocator noise
        print(f"    growth over the second half {growth / MB:+.1f} MB ({per_min / MB:+.2f} MB/min: "
              f"{'flat' if flat else 'GROWING'})", flush=True)
        over += peak > SIDECAR_TARGET or not flat
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
