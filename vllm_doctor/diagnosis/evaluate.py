"""Evaluate rules against a state: stage 5 of the pipeline (state -> rules -> findings).

``RuleEngine.evaluate(state)`` runs every rule once on the state's current window and returns
the findings active now; it also folds them into ``engine.findings`` (all findings ever seen,
with first/last seen, for the diagnose report) and clears those whose condition ended.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re
from types import SimpleNamespace
from typing import Any

from vllm_doctor.diagnosis.advice import BalanceCriteria, concurrency, engine_balance, relate_fixes
from vllm_doctor.findings import GRADES, Evidence, Finding, FlagFix, by_severity
from vllm_doctor.state.core import State, Window, stalls
from vllm_doctor.state.incidents import host_trend, prefix_collapse, queue_growth
from vllm_doctor.state.signals import quantile_between
from vllm_doctor.state.windows import WindowAggregate
from vllm_doctor.versions import flag_exists, flag_first_version, parse_version
from vllm_doctor.diagnosis.expr import Evaluator, compile_line, names_in, parse_expr
from vllm_doctor.diagnosis.loader import TEMPLATE_RE, WINDOW_SERIES, Rule, RuleSet, const_args, split_placeholder

MAX_EVIDENCE = 8
#: The finding about vllm-doctor itself: a rule that failed to evaluate (see RuleEngine.evaluate).
RULE_ERROR_ID, RULE_ERROR_NAME = "VD000", "rule-evaluation-failed"
MAX_CLOSED = 200  # earlier occurrences kept for the report


def _run_events(state, kind: str) -> list:
    """The kept events of ``kind`` in this engine run. In the first run this is the state's ring
    with the kind's first event kept apart (``State.kept``), so that "the first OOM" survives a
    flood; after a restart, only the events since it (``State.run_events``)."""
    return state.kept(kind) if state.run_index == 0 else state.run_events(kind)


def render(template: str, ev: Evaluator) -> str:
    """Fill ``{expr}`` / ``{expr:spec}`` placeholders; None renders as "unknown"."""

    def sub(m: re.Match) -> str:
        expr, spec = split_placeholder(m.group(1))
        val = ev(expr.strip())
        if val is None:
            return "unknown"
        if spec:
            try:
                return format(val, spec)
            except (ValueError, TypeError):
                return str(val)
        if isinstance(val, float):
            return f"{val:.4g}" if abs(val) < 1e6 else f"{val:,.0f}"
        if isinstance(val, int) and not isinstance(val, bool) and abs(val) >= 10000:
            return f"{val:,}"
        return str(val)

    return TEMPLATE_RE.sub(sub, template)


def _grade(v: Any) -> str:
    """A fix's evidence grade: counted | inferred | assumed (anything else is the rule's fault:
    read as the weakest, assumed)."""
    return v if v in GRADES else "assumed"


def _flag_value(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "" if v else None
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return None
        return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) or abs(v) < 10 else str(int(v))
    return str(v)


VALUE_LIST_MAX = 50  # a list value (events of a window) is cut to its first 50 items in the JSON


def _jsonable(v: Any) -> Any:
    """A rule value as plain JSON (docs/report.schema.json): scalars as they are, an event as a
    reference to its line (``{"source", "lineno", "ts"}``), lists item by item; never a repr."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 6)
    meta = getattr(v, "meta", None)
    if meta is not None and hasattr(meta, "lineno"):
        return {"source": meta.source, "lineno": meta.lineno, "ts": meta.ts}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):  # a computed record: its fields
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in list(v)[:VALUE_LIST_MAX]]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def _per_rule(fn):
    """``fn(rule)`` worked out once per rule and process (a rule is immutable; the loaded rules are
    shared by every pipeline: see load_rules). The result is shared: read it, never change it."""
    memo: dict[int, tuple[Rule, Any]] = {}  # id(rule) -> (rule: keeps the id its own, result)

    def once(rule: Rule):
        got = memo.get(id(rule))
        if got is None or got[0] is not rule:
            if len(memo) >= 4096:
                memo.clear()
            got = memo[id(rule)] = (rule, fn(rule))
        return got[1]

    once.__doc__ = fn.__doc__
    return once


