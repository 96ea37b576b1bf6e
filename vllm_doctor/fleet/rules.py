"""Fleet rules (``rules/fleet/VD020+``): YAML rules of the same schema as ``rules/VD0xx``
(:class:`~vllm_doctor.diagnosis.loader.Rule`), run by the same :class:`RuleEngine` (conditions,
values, evidence, message templates, flag fixes checked against vLLM's flags), over a fleet
namespace instead of one deployment's state.

The fleet namespace (what a fleet rule's expressions may name):

* ``replicas``: one summary per replica (``replica``, ``steps``, ``running_peak``,
  ``waiting_peak``, ``kv_peak``, ``kv_mean``, ``preemptions``, ``saturated_ratio``,
  ``idle_ratio``, ``latency_p99[signal]``, ``findings`` (names of its rules that fired));
  ``engines``: the same per engine, for replicas running several (data parallel) engines;
* ``n_replicas``; ``window_seconds`` (the range diagnosed); ``step_seconds``;
* ``imbalance_seconds``: time with a saturated replica (KV cache full, requests waiting) while
  another sat idle; ``imbalance_hot`` / ``imbalance_cold``: replicas saturated / idle for at
  least ``t.fleet_imbalance_min_seconds`` of that time; ``engine_imbalance``: per replica with
  several engines, ``(replica, seconds, hot engines, cold engines)`` of the same within it;
* ``preemptions_first_half`` / ``preemptions_second_half``: fleet preemptions in each half of
  the range (the trend); ``kv_slope_per_hour``: slope of the fleet's mean KV cache usage;
* ``latency_p99[signal]`` and ``slo_good_ratio[signal]`` over the fleet (signals ``ttft``,
  ``itl``, ``tpot``, ``e2e``, ``queue``), None when vLLM exported no such histogram;
* ``vanished``: replicas whose series stopped ``t.replica_down_seconds`` or more before the
  fleet's newest sample (a replica that died, hangs or was removed): ``(replica, last_seen, silent_seconds,
  meta)``, the replica's summary as ``summary``;
* ``t``: rules/thresholds.yaml.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm_doctor.diagnosis.evaluate import RuleEngine
from vllm_doctor.diagnosis.expr import Evaluator
from vllm_doctor.diagnosis.loader import RuleSet, builtin_rules_dir, load_rule_file
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.findings import Finding
from vllm_doctor.state.core import State

FLEET_NAMES = {
    "replicas", "engines", "n_replicas", "window_seconds", "step_seconds", "imbalance_seconds",
    "imbalance_hot", "imbalance_cold", "engine_imbalance", "preemptions_first_half",
    "preemptions_second_half", "kv_slope_per_hour", "latency_p99", "slo_good_ratio", "vanished", "t",
    "None", "True", "False",
}


def fleet_rules_dir() -> Path:
    return builtin_rules_dir() / "fleet"


def load_fleet_rules(thresholds: dict[str, float], directory: Path | None = None) -> RuleSet:
    """The fleet rules, validated by the rules' one loader (diagnosis/loader.py ``load_rule_file``,
    scope "fleet": the names of the fleet namespace): schema, id = file name, names and thresholds.
    The built-in directory without a rule is an installation that lost its package data: an
    error, never a fleet diagnosis that silently runs no fleet rule."""
    d = directory or fleet_rules_dir()
    rules = []
    paths = sorted(d.glob("VD*.yaml"))
    if not paths and directory is None:
        raise RuleLoadError(f"no fleet rule (VD020+) in {d}: this installation of vllm-incident-doctor lacks its "
                            "package data; reinstall it (pip install --force-reinstall vllm-incident-doctor)")
    for path in paths:
        rules.append(load_rule_file(path, True, thresholds, scope="fleet", scope_names=FLEET_NAMES))
    return RuleSet(tuple(rules), thresholds)


class FleetRuleEngine(RuleEngine):
    """The rule engine, reading the fleet namespace instead of a deployment's state."""

    def __init__(self, ruleset: RuleSet, names: dict[str, Any]) -> None:
        super().__init__(ruleset, log_time=False)
        self.names = names

    def _namespace(self, rule, state, facts):
        seconds = self.names["window_seconds"]
        names = dict(self.names, t=SimpleNamespace(**self.ruleset.thresholds), window_seconds=seconds)
        return Evaluator(names, {}), state.window(None)

    def run(self, now: float) -> list[Finding]:
        from dataclasses import replace

        state = State()
        state.now = now
        self.evaluate(state)
        spans = self.names.get("spans") or {}
        return [replace(f, first_seen=spans[f.name][0], last_seen=spans[f.name][1]) if f.name in spans else f
                for f in self.findings.values()]


