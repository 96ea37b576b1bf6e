"""The one pipeline: source -> envelope -> parser -> typed events -> state -> rules -> findings.

One intake path for every command. A source is bytes (``serve`` appends what the log grew by:
:meth:`Pipeline.feed` / :meth:`Pipeline.end`; ``diagnose`` reads files to their end:
:meth:`Pipeline.run`, one file or several merged in time order) or blocks already scanned by
the parallel reader of a large file (:class:`Scanned`); either way each block goes through
:meth:`Pipeline._records` (line numbers, line counts, envelope) and each record through
:meth:`Pipeline.consume` (parser, state, rules).

When rules run is the injected clock's business, not a mode of the stages: :class:`LogTime`
(``diagnose``: the log is the clock, rules run every ``eval_interval`` seconds of log time and at
the end) or :class:`WallTime` (``serve``: the caller runs :meth:`Pipeline.evaluate` on a timer).

Speed: a log is handled in blocks of complete lines; :class:`~vllm_doctor.ingest.envelope.KeywordScanner`
finds (with Hyperscan, at grep speed) the few lines any matcher could match (its keywords are
derived from the matcher table), request-logging lines (user prompts) are skipped by their head,
and only the rest are decoded and parsed, whatever wraps the log (CRI pieces are kept whole).
Lines are still counted (``state.lines_total``) and those that gave no event are unparsed
(:meth:`Pipeline.unparsed`: lines counted less lines parsed, per source). UTF-16/32 logs with a
byte-order mark are decoded to UTF-8 first.
"""

from __future__ import annotations

import codecs
import heapq
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from vllm_doctor.about import __version__
from vllm_doctor.diagnosis.advice import share_fixes
from vllm_doctor.diagnosis import RuleEngine, RuleSet
from vllm_doctor.diagnosis.schedule import Schedule
from vllm_doctor.ingest.clock import ClockGuard
from vllm_doctor.ingest.envelope import Envelope, KeywordScanner, LineSplitter, LogClock, Record, candidate_spans
from vllm_doctor.events import EngineConfigObserved, SchedulerStats, VersionSeen
from vllm_doctor.findings import Finding, by_severity
from vllm_doctor.parsers.records import RecordParser, keyword_scanner
from vllm_doctor.state.core import QUIET_KINDS, State
from vllm_doctor.state.snapshot import PipelineSnapshot, SourceCounters

BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def bom_encoding(head: bytes) -> tuple[str, int] | None:
    """(encoding, BOM length) when ``head`` (the first bytes of a source, up to a few KiB)
    starts with a UTF-8/16/32 byte-order mark and, for UTF-16/32, the text after it decodes to
    lines (a newline within the head, or a short head of printable text): bytes that merely begin
    like a BOM (a damaged UTF-8 log) stay UTF-8."""
    for bom, enc in BOMS:
        if head.startswith(bom):
            if enc == "utf-8":
                return enc, len(bom)
            sample = head[len(bom) : len(bom) + 8192]
            sample = sample[: len(sample) - len(sample) % (4 if "32" in enc else 2)]
            text = sample.decode(enc, "replace")
            if "\n" in text or (len(sample) < 512 and text.isprintable() and "\ufffd" not in text):
                return enc, len(bom)
            return None
    return None


@dataclass(frozen=True, slots=True)
class Scanned:
    """A block of a source already scanned for candidate lines (in this process, or by the
    parallel reader): the k-th candidate line is ``buf[starts[k]:ends[k]]``, ``linenos[k]`` its
    number within the block (from 0, as in :func:`~vllm_doctor.ingest.envelope.candidate_spans`);
    ``nlines`` the lines in the block. Offsets into one buffer, not a list of lines: a block
    holds no object per line, whatever its size."""

    buf: bytes
    starts: Sequence[int]
    ends: Sequence[int]
    linenos: Sequence[int]
    nlines: int


#: The events that can begin an engine run (State.starts_run) and, with stats lines, the only
#: ones that are no incident (a whole-log rule need not run after them)
_RUN_START_TYPES = frozenset((EngineConfigObserved, VersionSeen))


class LogTime:
    """The clock of ``diagnose``: time is the log's own; rules run as log time passes."""

    follows_log = True

    def now(self) -> float | None:
        return None


class WallTime:
    """The clock of ``serve``: wall time (``now`` injectable for tests); rules run when the
    caller asks (:meth:`Pipeline.evaluate`)."""

    follows_log = False

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now