@_per_rule
def _rule_exprs(rule: Rule) -> tuple[str, ...]:
    """Every expression of a rule (conditions, values, fixes' values and conditions, placeholders)."""
    out = list(rule.when.all) + list(rule.when.any) + list(rule.values.values())
    texts = [rule.message] if isinstance(rule.message, str) else [c.text for c in rule.message]
    out += [c.if_ for c in (rule.message if not isinstance(rule.message, str) else []) if c.if_]
    for f in rule.fixes:
        out += [f.value] + ([f.if_] if f.if_ else [])
        texts += [f.why] + ([f.arithmetic] if f.arithmetic else [])
    out += [e.if_ for e in rule.escalate]
    for c in list(rule.checks) + list(rule.collect):
        out += [c.if_] if c.if_ else []
        texts.append(c.text)
    out += [rule.grade] + [f.grade for f in rule.fixes if f.grade]
    out += [split_placeholder(m.group(1))[0] for t in texts for m in TEMPLATE_RE.finditer(t)]
    return tuple(out)


def _line_fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.name != "meta")


def _aggregate(name: str, span: float, fields: dict[str, str], cls: type, where=None,
               quantiles: tuple = ()) -> WindowAggregate:
    """A window aggregate reading ``fields`` (name -> a field of the line, or an expression on it)."""
    getters = {}
    for fname, expr in fields.items():
        if expr in _line_fields(cls):
            getters[fname] = operator.attrgetter(expr)
        elif expr.isidentifier():
            getters[fname] = (lambda f: lambda item: getattr(item, f, None))(expr)
        else:
            getters[fname] = (lambda fn: lambda item: _or_none(fn, item))(compile_line(expr, _line_fields(cls), {}))
    agg = WindowAggregate(name, span, getters, where, quantiles)
    agg.fit_fields = set()  # what the rules read of a fit is added by RuleEngine.attach
    return agg


#: Facts that a stats line itself moves (State._on_SchedulerStats), read live by a ``where``
LINE_MOVED_FACTS = {
    "peak_num_running": lambda st: st.peak_running,
    "peak_num_waiting": lambda st: st.peak_waiting,
    "peak_kv_cache_usage_ratio": lambda st: st.peak_kv,
    "preemptions_total": lambda st: st.preemptions_total if st.preemptions_reported else None,
}


@_per_rule
def _fit_fields(rule: Rule) -> dict[str, set[str] | None]:
    """Window name -> the fields whose least-squares fit the rule reads (``w.slope_per_hour('f')``;
    None: a field not named by a constant, so every field). An aggregate keeps the fit's sums of
    these fields only."""
    out: dict[str, set[str] | None] = {}
    for expr in _rule_exprs(rule):
        try:
            tree = parse_expr(expr.strip())
        except SyntaxError:
            continue
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "slope_per_hour"
                    and isinstance(n.func.value, ast.Name) and n.func.value.id in rule.windows):
                w = n.func.value.id
                arg = n.args[0] if n.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if out.get(w, set()) is not None:
                        out[w] = out.get(w, set()) | {arg.value}
                else:
                    out[w] = None
    return out


def _or_none(fn, item):
    try:
        return fn(item)
    except (TypeError, AttributeError, ZeroDivisionError):
        return None  # None in arithmetic: the line does not give this value


