#!/usr/bin/env python3
"""Benchmark: `vllm-doctor diagnose` against `grep -c preempt` on the same large vLLM log, for
each realistic shape of log that vLLM writes (bench/gen_log.py):

* v0: request-heavy, vLLM <= 0.9's V0 engine with its default request logging (``Received request
  ... prompt: '...'``, ``Added request``, ``Finished request``, uvicorn access lines);
* debug: vLLM 0.32 at VLLM_LOGGING_LEVEL=DEBUG with --enable-log-requests (each prompt twice, its
  token ids, health probes);
* stats8: a week of the stats lines of 8 data-parallel engines with an hour's storm in it (about
  130 MB whatever --size: what a week is; --stats-days changes it);
* v1: request-heavy vLLM 0.32 with --enable-log-requests.

Each log is generated once (default 1 GiB, kept in --dir for reuse; --clean deletes it after),
the page cache warmed, then each command timed --runs times (best run reported), each child's
peak RSS read from os.wait4. Prints throughput, the ratio to grep, peak RSS and the load average
(the machine may be shared: a ratio measured at load 6 on 2 cores is not one measured at load 1).
Targets (issue 26 item 10): wall time <= 3x grep, peak RSS <= 150 MB whatever the log size.
Then the throughput of keyword-bearing lines (lines the prefilter passes and the matcher table
reads: stats lines, V0 preemption warnings, OOM lines, traceback frames) through the one
pipeline in this process, per core (lines / CPU seconds of this process), with the cost per line
of each stage: a figure to follow, not a target (issue 26 dropped the 300k lines/s one).

    python bench/bench_diagnose.py                        # v0, debug, stats8: 1 GiB each
    python bench/bench_diagnose.py --shape v0 --size 200MiB --runs 3
    python bench/bench_diagnose.py --throughput-only --keyword-lines 200000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gen_log import SHAPES, generate_stats8, size_arg  # noqa: E402

from vllm_doctor import events as ev  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, int, int, float]:
    """(wall seconds, peak RSS bytes, exit code, CPU seconds: user + system of the command and of
    the workers it started) of one run, output discarded."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, ru.ru_maxrss * 1024, p.returncode, cpu


# One template per kind of keyword-bearing line (vLLM's own wordings, as in tests/fixtures/logs):
# {md} {hms} is the log time (100 lines a second), {a} {b} {c} vary per line, so that no line
# repeats the one before it (a cache of the last line or timestamp string gains nothing unfair).
KEYWORD_LINES = {
    "V1 stats line": "(APIServer pid=1) INFO {md} {hms} [loggers.py:271] Engine 000: Avg prompt throughput: {a}.5 tokens/s, Avg generation throughput: {b}.0 tokens/s, Running: {c} reqs, Waiting: {b} reqs, GPU KV cache usage: {c}.9%, Prefix cache hit rate: 0.{a}%",
    "V0 preemption warning": "WARNING {md} {hms} scheduler.py:1141] Sequence group {a} is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={b}",
    "OOM line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {a}.00 MiB. GPU 0 has a total capacity of 79.1 GiB of which {c}.2 MiB is free.",
    "traceback frame": '(EngineCore_DP0 pid=7) ERROR {md} {hms} [core.py:710]   File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line {a}, in run_busy_loop',
    "request line with a keyword": "(APIServer pid=1) INFO {md} {hms} [logger.py:43] Received request cmpl-{a}: prompt: 'why does CUDA out of memory happen', params: SamplingParams(n=1)",
}