class SidecarTime:
    """The clock of the sidecar (``serve``, ``watch``): wall time, except while the log read is old
    or replayed (``on_log_clock()`` true), when the rules judge it as ``diagnose`` does, on the
    log's own clock. Fixed at construction; what it answers follows what the sidecar reads."""

    def __init__(self, on_log_clock: Callable[[], bool], now: Callable[[], float] = time.time) -> None:
        self._on_log_clock = on_log_clock
        self.now = now

    @property
    def follows_log(self) -> bool:
        return self._on_log_clock()


class Clock(Protocol):
    """What a pipeline asks its clock: ``now()`` (None: the log's time) and whether the rules
    run as log time passes (``follows_log``) or when the caller evaluates."""

    @property
    def follows_log(self) -> bool: ...

    def now(self) -> float | None: ...


class _SourceCtx:
    """Per-source stage state: decoder, line splitter, envelope, parser."""

    def __init__(self, name: str, base_year: int | None, ref_month: int | None = None) -> None:
        self.name = name
        self.splitter = LineSplitter()
        self.envelope = Envelope(LogClock(base_year, ref_month))
        self.parser = RecordParser(name)
        self.guard = ClockGuard()  # a line far ahead of the others does not move the clock
        self.decoder = None  # an incremental decoder for UTF-16/32 input, once a BOM was seen
        self.started = False
        self.carry = False  # the last candidate line was a piece of a longer record
        self.vllm_records = 0
        self.lineno = 0  # lines counted so far


