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
* imbalance is decided at a moment: an episode is a run of moments at which a replica was
  saturated (KV cache full, requests waiting) while another had room (idle, or its KV cache under
  ``t.balance_room_kv_ratio`` with a queue at most ``t.balance_queue_ratio`` of the saturated
  one's), lasting at least ``t.fleet_imbalance_min_seconds``; ``imbalance_seconds``,
  ``imbalance_start`` (``imbalance_from`` as text), ``imbalance_hot`` / ``imbalance_cold``: the
  longest episode's length, start, and the replicas saturated / with room at its moments (in half
  of them or more), ``imbalance_room_text`` what those had ("had room (KV cache 20-70 %, at most 2
  waiting)"); ``imbalance_episodes``: how many, ``imbalance_hot_all``: the replicas hot in any of
  them; ``engine_imbalance``: per replica with several
  engines, ``(replica, seconds, hot engines, cold engines, room_text, start, end, episodes)`` of its
  longest episode between its engines;
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

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm_doctor.diagnosis.advice import BalanceCriteria, room_text
from vllm_doctor.diagnosis.evaluate import RuleEngine
from vllm_doctor.diagnosis.expr import Evaluator
from vllm_doctor.diagnosis.loader import RuleSet, builtin_rules_dir, load_rule_file
from vllm_doctor.diagnosis.schedule import Schedule
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.findings import Finding
from vllm_doctor.state.core import State

FLEET_NAMES = {
    "replicas", "engines", "n_replicas", "window_seconds", "step_seconds", "imbalance_seconds",
    "imbalance_hot", "imbalance_hot_all", "imbalance_cold", "imbalance_room_text", "imbalance_start", "imbalance_from",
    "imbalance_episodes",
    "engine_imbalance",
    "preemptions_first_half",
    "preemptions_second_half", "kv_slope_per_hour", "latency_p99", "slo_good_ratio", "vanished", "t",
    "None", "True", "False",
}

#: what the schedule of the fleet rules is told once the fleet namespace is built (an event kind
#: no rule names: it triggers the rules that read ``*``)
FLEET_NAMESPACE_READY = "FleetNamespace"


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
        """The fleet rules due at the end of the range, by a :class:`Schedule` built from what
        they read (diagnosis/schedule.py), as the pipeline runs a replica's: the fleet namespace is
        complete at ``now``, one change of everything a rule reading ``*`` reads; a rule reading
        only named events (none of which a fleet has) is not due."""
        from dataclasses import replace

        state = State()
        state.now = now
        schedule = Schedule(self.ruleset, self.names["step_seconds"])
        schedule.note(FLEET_NAMESPACE_READY)
        due = schedule.due(now)
        # every rule due: a full evaluation (a fallback rule is judged only in one)
        self.evaluate(state, None if due == {r.id for r in self.ruleset.rules} else due)
        spans = self.names.get("spans") or {}
        return [replace(f, first_seen=spans[f.name][0], last_seen=spans[f.name][1]) if f.name in spans else f
                for f in self.findings.values()]


def episodes(by_ts: dict[float, dict[str, tuple[str, float, float | None]]], grid: float, since: float,
             min_seconds: float, criteria: BalanceCriteria) -> list[SimpleNamespace]:
    """The imbalance episodes of ``by_ts`` (ts -> member -> (status, waiting, fullest KV cache
    usage), status "saturated" | "idle" | "room" | "busy"): runs of consecutive moments on the
    ``grid`` (one missed moment allowed) at which one member was saturated while another had room
    (idle, or its KV cache clearly below full with a queue an order of magnitude shorter than the
    saturated members': :class:`~vllm_doctor.diagnosis.advice.BalanceCriteria`), lasting
    ``min_seconds`` or more. Each with its start, end, seconds, the members hot and cold *at those
    moments* (in at least half of them), and ``room_text``: what the cold ones had then."""
    moments = sorted(ts for ts in by_ts if abs((ts - since) / grid - round((ts - since) / grid)) < 1e-6)
    runs: list[list[tuple[float, list[str], list[tuple[str, float, float | None, bool]]]]] = []
    last = None
    for ts in moments:
        sts = by_ts[ts]
        hot = [r for r, (st, _, _) in sts.items() if st == "saturated"]
        queue = min((w for st, w, _ in sts.values() if st == "saturated"), default=0)
        cold = [(r, w, kv, st == "idle") for r, (st, w, kv) in sts.items()
                if st == "idle" or st == "room" and criteria.short_queue(w, queue)]
        if not (hot and cold):
            continue
        if last is None or ts - last > 2 * grid + 1e-6:
            runs.append([])
        runs[-1].append((ts, hot, cold))
        last = ts
    out = []
    for run in runs:
        seconds = run[-1][0] - run[0][0] + grid
        if seconds < min_seconds:
            continue
        hot_n: dict[str, int] = {}
        cold_n: dict[str, int] = {}
        for _, hot, cold in run:
            for r in hot:
                hot_n[r] = hot_n.get(r, 0) + 1
            for r, *_ in cold:
                cold_n[r] = cold_n.get(r, 0) + 1
        need = len(run) / 2
        cold_names = sorted(r for r, n in cold_n.items() if n >= need)
        had = [x for _, _, cold in run for x in cold if x[0] in cold_names]
        out.append(SimpleNamespace(start=run[0][0], end=run[-1][0], seconds=seconds,
                                   hot=sorted(r for r, n in hot_n.items() if n >= need), cold=cold_names,
                                   room_text=room_text([kv for _, _, kv, _ in had if kv is not None],
                                                       max((w for _, w, _, _ in had), default=0),
                                                       all(idle for *_, idle in had))))
    return out


