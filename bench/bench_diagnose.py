#!/usr/bin/env python3
"""Benchmark: `vllm-doctor diagnose` against `grep -c preempt` on the same large vLLM log.

Generates a request-heavy vLLM log (bench/gen_log.py; default 1 GiB, kept in --dir for reuse),
warms the page cache, then times each command --runs times (best run reported) and reads each
child's peak RSS from os.wait4. Prints throughput, the ratio to grep and peak RSS.
Targets (issue 2): wall time <= 3x grep, peak RSS <= 150 MB whatever the log size.
Then the throughput of keyword-bearing lines (lines the prefilter passes and the matcher table
reads: stats lines, V0 preemption warnings, OOM lines, traceback frames) through the one
pipeline in this process, on one core (target, issue 10: >= 300k lines/s).

    python bench/bench_diagnose.py                # 1 GiB
    python bench/bench_diagnose.py --size 200MiB --runs 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gen_log import generate, size_arg  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one run, output discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_maxrss * 1024, p.returncode


KEYWORD_LINES = {
    "V1 stats line": "(APIServer pid=1) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 300.0 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%, Prefix cache hit rate: 0.0%",
    "V0 preemption warning": "WARNING 08-20 10:18:39 scheduler.py:1141] Sequence group 147 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=1",
    "OOM line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.1 GiB of which 1.2 MiB is free.",
    "traceback frame": '(EngineCore_DP0 pid=7) ERROR 05-19 10:13:11 [core.py:710]   File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 100, in run_busy_loop',
    "request line with a keyword": "(APIServer pid=1) INFO 05-19 10:13:11 [logger.py:43] Received request cmpl-1: prompt: 'why does CUDA out of memory happen', params: SamplingParams(n=1)",
}


def keyword_throughput(n: int) -> None:
    """Lines per second of each kind of keyword-bearing line through Pipeline.feed (one core)."""
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.pipeline import Pipeline

    rules = load_rules([])
    worst = None
    for name, line in KEYWORD_LINES.items():
        data = (line + "\n").encode() * n
        pipe = Pipeline(rules, base_year=2026)
        t0 = time.process_time()
        for i in range(0, len(data), 1 << 20):
            pipe.feed("bench.log", data[i : i + (1 << 20)])
        pipe.end("bench.log")
        rate = n / (time.process_time() - t0)
        worst = rate if worst is None else min(worst, rate)
        print(f"keyword-bearing lines, {name:<28} {rate:12,.0f} lines/s per core (CPU time, {n:,} lines)")
    print(f"slowest kind: {worst:,.0f} lines/s per core (target >= 300,000): {'OK' if worst >= 300_000 else 'UNDER'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("VLLM_DOCTOR_BENCH_DIR", tempfile.gettempdir()))
    ap.add_argument("--keyword-lines", type=int, default=1_000_000, help="lines per kind in the throughput test")
    ap.add_argument("--throughput-only", action="store_true", help="only the keyword-bearing lines throughput")
    a = ap.parse_args()
    if a.throughput_only:
        keyword_throughput(a.keyword_lines)
        return
    size = size_arg(a.size)
    path = Path(a.dir) / f"vllm-doctor-bench-{size >> 20}MiB.log"
    if not path.exists() or path.stat().st_size < size * 0.99:
        t0 = time.perf_counter()
        with open(path, "w") as fh:
            n = generate(size, fh)
        print(f"generated {path} ({path.stat().st_size / 2**20:,.0f} MiB, {n:,} requests) in {time.perf_counter() - t0:.1f} s")
    real = path.stat().st_size
    with open(path, "rb") as fh:  # warm the page cache for both commands
        while fh.read(1 << 24):
            pass
    doctor = [sys.executable, "-m", "vllm_doctor", "diagnose", "--format", "json", "--fail-on", "never", str(path)]
    grep = ["grep", "-c", "preempt", str(path)]
    from vllm_doctor.envelope import KeywordScanner

    print(f"log: {real / 2**20:,.0f} MiB, {sum(1 for _ in open(path, 'rb')):,} lines; keyword scanner: {KeywordScanner().backend}")
    res = {}
    for name, cmd in (("grep -c preempt", grep), ("vllm-doctor diagnose", doctor)):
        runs = [timed(cmd) for _ in range(a.runs)]
        best = min(r[0] for r in runs)
        rss = max(r[1] for r in runs)
        res[name] = (best, rss)
        print(f"{name:<22} best {best:6.2f} s  {real / best / 2**20:8,.0f} MiB/s  peak RSS {rss / 2**20:6.1f} MiB  "
              f"(runs: {', '.join(f'{r[0]:.2f}' for r in runs)}; exit {runs[-1][2]})")
    ratio = res["vllm-doctor diagnose"][0] / res["grep -c preempt"][0]
    rss = res["vllm-doctor diagnose"][1]
    print(f"diagnose / grep wall-time ratio: {ratio:.2f}x (target <= 3x): {'OK' if ratio <= 3 else 'OVER'}")
    print(f"diagnose peak RSS: {rss / 2**20:.1f} MiB (target <= 150 MB): {'OK' if rss <= 150e6 else 'OVER'}")
    keyword_throughput(a.keyword_lines)


if __name__ == "__main__":
    main()