def keyword_data(template: str, n: int) -> bytes:
    """``n`` lines of one kind, the log time advancing 100 lines a second."""
    out = []
    t0 = 1764460800  # 11-30 00:00:00
    for i in range(n):
        t = time.gmtime(t0 + i // 100)
        out.append(template.format(md=time.strftime("%m-%d", t), hms=time.strftime("%H:%M:%S", t),
                                   a=i % 1000, b=(i * 7) % 97, c=(i * 13) % 89) + "\n")
    return "".join(out).encode()


def keyword_throughput(n: int) -> None:
    """Lines per second of each kind of keyword-bearing line through the one pipeline
    (Pipeline.feed, 1 MiB blocks, in this process: one core), measured in CPU time of this
    process (time.process_time), so that other load on the machine does not count; then where
    the time goes per line, stage by stage (the stages run apart on the same lines)."""
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.ingest.envelope import Envelope, LineSplitter, LogClock, candidate_spans
    from vllm_doctor.parsers.records import RecordParser, keyword_scanner
    from vllm_doctor.pipeline import Pipeline

    rules = load_rules([])
    worst = None
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; figures are CPU time (time.process_time)")
    for name, template in KEYWORD_LINES.items():
        data = keyword_data(template, n)
        pipe = Pipeline(rules, base_year=2026)
        t0 = time.process_time()
        for i in range(0, len(data), 1 << 20):
            pipe.feed("bench.log", data[i : i + (1 << 20)])
        pipe.end("bench.log")
        total = time.process_time() - t0
        rate = n / total
        worst = rate if worst is None else min(worst, rate)
        # the stages alone, on the same 1 MiB blocks of complete lines as the pipeline's: keyword
        # scan, envelope (records), parser (typed events); the rest of the total is the state
        # and the rules
        split = LineSplitter()
        spans = [sp for i in range(0, len(data), 1 << 20) for sp in split.feed(data[i : i + (1 << 20)])] + split.flush()
        scanner = keyword_scanner()  # (compiling its database is no cost per line)
        t0 = time.process_time()
        blocks = [(buf, candidate_spans(scanner, buf, a, b)) for buf, a, b in spans]
        t1 = time.process_time()

        def records(env):
            base = 1
            for buf, (starts, ends, idxs, nlines, _) in blocks:
                for a, b, k in zip(starts, ends, idxs):
                    yield from env.records(base + k, buf[a:b])
                base += nlines

        for _ in records(Envelope(LogClock(2026))):  # each record dropped once made, as in the pipeline
            pass
        t2 = time.process_time()
        recs = list(records(Envelope(LogClock(2026))))  # the parser's input, untimed (a list of
        parser = RecordParser("bench.log")  # every record costs its GC)
        t2b = time.process_time()
        for r in recs:
            parser.parse(r)
        t3 = time.process_time() - t2b + t2
        us = [1e6 * x / n for x in (t1 - t0, t2 - t1, t3 - t2)]
        rest = 1e6 * total / n - sum(us)
        print(f"keyword-bearing lines, {name:<28} {rate:10,.0f} lines/s per core ({n:,} lines; per line: "
              f"scan {us[0]:.1f} us, envelope {us[1]:.1f} us, parser {us[2]:.1f} us, state+rules {max(rest, 0):.1f} us)")
    print(f"slowest kind: {worst:,.0f} lines/s per core")
    keyword_floor(n)


# The least work any per-line design with typed events does for a line of each kind: one regex
# written for exactly the bench's line (no alternatives, no wrapper, no fallback), its numbers
# converted, one Meta and one event built, kept in a bounded ring; nothing else (no state, no
# rule, no client-text check, no version or shape logic). A lower bound, not a design.
def _floor_stats(meta, g):
    return ev.SchedulerStats(meta, float(g[1]), float(g[2]), int(g[3]), int(g[4]), None, round(float(g[5]) / 100, 6),
                             None, round(float(g[6]) / 100, 6), None, int(g[0]), "GPU")


def _floor_preemption(meta, g):
    return ev.Preemption(meta, g[1], int(g[2]), g[0])


def _floor_oom(meta, g):
    return ev.OutOfMemory(meta, round(float(g[0]) * 2**20), round(float(g[2]) * 2**30), round(float(g[3]) * 2**20),
                          int(g[1]))


FLOOR = {
    "V1 stats line": (r"Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) "
                      r"tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%, "
                      r"Prefix cache hit rate: ([\d.]+)%", _floor_stats),
    "V0 preemption warning": (r"Sequence group (\S+) is preempted by PreemptionMode\.(\w+) mode .*"
                              r"total_num_cumulative_preemption=(\d+)", _floor_preemption),
    "OOM line": (r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+) MiB\. GPU (\d+) has a "
                 r"total capacity of ([\d.]+) GiB of which ([\d.]+) MiB is free\.", _floor_oom),
}