def fleet_namespace(replicas, engines, reps, t: dict[str, float], since: float, until: float,
                    fleet_latency: dict | None = None, step: float = 15.0, grid: float | None = None) -> dict[str, Any]:
    """The names a fleet rule reads (see the module doc), from the per-replica summaries.
    ``grid``: the step every replica was read at (a quiet one at a longer step than a pressured
    one): imbalance is judged at those moments, where every replica has a value."""
    from vllm_doctor.diagnosis.expr import slope_per_hour

    grid = grid or step
    criteria = BalanceCriteria.from_thresholds(t)
    by_ts: dict[float, dict[str, tuple[str, float, float | None]]] = {}
    for s in replicas:
        for ts, st in s.status.items():
            by_ts.setdefault(ts, {})[s.replica] = (st, *s.load.get(ts, (0.0, None)))
    sat_times = sorted(ts for ts, sts in by_ts.items() if any(x[0] == "saturated" for x in sts.values()))
    eps = episodes(by_ts, grid, since, t["fleet_imbalance_min_seconds"], criteria)
    longest = max(eps, key=lambda e: (e.seconds, e.end), default=None)
    engine_imb = []
    eng_times: list[float] = []
    pre_times: list[float] = []
    per_rep: dict[str, list] = {}
    for e in engines:
        per_rep.setdefault(e.replica, []).append(e)
    for rep, es in per_rep.items():
        by_eng: dict[float, dict[str, tuple[str, float, float | None]]] = {}
        for e in es:
            for ts, st in e.status.items():
                by_eng.setdefault(ts, {})[e.engine] = (st, *e.load.get(ts, (0.0, None)))
        e_eps = episodes(by_eng, step, since, t["fleet_imbalance_min_seconds"], criteria)
        if e_eps:
            worst = max(e_eps, key=lambda x: (x.seconds, x.end))
            eng_times += [e_eps[0].start, e_eps[-1].end]
            engine_imb.append(SimpleNamespace(replica=rep, seconds=worst.seconds, hot=worst.hot, cold=worst.cold,
                                              room_text=worst.room_text,
                                              start=worst.start, end=worst.end, episodes=len(e_eps),
                                              meta=next(e.meta for e in es if e.engine in worst.hot)))
    imb_times = [eps[0].start, eps[-1].end] if eps else []
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

    def last_seen(s) -> float | None:
        """The replica's last sample, or the last scrape its vLLM answered when Prometheus' up
        says it was down at the end (up == 0: dead, hung, restarting); since when down all along."""
        last = max(s.status) if s.status else None
        r = reps.get(s.key)
        if r is not None and r.up_down_at_end:
            last = min(x for x in (last, r.up_last_ok if r.up_last_ok is not None else since) if x is not None)
        return last

    vanished = []
    for s in replicas:
        last = last_seen(s)
        if last is not None and newest - last >= t["replica_down_seconds"]:
            vanished.append(SimpleNamespace(replica=s.replica, last_seen=last, silent_seconds=newest - last,
                                            meta=s.meta, summary=s))
    return {
        "replicas": list(replicas), "engines": list(engines), "n_replicas": len(replicas),
        "window_seconds": until - since, "step_seconds": step,
        # the longest episode of replica imbalance: its length, and the replicas hot and idle then
        "imbalance_seconds": longest.seconds if longest else 0.0,
        "imbalance_hot": longest.hot if longest else [],
        "imbalance_hot_all": sorted({r for e in eps for r in e.hot}),
        "imbalance_cold": longest.cold if longest else [],
        "imbalance_room_text": longest.room_text if longest else "",
        "imbalance_start": longest.start if longest else None,
        "imbalance_from": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(longest.start)) if longest else None,
        "imbalance_episodes": len(eps),
        "engine_imbalance": engine_imb,
        "preemptions_first_half": int(first), "preemptions_second_half": int(second),
        "kv_slope_per_hour": slope_per_hour([sum(kv_by_ts[x]) / len(kv_by_ts[x]) for x in times], times),
        "latency_p99": {sig: fl.get((sig, "p99")) for sig in ("ttft", "itl", "tpot", "e2e", "queue")},
        "slo_good_ratio": {sig: fl.get((sig, "good")) for sig in ("ttft", "itl", "tpot", "e2e", "queue")},
        "vanished": vanished,
        # when each fleet finding's condition held (its first and last seen), not the end of the range
        "spans": {name: (min(ts), max(ts)) for name, ts in (
            ("replica-imbalance", imb_times), ("engine-imbalance", eng_times), ("fleet-preemptions", pre_times),
            ("fleet-kv-saturation", sat_times),
            ("latency-objective-missed", [x for r in reps.values() for span in r.latency_span.values() for x in span]),
            ("replica-down", [v.last_seen for v in vanished] + (
                [newest] if vanished else []))) if ts},
    }
