"""Advice: the one calculation behind every fix value, and how fixes relate to each other.

Concurrency (``--max-num-seqs``) is sized from what the server was seen doing, in this order:

1. **running at full**: the number of sequences that were running when the KV cache was full
   (usage at or above ``kv_cache_full_ratio``): that is what this KV cache holds for the lengths
   actually served;
2. **tokens per sequence**: when the cache was never sampled full, KV cache tokens / the tokens a
   running sequence was seen to hold (usage x KV cache tokens / running), from the busiest
   sample;
3. **never-preempt bound**: KV cache tokens / max_model_len, the count for which no sequence can
   ever be preempted because every one could grow to max_model_len. It is a worst case (real
   requests are far shorter), used only when nothing was observed, and always labelled.

That number is what the KV cache *held*; it is not by itself a fix for preemption. vLLM preempts
when the cache is full, so the sequences that ran then are what it preempted at: a
``--max-num-seqs`` at or above that count changes nothing. :attr:`Concurrency.admit` is the
value a rule may recommend, below what ran under pressure: what the server ran in an interval
where vLLM counted no preemption (V1's ``Preemptions: 0``), or what the KV cache holds at the
longest length a running sequence was seen to hold (usage x KV cache tokens / running, at its
largest), whichever is larger. That is the never-preempt bound (every sequence at max_model_len)
only where requests really grow to max_model_len; the bound itself is used only when nothing
was seen running, and then said to be assumed. Rules give it only where preemptions were
counted (the harm it removes).

Every rule that recommends ``--max-num-seqs`` calls :func:`concurrency` (exposed to rule
expressions), so preemption-storm and kv-capacity-bound cannot disagree. The block arithmetic is
:mod:`vllm_doctor.plan.capacity`'s (the one ``plan`` and ``check`` use): whole KV cache blocks per
sequence, ``max_num_seqs_that_fit`` for the never-preempt bound, ``concurrency_at_length`` for
the observed length; this module adds the observed side (which sample, which method).

Fix relations: each fix of a finding belongs to an *option*. Fixes of one option go together
(a set); different options are alternatives (pick one). :func:`relate_fixes` numbers them, and
:func:`share_fixes` makes a fix that two findings give appear once in a report.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.plan.capacity import concurrency_at_length, max_num_seqs_that_fit
from vllm_doctor.findings import Finding, FlagFix


@dataclass(frozen=True)
class Concurrency:
    """The concurrency the KV cache holds, and how that number was obtained.

    value: the recommended ``--max-num-seqs`` (None when nothing is known); method:
    ``running-at-full`` | ``tokens-per-sequence`` | ``never-preempt-bound``; sample: the stats
    line or /metrics sample the value was read from (its ``meta`` cites it)."""

    value: int | None
    method: str | None
    running: int | None = None
    usage_ratio: float | None = None
    tokens_per_sequence: float | None = None
    never_preempt: int | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    sample: Any = None
    #: the most sequences running where vLLM preempted or had to (a sample with the KV cache full
    #: or with preemptions counted in its interval; without one, the most seen running), and that sample
    pressure_running: int | None = None
    pressure_sample: Any = None
    pressure_full: bool = False
    #: the most KV cache tokens a running sequence was seen to hold (usage x KV cache tokens /
    #: running, over every sample), that sample, and how many such sequences the cache holds
    longest_per_sequence: float | None = None
    longest_sample: Any = None
    longest_fit: int | None = None
    #: the most sequences running in a stats interval for which vLLM counted no preemption
    #: (V1's "Preemptions: 0"), and that line: what the server ran without preempting
    clean_running: int | None = None
    clean_sample: Any = None
    #: the fewest sequences running in a stats interval for which vLLM counted preemptions, and
    #: that line: a --max-num-seqs at or above it is known not to stop them
    preempting_running: int | None = None
    preempting_sample: Any = None

    def bytes_for(self, kv_cache_memory_bytes: int | None, sequences: int | None) -> int | None:
        """The ``--kv-cache-memory-bytes`` that holds ``sequences`` at the size observed per
        sequence: current bytes x sequences / sequences held now, rounded up to a MiB."""
        if not kv_cache_memory_bytes or not sequences or not self.value or sequences <= self.value:
            return None
        return math.ceil(kv_cache_memory_bytes * sequences / self.value / (1 << 20)) * (1 << 20)

    @property
    def summary(self) -> str:
        """One clause for a message: how many sequences the KV cache holds, and how we know."""
        if self.method == "running-at-full":
            return f"which held {_n(self.value, 'running sequence')} when it was full"
        if self.method == "tokens-per-sequence":
            return (f"which holds about {_n(self.value, 'sequence')} of the length observed "
                    f"({self.tokens_per_sequence:,.0f} tokens each)")
        if self.method == "never-preempt-bound":
            return f"which holds {_n(self.value, 'sequence')} of max_model_len (the never-preempt bound)"
        return "whose size is unknown"

    @property
    def _blocks(self) -> str:
        return f" in whole blocks of {self.block_size} tokens" if self.block_size and self.block_size > 1 else ""

    @property
    def text(self) -> str:
        """The method in words, with the arithmetic (for a fix's ``arithmetic``)."""
        where = _where(self.sample)
        bound = ("" if self.never_preempt is None or self.method == "never-preempt-bound" else
                 f"; the never-preempt bound (every sequence at max_model_len) would be "
                 f"{self.kv_cache_tokens:,} / {self.max_model_len:,} = {self.never_preempt}{self._blocks}")
        if self.method == "running-at-full":
            return (f"{_n(self.running, 'sequence')} {'was' if self.running == 1 else 'were'} running when the KV "
                    f"cache was full ({self.usage_ratio:.1%}{where}){bound}")
        if self.method == "tokens-per-sequence":
            return (f"{self.kv_cache_tokens:,} KV cache tokens / {self.tokens_per_sequence:,.0f} tokens per running "
                    f"sequence observed ({self.usage_ratio:.1%} x {self.kv_cache_tokens:,} / {self.running} running"
                    f"{where}) = {self.value}{bound}")
        if self.method == "never-preempt-bound":
            return (f"never-preempt bound: {self.kv_cache_tokens:,} KV cache tokens / max_model_len "
                    f"{self.max_model_len:,} = {self.value}{self._blocks} (a worst case: it assumes every sequence grows to "
                    f"max_model_len; no busy interval was observed to size it from)")
        return "unknown"


    # ---- the --max-num-seqs fix --------------------------------------------------------------
    @property
    def admit(self) -> int | None:
        """The ``--max-num-seqs`` that removes preemption, below what ran under pressure (a value at
        or above what vLLM already ran is no fix): what the server ran in an interval without
        preemption where vLLM says so, or what the KV cache holds at the longest length a running
        sequence was seen to hold (that is the never-preempt bound only where requests really grow
        to max_model_len), the larger of the two; with nothing observed running, the never-preempt
        bound (assumed)."""
        return self._admit()[0]

    def _admit(self) -> tuple[int | None, str | None]:
        p = self.pressure_running
        if p is None:
            return self.never_preempt, None if self.never_preempt is None else "never-preempt-bound"
        # below what ran under pressure, and below the fewest vLLM was seen preempting at; or, below
        # what ran, at or under the never-preempt bound, where no sequence can be preempted: a
        # sample's running count is read at the end of its interval, after the preemptions that
        # shrank it (vLLM's /metrics at a 2 s step: 2 running where it preempted)
        cap = p if self.preempting_running is None else min(p, self.preempting_running)
        never = self.never_preempt

        def stops(v: int) -> bool:
            return v < cap or (never is not None and v <= never and v < p)

        below = [(v, m) for v, m in ((self.clean_running, "ran-without-preemption"),
                                     (self.longest_fit, "longest-observed")) if v is not None and stops(v)]
        if below:
            return max(below, key=lambda x: x[0])
        if never is not None and stops(never):
            return never, "below-preempting"
        return None, None

    @property
    def admit_method(self) -> str | None:
        """How :attr:`admit` was obtained: ``ran-without-preemption`` | ``longest-observed`` |
        ``below-preempting`` (the never-preempt bound, vLLM having preempted at every count the
        observations give) | ``never-preempt-bound`` (assumed: nothing was seen running)."""
        return self._admit()[1]

    @property
    def admit_stops(self) -> bool:
        """True when :attr:`admit` is at or below the never-preempt bound (no admitted sequence can
        be preempted, however long it grows), False when it only stops it at the lengths seen."""
        a = self.admit
        return a is not None and self.never_preempt is not None and a <= self.never_preempt

    @property
    def _pressure(self) -> str:
        if self.pressure_running is None:
            return "how many ran when vLLM preempted is not in the inputs"
        s = self.pressure_sample
        ratio = getattr(s, "kv_cache_usage_ratio", None)
        when = ("when the KV cache was full" if self.pressure_full else
                "when vLLM counted preemptions" if getattr(s, "preemptions", None) else "at the most seen")
        kv = f"{ratio:.1%}" if ratio is not None else "KV cache usage unknown"
        return f"{self.pressure_running} {'was' if self.pressure_running == 1 else 'were'} running {when} ({kv}{_where(s)})"

    @property
    def _ran(self) -> str:
        """What ran under pressure, as a clause: "4 ran with the KV cache full"."""
        s = self.pressure_sample
        how = ("with the KV cache full" if self.pressure_full else
               "while vLLM preempted" if getattr(s, "preemptions", None) else "at most")
        return f"{self.pressure_running} ran {how}"

    @property
    def _bound(self) -> str:
        """The never-preempt bound as a clause, with its blocks."""
        if self.never_preempt is None:
            return "the never-preempt bound is unknown (the KV cache size or max_model_len is not in the inputs)"
        blocks = ""
        if self.block_size and self.block_size > 1 and self.kv_cache_tokens and self.max_model_len:
            per = -(-int(self.max_model_len) // int(self.block_size))
            blocks = (f" ({int(self.kv_cache_tokens) // int(self.block_size):,} blocks of {self.block_size} "
                      f"tokens / {per:,} blocks per sequence)")
        return (f"never-preempt bound: {self.kv_cache_tokens:,} KV cache tokens / max_model_len "
                f"{self.max_model_len:,} = {self.never_preempt}{blocks}")

    @property
    def admit_why(self) -> str:
        """The reason for :attr:`admit`, in words (what it removes, and its cost)."""
        m = self.admit_method
        if m is None:
            return ""
        if m == "never-preempt-bound":
            return (f"Assumed: no running sequence can be preempted at {self.admit}, even if every one grows to "
                    f"max_model_len; no sample shows how long requests really grow, so this is the worst case.")
        if m == "ran-without-preemption":
            return (f"vLLM ran {self.admit} at once without preempting ({self._ran} and preempted); the rest "
                    f"wait in the queue instead of being preempted and recomputed.")
        if m == "below-preempting":
            return (f"No running sequence can be preempted: the KV cache holds {_n(self.admit, 'sequence')} even if every "
                    f"one grows to max_model_len, and vLLM preempted even with {self.preempting_running} running; "
                    f"the rest wait in the queue instead of being preempted and recomputed.")
        long = f"{self.longest_per_sequence:,.0f}"
        tail = (" even if every one grows to max_model_len" if self.admit_stops else
                f" at the longest length observed ({long} tokens a sequence); longer ones can still be preempted")
        return (f"The KV cache holds {_n(self.admit, 'sequence')}{tail} ({self._ran}); the rest wait in the "
                f"queue instead of being preempted and recomputed.")

    @property
    def admit_text(self) -> str:
        """The arithmetic of :attr:`admit`: the observation (or the bound), against what ran under pressure."""
        m = self.admit_method
        if m is None:
            return "unknown"
        if m == "never-preempt-bound":
            return f"{self._bound} (a worst case: nothing was seen running); {self._pressure}"
        if m == "below-preempting":
            return (f"{self._bound}; vLLM counted preemptions with {self.preempting_running} running "
                    f"({_where(self.preempting_sample).lstrip(', ')}); {self._pressure}")
        if m == "ran-without-preemption":
            s = self.clean_sample
            return (f"{self.clean_running} running with no preemption counted in the interval "
                    f"({_where(s).lstrip(', ')}); {self._pressure}")
        s = self.longest_sample
        bs = f", in whole blocks of {self.block_size} tokens" if self.block_size and self.block_size > 1 else ""
        bound = "" if self.never_preempt is None else f"; {self._bound}"
        return (f"{s.kv_cache_usage_ratio:.1%} x {self.kv_cache_tokens:,} KV cache tokens / {s.num_running:g} running = "
                f"{self.longest_per_sequence:,.0f} tokens per sequence at most ({_where(s).lstrip(', ')}); "
                f"{self.kv_cache_tokens:,} / {self.longest_per_sequence:,.0f} = {_n(self.admit, 'sequence')}{bs}"
                f"{bound}; {self._pressure}")


def _n(count: int | None, noun: str) -> str:
    """``1 sequence``, ``2 sequences`` (English plural: the noun's last word takes an s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _where(sample: Any) -> str:
    meta = getattr(sample, "meta", None)
    if meta is None:
        return ""
    eng = getattr(sample, "engine_index", None)
    who = f"engine {eng}, " if eng is not None else ""
    return f", {who}{meta.source}:{meta.lineno}" if meta.lineno else f", {who}{meta.source}"


def concurrency(stats: list, metrics: list, kv_cache_tokens: int | None, max_model_len: int | None,
                full_ratio: float, block_size: int | None = None) -> Concurrency:
    """See the module doc. ``stats`` are SchedulerStats lines (one per engine and interval),
    ``metrics`` /metrics samples (per engine where vLLM labels them); all of the same window.
    ``block_size``: tokens per KV cache block (sequences hold whole blocks); None: per token."""
    samples = [s for s in list(stats) + list(metrics)
               if s.kv_cache_usage_ratio is not None and s.num_running is not None and s.num_running >= 1]
    bs = int(block_size) if block_size else 1
    blocks = int(kv_cache_tokens) // bs if kv_cache_tokens else None
    never = None
    if blocks and max_model_len:
        never = max_num_seqs_that_fit(blocks, int(max_model_len), bs)
    common = dict(never_preempt=never, kv_cache_tokens=kv_cache_tokens, max_model_len=max_model_len,
                  block_size=block_size)
    full = [s for s in samples if s.kv_cache_usage_ratio >= full_ratio]
    counted = [s for s in list(stats) if getattr(s, "preemptions", None) and s.num_running is not None]
    full_ids = {id(s) for s in full}
    pressed = full + [s for s in counted if id(s) not in full_ids]
    seen_running = [s for s in list(stats) + list(metrics) if s.num_running is not None and s.num_running >= 1]
    top = max(pressed or seen_running, key=lambda x: x.num_running, default=None)
    common.update(pressure_running=None if top is None else int(top.num_running), pressure_sample=top,
                  pressure_full=id(top) in full_ids)
    if kv_cache_tokens and samples:
        lng = max(samples, key=lambda x: (x.kv_cache_usage_ratio / x.num_running, x.num_running))
        per = lng.kv_cache_usage_ratio * kv_cache_tokens / lng.num_running
        if per > 0:
            fit = max(1, concurrency_at_length(blocks, math.ceil(per), bs))
            common.update(longest_per_sequence=per, longest_sample=lng,
                          longest_fit=fit if never is None else max(fit, never))
    clean = [s for s in stats if getattr(s, "preemptions", None) == 0 and s.num_running is not None
             and s.num_running >= 1]
    if clean:
        cs = max(clean, key=lambda x: x.num_running)
        common.update(clean_running=int(cs.num_running), clean_sample=cs)
    if counted:
        ps = min(counted, key=lambda x: x.num_running)
        common.update(preempting_running=int(ps.num_running), preempting_sample=ps)
    if full:
        s = max(full, key=lambda x: (x.num_running, x.kv_cache_usage_ratio))
        return Concurrency(int(s.num_running), "running-at-full", int(s.num_running), s.kv_cache_usage_ratio,
                           sample=s, **common)
    busy = [s for s in samples if s.kv_cache_usage_ratio > 0]
    if busy and kv_cache_tokens:
        s = max(busy, key=lambda x: (x.kv_cache_usage_ratio, x.num_running))
        per_seq = s.kv_cache_usage_ratio * kv_cache_tokens / s.num_running
        value = max(1, concurrency_at_length(blocks, math.ceil(per_seq), bs))
        return Concurrency(value, "tokens-per-sequence", int(s.num_running), s.kv_cache_usage_ratio, per_seq,
                           sample=s, **common)
    if never is not None:
        return Concurrency(never, "never-preempt-bound", **common)
    return Concurrency(None, None, **common)


@dataclass(frozen=True)
class BalanceCriteria:
    """When one member of a group (a data-parallel engine of a server, a replica of a fleet) is
    saturated while another has room: the one test of data-parallel-imbalance (VD026),
    replica-imbalance and engine-imbalance (rules/thresholds.yaml names each figure).

    *Saturated*: the KV cache full (``kv_cache_full_ratio``) with requests waiting
    (``waiting_min``). *Room*: the KV cache clearly below full (under ``balance_room_kv_ratio``)
    and a queue an order of magnitude shorter than the saturated member's (at most
    ``balance_queue_ratio`` of it), or none. *Idle* (room with nothing running to speak of: no
    request waiting, KV cache under ``fleet_idle_kv_ratio``) only changes the words. Members all
    near full with similar queues are capacity, not imbalance: none of them has room."""

    full_ratio: float
    waiting_min: float
    room_ratio: float
    queue_ratio: float
    idle_ratio: float

    @classmethod
    def from_thresholds(cls, t: Mapping[str, float]) -> BalanceCriteria:
        return cls(t["kv_cache_full_ratio"], t["waiting_min"], t["balance_room_kv_ratio"], t["balance_queue_ratio"],
                   t["fleet_idle_kv_ratio"])

    def saturated(self, kv: float | None, waiting: float | None) -> bool:
        return kv is not None and kv >= self.full_ratio and (waiting or 0) >= self.waiting_min

    def spare_kv(self, kv: float | None) -> bool:
        """KV cache clearly below full."""
        return kv is None or kv < self.room_ratio

    def short_queue(self, waiting: float | None, hot_waiting: float) -> bool:
        """A queue an order of magnitude shorter than ``hot_waiting`` (the saturated member's), or none."""
        return (waiting or 0) <= self.queue_ratio * hot_waiting

    def room(self, kv: float | None, waiting: float | None, hot_waiting: float) -> bool:
        """Room beside a saturated member whose queue is ``hot_waiting``."""
        return self.spare_kv(kv) and self.short_queue(waiting, hot_waiting)

    def idle(self, kv: float | None, waiting: float | None) -> bool:
        return (waiting or 0) < self.waiting_min and (kv is None or kv < self.idle_ratio)


def room_text(kvs: list[float], waiting_max: float, idled: bool) -> str:
    """What the members with room had: ``idled (KV cache 0-1 %, no request waiting)`` or ``had
    room (KV cache 20-70 %, at most 2 waiting)``."""
    lo, hi = (round(100 * min(kvs)), round(100 * max(kvs))) if kvs else (None, None)
    kv = "" if lo is None else f"KV cache {lo} %, " if lo == hi else f"KV cache {lo}-{hi} %, "
    queue = "no request waiting" if waiting_max <= 0 else f"at most {waiting_max:,.0f} waiting"
    return f"{'idled' if idled else 'had room'} ({kv}{queue})"


@dataclass(frozen=True)
class EngineBalance:
    """How the data-parallel engines of one server compare over a window (:class:`BalanceCriteria`).
    hot: engines saturated in most of their samples; room: engines with room beside them in most
    of theirs (``idle``: those of them that idled); ``lines``: the newest sample of each hot and
    room engine (the evidence); ``peak``: engine -> (most running, most waiting, highest KV cache
    usage) over the window; ``room_kv`` / ``room_waiting``: the KV cache usage and the most waiting
    of the room engines' samples with room."""

    hot: list[int]
    room: list[int]
    lines: list
    peak: dict
    idle: list[int] = field(default_factory=list)
    room_kv: list[float] = field(default_factory=list)
    room_waiting: float = 0

    @property
    def imbalanced(self) -> bool:
        return bool(self.hot) and bool(self.room)

    def describe(self, engines: list[int]) -> str:
        """``engine 0 (200 running, 300 waiting, KV cache 100%)``, joined with "and"."""
        out = []
        for e in engines:
            r, w, kv = self.peak[e]
            out.append(f"engine {e} ({r:,} running, {w:,} waiting, KV cache {kv:.0%})")
        return " and ".join(out)

    def room_text(self) -> str:
        """``engines 2, 3, 4, 5, 6 and 7 had room (KV cache 20-70 %, at most 2 waiting)``."""
        names = [str(e) for e in self.room]
        who = f"engine {names[0]}" if len(names) == 1 else f"engines {', '.join(names[:-1])} and {names[-1]}"
        return f"{who} {room_text(self.room_kv, self.room_waiting, set(self.idle) == set(self.room))}"


def engine_balance(stats: list, metrics: list, criteria: BalanceCriteria) -> EngineBalance:
    """Compare the engines (``engine_index``: V1's "Engine 000" stats lines, /metrics' ``engine``
    label) of one window, from the first to the last sample in which an engine was saturated: see
    :class:`EngineBalance`. Fewer than two engines: nothing is hot or has room. The saturated
    engines' queue is the smallest median queue of a hot engine over its saturated samples: an
    engine with room has a queue an order of magnitude shorter than that."""
    per: dict[int, list] = {}
    for s in list(stats) + list(metrics):  # a /metrics sample without an engine label has no engine_index
        if (getattr(s, "engine_index", None) is not None and s.kv_cache_usage_ratio is not None
                and s.num_waiting is not None):
            per.setdefault(int(s.engine_index), []).append(s)
    if len(per) < 2:
        return EngineBalance([], [], [], {})
    c = criteria
    # judged over the stretch of the window in which an engine was saturated (its first to its last
    # saturated sample): as long as kv-capacity-bound sees saturated lines in its window, so does this
    tss = [x.meta.ts for ss in per.values() for x in ss
           if x.meta.ts is not None and c.saturated(x.kv_cache_usage_ratio, x.num_waiting)]
    if tss:
        lo, hi = min(tss), max(tss)
        per = {e: k for e, k in ((e, [x for x in ss if x.meta.ts is None or lo <= x.meta.ts <= hi])
                                 for e, ss in per.items()) if k}
    hot, lines, peak, queues = [], [], {}, []
    for e, ss in sorted(per.items()):
        peak[e] = (int(max(x.num_running or 0 for x in ss)), int(max(x.num_waiting for x in ss)),
                   max(x.kv_cache_usage_ratio for x in ss))
        sat = sorted(x.num_waiting for x in ss if c.saturated(x.kv_cache_usage_ratio, x.num_waiting))
        if sat and 2 * len(sat) >= len(ss):
            hot.append(e)
            lines.append(ss[-1])
            queues.append(sat[len(sat) // 2])
    room, idle, kvs, waiting = [], [], [], 0
    for e, ss in sorted(per.items()):
        if not hot or e in hot:
            continue
        ok = [x for x in ss if c.room(x.kv_cache_usage_ratio, x.num_waiting, min(queues))]
        if ok and 2 * len(ok) >= len(ss):
            room.append(e)
            lines.append(ss[-1])
            kvs += [x.kv_cache_usage_ratio for x in ok]
            waiting = max(waiting, max(x.num_waiting for x in ok))
            if 2 * sum(1 for x in ss if c.idle(x.kv_cache_usage_ratio, x.num_waiting)) >= len(ss):
                idle.append(e)
    return EngineBalance(hot, room, lines, peak, idle, kvs, waiting)


def relate_fixes(fixes: list[FlagFix], options: list[str | None]) -> None:
    """Number the options of one finding's fixes in place: ``options[i]`` names the option of
    ``fixes[i]`` (None: an option of its own). Sets ``option`` (1-based) and ``relation``:
    ``only`` (the one thing to do), ``alternative`` (one of several options: pick one),
    ``set`` (goes together with the other fixes of its option)."""
    numbers: dict[str, int] = {}
    for i, (fx, name) in enumerate(zip(fixes, options)):
        key = name or f"#{i}"
        if key not in numbers:
            numbers[key] = len(numbers) + 1
        fx.option = numbers[key]
    sizes: dict[int, int] = {}
    for fx in fixes:
        sizes[fx.option] = sizes.get(fx.option, 0) + 1
    for fx in fixes:
        fx.relation = "set" if sizes[fx.option] > 1 else ("alternative" if len(sizes) > 1 else "only")


def fix_label(fx: FlagFix, fixes: list[FlagFix]) -> str:
    """How ``fx`` relates to the other fixes of its finding, in words for a report: "" (the only
    thing to do), "option 1 of 2: pick one", "option 2 of 3, applied together", "apply together"."""
    total = len({f.option for f in fixes})
    if fx.relation == "alternative":
        return f"option {fx.option} of {total}: pick one"
    if fx.relation == "set":
        return f"option {fx.option} of {total}, applied together" if total > 1 else "apply together"
    return ""


def fix_tag(fx: FlagFix, fixes: list[FlagFix]) -> str:
    """:func:`fix_label` with the fix's evidence grade, as every report format shows it:
    "option 1 of 2: pick one; evidence: counted", "evidence: assumed"."""
    grade = getattr(fx, "grade", None)
    return "; ".join(x for x in (fix_label(fx, fixes), f"evidence: {grade}" if grade else "") if x)


def share_fixes(findings: list[Finding]) -> list[Finding]:
    """Copies of ``findings`` (in report order) where a fix that an earlier finding already gives
    (same command) appears once: the first keeps it, with ``also_for`` naming the others; a later
    finding drops it and says where it is, and its remaining options are numbered again (1..n, the
    relations recomputed: a single option left is the ``only`` thing to do)."""
    out = [copy.deepcopy(f) for f in findings]
    first: dict[str, tuple[Finding, FlagFix]] = {}
    for f in out:
        kept: list[FlagFix] = []
        for fx in f.fixes:
            key = fx.command()
            owner = first.get(key)
            if owner is None:
                first[key] = (f, fx)
                kept.append(fx)
            elif owner[0] is not f:
                o = owner[0]
                if o.rule_id == f.rule_id:  # an earlier occurrence of the same incident
                    f.notes.append(f"{key} also fixes this; it is listed under occurrence {o.occurrence} of this incident")
                else:
                    owner[1].also_for.append(f.name)
                    f.notes.append(f"{key} also fixes this; it is listed under {o.name} ({o.rule_id})")
            else:
                kept.append(fx)
        if len(kept) < len(f.fixes):  # what is left is numbered again: "option 2 of 2", never "option 4 of 2"
            relate_fixes(kept, [str(fx.option) for fx in kept])
        f.fixes = kept
    return out
