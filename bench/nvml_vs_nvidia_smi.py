"""Compare the sidecar's GPU metrics with nvidia-smi on a machine with a real NVIDIA GPU.

Starts the sidecar (NVML source only, real pynvml) with its HTTP server on 127.0.0.1, reads
/metrics through HTTP, and prints, per GPU, what the sidecar exports next to
``nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw,
temperature.gpu --format=csv,noheader,nounits``. Also times one NVML poll (the sidecar never
polls on the scrape path). Exit 1 when memory used/total or identity disagree.

    python bench/nvml_vs_nvidia_smi.py [--port 9411]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from vllm_doctor.export.serve import Sidecar, load_config
from vllm_doctor.export.server import create_app

MiB = 1 << 20


def smi() -> list[dict]:
    q = "index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw,temperature.gpu"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        i, uuid, name, used, total, util, power, temp = [x.strip() for x in line.split(",")]
        rows.append(dict(index=i, uuid=uuid, name=name, used_mib=float(used), total_mib=float(total),
                         util_pct=float(util), power_w=float(power), temp_c=float(temp)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=9411)
    args = ap.parse_args()
    cfg = load_config({"metrics_url": "none", "nvml": True, "host": "127.0.0.1", "port": args.port,
                       "nvml_interval": 1.0}, env={})
    sidecar = Sidecar(cfg)
    server = uvicorn.Server(uvicorn.Config(create_app(sidecar, manage=True), host="127.0.0.1",
                                           port=args.port, log_level="warning", lifespan="on"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{args.port}/metrics"
    text = ""
    for _ in range(100):
        try:
            text = httpx.get(url, timeout=2).text
            if "gpu_memory_used_bytes{" in text:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    t0 = time.perf_counter()
    sidecar.nvml.poll_once()
    poll_ms = (time.perf_counter() - t0) * 1000
    text = httpx.get(url, timeout=2).text
    t0 = time.perf_counter()
    httpx.get(url, timeout=2)
    scrape_ms = (time.perf_counter() - t0) * 1000
    rows = smi()
    server.should_exit = True
    th.join(10)

    got: dict[tuple[str, str], float] = {}
    procs = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("gpu_") and "gpu" in s.labels:
                if s.name == "gpu_process_memory_used_bytes":
                    procs.append((s.labels["gpu"], s.labels["pid"], s.labels["process"], s.value))
                else:
                    got[(s.labels["gpu"], s.name)] = s.value
                    got[(s.labels["gpu"], "uuid")] = s.labels["uuid"]
                    got[(s.labels["gpu"], "model")] = s.labels["model"]
            if s.name == "vllm_doctor_source_up" and s.labels.get("source") == "nvml":
                print(f"vllm_doctor_source_up{{source=\"nvml\"}} {s.value}")
    print(f"NVML memory info version used: {sidecar.nvml.stats.memory_info_version}; "
          f"driver {sidecar.nvml.stats.driver_version}; one poll of {len(rows)} GPU(s): {poll_ms:.1f} ms; "
          f"one /metrics scrape: {scrape_ms:.1f} ms")
    bad = 0
    for r in rows:
        i = r["index"]
        used = got.get((i, "gpu_memory_used_bytes"), float("nan")) / MiB
        total = got.get((i, "gpu_memory_total_bytes"), float("nan")) / MiB
        print(f"GPU {i} {r['name']} {r['uuid']}")
        print(f"  memory.used   nvidia-smi {r['used_mib']:>10.0f} MiB   sidecar {used:>10.1f} MiB")
        print(f"  memory.total  nvidia-smi {r['total_mib']:>10.0f} MiB   sidecar {total:>10.1f} MiB")
        print(f"  utilization   nvidia-smi {r['util_pct']:>10.0f} %     sidecar "
              f"{got.get((i, 'gpu_utilization_ratio'), float('nan')) * 100:>10.0f} %")
        print(f"  power         nvidia-smi {r['power_w']:>10.2f} W     sidecar "
              f"{got.get((i, 'gpu_power_watts'), float('nan')):>10.2f} W")
        print(f"  temperature   nvidia-smi {r['temp_c']:>10.0f} C     sidecar "
              f"{got.get((i, 'gpu_temperature_celsius'), float('nan')):>10.0f} C")
        print(f"  uuid/model    match: {got.get((i, 'uuid')) == r['uuid'] and got.get((i, 'model')) == r['name']}")
        if abs(used - r["used_mib"]) > 64 or abs(total - r["total_mib"]) > 1 or got.get((i, "uuid")) != r["uuid"]:
            bad += 1
    for p in procs:
        print(f"  process gpu={p[0]} pid={p[1]} name={p[2]} used={p[3] / MiB:.0f} MiB")
    print("RESULT:", "agree" if not bad else f"{bad} GPU(s) disagree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
