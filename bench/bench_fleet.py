#!/usr/bin/env python3
"""Benchmark ``diagnose --prometheus``: 100 replicas x 6 h at a 15 s step.

Backfills (once; the TSDB blocks are kept in ``--data``) a real Prometheus with the history of
``--replicas`` replicas over ``--hours`` hours, built by tests/fleet_history.py out of the real
vLLM 0.32 captures and logs (15 replicas in incidents, the rest healthy; the TTFT histogram every
minute), starts Prometheus on it, then times the diagnosis: the range and instant queries, the
typed events, one pipeline and the rules per replica, the fleet rules and the report.

    python bench/bench_fleet.py [--replicas 100] [--hours 6] [--step 15s] [--runs 3]

Prints the backfill time (once), then for each run the wall time of the diagnosis, split into
querying Prometheus and the rest, its CPU, the peak RSS of this process (it holds the fetched
series and the judged replicas; its children's figure includes Prometheus and promtool, reaped
here), and the incidents found. Target (issue 13): <= 10 s.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", default="15s")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "vllm-doctor-bench" / "fleet")
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("prometheus / promtool not found (apt-get install prometheus)", file=sys.stderr)
        return 2
    data = args.data / f"{args.replicas}x{args.hours:g}h"
    meta = data / "bench.json"
    if not meta.is_file():
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        start = (int(time.time()) // 3600) * 3600 - int(args.hours * 3600) - 3600
        t0 = time.monotonic()
        reps = fleet_history.scenario(args.replicas, args.hours)
        text = fleet_history.openmetrics(reps, start, args.hours,
                                         histograms=("vllm:time_to_first_token_seconds",))
        t1 = time.monotonic()
        fleet_history.backfill(promtool, text, data, data)
        print(f"backfill (once): {len(text.splitlines()):,} OpenMetrics lines built in {t1 - t0:.1f} s, "
              f"promtool tsdb create-blocks-from openmetrics {time.monotonic() - t1:.1f} s")
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
              f"{args.replicas} replicas x {args.hours:g} h")
        best = None
        for run in range(args.runs):
            spent[0] = 0.0
            cpu0 = _cpu()
            t0 = time.monotonic()
            res = diagnose_prometheus(url, since=since, until=until, step=args.step)
            wall = time.monotonic() - t0
            cpu = _cpu() - cpu0
            best = wall if best is None else min(best, wall)
            found = sum(1 for s in res.replicas if s.findings)
            print(f"  run {run + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU of vllm-doctor (queries {spent[0]:.2f} s summed over parallel requests), "
                  f"{len(res.replicas)} replicas, {found} with findings, fleet findings: "
                  f"{', '.join(sorted(f.name for f in res.fleet_findings)) or '-'}; peak RSS {_peak_rss_mb()[0]:.0f} MB "
                  f"(largest worker {_peak_rss_mb()[1]:.0f} MB)")
        print(f"best: {best:.2f} s (target <= 10 s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
