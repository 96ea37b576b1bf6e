"""A fleet's history for a real Prometheus: vLLM series of many replicas over hours, built out of
real vLLM output and backfilled with ``promtool tsdb create-blocks-from openmetrics``.

Where the values come from (nothing is invented where a real run shows it):

* every series a replica exports, its labels, the ``vllm:cache_config_info`` labels and every
  histogram's bucket bounds: the real vLLM 0.32 /metrics capture
  (tests/fixtures/metrics/vllm-0.32-cpu-preemption.txt: 18 gauge, counter and info families,
  16 histograms, 374 ``vllm:`` samples per engine). At ``density="real"`` every one of them is
  written at every 15 s step, as Prometheus scraping that vLLM every 15 s stores it (the
  ``_created`` gauges of prometheus_client aside); ``density="light"`` writes the load series
  and four latency histograms once a minute (the older, faster fleet test);
* an old replica (``version="0.8.5"``) exports what vLLM 0.8.5 exported, under its names
  (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*, vllm:time_per_output_token_seconds; the
  metric catalogue's renames), without the series added since;
* a preemption storm: the real 0.32 timeline of running / waiting / KV cache usage / preemptions
  (vllm-0.32-cpu-preemption-timeline.txt, 2 s apart), replayed;
* KV-capacity-bound: the stats line of the real log 034 (running 35, pending 115, KV 99 %,
  max_num_seqs 256), parsed by vllm-doctor's own parser; the sidecar's configuration gauges
  carry that log's facts;
* prefill blocking decode ("stalled"): the three stats lines of the real log 033 (prompt
  throughput 1,032-1,096 tokens/s while generation throughput falls to 0), replayed in a loop;
* healthy load: the per-request generation rate of the real log 026 (41.7 tokens/s per running
  request) at a moderate, varying concurrency with the KV cache half full.

Incidents (``Replica.kind``, during ``Replica.incident``): ``storm``, ``kv-bound``, ``stalled``,
``hot`` (KV cache full, a queue) and ``cold`` (no request), ``dp`` (two engines: engine 0 hot,
engine 1 cold), ``ttft`` (healthy load, every request's time to first token 4-18 s: one
replica's latency breach), ``itl`` (the same for inter-token latency), ``dying`` (every series
stops at the incident's start: the server died) and ``healthy``.

:func:`scenario` lays incidents on replicas; :func:`write_openmetrics` streams the exposition
(family by family, series by series, in bounded memory); :func:`backfill` turns it into TSDB
blocks.
"""

from __future__ import annotations

import bisect
import io
import itertools
import math
import random
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CAPTURE = FIXTURES / "metrics" / "vllm-0.32-cpu-preemption.txt"
TIMELINE = FIXTURES / "metrics" / "vllm-0.32-cpu-preemption-timeline.txt"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")
OLD_VERSION = "0.8.5"


@dataclass
class Family:
    name: str  # the sample name of a gauge / counter, a histogram's base name
    type: str
    samples: list[tuple[str, str, float]]  # (sample name, extra labels, value) of a gauge or counter
    bounds: list[float] = field(default_factory=list)  # a histogram's finite bucket bounds


def _capture() -> tuple[list[Family], str]:
    """The capture's ``vllm:`` families (the engine and model_name labels taken off) and its model."""
    fams: dict[str, Family] = {}
    cur = None
    for line in CAPTURE.read_text().splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            vllm = m.group(1).startswith("vllm:") and not m.group(1).endswith("_created")
            cur = fams.setdefault(m.group(1), Family(m.group(1), m.group(2), [])) if vllm else None
            continue
        if cur is None or line.startswith("#") or not line.strip():
            continue
        name, labels, value = re.match(r"([^{\s]+)(?:\{([^}]*)\})?\s+(\S+)", line).groups()
        lab = [p for p in re.findall(r'\w+="[^"]*"', labels or "") if not p.startswith(("engine=", "model_name="))]
        if cur.type == "histogram":
            le = [p for p in lab if p.startswith("le=")]
            if name.endswith("_bucket") and le and le[0] != 'le="+Inf"':
                bound = float(le[0][4:-1])
                if bound not in cur.bounds:
                    cur.bounds.append(bound)
            continue
        cur.samples.append((name, ",".join(lab), float(value)))
    model = re.search(r'model_name="([^"]+)"', CAPTURE.read_text()).group(1)
    return list(fams.values()), model


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
    kind: str  # healthy | storm | kv-bound | stalled | hot | cold | dp | ttft | itl | dying
    incident: tuple[float, float] | None = None  # seconds from the start
    engines: int = 1
    config: dict[str, float] = field(default_factory=dict)
    version: str | None = None  # None: vLLM 0.32's names; OLD_VERSION: that release's series and names


