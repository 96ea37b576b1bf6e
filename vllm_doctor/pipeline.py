"""The one pipeline: source -> envelope -> parser -> typed events -> state -> rules -> findings.

``diagnose`` pushes whole files through it (log clock: rules are evaluated every
``eval_interval`` seconds of log time and at the end); ``serve`` pushes appended bytes and
collector samples and calls :meth:`Pipeline.evaluate` on a timer. Nothing else wires stages.

Speed: a log is handled in blocks of complete lines; :class:`~vllm_doctor.envelope.KeywordScanner`
finds (with Hyperscan, at grep speed) the few lines any parser could match, request-logging lines
(user prompts) are skipped by their head, and only the rest are decoded and parsed.
Lines are still counted (``state.lines_total``) and those that gave no event are counted as
unparsed (``state.unparsed_total``). Kubernetes CRI logs are not prefiltered (a partial ``P`` line
must be joined before it can be judged).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from . import __version__
from .advice import share_fixes
from .diagnosis import RuleEngine, RuleSet
from .envelope import CRI_RE, Envelope, KeywordScanner, LineSplitter, LogClock, Record, candidate_lines
from .events import EngineConfigObserved, SchedulerStats, VersionSeen
from .findings import Finding
from .parsers import RecordParser
from .state import QUIET_KINDS, State


class _SourceCtx:
    """Per-source stage state: line splitter, envelope, parser."""

    def __init__(self, name: str, base_year: int | None, ref_month: int | None = None) -> None:
        self.name = name
        self.splitter = LineSplitter()
        self.envelope = Envelope(LogClock(base_year, ref_month))
        self.parser = RecordParser(name)
        self.prefilter: bool | None = None  # decided on the first line
        self.vllm_records = 0


class Pipeline:
    """See the module doc and docs/CONTRACTS.md.

    ruleset: the validated rules; follow: True in serve (rules run on :meth:`evaluate` calls),
    False in diagnose (rules also run every ``eval_interval`` seconds of log time).
    """

    def __init__(self, ruleset: RuleSet, follow: bool = False, eval_interval: float = 10.0,
                 base_year: int | None = None) -> None:
        self.ruleset = ruleset
        self.follow = follow
        self.eval_interval = eval_interval
        self.base_year = base_year
        longest = max([ruleset.window_seconds(r) or 0 for r in ruleset.rules] + [3600.0])
        self.state = State(max_window_seconds=longest + 60)
        self.engine = RuleEngine(ruleset, log_time=not follow)
        self._sources: dict[str, _SourceCtx] = {}
        self.active: list[Finding] = []
        self._scanner = KeywordScanner()
        self._parsed: dict[str, int] = {}  # source -> lines that gave an event
        self.source_times: dict[str, tuple[int | None, int | None]] = {}  # source -> (year, month) of its mtime
        self._rule_last: dict[str, float] = {}
        self._incident_pending = False
        # diagnose --since / --until (epoch seconds, log clock): events outside are not applied,
        # except what a starting engine writes (version, configuration, KV cache size: sticky facts)
        self.time_range: tuple[float | None, float | None] = (None, None)
        self._last_ts: float | None = None

    # ---- stage 1 -> 2: bytes to records ----------------------------------------------------
    def _ctx(self, source: str) -> _SourceCtx:
        ctx = self._sources.get(source)
        if ctx is None:
            year, month = self.source_times.get(source, (self.base_year, None))
            ctx = self._sources[source] = _SourceCtx(source, year, month)
        return ctx

    def records(self, source: str, spans: list[tuple[bytes, int, int]]) -> Iterator[Record]:
        """Records in spans of complete lines (see LineSplitter); every line is counted in
        ``state.lines_total`` and numbered, candidates only are decoded."""
        ctx = self._ctx(source)
        for buf, start, end in spans:
            if ctx.prefilter is None:
                nl = buf.find(b"\n", start, end)
                first_line = buf[start : nl if nl >= 0 else end]
                ctx.prefilter = not CRI_RE.match(first_line[:200].decode("utf-8", "replace"))
            base = ctx.splitter.lineno + 1  # number of the line at `start`
            if ctx.prefilter:
                cands, n = candidate_lines(self._scanner, buf, start, end)
                for idx, line in cands:
                    yield from ctx.envelope.records(base + idx, line)
            else:
                lines = buf[start:end].split(b"\n")
                n = len(lines)
                for i, line in enumerate(lines):
                    yield from ctx.envelope.records(base + i, line[:65536])
            ctx.splitter.lineno += n
            self.state.lines_total[source] += n

    # ---- stage 3 -> 5 ------------------------------------------------------------------------
    def consume(self, source: str, rec: Record) -> int:
        """Parse one record and fold its events into the state; returns the number of events."""
        ctx = self._ctx(source)
        if rec.src:
            ctx.vllm_records += 1
        evs = ctx.parser.parse(rec)
        n = 0
        st = self.state
        if rec.process:
            st.note_process(rec.process, rec.pid)
        lo, hi = self.time_range
        for e in evs:
            if e is None:
                n += 1
                continue
            if e.meta.ts is not None:
                self._last_ts = e.meta.ts
            if (lo is not None or hi is not None) and type(e).__name__ not in QUIET_KINDS:
                ts = self._last_ts  # an untimed line (a traceback) belongs where the log was
                if ts is not None and (lo is not None and ts < lo or hi is not None and ts > hi):
                    if hi is not None and ts > hi and (st.now is None or st.now < hi):
                        st.now = hi  # the log went on: what was still going on lasted until --until
                    n += 1
                    continue
            if not self.follow and st.starts_run(e):
                # a restart ends the run: judge everything on what it did before it is cut
                self.active = self.engine.evaluate(st)
            if (not self.follow and e.meta.ts is not None and st.now is not None
                    and e.meta.ts - st.now > max(self.eval_interval, 60.0)):
                # diagnose, a quiet stretch: judge what came before it while it is still in the
                # windows, then the stretch itself at its end (a stall or an incident that lasted
                # until now), as serve would have on its timer
                self.active = self.engine.evaluate(st)
                st.now = e.meta.ts
                self._tick(e.meta.ts)
            st.apply(e)
            n += 1
            if isinstance(e, SchedulerStats):
                st.note_src(rec.src)
            if not self.follow:
                if not isinstance(e, (SchedulerStats, EngineConfigObserved, VersionSeen)):
                    self._incident_pending = True
                if e.meta.ts is not None:
                    self._tick(e.meta.ts)
        return n

    def _count_parsed(self, source: str, recs: Iterable[Record]) -> None:
        parsed_lines: set[int] = set()
        for rec in recs:
            if self.consume(source, rec):
                parsed_lines.add(rec.lineno)
        self._parsed[source] = self._parsed.get(source, 0) + len(parsed_lines)

    def _tick(self, ts: float) -> None:
        """diagnose: run the rules that are due at log time ``ts``. A windowed rule runs every
        max(eval_interval, window/2) seconds of log time (consecutive evaluations overlap by half
        a window, so events less than half a window apart are always judged together); a
        whole-log rule runs when an incident event arrived."""
        due = set()
        for rule in self.ruleset.rules:
            w = self.ruleset.window_seconds(rule)
            last = self._rule_last.get(rule.id)
            if w is None:
                if self._incident_pending and (last is None or ts - last >= self.eval_interval):
                    due.add(rule.id)
            elif last is None or ts - last >= max(self.eval_interval, w / 2):
                due.add(rule.id)
        if due:
            for rid in due:
                self._rule_last[rid] = ts
            if any(self.ruleset.window_seconds(r) is None for r in self.ruleset.rules if r.id in due):
                self._incident_pending = False
            self.active = self.engine.evaluate(self.state, due)

    def feed(self, source: str, data: bytes) -> None:
        """Bytes appended to log ``source``; a partial last line is kept for the next call."""
        ctx = self._ctx(source)
        spans = ctx.splitter.feed(data)
        if spans:
            self._count_parsed(source, self.records(source, spans))

    def feed_candidates(self, source: str, cands: Iterable[tuple[int, bytes]], nlines: int) -> None:
        """Candidate lines found by a parallel reader (``(line number, bytes)``, in order) out of
        ``nlines`` lines: the same envelope, parser, state and rules as :meth:`feed`."""
        ctx = self._ctx(source)
        ctx.prefilter = True
        self.state.lines_total[source] += nlines
        ctx.splitter.lineno += nlines

        def recs():
            for lineno, line in cands:
                yield from ctx.envelope.records(lineno, line)

        self._count_parsed(source, recs())

    def end(self, source: str) -> None:
        """End of file (or rotation / truncation): the partial last line becomes a line."""
        ctx = self._ctx(source)
        recs = list(self.records(source, ctx.splitter.flush()))
        recs += ctx.envelope.flush()
        self._count_parsed(source, recs)

    def reset_source(self, source: str) -> None:
        """Forget a source's partial line and CRI state (after truncation or rotation); line
        numbers restart at 1. Counters are kept."""
        ctx = self._sources.pop(source, None)
        if ctx is not None:
            new = self._ctx(source)
            new.envelope.clock = ctx.envelope.clock

    def observe(self, event) -> None:
        """A typed event from a collector (VllmMetricsSample, GpuSample)."""
        self.state.apply(event)

    def tick(self, ts: float) -> None:
        """diagnose of events fed with :meth:`observe` (``diagnose --prometheus``: series read
        back from Prometheus): run the rules due at time ``ts``, as for log lines."""
        self._tick(ts)

    def evaluate(self, now: float | None = None) -> list[Finding]:
        """Run the rules now. ``now`` (epoch seconds) advances the state clock (serve)."""
        if now is not None and (self.state.now is None or now > self.state.now):
            self.state.now = now
        self.active = self.engine.evaluate(self.state)
        return self.active

    def unparsed(self, source: str) -> int:
        """Lines of ``source`` that gave no event."""
        return self.state.lines_total.get(source, 0) - self._parsed.get(source, 0)

    def vllm_records(self, source: str) -> int:
        """Records of ``source`` that carried vLLM's logger prefix."""
        ctx = self._sources.get(source)
        return ctx.vllm_records if ctx else 0

    # ---- diagnose: whole files, merged in time order ------------------------------------------
    def run_files(self, sources: list[tuple[str, Iterable[bytes]]], after=None) -> None:
        """Read each source (name, iterable of byte chunks) to its end; several sources are
        merged in time order (records without a timestamp keep their place in their file).
        ``after()`` runs once the logs are read, before the final evaluation."""
        if len(sources) == 1:
            name, chunks = sources[0]
            for chunk in chunks:
                self.feed(name, chunk)
            self.end(name)
        else:
            streams = [self._record_stream(name, chunks) for name, chunks in sources]
            parsed: dict[str, set[int]] = {name: set() for name, _ in sources}
            for _, _, name, rec in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
                if self.consume(name, rec):
                    parsed[name].add(rec.lineno)
            for name, lines in parsed.items():
                self._parsed[name] = self._parsed.get(name, 0) + len(lines)
        if after is not None:
            after()
        self.active = self.engine.evaluate(self.state)

    def _record_stream(self, name: str, chunks: Iterable[bytes]) -> Iterator[tuple[float, int, str, Record]]:
        ctx = self._ctx(name)
        seq = 0
        last_ts = 0.0
        for chunk in chunks:
            for rec in self.records(name, ctx.splitter.feed(chunk)):
                last_ts = rec.ts if rec.ts is not None else last_ts
                seq += 1
                yield (last_ts, seq, name, rec)
        tail = list(self.records(name, ctx.splitter.flush()))
        for rec in tail + ctx.envelope.flush():
            last_ts = rec.ts if rec.ts is not None else last_ts
            seq += 1
            yield (last_ts, seq, name, rec)

    def report(self) -> "Report":
        """The diagnosis so far (the JSON schema of ``diagnose --format json``)."""
        st = self.state
        facts = st.facts()
        return Report(
            vllm_version=st.vllm_version,
            vllm_version_source=st.version_source,
            engine=st.engine,
            facts=facts,
            facts_defaulted=sorted(st.defaulted),
            findings=share_fixes(sorted(self.engine.all_occurrences(),
                                        key=lambda f: (-{"info": 0, "warning": 1, "critical": 2}[f.severity], f.rule_id,
                                                       f.occurrence))),
            sources=[{"name": n, "lines_total": st.lines_total.get(n, 0), "unparsed_lines": self.unparsed(n),
                      "vllm_lines": self.vllm_records(n)} for n in self._sources],
            unknown_flags=dict(st.unknown_flags),
            rule_errors=dict(self.engine.rule_errors),
            generated_at=time.time(),
            timeline=st.timeline.snapshot(),
        )


