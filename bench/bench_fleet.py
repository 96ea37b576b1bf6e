#!/usr/bin/env python3
"""Benchmark ``diagnose --prometheus``: 10 and 100 replicas x 6 h at vLLM's real export density.

Backfills (once per size; the TSDB blocks are kept in ``--data``) a real Prometheus with the
history of the replicas over ``--hours`` hours, built by tests/fleet_history.py out of the real
vLLM 0.32 capture and logs: every ``vllm:`` series that vLLM 0.32 exports (330 per engine: every
histogram's buckets, count and sum) at a 15 s scrape, incidents on 19 replicas of 100 (storm,
KV-capacity-bound, prefill blocking decode, imbalance, a data-parallel engine imbalance, one
replica's TTFT and one's ITL breach, a replica that dies), one replica in ten on vLLM 0.8.5's
names; then starts Prometheus on it and times the diagnosis: the range and instant queries, the
typed events, one pipeline and the rules per replica, the fleet rules and the report.

    python bench/bench_fleet.py [--replicas 10,100] [--hours 6] [--step 15s] [--runs 3]

Prints the backfill (once), then for each run: wall, CPU (this process and its judging
workers), the time spent waiting on Prometheus, the peak RSS of this process and of its largest
worker, the load average of the machine at that moment, and what was found. Target (issue 22):
100 replicas <= 10 s wall, <= 200 MB RSS on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import fleet_history  # noqa: E402


def _peak_rss_mb() -> tuple[float, float]:
    """Peak resident memory (MB) of this process, and of its largest finished child (a judging worker)."""
    import resource

    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def _cpu() -> float:
    """User + system CPU seconds of this process and its finished children (the judging workers)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (Prometheus), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the incidents of the benchmark's fleet (the rest healthy): tests/fleet_history.py's kinds
PLAN = (["storm"] * 3 + ["kv-bound"] * 3 + ["stalled"] * 2 + ["hot"] * 2 + ["cold"] * 4 + ["dp", "ttft", "itl", "dying"])


def bench(n: int, args, prometheus: str, promtool: str) -> None:
    data = args.data / f"{n}x{args.hours:g}h"
    meta = data / "bench.json"
    if not meta.is_file():
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        start = (int(time.time()) // 3600) * 3600 - int(args.hours * 3600) - 3600
        t0 = time.monotonic()
        reps = fleet_history.scenario(n, args.hours, plan=PLAN[:n], old=set(range(5, n, 10)))
        src = data / "fleet.om.txt"
        with src.open("w") as out:
            samples = fleet_history.write_openmetrics(reps, start, args.hours, out, density="real")
        t1 = time.monotonic()
        fleet_history.backfill(promtool, src, data, data)
        print(f"backfill (once): {samples:,} samples ({src.stat().st_size / 1e9:.1f} GB of OpenMetrics) built in "
              f"{t1 - t0:.0f} s, promtool tsdb create-blocks-from openmetrics {time.monotonic() - t1:.0f} s")
        src.unlink()
        meta.write_text(json.dumps({"start": start}))
    start = json.loads(meta.read_text())["start"]
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={ROOT / 'bench' / 'prometheus-empty.yml'}",
                             f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        from vllm_doctor.fleet import diagnose_prometheus
        import vllm_doctor.fleet.prometheus as prom

        spent = [0.0]
        post = prom.PrometheusClient._post

        def timed(self, path, form):
            t = time.monotonic()
            try:
                return post(self, path, form)
            finally:
                spent[0] += time.monotonic() - t

        prom.PrometheusClient._post = timed
        since, until = str(start), str(start + int(args.hours * 3600))
        print(f"diagnose --prometheus {url} --since {since} --until {until} --step {args.step}: "
              f"{n} replicas x {args.hours:g} h")
        best = None
        for run in range(args.runs):
            spent[0] = 0.0
            cpu0, prom0 = _cpu(), _proc_cpu(proc.pid)
            t0 = time.monotonic()
            res = diagnose_prometheus(url, since=since, until=until, step=args.step)
            wall = time.monotonic() - t0
            cpu, prom_cpu = _cpu() - cpu0, _proc_cpu(proc.pid) - prom0
            best = wall if best is None else min(best, wall)
            found = sum(1 for s in res.replicas if s.findings)
            print(f"  run {run + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU of vllm-doctor + {prom_cpu:.2f} s of Prometheus "
                  f"(on {os.cpu_count()} idle cores at least {(cpu + prom_cpu) / (os.cpu_count() or 1):.1f} s), peak RSS "
                  f"{_peak_rss_mb()[0]:.0f} MB (largest worker {_peak_rss_mb()[1]:.0f} MB), load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; waiting on Prometheus {spent[0]:.2f} s; "
                  f"{len(res.replicas)} replicas, {found} with findings, fleet findings: "
                  f"{', '.join(sorted(f.name for f in res.fleet_findings)) or '-'}")
        print(f"best of {n}: {best:.2f} s wall (target for 100: <= 10 s, <= 200 MB)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="10,100", help="fleet sizes, comma-separated")
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", default="15s")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "vllm-doctor-bench" / "fleet")
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("prometheus / promtool not found (apt-get install prometheus)", file=sys.stderr)
        return 2
    for n in [int(x) for x in str(args.replicas).split(",") if x]:
        bench(n, args, prometheus, promtool)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