def fleet_namespace(replicas, engines, reps, t: dict[str, float], since: float, until: float,
                    fleet_latency: dict | None = None, step: float = 15.0) -> dict[str, Any]:
    """The names a fleet rule reads (see the module doc), from the per-replica summaries."""
    from vllm_doctor.diagnosis.expr import slope_per_hour

    by_ts: dict[float, dict[str, str]] = {}
    for s in replicas:
        for ts, st in s.status.items():
            by_ts.setdefault(ts, {})[s.replica] = st
    hot_t: dict[str, int] = {}
    cold_t: dict[str, int] = {}
    n_imb = 0
    imb_times: list[float] = []
    sat_times: list[float] = []
    for ts, sts in by_ts.items():
        hot = [r for r, st in sts.items() if st == "saturated"]
        cold = [r for r, st in sts.items() if st == "idle"]
        if hot:
            sat_times.append(ts)
        if hot and cold:
            n_imb += 1
            imb_times.append(ts)
            for r in hot:
                hot_t[r] = hot_t.get(r, 0) + 1
            for r in cold:
                cold_t[r] = cold_t.get(r, 0) + 1
    need = t["fleet_imbalance_min_seconds"] / step
    engine_imb = []
    eng_times: list[float] = []
    pre_times: list[float] = []
    per_rep: dict[str, list] = {}
    for e in engines:
        per_rep.setdefault(e.replica, []).append(e)
    for rep, es in per_rep.items():
        times = set().union(*(e.status.keys() for e in es))
        n = 0
        hot_e: set[str] = set()
        cold_e: set[str] = set()
        for ts in times:
            hot = [e.engine for e in es if e.status.get(ts) == "saturated"]
            cold = [e.engine for e in es if e.status.get(ts) == "idle"]
            if hot and cold:
                n += 1
                hot_e.update(hot)
                cold_e.update(cold)
                eng_times.append(ts)
        if n:
            engine_imb.append(SimpleNamespace(replica=rep, seconds=n * step, hot=sorted(hot_e), cold=sorted(cold_e),
                                              meta=next(e.meta for e in es if e.engine in hot_e)))
    # the trend: fleet preemptions per half, fleet mean KV usage over time
    mid = (since + until) / 2
    first = second = 0.0
    kv_by_ts: dict[float, list[float]] = {}
    for rep in reps.values():
        for es in rep.engines.values():
            pre = es.values.get("num_preemptions_total") or {}
            prev = None
            for ts in sorted(pre):
                cur = pre[ts]
                inc = 0.0 if prev is None else (cur - prev if cur >= prev else cur)
                prev = cur
                if inc > 0:
                    pre_times.append(ts)
                if ts < mid:
                    first += inc
                else:
                    second += inc
            for ts, v in (es.values.get("kv_cache_usage_ratio") or {}).items():
                kv_by_ts.setdefault(ts, []).append(v)
    times = sorted(kv_by_ts)
    fl = fleet_latency or {}
    # silent since: the fleet's newest sample, not the end of the range (a range past the data, or
    # Prometheus' own gap, would make every replica look dead)
    newest = max((max(s.status) for s in replicas if s.status), default=until)
    vanished = [SimpleNamespace(replica=s.replica, last_seen=max(s.status), silent_seconds=newest - max(s.status),
                                meta=s.meta, summary=s)
                for s in replicas if s.status and newest - max(s.status) >= t["replica_down_seconds"]]
    return {
        "replicas": list(replicas), "engines": list(engines), "n_replicas": len(replicas),
        "window_seconds": until - since, "step_seconds": step,
        "imbalance_seconds": n_imb * step,
        "imbalance_hot": sorted(r for r, n in hot_t.items() if n >= need),
        "imbalance_cold": sorted(r for r, n in cold_t.items() if n >= need),
        "engine_imbalance": engine_imb,
        "preemptions_first_half": int(first), "preemptions_second_half": int(second),
        "kv_slope_per_hour": slope_per_hour([sum(kv_by_ts[x]) / len(kv_by_ts[x]) for x in times], times),
        "latency_p99": {sig: fl.get((sig, "p99")) for sig in ("ttft", "itl", "tpot", "e2e", "queue")},
        "slo_good_ratio": {sig: fl.get((sig, "good")) for sig in ("ttft", "itl", "tpot", "e2e", "queue")},
        "vanished": vanished,
        # when each fleet finding's condition held (its first and last seen), not the end of the range
        "spans": {name: (min(ts), max(ts)) for name, ts in (
            ("replica-imbalance", imb_times), ("engine-imbalance", eng_times), ("fleet-preemptions", pre_times),
            ("fleet-kv-saturation", sat_times), ("replica-down", [v.last_seen for v in vanished] + (
                [newest] if vanished else []))) if ts},
    }
