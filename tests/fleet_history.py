"""A fleet's history for a real Prometheus: vLLM series of many replicas over hours, built out of
real vLLM output and backfilled with ``promtool tsdb create-blocks-from openmetrics``.

Where the values come from (nothing is invented where a real run shows it):

* label sets, the ``vllm:cache_config_info`` labels and every histogram's bucket bounds: the
  real vLLM 0.32 /metrics capture (tests/fixtures/metrics/vllm-0.32-cpu-preemption.txt);
* a preemption storm: the real 0.32 timeline of running / waiting / KV cache usage / preemptions
  (vllm-0.32-cpu-preemption-timeline.txt, 2 s apart), replayed;
* KV-capacity-bound: the stats line of the real log 034 (running 35, pending 115, KV 99 %,
  max_num_seqs 256), parsed by vllm-doctor's own parser; the sidecar's configuration gauges
  carry that log's facts;
* prefill blocking decode ("stalled"): the three stats lines of the real log 033 (prompt
  throughput 1,032-1,096 tokens/s while generation throughput falls to 0), replayed in a loop;
* healthy load: the per-request generation rate of the real log 026 (41.7 tokens/s per running
  request) at a moderate, varying concurrency with the KV cache half full.

:func:`scenario` lays incidents on replicas at separate times; :func:`openmetrics` writes the
exposition; :func:`backfill` turns it into TSDB blocks.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CAPTURE = FIXTURES / "metrics" / "vllm-0.32-cpu-preemption.txt"
TIMELINE = FIXTURES / "metrics" / "vllm-0.32-cpu-preemption-timeline.txt"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")


def _capture():
    text = CAPTURE.read_text()
    buckets: dict[str, list[float]] = {}
    for h in HISTOGRAMS:
        les = re.findall(re.escape(h) + r'_bucket\{[^}]*le="([^"]+)"', text)
        buckets[h] = sorted({float(x) for x in les if x != "+Inf"})
    cc = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M).group(1)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', cc))
    model = re.search(r'model_name="([^"]+)"', text).group(1)
    return buckets, labels, model


def _timeline() -> list[tuple[float, float, float, float]]:
    """(running, waiting, kv usage, preemptions_total) every 2 s of the real 0.32 run."""
    rows = []
    for line in TIMELINE.read_text().splitlines():
        kv = dict(re.findall(r"(\w+)=([\d.]+)", line))
        if "num_requests_running" in kv:
            rows.append((float(kv["num_requests_running"]), float(kv["num_requests_waiting"]),
                         float(kv["kv_cache_usage_perc"]), float(kv["num_preemptions_total"])))
    return rows


def _log_stats(name: str):
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.pipeline import Pipeline

    pipe = Pipeline(load_rules([]))
    pipe.run_files([(name, [(FIXTURES / "logs" / name).read_bytes()])])
    return list(pipe.state.stats), pipe.state.facts()


@dataclass
class Replica:
    pod: str
    kind: str  # healthy | storm | kv-bound | stalled | hot | cold | dp
    incident: tuple[float, float] | None = None  # seconds from the start
    engines: int = 1
    config: dict[str, float] = field(default_factory=dict)


def scenario(n: int = 24, hours: float = 4.0) -> list[Replica]:
    """``n`` replicas: most healthy, and at separate times: 3 in a preemption storm, 3 bound by
    KV cache capacity, 2 with prefill blocking decode, 2 saturated while 4 sit idle (imbalance),
    and one data-parallel replica (2 engines) whose engine 0 is saturated while engine 1 idles."""
    h = hours * 3600
    _, facts034 = _log_stats("034-v0.3-stuck-kv99-running35-pending115.log")
    cfg = {k: facts034[f] for k, f in (("vllm_max_num_seqs", "max_num_seqs"), ("vllm_max_model_len", "max_model_len"),
                                       ("vllm_kv_cache_tokens", "kv_cache_tokens")) if facts034.get(f)}
    plan = (["storm"] * 3 + ["kv-bound"] * 3 + ["stalled"] * 2 + ["hot"] * 2 + ["cold"] * 4 + ["dp"])
    plan += ["healthy"] * (n - len(plan))
    when = {"storm": (0.125, 0.375), "kv-bound": (0.375, 0.625), "stalled": (0.625, 0.75),
            "hot": (0.75, 0.917), "cold": (0.75, 0.917), "dp": (0.25, 0.33)}
    out = []
    for i, kind in enumerate(plan):
        w = when.get(kind)
        out.append(Replica(pod=f"vllm-{i:03d}", kind=kind, incident=(w[0] * h, w[1] * h) if w else None,
                           engines=2 if kind == "dp" else 1, config=cfg if kind == "kv-bound" else {}))
    return out


@dataclass
class _Profiles:
    timeline: list
    stall: list
    bound: object


def _profiles() -> _Profiles:
    stall, _ = _log_stats("033-v0.2-prefill-blocks-decode-gen-throughput-zero.log")
    bound, _ = _log_stats("034-v0.3-stuck-kv99-running35-pending115.log")
    return _Profiles(_timeline(), stall, bound[0])


HEALTHY_GEN_TPS_PER_REQUEST = 41.7  # log 026: one request decoding at 41.7 tokens/s


def _state(rep: Replica, engine: int, k: int, t: float, step: float, prof: _Profiles, rng: random.Random):
    """(running, waiting, kv, preempt_increase, prompt_tps, gen_tps, latency class) at step k."""
    inside = rep.incident is not None and rep.incident[0] <= t < rep.incident[1]
    kind = rep.kind if inside else "healthy"
    if kind == "dp":
        kind = "hot" if engine == 0 else "cold"
    if kind == "storm":
        j = int((t - rep.incident[0]) / 2.0)  # the timeline is 2 s apart
        row = prof.timeline[j % len(prof.timeline)]
        prev = prof.timeline[(j - int(step / 2)) % len(prof.timeline)]
        inc = row[3] - prev[3] if row[3] >= prev[3] else row[3]
        return row[0], row[1], row[2], inc, 300.0, row[0] * 20.0, "slow"
    if kind == "kv-bound":
        s = prof.bound
        return s.num_running, s.num_waiting, s.kv_cache_usage_ratio, 0.0, s.prompt_tps, s.generation_tps, "slow"
    if kind == "stalled":
        s = prof.stall[k % len(prof.stall)]
        return s.num_running, s.num_waiting, s.kv_cache_usage_ratio, 0.0, s.prompt_tps, s.generation_tps, "stall"
    if kind == "hot":
        return 35.0, 40.0 + rng.randint(0, 10), 1.0, 0.0, 400.0, 35 * HEALTHY_GEN_TPS_PER_REQUEST * 0.5, "slow"
    if kind == "cold":
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None
    running = 10 + round(4 * math.sin(t / 1800.0 + hash(rep.pod) % 7))
    kv = 0.45 + 0.15 * math.sin(t / 2400.0 + hash(rep.pod) % 5)
    return float(running), 0.0, round(kv, 3), 0.0, 120.0, running * HEALTHY_GEN_TPS_PER_REQUEST, "fast"


# seconds of each latency class (TTFT, ITL, e2e, queue) drawn per request
LATENCY_CLASS = {
    "fast": (0.08, 0.4, 0.012, 0.04, 4.0, 12.0, 0.0, 0.05),
    "slow": (4.0, 18.0, 0.03, 0.09, 30.0, 90.0, 2.0, 15.0),
    "stall": (2.6, 9.0, 0.3, 1.5, 40.0, 120.0, 0.5, 3.0),
}


def openmetrics(reps: list[Replica], start: float, hours: float, step: float = 15.0,
                hist_step: float = 60.0, seed: int = 13, histograms: tuple[str, ...] = HISTOGRAMS) -> str:
    """The OpenMetrics text of the fleet's history (timestamps in seconds); ``histograms``: the
    latency histograms written (every ``hist_step`` seconds)."""
    buckets, cc_labels, model = _capture()
    prof = _profiles()
    rng = random.Random(seed)
    n = int(hours * 3600 / step) + 1
    gauges = {"vllm:num_requests_running": [], "vllm:num_requests_waiting": [], "vllm:kv_cache_usage_perc": []}
    counters = {"vllm:num_preemptions": [], "vllm:prompt_tokens": [], "vllm:generation_tokens": []}
    hists = {h: [] for h in histograms}
    info = []
    sidecar: dict[str, list[str]] = {}
    for i, rep in enumerate(reps):
        for eng in range(rep.engines):
            lab = (f'engine="{eng}",instance="10.0.{i // 250}.{i % 250}:8000",job="vllm",'
                   f'model_name="{model}",namespace="fleet",pod="{rep.pod}"')
            g = {name: [] for name in gauges}
            c = {name: [] for name in counters}
            totals = {name: 0.0 for name in counters}
            hcount = {h: [0] * len(buckets[h]) for h in HISTOGRAMS}
            hsum = {h: 0.0 for h in HISTOGRAMS}
            hinf = {h: 0 for h in HISTOGRAMS}
            hlines = {h: [] for h in HISTOGRAMS}
            for k in range(n):
                t = k * step
                ts = start + t
                running, waiting, kv, pre, ptps, gtps, cls = _state(rep, eng, k, t, step, prof, rng)
                g["vllm:num_requests_running"].append(f"{{{lab}}} {running:g} {ts:.3f}")
                g["vllm:num_requests_waiting"].append(f"{{{lab}}} {waiting:g} {ts:.3f}")
                g["vllm:kv_cache_usage_perc"].append(f"{{{lab}}} {kv:g} {ts:.3f}")
                totals["vllm:num_preemptions"] += pre
                totals["vllm:prompt_tokens"] += round(ptps * step)
                totals["vllm:generation_tokens"] += round(gtps * step)
                for name in counters:
                    c[name].append(f"{{{lab}}} {totals[name]:g} {ts:.3f}")
                if cls is not None:
                    lo_hi = LATENCY_CLASS[cls]
                    for h_i, h in enumerate(HISTOGRAMS):
                        if h not in hists:
                            continue
                        for _ in range(max(1, int(running // 8))):
                            v = rng.uniform(lo_hi[2 * h_i], lo_hi[2 * h_i + 1])
                            hsum[h] += v
                            hinf[h] += 1
                            for b_i, le in enumerate(buckets[h]):
                                if v <= le:
                                    hcount[h][b_i] += 1
                if k % int(hist_step / step) == 0:
                    for h in hists:
                        for le, cnt in zip(buckets[h], hcount[h]):
                            hlines[h].append((f'{h}_bucket{{{lab},le="{_le(le)}"}} {cnt} {ts:.3f}', le))
                        hlines[h].append((f'{h}_bucket{{{lab},le="+Inf"}} {hinf[h]} {ts:.3f}', math.inf))
                        hlines[h].append((f"{h}_count{{{lab}}} {hinf[h]} {ts:.3f}", -1))
                        hlines[h].append((f"{h}_sum{{{lab}}} {hsum[h]:.4f} {ts:.3f}", -2))
            for name in gauges:
                gauges[name].append(g[name])
            for name in counters:
                counters[name].append(c[name])
            for h in hists:
                # one series after the other (OpenMetrics: a series' samples together, in time order)
                per: dict[object, list[str]] = {}
                for line, key in hlines[h]:
                    per.setdefault(key, []).append(line)
                hists[h].append(per)
            info.append(",".join(f'{k}="{v}"' for k, v in sorted({**cc_labels, "engine": str(eng)}.items()))
                        + f',instance="10.0.{i // 250}.{i % 250}:8000",job="vllm",model_name="{model}",'
                          f'namespace="fleet",pod="{rep.pod}"')
        for name, v in rep.config.items():
            lab = f'instance="10.0.{i // 250}.{i % 250}:9401",job="vllm-doctor",namespace="fleet",pod="{rep.pod}"'
            sidecar.setdefault(name, []).append("\n".join(f"{name}{{{lab}}} {v:g} {start + k * step:.3f}"
                                                          for k in range(0, n, 4)))
    out = []
    for name, series in gauges.items():
        out.append(f"# TYPE {name} gauge")
        out += [name + line for s in series for line in s]
    for name, series in counters.items():
        out.append(f"# TYPE {name} counter")
        out += [f"{name}_total" + line for s in series for line in s]
    out.append("# TYPE vllm:cache_config_info gauge")
    for lab in info:
        out += [f"vllm:cache_config_info{{{lab}}} 1 {start + k * step:.3f}" for k in range(0, n, 4)]
    for h, series in hists.items():
        out.append(f"# TYPE {h} histogram")
        for per in series:
            for lines in per.values():
                out += lines
    for name, series in sidecar.items():
        out.append(f"# TYPE {name} gauge")
        out += series
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _le(v: float) -> str:
    """A bound as prometheus_client writes it (1.0, 2.5, 0.001)."""
    return repr(float(v))


def backfill(promtool: str, text: str, data_dir: Path, workdir: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data_dir``."""
    src = workdir / "fleet.om.txt"
    src.write_text(text)
    res = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(data_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {res.stdout[-2000:]}")
    src.unlink()