#: when each kind's incident runs, as fractions of the range (the default scenario's)
WHEN = {"storm": (0.125, 0.375), "kv-bound": (0.375, 0.625), "stalled": (0.625, 0.75),
        "hot": (0.75, 0.917), "cold": (0.75, 0.917), "dp": (0.25, 0.33), "ttft": (0.4, 0.6), "itl": (0.4, 0.6),
        "dying": (0.8, math.inf)}  # a dead replica never comes back


def kv_bound_config() -> dict[str, float]:
    """The sidecar's configuration gauges of a kv-bound replica: the facts of the real log 034."""
    _, facts034 = _log_stats("034-v0.3-stuck-kv99-running35-pending115.log")
    return {k: facts034[f] for k, f in (("vllm_max_num_seqs", "max_num_seqs"), ("vllm_max_model_len", "max_model_len"),
                                        ("vllm_kv_cache_tokens", "kv_cache_tokens")) if facts034.get(f)}


def scenario(n: int = 24, hours: float = 4.0, plan: list[str] | None = None,
             when: dict[str, tuple[float, float]] | None = None, old: set[int] = frozenset()) -> list[Replica]:
    """``n`` replicas following ``plan`` (one kind per replica, the rest healthy; default: 3 in a
    preemption storm, 3 bound by KV cache capacity, 2 with prefill blocking decode, 2 saturated
    while 4 sit idle (imbalance), one data-parallel replica (2 engines) whose engine 0 is
    saturated while engine 1 idles), each incident at its ``when`` (fractions of the range);
    the replicas numbered in ``old`` run vLLM OLD_VERSION."""
    h = hours * 3600
    cfg = kv_bound_config()
    plan = list(plan) if plan is not None else (["storm"] * 3 + ["kv-bound"] * 3 + ["stalled"] * 2 + ["hot"] * 2
                                                + ["cold"] * 4 + ["dp"])
    plan += ["healthy"] * (n - len(plan))
    when = {**WHEN, **(when or {})}
    out = []
    for i, kind in enumerate(plan):
        w = when.get(kind)
        out.append(Replica(pod=f"vllm-{i:03d}", kind=kind, incident=(w[0] * h, min(w[1], 9.0) * h) if w else None,
                           engines=2 if kind == "dp" else 1, config=cfg if kind == "kv-bound" else {},
                           version=OLD_VERSION if i in old else None))
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
    """(running, waiting, kv, preempt_increase, prompt_tps, gen_tps, latency class) at step k;
    None where the replica exports nothing (it died)."""
    inside = rep.incident is not None and rep.incident[0] <= t < rep.incident[1]
    kind = rep.kind if inside else "healthy"
    if kind == "dying":
        return None
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
    running = 10 + round(4 * math.sin(t / 1800.0 + int(rep.pod[-3:]) % 7))
    kv = 0.45 + 0.15 * math.sin(t / 2400.0 + int(rep.pod[-3:]) % 5)
    cls = kind if kind in ("ttft", "itl") else "fast"
    return float(running), 0.0, round(kv, 3), 0.0, 120.0, running * HEALTHY_GEN_TPS_PER_REQUEST, cls


#: (low, high) of what each request observes in each histogram, per latency class: "fast" is a
#: healthy replica; a class lists what differs from it.
FAST = {
    "vllm:time_to_first_token_seconds": (0.08, 0.4), "vllm:inter_token_latency_seconds": (0.012, 0.04),
    "vllm:request_time_per_output_token_seconds": (0.012, 0.04), "vllm:e2e_request_latency_seconds": (4.0, 12.0),
    "vllm:request_queue_time_seconds": (0.0, 0.05), "vllm:request_inference_time_seconds": (4.0, 12.0),
    "vllm:request_prefill_time_seconds": (0.05, 0.3), "vllm:request_decode_time_seconds": (4.0, 12.0),
    "vllm:request_prompt_tokens": (100, 2000), "vllm:request_generation_tokens": (50, 500),
    "vllm:iteration_tokens_total": (1, 512), "vllm:request_max_num_generation_tokens": (50, 500),
    "vllm:request_params_n": (1, 1), "vllm:request_params_max_tokens": (256, 2048),
    "vllm:request_num_preemptions": (0, 0), "vllm:request_prefill_kv_computed_tokens": (100, 2000),
}
LATENCY_CLASS = {
    "fast": {},
    "slow": {"vllm:time_to_first_token_seconds": (4.0, 18.0), "vllm:inter_token_latency_seconds": (0.03, 0.09),
             "vllm:request_time_per_output_token_seconds": (0.03, 0.09),
             "vllm:e2e_request_latency_seconds": (30.0, 90.0), "vllm:request_queue_time_seconds": (2.0, 15.0),
             "vllm:request_inference_time_seconds": (20.0, 70.0), "vllm:request_decode_time_seconds": (20.0, 70.0),
             "vllm:request_num_preemptions": (0, 3)},
    "stall": {"vllm:time_to_first_token_seconds": (2.6, 9.0), "vllm:inter_token_latency_seconds": (0.3, 1.5),
              "vllm:request_time_per_output_token_seconds": (0.3, 1.5),
              "vllm:e2e_request_latency_seconds": (40.0, 120.0), "vllm:request_queue_time_seconds": (0.5, 3.0)},
    "ttft": {"vllm:time_to_first_token_seconds": (4.0, 18.0), "vllm:e2e_request_latency_seconds": (8.0, 30.0)},
    "itl": {"vllm:inter_token_latency_seconds": (0.3, 1.5), "vllm:request_time_per_output_token_seconds": (0.3, 1.5),
            "vllm:e2e_request_latency_seconds": (30.0, 100.0)},
}