def keyword_floor(n: int) -> None:
    """The lower bound of FLOOR per kind: the keyword scan (as in the pipeline) plus decoding,
    cutting the logger prefix at its first '] ' if any (time read from a cache of the prefix text), the
    one regex, the numbers, a Meta and the event. Its ceiling (1 / that cost) is what no per-line
    design with typed events can pass in CPython on this machine, before any state or rule."""
    import re
    from collections import deque

    from vllm_doctor.ingest.envelope import LineSplitter, candidate_spans
    from vllm_doctor.parsers.records import keyword_scanner

    for name, (pattern, build) in FLOOR.items():
        data = keyword_data(KEYWORD_LINES[name], n)
        split = LineSplitter()
        spans = [sp for i in range(0, len(data), 1 << 20) for sp in split.feed(data[i : i + (1 << 20)])] + split.flush()
        scanner, rx, ring, times, meta = keyword_scanner(), re.compile(pattern), deque(maxlen=20000), {}, ev.Meta
        best = None
        for _ in range(3):  # best of three: a floor
            t0 = time.process_time()
            for buf, a, b in spans:
                starts, ends, idxs, _, _ = candidate_spans(scanner, buf, a, b)
                for s, e, k in zip(starts, ends, idxs):
                    line = buf[s:e].decode()
                    i = line.find("] ")  # -1: a line with no logger prefix (the OOM line's)
                    ts = times.get(line[:i])
                    if ts is None:
                        ts = times[line[:i]] = float(len(times))
                    msg = line[i + 2 :] if i >= 0 else line
                    ring.append(build(meta("bench.log", k, k, ts, None, "INFO", msg), rx.match(msg).groups()))
            t = (time.process_time() - t0) / n
            best = t if best is None else min(best, t)
        print(f"floor of any per-line design with typed events, {name:<22} {1e6 * best:.2f} us a line: at most "
              f"{1 / best:10,.0f} lines/s per core before any state or rule")