class RuleEngine:
    """Runs a RuleSet on a State. ``findings``: rule id -> Finding, everything seen so far."""

    def __init__(self, ruleset: RuleSet, log_time: bool = False, clock: Any = None) -> None:
        self.ruleset = ruleset
        self._log_time = log_time
        self._clock = clock  # a pipeline's clock: its follows_log, when given, decides log_time
        self.findings: dict[str, Finding] = {}  # rule id -> its newest occurrence
        self.closed: list[Finding] = []  # earlier occurrences (ended, or cut by a restart), oldest first
        self._run_of: dict[str, int] = {}  # rule id -> engine run of its newest occurrence
        self.rule_errors: dict[str, list[str]] = {}  # rule id -> its last errors (while it fails)
        self.rule_errors_total: dict[str, int] = {}  # rule id -> evaluations that failed (a counter)
        self._thresholds = SimpleNamespace(**ruleset.thresholds)
        self._fallbacks = frozenset(r.name for r in ruleset.rules if r.fallback)
        self._gates: dict[str, list[str]] = {}
        self._windows: dict[str, dict[str, WindowAggregate]] = {}  # rule id -> its window aggregates
        self._uses: dict[str, set[str]] = {}  # rule id -> the names its expressions use
        self._facts_key: tuple | None = None
        self._facts: dict = {}

    # ---- window aggregates: kept by the state, line by line ------------------------------------
    def attach(self, state: State) -> None:
        """Register every rule's window aggregates (``windows:``) with ``state``, which then
        updates them on each new line. Also, per rule, the aggregate behind ``stats_max(f)`` /
        ``stats_min(f)`` and a ``where``'s ``peak(f)``: the largest value of any line."""
        self._windows = {}
        shared: dict[tuple, WindowAggregate] = {}  # the same aggregate asked for by several rules: kept once

        def add(series: str, key: tuple, make) -> WindowAggregate:
            got = shared.get((series, *key))
            if got is None:
                got = shared[(series, *key)] = state.add_window(series, make())
            return got

        for rule in self.ruleset.rules:
            span = self.ruleset.window_seconds(rule) or state.max_window
            aggs: dict[str, WindowAggregate] = {}
            stat_fields = sorted({f for expr in _rule_exprs(rule) for fn in ("stats_max", "stats_min")
                                  for f in const_args(expr, fn)})
            if stat_fields:
                aggs["stats"] = add("stats", (span, tuple(stat_fields)), lambda: _aggregate(
                    "stats", span, {f: f for f in stat_fields}, WINDOW_SERIES["stats"]))
            for name, spec in rule.windows.items():
                peaks = sorted(set(const_args(spec.where, "peak"))) if spec.where else []
                peak_agg = None
                if peaks:  # every line of the series, before the filtered aggregate sees it (the
                    # same aggregate as a stats_max() of these fields over the same span: kept once)
                    peak_agg = add(spec.of, (span, tuple(peaks)), lambda: _aggregate(
                        f"{name}:peak", span, {f: f for f in peaks}, WINDOW_SERIES[spec.of]))
                cls = WINDOW_SERIES[spec.of]
                where = self._line_condition(spec.where, cls, state, span, peak_agg) if spec.where else None
                key = (span, spec.where, tuple(spec.field_exprs().items()), tuple(spec.quantiles))
                aggs[name] = add(spec.of, key, lambda: _aggregate(name, span, spec.field_exprs(), cls, where,
                                                                  tuple(spec.quantiles)))
            for name, fields in _fit_fields(rule).items():
                agg = aggs[name]
                if agg.fit_fields is not None:
                    agg.fit_fields = None if fields is None else agg.fit_fields | fields
            self._windows[rule.id] = aggs

    def _line_condition(self, expr: str, cls: type, state: State, span: float, peak_agg):
        """A ``where`` as a function of one line: its fields by name, ``t.X``, the facts (as now),
        ``peak(f)``. Missing data (None in a comparison) is "no"; anything else raises (counted)."""
        # a batch of lines (State.flush_windows): per peak field, the window's maximum before the
        # batch and the running maximum within it, and the index of the line being judged
        batch: list = [None, 0]
        peaks = sorted(set(const_args(expr, "peak")))

        def peak(f: str):
            got = batch[0]
            if got is not None:
                base, running = got[f]
                v = running[batch[1]]
                return base if v is None or (base is not None and base > v) else v
            ts = state.now
            return peak_agg.sliding_max(f, None if ts is None else ts - span)

        def begin(items: list) -> None:
            """Before any aggregate folds ``items`` in: what peak(f) is at each of them (every
            line of the series counts for the peak before a condition reads it)."""
            ts = state.now
            got = {}
            for f in peaks:
                m = None
                running = []
                for it in items:
                    v = getattr(it, f, None)
                    if type(v) in (int, float) and v == v and (m is None or v >= m):
                        m = v
                    running.append(m)
                got[f] = (peak_agg.sliding_max(f, None if ts is None else ts - span), running)
            batch[0] = got

        def end() -> None:
            batch[0] = None

        def fact(name: str):
            live = LINE_MOVED_FACTS.get(name)
            if live is not None:  # moved by the stats lines themselves: read now, not from the cache
                return live(state)
            return self._cached_facts(state).get(name)  # recomputed only when the facts changed

        test = compile_line(expr, _line_fields(cls), self.ruleset.thresholds, {"peak": peak}, fact)

        def where(item) -> bool:
            try:
                return bool(test(item))
            except (TypeError, AttributeError, ZeroDivisionError):
                return False  # None in a comparison: the line does not say, so it does not count

        where.test = test  # the bare condition: a batch of lines calls it in one comprehension
        # a condition on a fact the stats lines move (a peak, the preemptions) is judged line by
        # line, after the state took in the line (State._on_SchedulerStats), never in a batch
        where.per_line = bool(names_in(expr) & set(LINE_MOVED_FACTS))
        if peaks:
            where.batch, where.begin, where.end = batch, begin, end
        return where

    def _cached_facts(self, state: State) -> dict:
        """The facts, recomputed only when what they are made of changed (a line's condition
        reads them for every line)."""
        key = (state.serial, state.vllm_version, state.engine, state.run_index)
        if key != self._facts_key:
            self._facts_key, self._facts = key, state.facts()
        return self._facts

    @property
    def log_time(self) -> bool:
        """True when findings are dated by their evidence lines (the log's clock), not when judged."""
        return self._clock.follows_log if self._clock is not None else self._log_time

    def evaluate(self, state: State, due: set[str] | None = None) -> list[Finding]:
        """Run the rules (all, or the ids in ``due``; the others keep their state) now; return
        the findings active now (critical first)."""
        state.flush_windows()
        facts = state.facts()
        now = state.now
        fired: dict[str, tuple[Rule, Evaluator, dict] | None] = {}
        for rule in self.ruleset.rules:
            # a fallback is judged against every other rule: only in a full evaluation
            if due is not None and (rule.id not in due or rule.fallback):
                prev = self.findings.get(rule.id)
                if prev is not None and prev.active:
                    fired[rule.name] = None  # still active from its last evaluation
                continue
            res = self._eval_rule(rule, state, facts)
            if res is not None:
                fired[rule.name] = (rule, *res)
            else:
                self._errored(rule, self._last_ev.errors)
        active_ids: set[str] = set()
        for name, got in fired.items():
            if got is None:
                rid = next(r.id for r in self.ruleset.rules if r.name == name)
                active_ids.add(rid)
                continue
            rule, ev, values = got
            if any(u in fired for u in rule.unless):
                # another rule explains it: an occurrence opened within this rule's window is
                # withdrawn (it was judged before the explaining lines arrived: the engines of one
                # interval log one after another), an older one stays as history
                prev = self.findings.get(rule.id)
                span = self.ruleset.window_seconds(rule)
                if span is None:  # a whole-log rule: fresh within one incident's merge gap
                    span = self._thresholds.incident_merge_gap_seconds
                if (prev is not None and prev.active and now is not None
                        and prev.first_seen is not None and now - prev.first_seen <= span
                        and self._run_of.get(rule.id) == state.run_index):
                    del self.findings[rule.id]
                continue
            if rule.fallback and any(n not in self._fallbacks for n in fired):
                continue  # another rule explains what this one would report
            f = self._finding(rule, ev, values, state)
            self._errored(rule, ev.errors)
            prev = self.findings.get(rule.id)
            gap = self._thresholds.incident_merge_gap_seconds
            if prev is not None and (self._run_of.get(rule.id) != state.run_index or not prev.active and (
                    now is None or prev.last_seen is None or now - prev.last_seen > gap)):
                # a new occurrence: the rule had stopped firing, or the engine restarted since
                prev.active = False
                self.closed.append(prev)
                if len(self.closed) > MAX_CLOSED:
                    self.closed.pop(0)
                f.occurrence = prev.occurrence + 1
                prev = None
            self._run_of[rule.id] = state.run_index
            f.run = state.run_index
            if prev is not None:
                f.occurrence = prev.occurrence
                f.first_seen = prev.first_seen
                # the evidence is this evaluation's: the lines that back this message (an earlier
                # window's lines could contradict it); the occurrence keeps its first_seen
            else:
                f.first_seen = now
            f.last_seen = now
            times = [e.ts for e in f.evidence if e.ts is not None]
            if self.log_time and times:  # diagnose: when the cited lines were written, not when judged
                f.first_seen = min(times) if prev is None else min(prev.first_seen or min(times), min(times))
                f.last_seen = max(times)
            elif times:  # serve: last seen is the log's time of the last evidence, not the evaluation's
                f.last_seen = max(times)
                if f.first_seen is not None and f.first_seen > f.last_seen:
                    f.first_seen = min(times)
            self.findings[rule.id] = f
            active_ids.add(rule.id)
        if self.rule_errors:
            self.findings[RULE_ERROR_ID] = self._error_finding(now, self.findings.get(RULE_ERROR_ID))
            active_ids.add(RULE_ERROR_ID)
        for rid, f in self.findings.items():
            f.active = rid in active_ids
        for f in self.findings.values():
            f.occurrences = f.occurrence
        active = [f for f in self.findings.values() if f.active]
        active.sort(key=by_severity)
        return active

    def _errored(self, rule: Rule, errors: list[str]) -> None:
        """Record the outcome of one evaluation of ``rule``: errors are counted and kept (the
        finding about vllm-doctor) until an evaluation of the rule succeeds."""
        if errors:
            self.rule_errors[rule.id] = errors[-5:]
            self.rule_errors_total[rule.id] = self.rule_errors_total.get(rule.id, 0) + 1
        else:
            self.rule_errors.pop(rule.id, None)

    def _error_finding(self, now: float | None, prev: Finding | None) -> Finding:
        names = {r.id: r.name for r in self.ruleset.rules}
        failing = ", ".join(f"{rid} ({names.get(rid, '?')})" for rid in sorted(self.rule_errors))
        first = next(iter(sorted(self.rule_errors.items())))
        f = Finding(
            rule_id=RULE_ERROR_ID, name=RULE_ERROR_NAME, severity="warning",
            title="A rule could not be evaluated: its incident is not being checked",
            message=(f"vllm-doctor could not evaluate {failing}, so {'that incident is' if len(self.rule_errors) == 1 else 'those incidents are'} "
                     f"not being checked. This is a fault in vllm-doctor or in a user rule, not in vLLM: "
                     f"{first[0]}: {first[1][-1]}"),
            evidence=[], fixes=[], values={"failing_rules": failing},
        )
        f.first_seen = prev.first_seen if prev is not None and prev.active else now
        f.last_seen = now
        return f

    def all_occurrences(self) -> list[Finding]:
        """Every occurrence seen (ended ones first, then the newest of each rule), in time order."""
        out = self.closed + list(self.findings.values())
        out.sort(key=lambda f: (f.first_seen is None, f.first_seen or 0.0, f.rule_id))
        return out

    def _namespace(self, rule: Rule, state: State, facts: dict) -> tuple[Evaluator, Any]:
        seconds = self.ruleset.window_seconds(rule)
        win = state.window(seconds)
        names: dict[str, Any] = dict(facts)
        uses = self._uses.get(rule.id)
        if uses is None:
            uses = self._uses[rule.id] = {n for e in _rule_exprs(rule) for n in names_in(e)}
        # the window's lines as lists, for rules that iterate them (user rules; the built-in ones read
        # their window aggregates): built only for a rule that names them
        names.update(
            t=self._thresholds, stats=win.stats() if "stats" in uses else [],
            metrics=win.metrics() if "metrics" in uses else [],
            engine_metrics=win.engine_metrics() if "engine_metrics" in uses else [],
            window_seconds=seconds,
            vllm_version=state.vllm_version, engine=state.engine,
            gpu=win.gpu_series() if "gpu" in uses else [], unknown_flags=sorted(state.unknown_flags),
            defaulted=tuple(state.defaulted),  # facts filled from the version's defaults (not in the log)
        )
        fired_names = {f.name for f in self.findings.values() if f.active}

        def count(kind: str) -> int:
            return win.count(kind)

        def total(kind: str) -> int:  # in the current engine run: a restart starts afresh
            return state.run_total(kind)

        def exists(kind: str) -> bool:
            return total(kind) > 0

        def recent(kind: str) -> bool:
            return count(kind) > 0

        def last_event(kind: str):
            evs = state.run_events(kind)
            return evs[-1] if evs else None

        def first_event(kind: str):
            evs = _run_events(state, kind)
            return evs[0] if evs else None

        def events(kind: str) -> list:
            return _run_events(state, kind)

        def recent_events(kind: str) -> list:
            return win.events(kind)

        aggs = self._windows.get(rule.id, {})
        views = {name: agg.view(win.start) for name, agg in aggs.items() if not name.endswith(":peak")}
        agg_errors = [err for agg in aggs.values() for err in agg.errors]
        for agg in aggs.values():
            agg.errors.clear()
        names.update({name: v for name, v in views.items() if name in rule.windows})

        def stats_max(field: str):
            """The largest value of a stats field in the window (None when none has it)."""
            if "stats" in views and field in aggs["stats"].fields:
                return views["stats"].max(field)
            vals = [v for v in (getattr(x, field) for x in win.stats()) if v is not None]
            return max(vals) if vals else None

        def stats_min(field: str):
            if "stats" in views and field in aggs["stats"].fields:
                return views["stats"].min(field)
            vals = [v for v in (getattr(x, field) for x in win.stats()) if v is not None]
            return min(vals) if vals else None

        def version_at_least(v: str) -> bool | None:
            pv = parse_version(state.vllm_version)
            return None if pv is None else pv >= parse_version(v)

        def ttft_p99() -> float | None:
            """TTFT p99 (seconds) over the window, from the first and last /metrics samples."""
            ms = [m for m in win.metrics() if m.ttft_buckets]
            return quantile_between(0.99, ms[0].ttft_buckets, ms[-1].ttft_buckets) if len(ms) >= 2 else None

        funcs = dict(
            count=count, total=total, exists=exists, recent=recent, last_event=last_event,
            first_event=first_event, events=events, recent_events=recent_events,
            preemptions_counted=win.preemptions_counted, preemptions_total=lambda: state.preemptions_total, preemptions=win.preemptions,
            flag_exists=lambda f: flag_exists(f, state.vllm_version), fired=lambda n: n in fired_names,
            version_at_least=version_at_least, ttft_p99=ttft_p99, stats_max=stats_max, stats_min=stats_min,
            stalls=lambda: [x for x in stalls(list(state.stats), Window(state, None).engine_metrics(), state.now,
                                              int(self._thresholds.engine_stalled_min_intervals))
                            if win.start is None or x.samples[0].meta.ts + x.seconds >= win.start]
            if state.may_stall() else [],
            engine_balance=lambda: engine_balance(win.stats(), win.engine_metrics(),
                                                  BalanceCriteria.from_thresholds(vars(self._thresholds))),
            startups=lambda: list(state.startups.items), starts_total=lambda: state.startups.total,
            hang_waits=state.hang_waits,
            host_memory=lambda: [x for x in state.host_memory if win.start is None or (x.meta.ts or 0) >= win.start],
            queue_growth=lambda: queue_growth(win.stats(), win.metrics()),
            prefix_collapse=lambda: prefix_collapse(win.stats(), win.metrics(), self._thresholds.prefix_cache_collapse_ratio),
            host_trend=lambda: host_trend([x for x in state.host_memory if win.start is None or (x.meta.ts or 0) >= win.start]),
            concurrency=lambda: concurrency(win.stats(), win.engine_metrics(), facts.get("kv_cache_tokens"),
                                            facts.get("max_model_len"), self._thresholds.kv_cache_full_ratio,
                                            facts.get("block_size")),
        )
        ev = Evaluator(names, funcs, comprehension_limit=4 * state.max_items)
        ev.errors.extend(agg_errors)  # a window's condition that failed on a line: the rule's fault, shown
        return ev, win

    def _gating_values(self, rule: Rule) -> list[str]:
        """The values the rule's conditions need (transitively), in declaration order."""
        got = self._gates.get(rule.id)
        if got is None:
            need: set[str] = set()
            todo = [n for c in rule.when.all + rule.when.any for n in names_in(c)]
            while todo:
                n = todo.pop()
                if n in rule.values and n not in need:
                    need.add(n)
                    todo.extend(names_in(rule.values[n]))
            got = self._gates[rule.id] = [k for k in rule.values if k in need]
        return got

    def _eval_rule(self, rule: Rule, state: State, facts: dict):
        ev, win = self._namespace(rule, state, facts)
        self._last_ev = ev
        values: dict[str, Any] = {}
        gating = self._gating_values(rule)
        for k in gating:  # the rest is computed only if the rule fires
            values[k] = ev(rule.values[k])
            ev.set(k, values[k])
        ok_all = all(bool(ev(c)) for c in rule.when.all) if rule.when.all else True
        ok_any = any(bool(ev(c)) for c in rule.when.any) if rule.when.any else True
        if not (ok_all and ok_any):
            return None
        for k, expr in rule.values.items():
            if k not in values:
                values[k] = ev(expr)
                ev.set(k, values[k])
        values = {k: values[k] for k in rule.values}
        ev.win = win
        return ev, values

    @staticmethod
    def _message(rule: Rule, ev: Evaluator) -> str:
        if isinstance(rule.message, str):
            return render(rule.message, ev).strip()
        for case in rule.message:
            if case.if_ is None or ev(case.if_):
                return render(case.text, ev).strip()
        return rule.title

    def _finding(self, rule: Rule, ev: Evaluator, values: dict, state: State) -> Finding:
        win = ev.win
        evidence: list[Evidence] = []
        seen: set[tuple[str, int]] = set()
        for kind in rule.evidence:
            if kind in values:  # a value holding the events that matter
                evs = [e for e in (values[kind] or []) if hasattr(e, "meta")] if isinstance(values[kind], list) else []
            elif kind == "SchedulerStats":
                evs = win.stats()
            elif self.ruleset.window_seconds(rule) is None:  # a whole-log rule: this engine run's events
                evs = state.run_events(kind)
            else:
                evs = win.events(kind)
                if kind.startswith("OutOfMemory:") or not evs:
                    evs = _run_events(state, kind) or evs
            picked = evs[:MAX_EVIDENCE // 2] + evs[-(MAX_EVIDENCE // 2):] if len(evs) > MAX_EVIDENCE else evs
            for e in picked:
                key = (e.meta.source, e.meta.end_lineno or e.meta.lineno)
                if key in seen:
                    continue
                seen.add(key)
                evidence.append(Evidence(e.meta.source, e.meta.lineno, e.meta.text[:300],
                                         e.meta.end_lineno if e.meta.end_lineno != e.meta.lineno else None,
                                         e.meta.ts))
        evidence.sort(key=lambda e: (e.source, e.lineno))
        fixes: list[FlagFix] = []
        options: list[str | None] = []
        notes: list[str] = []
        flags_done: set[str] = set()
        upgrade: list[tuple[str, FlagFix]] = []  # (first version, fix) of flags this version lacks
        for fx in rule.fixes:
            if fx.flag in flags_done:
                continue
            if fx.if_ and not ev(fx.if_):
                continue
            value = _flag_value(ev(fx.value))
            if value is None:
                continue
            made = FlagFix(fx.flag, value, render(fx.why, ev), render(fx.arithmetic, ev) if fx.arithmetic else None,
                           fx.kind, grade=_grade(ev(fx.grade or rule.grade)))
            flags_done.add(fx.flag)
            if (fx.kind == "flag" or fx.flag.startswith("VLLM_")) and not flag_exists(fx.flag, state.vllm_version):
                first = flag_first_version(fx.flag)
                if first and state.vllm_version and parse_version(first) > parse_version(state.vllm_version):
                    upgrade.append((first, made))
                continue
            fixes.append(made)
            options.append(fx.option)
        if upgrade:  # one fix: upgrade to the newest version any of them needs, and set them all
            need = max((v for v, _ in upgrade), key=parse_version)
            names = " and ".join(f.command() for _, f in upgrade)
            fixes.append(FlagFix("vllm", f">={need}", f"vLLM {state.vllm_version} has no {names.split(' ')[0]}"
                                 f"{'' if len(upgrade) == 1 else ' (nor the others of this set)'}: upgrade to "
                                 f">= {need} and set {names}.", None, "upgrade", grade=upgrade[0][1].grade))
            options.append("upgrade")
            for _, f in upgrade:
                fixes.append(f)
                options.append("upgrade")
        relate_fixes(fixes, options)
        checks = [c for c in rule.checks if c.if_ is None or ev(c.if_)]
        return Finding(
            rule_id=rule.id, name=rule.name, severity=next((e.severity for e in rule.escalate if ev(e.if_)), rule.severity),
            title=rule.title,
            message=self._message(rule, ev), evidence=evidence, fixes=fixes,
            values={k: _jsonable(v) for k, v in values.items()}, notes=notes,
            checks=[render(c.text, ev).strip() for c in checks],
            checks_first=bool(checks) and checks[0].first,
            collect=next((render(c.text, ev).strip() for c in rule.collect if c.if_ is None or ev(c.if_)), None),
        )
