"""Latency objectives of ``bench ladder`` and the confidence of each percentile.

A percentile from few requests is uncertain (with 8 requests p99 is their maximum). Each p99
gets a bootstrap confidence interval: the p99 of a resample of n requests drawn with
replacement is its k-th smallest value (k = ceil(0.99 n), the nearest rank), and the k-th
smallest of n draws with replacement from the sorted sample is the sample's value at index
floor(n U), U ~ Beta(k, n - k + 1). Drawing U instead of n values gives the exact bootstrap
distribution in O(1) per resample, seeded, numpy-free.

A level PASSES an objective when the whole interval is at or under it, FAILS when the whole
interval is above it, and is UNDECIDED when the interval straddles it (more requests decide).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

RESAMPLES = 2000
CONFIDENCE = 0.95

# objective name -> (level metric key, percentile key, what it is)
METRICS = {
    "ttft_p99_ms": ("ttft_ms", "p99", "TTFT p99"),
    "itl_p99_ms": ("itl_ms", "p99", "ITL p99"),
    "tpot_p99_ms": ("tpot_ms", "p99", "TPOT p99"),
    "e2e_p99_ms": ("e2el_ms", "p99", "E2E p99"),
}


def percentile_ci(values: list[float], q: float, seed: int = 0, resamples: int = RESAMPLES,
                  confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Bootstrap interval of the q-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    k = max(1, math.ceil(q / 100.0 * n))
    rng = random.Random(seed)
    draws = sorted(v[min(n - 1, int(n * rng.betavariate(k, n - k + 1)))] for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    lo = draws[int(tail * (resamples - 1))]
    hi = draws[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    return lo, hi


@dataclass
class Objectives:
    """p99 objectives in ms; None: not an objective."""

    ttft_p99_ms: float | None = 500.0
    itl_p99_ms: float | None = 100.0
    tpot_p99_ms: float | None = None
    e2e_p99_ms: float | None = None

    def items(self) -> list[tuple[str, float]]:
        return [(name, getattr(self, name)) for name in METRICS if getattr(self, name) is not None]

    def describe(self) -> str:
        return ", ".join(f"{METRICS[n][2]} <= {v:,.0f} ms" for n, v in self.items()) or "none"


def judge(level: dict, obj: Objectives) -> dict:
    """Each objective of one level (a result_dict level): PASS, FAIL or UNDECIDED, with its interval."""
    out = {}
    for name, limit in obj.items():
        key, pct, _ = METRICS[name]
        stats = level.get(key) or {}
        val, lo, hi = stats.get(pct), stats.get(pct + "_ci_low"), stats.get(pct + "_ci_high")
        if val is None:
            status = "UNKNOWN"
        elif lo is None or hi is None:
            status = "PASS" if val <= limit else "FAIL"
        elif hi <= limit:
            status = "PASS"
        elif lo > limit:
            status = "FAIL"
        else:
            status = "UNDECIDED"
        out[name] = {"objective_ms": limit, "value_ms": val, "ci_low_ms": lo, "ci_high_ms": hi, "status": status}
    return out


def level_status(verdicts: dict) -> str:
    """A level meets the objectives only when every one PASSes."""
    s = {v["status"] for v in verdicts.values()}
    if "FAIL" in s:
        return "FAIL"
    if s - {"PASS"}:
        return "UNDECIDED"
    return "PASS"


def _key(lv: dict) -> float:
    rate = lv.get("request_rate")
    return float(rate) if rate is not None else float(lv["concurrency"])


def _name(lv: dict) -> str:
    rate = lv.get("request_rate")
    return f"{rate:g} req/s" if rate is not None else f"{lv['concurrency']} concurrent requests"


def highest_meeting(levels: list[dict], obj: Objectives) -> tuple[float | None, str]:
    """The highest level (concurrency, or request rate on a rate ladder) that meets EVERY
    objective, and why; None when none does."""
    judged = [(_key(lv), lv, level_status(judge(lv, obj))) for lv in levels if lv.get("completed")]
    ok = [(k, lv) for k, lv, s in judged if s == "PASS"]
    if ok:
        top, lv = max(ok, key=lambda x: x[0])
        above = [f"{k:g} {s}" for k, _, s in judged if k > top]
        return (lv.get("request_rate") if lv.get("request_rate") is not None else lv["concurrency"],
                f"{_name(lv)} is the highest level that met every objective ({obj.describe()})"
                + (f"; above it: {', '.join(above)}" if above else ""))
    return None, ("no level met every objective (" + obj.describe() + "): "
                  + ", ".join(f"{k:g} {s}" for k, _, s in judged))