def _old_names() -> dict[str, str]:
    """vLLM 0.32's family name -> OLD_VERSION's (the catalogue's renames); None: not exported then."""
    from vllm_doctor import catalogue

    out = {}
    fams, _ = _capture()
    for f in fams:
        qname = f.name if f.type != "counter" or f.name.endswith("_total") else f.name + "_total"
        old = [n for n in catalogue.names(qname) if catalogue.exported(n, OLD_VERSION)] \
            if qname in catalogue.vllm_families() else []
        out[f.name] = old[0] if old else None
    return out


def _fmt(v: float) -> str:
    return str(int(v)) if v == int(v) else repr(v)


def write_openmetrics(reps: list[Replica], start: float, hours: float, out: TextIO, step: float = 15.0,
                      density: str = "real", seed: int = 13) -> int:
    """Write the OpenMetrics text of the fleet's history to ``out``; return the samples written.

    density "real": every ``vllm:`` series of the capture at every step; "light": the load
    series every step and four latency histograms every minute."""
    fams, model = _capture()
    prof = _profiles()
    real = density == "real"
    hist_every = 1 if real else max(1, int(60 / step))
    n = int(hours * 3600 / step) + 1
    old_names = _old_names()
    # each replica's state at each step, per engine (a few tuples per step: bounded by the fleet)
    states: dict[tuple[int, int], list] = {}
    for i, rep in enumerate(reps):
        rng = random.Random(seed * 1000 + i)
        for eng in range(rep.engines):
            states[(i, eng)] = [_state(rep, eng, k, k * step, step, prof, rng) for k in range(n)]
    written = 0

    def labels(i: int, eng: int, extra: str) -> str:
        rep = reps[i]
        base = (f'engine="{eng}",instance="10.0.{i // 250}.{i % 250}:8000",job="vllm",model_name="{model}",'
                f'namespace="fleet",pod="{rep.pod}"')
        return base + ("," + extra if extra else "")

    def exporters(fam: Family, version: str | None):
        for i, rep in enumerate(reps):
            if rep.version == version:
                for eng in range(rep.engines):
                    yield i, eng

    driven = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
              "vllm:cache_config_info"}

    def gauge_values(fam: Family, sample: str, extra: str, const: float, st: list):
        """The value of one series at each step (None: not exported then)."""
        if sample == "vllm:num_requests_running":
            return [None if s is None else s[0] for s in st]
        if sample == "vllm:num_requests_waiting":
            return [None if s is None else s[1] for s in st]
        if sample == "vllm:num_requests_waiting_by_reason":
            return [None if s is None else (s[1] if "capacity" in extra else 0.0) for s in st]
        if sample == "vllm:kv_cache_usage_perc":
            return [None if s is None else s[2] for s in st]
        if fam.type == "counter" and sample in ("vllm:num_preemptions_total", "vllm:prompt_tokens_total",
                                                "vllm:generation_tokens_total", "vllm:prompt_tokens_by_source_total",
                                                "vllm:prefix_cache_queries_total", "vllm:request_success_total"):
            if sample == "vllm:prompt_tokens_by_source_total" and "local_compute" not in extra:
                return [None if s is None else const for s in st]
            if sample == "vllm:request_success_total" and 'finished_reason="stop"' not in extra:
                return [None if s is None else const for s in st]
            col = {"vllm:num_preemptions_total": 3, "vllm:generation_tokens_total": 5,
                   "vllm:request_success_total": 0}.get(sample, 4)
            total, vals = 0.0, []
            for s in st:
                if s is None:
                    vals.append(None)
                    continue
                total += s[col] / 2 if col == 0 else (s[col] if col == 3 else round(s[col] * step))
                vals.append(float(int(total)))
            return vals
        return [None if s is None else const for s in st]

    def series_lines(name: str, lab: str, vals: list) -> list[str]:
        return [f"{name}{{{lab}}} {_fmt(v)} {int(start + k * step)}" for k, v in enumerate(vals) if v is not None]

    for fam in fams:
        if not real and (fam.type != "histogram" and fam.name not in driven
                         or fam.type == "histogram" and fam.name not in HISTOGRAMS):
            continue
        old = old_names.get(fam.name)
        blocks = ([(fam.name, [x for v in (None, OLD_VERSION) for x in exporters(fam, v)])] if old == fam.name else
                  [(fam.name, list(exporters(fam, None)))] + ([(old, list(exporters(fam, OLD_VERSION)))] if old else []))
        for out_name, members in blocks:
            if not members:
                continue
            if fam.type == "histogram":
                out.write(f"# TYPE {out_name} histogram\n")
                for i, eng in members:
                    written += _write_histogram(out, fam, out_name, labels(i, eng, ""), states[(i, eng)], start, step,
                                                hist_every, random.Random(f"{seed}/{i}/{eng}/{fam.name}"))
                continue
            typ = "counter" if fam.type == "counter" else "gauge"
            head = out_name[:-len("_total")] if typ == "counter" and out_name.endswith("_total") else out_name
            out.write(f"# TYPE {head} {typ}\n")
            for i, eng in members:
                for sample, extra, const in fam.samples:
                    vals = gauge_values(fam, sample, extra, const, states[(i, eng)])
                    lines = series_lines(out_name, labels(i, eng, extra), vals)
                    written += len(lines)
                    out.write("\n".join(lines) + "\n")
    side: dict[str, list[str]] = {}
    for i, rep in enumerate(reps):
        alive = [k for k in range(n) if states[(i, 0)][k] is not None]
        for name, v in rep.config.items():
            lab = f'instance="10.0.{i // 250}.{i % 250}:9401",job="vllm-doctor",namespace="fleet",pod="{rep.pod}"'
            side.setdefault(name, []).extend(f"{name}{{{lab}}} {v:g} {int(start + k * step)}" for k in alive[::4])
    for name, lines in side.items():
        out.write(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n")
        written += len(lines)
    out.write("# EOF\n")
    return written


def _write_histogram(out: TextIO, fam: Family, name: str, lab: str, st: list, start: float, step: float,
                     every: int, rng: random.Random) -> int:
    """One histogram series set (every bucket, _count, _sum) of one engine: cumulative counts of
    what its requests observed, each request drawn from its step's latency class."""
    bounds = fam.bounds
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    rows: list[tuple[int, list[int], float] | None] = []
    for k, s in enumerate(st):
        if s is None:
            rows.append(None)
            continue
        if s[6] is not None:
            lo, hi = LATENCY_CLASS[s[6]].get(fam.name) or FAST[fam.name]
            for _ in range(max(1, int(s[0] // 2))):
                v = rng.uniform(lo, hi)
                total += v
                counts[bisect.bisect_left(bounds, v)] += 1
        rows.append((k, list(itertools.accumulate(counts)), total) if k % every == 0 else None)
    live = [r for r in rows if r is not None]
    if not live:
        return 0
    les = [repr(float(b)) for b in bounds] + ["+Inf"]
    parts = []
    for b, le in enumerate(les):
        parts.append("\n".join(f'{name}_bucket{{{lab},le="{le}"}} {c[b]} {int(start + k * step)}' for k, c, _ in live))
    parts.append("\n".join(f"{name}_count{{{lab}}} {c[-1]} {int(start + k * step)}" for k, c, _ in live))
    parts.append("\n".join(f"{name}_sum{{{lab}}} {round(tot, 4)!r} {int(start + k * step)}" for k, _, tot in live))
    out.write("\n".join(parts) + "\n")
    return len(live) * (len(les) + 2)


def openmetrics(reps: list[Replica], start: float, hours: float, step: float = 15.0, density: str = "light",
                seed: int = 13) -> str:
    """The OpenMetrics text of the fleet's history (see :func:`write_openmetrics`)."""
    buf = io.StringIO()
    write_openmetrics(reps, start, hours, buf, step=step, density=density, seed=seed)
    return buf.getvalue()


def backfill(promtool: str, text: str | Path, data_dir: Path, workdir: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data_dir`` (``text``: the
    exposition, or the path of a file holding it)."""
    if isinstance(text, Path):
        src, keep = text, True
    else:
        src, keep = workdir / "fleet.om.txt", False
        src.write_text(text)
    res = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                          str(src), str(data_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {res.stdout[-2000:]}")
    if not keep:
        src.unlink()