class Pipeline:
    """See the module doc and docs/CONTRACTS.md.

    ruleset: the validated rules; clock: :class:`LogTime` (diagnose), :class:`WallTime` or
    :class:`SidecarTime` (serve, watch); ``follow=True`` is shorthand for ``clock=WallTime()``;
    schedule: when rules run on the log's clock (default: derived from the rules,
    :class:`~vllm_doctor.diagnosis.schedule.Schedule`). All three are fixed at construction.
    """

    def __init__(self, ruleset: RuleSet, clock: Clock | None = None, schedule: Schedule | None = None, *,
                 follow: bool = False, eval_interval: float = 10.0, base_year: int | None = None) -> None:
        self.ruleset = ruleset
        self.clock: Clock = clock or (WallTime() if follow else LogTime())
        self.eval_interval = eval_interval
        self.schedule = schedule or Schedule(ruleset, eval_interval)
        self.base_year = base_year
        longest = max([ruleset.window_seconds(r) or 0 for r in ruleset.rules] + [3600.0])
        self.state = State(max_window_seconds=longest + 60)
        self.engine = RuleEngine(ruleset, clock=self.clock)
        self.engine.attach(self.state)  # the rules' window aggregates, updated by the state per line
        self._sources: dict[str, _SourceCtx] = {}
        self.active: list[Finding] = []
        self._keyword_scanner: KeywordScanner | None = None  # built on the first log bytes (_scanner)
        self._parsed: dict[str, int] = {}  # source -> lines that gave an event
        self._last_parsed: dict[str, int] = {}  # source -> number of the last line that gave an event
        self.source_times: dict[str, tuple[int | None, int | None]] = {}  # source -> (year, month) of its mtime
        self.on_event: Callable[[object], None] | None = None  # sees every log event (``events``)
        # diagnose --since / --until (epoch seconds, log clock): events outside are not applied,
        # except what a starting engine writes (version, configuration, KV cache size: sticky facts)
        self.time_range: tuple[float | None, float | None] = (None, None)
        self._last_ts: float | None = None
        # with a time range: the log's first and last times, and the timed events inside / outside it
        self._first_ts: float | None = None
        self._max_ts: float | None = None
        self._in_range = self._out_of_range = 0
        # several files at once (run): per file its first/last time and the server it shows (version,
        # engine, model from its start-up lines), to refuse files of different servers (mixed_servers)
        self._identities: dict[str, dict] | None = None

    @property
    def _scanner(self) -> KeywordScanner:
        """The log keyword scanner, compiled when the first log bytes arrive: a pipeline fed only
        typed events (fleet diagnosis: one per replica) never pays for it."""
        if self._keyword_scanner is None:
            self._keyword_scanner = keyword_scanner()
        return self._keyword_scanner

    @property
    def follow(self) -> bool:
        """True while the rules run on the wall clock (serve), False on the log's (diagnose)."""
        return not self.clock.follows_log

    # ---- stage 1 -> 2: bytes to records ----------------------------------------------------
    def _ctx(self, source: str) -> _SourceCtx:
        ctx = self._sources.get(source)
        if ctx is None:
            year, month = self.source_times.get(source, (self.base_year, None))
            ctx = self._sources[source] = _SourceCtx(source, year, month)
        return ctx

    def _decode(self, ctx: _SourceCtx, data: bytes, final: bool = False) -> bytes:
        """UTF-8 bytes of ``data``: a UTF-16/32 source (byte-order mark at its start) is decoded."""
        if not ctx.started and data:
            ctx.started = True
            enc = bom_encoding(data[:8192])
            if enc is not None:
                data = data[enc[1]:]
                if enc[0] != "utf-8":
                    ctx.decoder = codecs.getincrementaldecoder(enc[0])("replace")
        if ctx.decoder is not None:
            return ctx.decoder.decode(data, final).encode("utf-8")
        return data

    def _scan(self, ctx: _SourceCtx, spans: list[tuple[bytes, int, int]]) -> Iterator[Scanned]:
        """Spans of complete lines -> scanned blocks (this process)."""
        for buf, start, end in spans:
            starts, ends, idxs, n, ctx.carry = candidate_spans(self._scanner, buf, start, end, carry=ctx.carry)
            yield Scanned(buf, starts, ends, idxs, n)

    def _records(self, ctx: _SourceCtx, blocks: Iterable[Scanned]) -> Iterator[Record]:
        """The one way from scanned blocks to records: every line is counted in
        ``state.lines_total`` and numbered, candidates only are decoded."""
        for blk in blocks:
            base = ctx.lineno + 1  # number of the block's first line
            buf = blk.buf
            push = ctx.guard.push
            for a, b, idx in zip(blk.starts, blk.ends, blk.linenos):
                for rec in ctx.envelope.records(base + idx, buf[a:b]):
                    yield from push(rec)
            ctx.lineno += blk.nlines
            self.state.lines_total[ctx.name] += blk.nlines

    def _tail(self, ctx: _SourceCtx) -> Iterator[Record]:
        """End of a source: its partial last line, then what the envelope still holds."""
        tail = self._decode(ctx, b"", final=True)
        spans = ctx.splitter.feed(tail) if tail else []
        yield from self._records(ctx, self._scan(ctx, spans + ctx.splitter.flush()))
        ctx.carry = False
        for rec in ctx.envelope.flush():
            yield from ctx.guard.push(rec)
        yield from ctx.guard.release()

    # ---- stage 3 -> 5 ------------------------------------------------------------------------
    def consume(self, source: str, rec: Record) -> int:
        """Parse one record and fold its events into the state; returns the number of events."""
        ctx = self._ctx(source)
        if rec.src:
            ctx.vllm_records += 1
        return self._fold(source, rec, ctx.parser.parse(rec))

    def _flush_parsers(self) -> None:
        """Events the parsers still hold (an OOM waiting for what follows to tell its phase):
        applied at the end of the input and before every evaluation, never lost."""
        for name, ctx in list(self._sources.items()):
            held = ctx.parser.flush()
            if held:
                self._fold(name, Record(held[0].meta.lineno, ""), held)

    def _fold(self, source: str, rec: Record, evs: list) -> int:
        """Fold a record's events into the state (and run the rules that are due)."""
        n = 0
        st = self.state
        if rec.process:
            st.note_process(rec.process, rec.pid)
        lo, hi = self.time_range
        log_clock = self.clock.follows_log
        for e in evs:
            if e is None:
                n += 1
                continue
            ts = e.meta.ts
            if ts is not None:
                self._last_ts = ts
            if lo is not None or hi is not None:
                t = self._last_ts  # an untimed line (a traceback) belongs where the log was
                outside = t is not None and (lo is not None and t < lo or hi is not None and t > hi)
                if ts is not None:
                    self._first_ts = ts if self._first_ts is None else min(self._first_ts, ts)
                    self._max_ts = ts if self._max_ts is None else max(self._max_ts, ts)
                if outside:
                    self._out_of_range += 1
                elif t is not None:  # a line before any time cannot be placed in the span
                    self._in_range += 1
            if (lo is not None or hi is not None) and type(e).__name__ not in QUIET_KINDS:
                if outside:
                    if hi is not None and t > hi and (st.now is None or st.now < hi):
                        st.now = hi  # the log went on: what was still going on lasted until --until
                    n += 1
                    continue
            if log_clock:
                if st._run_active and type(e) in _RUN_START_TYPES and st.starts_run(e):
                    # a restart ends the run: judge everything on what it did before it is cut
                    self.active = self.engine.evaluate(st)
                if ts is not None and st.now is not None and ts - st.now > max(self.eval_interval, 60.0):
                    # diagnose, a quiet stretch: judge what came before it while it is still in the
                    # windows, then the stretch itself at its end (a stall or an incident that lasted
                    # until now), as serve would have on its timer
                    self.active = self.engine.evaluate(st)
                    st.now = ts
                    self._tick(ts)
            if self._identities is not None and type(e) in (VersionSeen, EngineConfigObserved, SchedulerStats):
                self._note_identity(source, e)
            st.apply(e)
            n += 1
            if self.on_event is not None:
                self.on_event(e)
            stats = type(e) is SchedulerStats
            if stats:
                st.note_src(rec.src)
            if log_clock:
                self.schedule.note(type(e).__name__)
                if ts is not None and self.schedule.may_be_due(ts):
                    self._tick(ts)
        if n and self._last_parsed.get(source) != rec.lineno:
            self._last_parsed[source] = rec.lineno
            self._parsed[source] = self._parsed.get(source, 0) + 1
        return n

    def _tick(self, ts: float) -> None:
        """Log time ``ts`` reached: run the rules that are due (:class:`Schedule`)."""
        due = self.schedule.due(ts)
        if due:
            self.active = self.engine.evaluate(self.state, due)

    def feed(self, source: str, data: bytes) -> None:
        """Bytes appended to log ``source``; a partial last line is kept for the next call."""
        ctx = self._ctx(source)
        spans = ctx.splitter.feed(self._decode(ctx, data))
        if spans:
            for rec in self._records(ctx, self._scan(ctx, spans)):
                self.consume(source, rec)

    def end(self, source: str) -> None:
        """End of file (or rotation / truncation): the partial last line becomes a line, and a
        traceback the source ends inside is what it shows (it will not go on)."""
        ctx = self._ctx(source)
        for rec in self._tail(ctx):
            self.consume(source, rec)
        self._flush_parsers()
        self.end_tracebacks([source])

    def end_tracebacks(self, sources: list[str] | None = None) -> None:
        """The tracebacks the logs (``sources``, default all) end inside, as exceptions cut
        before their exception line: at the end of the input, or of a log no one writes to any
        more (the sidecar replaying an old log)."""
        for name, ctx in list(self._sources.items()):
            if sources is not None and name not in sources:
                continue
            cut = ctx.parser.cut_tracebacks()
            if cut:
                self._fold(name, Record(cut[0].meta.lineno, ""), cut)

    def reset_source(self, source: str) -> None:
        """Forget a source's partial line and CRI state (after truncation or rotation); line
        numbers restart at 1. Counters are kept."""
        self._release_held()
        self._flush_parsers()  # what the old file's parser still holds is not lost
        ctx = self._sources.pop(source, None)
        if ctx is not None:
            new = self._ctx(source)
            new.envelope.clock = ctx.envelope.clock
            self._last_parsed.pop(source, None)

    def observe(self, event) -> None:
        """A typed event from a collector (VllmMetricsSample, GpuSample)."""
        self.state.apply(event)

    def tick(self, ts: float) -> None:
        """diagnose of events fed with :meth:`observe` (``diagnose --prometheus``: series read
        back from Prometheus): run the rules due at time ``ts``, as for log lines."""
        self._tick(ts)

    def evaluate(self, now: float | None = None) -> list[Finding]:
        """Run the rules now. ``now`` (epoch seconds) advances the state clock (serve)."""
        if now is None:
            now = self.clock.now()
        self._release_held(now)
        self._flush_parsers()
        if now is not None and (self.state.now is None or now > self.state.now):
            self.state.now = now
        self.active = self.engine.evaluate(self.state)
        return self.active

    def _release_held(self, now: float | None = None) -> None:
        """The records each source's clock guard holds (a step ahead that no later line has
        confirmed yet), judged on the wall clock ``now`` (see :class:`ClockGuard`)."""
        for name, ctx in list(self._sources.items()):
            if ctx.guard.held:
                for rec in ctx.guard.release(now):
                    self.consume(name, rec)

    def snapshot(self) -> PipelineSnapshot:
        """The state's snapshot plus each source's line number and parsed-line count: what the
        sidecar checkpoints together with the offsets (see :meth:`State.snapshot`). Events the
        parsers still hold are applied first: the offsets already cover their lines."""
        self._release_held()
        self._flush_parsers()
        return PipelineSnapshot(state=self.state.snapshot(), sources={
            n: SourceCounters(lineno=c.lineno, parsed=self._parsed.get(n, 0)) for n, c in self._sources.items()})

    def restore(self, snap: PipelineSnapshot) -> None:
        """Put a :meth:`snapshot` back into a fresh pipeline (a resumed sidecar)."""
        self.state.restore(snap.state)
        for name, src in snap.sources.items():
            self._ctx(name).lineno = src.lineno  # evidence line numbers continue where they stopped
            self._parsed[name] = src.parsed

    def _clock_jumps(self, source: str) -> dict:
        """``clock_jumps`` (lines whose time was far ahead of the lines around them: stamped with
        the time before them, see :class:`ClockGuard`) and the first ones' line numbers."""
        g = self._sources[source].guard
        return {"clock_jumps": g.jumps, "clock_jump_lines": list(g.jump_lines)} if g.jumps else {}

    def unparsed(self, source: str) -> int:
        """Lines of ``source`` that gave no event."""
        return self.state.lines_total.get(source, 0) - self._parsed.get(source, 0)

    def vllm_records(self, source: str) -> int:
        """Records of ``source`` that carried vLLM's logger prefix."""
        ctx = self._sources.get(source)
        return ctx.vllm_records if ctx else 0

    # ---- diagnose: whole sources, merged in time order ----------------------------------------
    def records_of(self, source: str, data: Iterable[bytes | Scanned]) -> Iterator[Record]:
        """The records of a whole source given as byte chunks (or blocks scanned elsewhere),
        its end included."""
        ctx = self._ctx(source)
        for item in data:
            if isinstance(item, Scanned):
                yield from self._records(ctx, (item,))
            else:
                spans = ctx.splitter.feed(self._decode(ctx, item))
                if spans:
                    yield from self._records(ctx, self._scan(ctx, spans))
        yield from self._tail(ctx)

    def run(self, sources: list[tuple[str, Iterable[bytes | Scanned]]], after=None) -> None:
        """Read each source (name, byte chunks or scanned blocks) to its end; several sources
        are merged in time order (records without a timestamp keep their place in their file).
        ``after()`` runs once the logs are read, before the final evaluation."""
        if len(sources) == 1:
            name, data = sources[0]
            for rec in self.records_of(name, data):
                self.consume(name, rec)
        else:
            self._identities = ids = {name: {} for name, _ in sources}
            streams = [self._timed(name, self.records_of(name, data)) for name, data in sources]
            for _, _, name, rec in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
                if rec.ts is not None:
                    ids[name].setdefault("first_ts", rec.ts)
                    ids[name]["last_ts"] = rec.ts
                self.consume(name, rec)
        self._flush_parsers()
        self.end_tracebacks()
        if after is not None:
            after()
        self.active = self.engine.evaluate(self.state)

    run_files = run  # the name callers used before ``run``

    def _note_identity(self, source: str, e: VersionSeen | EngineConfigObserved | SchedulerStats) -> None:
        ident = self._identities.setdefault(source, {})
        if type(e) is SchedulerStats:  # the stats line's shape tells the engine (as State does)
            if "engine" not in ident:
                engine = "v0" if e.num_swapped is not None else "v1" if e.engine_index is not None or e.kv_device else None
                if engine:
                    ident["engine"] = engine
        elif type(e) is VersionSeen:
            ident.setdefault("version", e.version)
            if e.engine:
                ident.setdefault("engine", e.engine)
        else:
            model = dict(e.values).get("model")
            if isinstance(model, str) and model:
                ident.setdefault("model", model)

    def mixed_servers(self) -> str | None:
        """After :meth:`run` over several files: a one-line reason when two of them are logs of
        different vLLM servers, else None. Two files are one deployment's rotation (or its restarts)
        when their times do not overlap; files whose times overlap and whose start-up lines name a
        different vLLM version, engine or model were written by two servers at once, and merging
        them would mix one server's facts with the other's."""
        ids = self._identities or {}
        names = [n for n, i in ids.items() if i.get("first_ts") is not None]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                x, y = ids[a], ids[b]
                if max(x["first_ts"], y["first_ts"]) > min(x["last_ts"], y["last_ts"]):
                    continue  # one after the other: rotation or restart
                differ = [k for k in ("version", "engine", "model") if k in x and k in y and x[k] != y[k]]
                if differ:
                    def who(n: str, d: dict) -> str:
                        return f"{n} ({', '.join(f'{k} {d[k]}' for k in ('version', 'engine', 'model') if k in d)})"
                    return (f"{who(a, x)} and {who(b, y)} are logs of two vLLM servers running at the same time, "
                            f"not one deployment's rotated files: diagnose each server's logs on its own")
        return None

    @staticmethod
    def _timed(name: str, recs: Iterator[Record]) -> Iterator[tuple[float, int, str, Record]]:
        last_ts = 0.0
        for seq, rec in enumerate(recs):
            last_ts = rec.ts if rec.ts is not None else last_ts
            yield (last_ts, seq, name, rec)

    def report(self) -> Report:
        """The diagnosis so far (the JSON schema of ``diagnose --format json``)."""
        st = self.state
        facts = st.facts()
        timeline = st.timeline.snapshot()
        # the current run served requests: a stats line (or /metrics sample) since it began with a
        # request running or tokens generated (the server coming up is not serving)
        served = st.run_started is not None and any(
            p[0] is not None and p[0] >= st.run_started and ((p[2] or 0) > 0 or (p[5] or 0) > 0)
            for pts in timeline["series"].values() for p in pts)
        return Report(
            vllm_version=st.vllm_version,
            vllm_version_source=st.version_source,
            engine=st.engine,
            facts=facts,
            facts_defaulted=sorted(st.defaulted),
            findings=share_fixes(sorted(self.engine.all_occurrences(),
                                        key=lambda f: (*by_severity(f),
                                                       f.occurrence))),
            sources=[{"name": n, "lines_total": st.lines_total.get(n, 0), "unparsed_lines": self.unparsed(n),
                      "vllm_lines": self.vllm_records(n), **self._clock_jumps(n)} for n in self._sources],
            unknown_flags=dict(st.unknown_flags),
            rule_errors=dict(self.engine.rule_errors),
            generated_at=time.time(),
            timeline=timeline,
            startup=[x.to_dict() for x in st.startups.items],
            time_range=None if self.time_range == (None, None) else {
                "since": self.time_range[0], "until": self.time_range[1],
                "log_first_ts": self._first_ts, "log_last_ts": self._max_ts,
                "events_in_range": self._in_range, "events_outside": self._out_of_range},
            runs={"index": st.run_index, "started": st.run_started, "served": served,
                  "log_last_ts": st.timeline.log_ts},
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
    timeline: dict | None = None  # vllm_doctor.report.timeline.Timeline.snapshot(): the charts' series
    replicas: list[dict] = field(default_factory=list)  # diagnose --prometheus: the per-replica table
    # diagnose --since / --until on logs: the span (epoch s, log clock), the log's first and last
    # times, and how many events fell in it and outside it; None without a span
    time_range: dict | None = None
    # the engine runs the logs show (a version banner or engine start after activity begins the
    # next): ``index`` of the current one, when it ``started`` (epoch s), whether it ``served``
    # (a stats line since then with a request running or tokens generated) and the newest log time ``log_last_ts``; None when the
    # report is not read from logs. The verdict speaks of the current run (report.render.verdict).
    runs: dict | None = None
    # the engine starts seen, oldest first, each with its timed phases (state/startup.py Startup.to_dict)
    startup: list[dict] = field(default_factory=list)

    @property
    def nothing_in_range(self) -> bool:
        """True when --since / --until was given and no event of the logs fell in that span (the
        logs hold vLLM lines, all of them before or after it): nothing was judged."""
        tr = self.time_range
        return bool(tr) and tr["events_in_range"] == 0 and tr["events_outside"] > 0

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
            "startup": self.startup,
            **({"time_range": {**self.time_range, "nothing_in_range": self.nothing_in_range}}
               if self.time_range else {}),
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