SCHEMA_VERSION = 1


@dataclass
class Report:
    """A diagnosis. ``to_dict()`` gives the stable JSON schema (docs/json-schema.md)."""

    vllm_version: str | None
    vllm_version_source: str | None
    engine: str | None
    facts: dict[str, object]
    facts_defaulted: list[str]
    findings: list[Finding]
    sources: list[dict]
    unknown_flags: dict[str, str | None] = field(default_factory=dict)
    rule_errors: dict[str, list[str]] = field(default_factory=dict)
    generated_at: float = 0.0
    timeline: dict | None = None  # vllm_doctor.timeline.Timeline.snapshot(): the charts' series
    replicas: list[dict] = field(default_factory=list)  # diagnose --prometheus: the per-replica table

    @property
    def nothing_to_diagnose(self) -> bool:
        """True when no input line was recognised as vLLM output."""
        return not any(s["vllm_lines"] or (s["lines_total"] - s["unparsed_lines"]) for s in self.sources)

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "vllm-doctor", "version": __version__},
            "vllm_version": self.vllm_version,
            "vllm_version_source": self.vllm_version_source,
            "engine": self.engine,
            "facts": self.facts,
            "facts_defaulted": self.facts_defaulted,
            "findings": [f.to_dict() for f in self.findings],
            "sources": self.sources,
            "unknown_flags": [{"flag": k, "real_flag": v} for k, v in self.unknown_flags.items()],
            "rule_errors": self.rule_errors,
            "nothing_to_diagnose": self.nothing_to_diagnose,
            "timeline": self.timeline,
            **({"replicas": self.replicas} if self.replicas else {}),
        }


def file_year(path: str) -> int | None:
    """The year of a file's modification time (the base year of its year-less timestamps)."""
    ym = file_year_month(path)
    return ym[0] if ym else None


def file_year_month(path: str) -> tuple[int, int] | None:
    """(year, month) of a file's modification time, or None."""
    try:
        t = time.gmtime(os.stat(path).st_mtime)
        return t.tm_year, t.tm_mon
    except OSError:
        return None