def bench_shape(shape: str, size: int, runs: int, folder: str, stats_days: float, clean: bool) -> float:
    """Generate (once) the ``shape`` log, time grep and diagnose on it; print; the ratio."""
    name = f"vllm-doctor-bench-{shape}-{f'{stats_days:g}d' if shape == 'stats8' else f'{size >> 20}MiB'}.log"
    path = Path(folder) / name
    if not path.exists():
        t0 = time.perf_counter()
        with open(path, "w") as fh:
            if shape == "stats8":
                n = generate_stats8(size, fh, span=stats_days * 86400)
            else:
                n = SHAPES[shape](size, fh)
        print(f"generated {path} ({path.stat().st_size / 2**20:,.0f} MiB, {n:,} "
              f"{'stats lines' if shape == 'stats8' else 'requests'}) in {time.perf_counter() - t0:.1f} s")
    real = path.stat().st_size
    with open(path, "rb") as fh:  # warm the page cache for both commands
        while fh.read(1 << 24):
            pass
    doctor = [sys.executable, "-m", "vllm_doctor", "diagnose", "--format", "json", "--fail-on", "never", str(path)]
    grep = ["grep", "-c", "preempt", str(path)]  # (grep's time hardly depends on the word: it reads every byte)
    print(f"== shape {shape}: {real / 2**20:,.0f} MiB, {sum(1 for _ in open(path, 'rb')):,} lines")
    res = {}
    for label, cmd in (("grep -c preempt", grep), ("vllm-doctor diagnose", doctor)):
        out = []
        for _ in range(runs):
            load = os.getloadavg()[0]
            out.append((*timed(cmd), load))
        best = min(r[0] for r in out)
        res[label] = (best, max(r[1] for r in out), min(r[3] for r in out))
        print(f"{label:<22} best {best:6.2f} s  {real / best / 2**20:8,.0f} MiB/s  peak RSS {res[label][1] / 2**20:6.1f} MiB  "
              f"CPU {res[label][2]:.2f} s (runs: {', '.join(f'{r[0]:.2f} s, CPU {r[3]:.2f} s at load {r[4]:.1f}' for r in out)}; "
              f"exit {out[-1][2]})")
    ratio = res["vllm-doctor diagnose"][0] / res["grep -c preempt"][0]
    cpu_ratio = res["vllm-doctor diagnose"][2] / max(res["grep -c preempt"][2], 1e-3)
    rss = res["vllm-doctor diagnose"][1]
    print(f"{shape}: diagnose / grep wall-time ratio {ratio:.2f}x (target <= 3x): {'OK' if ratio <= 3 else 'OVER'}; "
          f"CPU-time ratio {cpu_ratio:.2f}x; peak RSS {rss / 2**20:.1f} MiB (target <= 150 MB): "
          f"{'OK' if rss <= 150e6 else 'OVER'}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          f"(a loaded machine stretches the wall times)")
    if shape == "stats8":
        floor = python_floor(path)
        print(f"stats8 floor: Python only reading each stats line's numbers (a loop, one regex search, six numbers; no "
              f"event, state or rule) takes CPU {floor:.2f} s = {floor / max(res['grep -c preempt'][2], 1e-3):.1f}x grep's "
              f"CPU: a design that reads every stats line cannot be within 3x grep on this shape")
    if clean:
        path.unlink()
    return ratio


STATS_NUMBERS_RE = re.compile(rb"Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: "
                              rb"([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%")


def python_floor(path: Path) -> float:
    """CPU seconds of the least any Python reader of every stats line does: iterate the lines,
    search each for the stats wording and turn its six numbers into ints and floats."""
    search = STATS_NUMBERS_RE.search
    t0 = time.process_time()
    with open(path, "rb") as fh:
        for line in fh:
            m = search(line)
            if m is not None:
                g = m.groups()
                (int(g[0]), float(g[1]), float(g[2]), int(g[3]), int(g[4]), float(g[5]))
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("VLLM_DOCTOR_BENCH_DIR", tempfile.gettempdir()))
    ap.add_argument("--keyword-lines", type=int, default=1_000_000, help="lines per kind in the throughput test")
    ap.add_argument("--throughput-only", action="store_true", help="only the keyword-bearing lines throughput")
    ap.add_argument("--shape", default="v0,debug,stats8",
                    help="comma-separated shapes of log (bench/gen_log.py): " + ", ".join(SHAPES))
    ap.add_argument("--stats-days", type=float, default=7, help="the stats8 log's span in days of log time")
    ap.add_argument("--clean", action="store_true", help="delete each generated log once measured")
    a = ap.parse_args()
    if a.throughput_only:
        keyword_throughput(a.keyword_lines)
        return
    shapes = [x.strip() for x in a.shape.split(",") if x.strip()]
    bad = [x for x in shapes if x not in SHAPES]
    if bad:
        ap.error(f"--shape {bad[0]!r}: expected some of {', '.join(SHAPES)}")
    from vllm_doctor.parsers.records import keyword_scanner

    print(f"keyword scanner: {keyword_scanner().backend}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    ratios = {x: bench_shape(x, size_arg(a.size), a.runs, a.dir, a.stats_days, a.clean) for x in shapes}
    print("summary, diagnose / grep: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    keyword_throughput(a.keyword_lines)


if __name__ == "__main__":
    main()
