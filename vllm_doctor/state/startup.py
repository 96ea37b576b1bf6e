"""Engine start-ups seen in a log: when each began, its timed phases, when it served.

One :class:`Startup` per engine start (a version banner, the API server's version line or its
args echo; a mark seen twice begins the next start), fed by :class:`~vllm_doctor.events.StartupPhase`
(vLLM's own "... took X seconds" lines), ``ServerReady`` and the failures that end a start. Read by
the slow-startup and restart-loop rules (``startups()``), the report's start-up timeline and the
sidecar's ``vllm_doctor_startup_phase_seconds{phase}``. Bounded: the newest :data:`MAX_STARTS`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: Starts kept (the newest).
MAX_STARTS = 32
#: The phases in the order vLLM runs them, with the names the report shows.
PHASES = (("download", "weights download"), ("weights", "weights load"), ("model_load", "model load (weights + init)"),
          ("dynamo", "Dynamo bytecode transform"), ("compile", "torch.compile"), ("profile", "memory profiling / warm-up"),
          ("graph_capture", "CUDA graph capture"), ("init_engine", "engine init (profile, KV cache, warm-up)"))
PHASE_LABELS = dict(PHASES)
#: An engine-init echo within this many seconds of the start's other marks belongs to it
#: (data parallel: one echo per engine core).
SAME_START_SECONDS = 120.0


@dataclass
class Startup:
    """One engine start. started / ready / last: log times (epoch s, None when untimed); lineno:
    the line that began it; phases: phase -> seconds (the longest of the workers that logged it);
    failed: a failure (exception, engine death, OOM) was seen before it served."""

    started: float | None
    lineno: int
    source: str
    marks: set[str] = field(default_factory=set)
    phases: dict[str, float] = field(default_factory=dict)
    ready: float | None = None
    ready_lineno: int | None = None
    last: float | None = None
    failed: bool = False
    before_last: float | None = None  # ``last`` before the newest time seen (the line before it)

    @property
    def wall_seconds(self) -> float | None:
        """From the start's first line to the server ready (None until ready or when untimed)."""
        return _since(self.started, self.ready)

    @property
    def phase_seconds(self) -> float:
        """The phases' own total, each counted once: download + model load (or weights) + engine
        init (or, without it, compile + profiling + graph capture)."""
        p = self.phases
        load = p.get("model_load", p.get("weights", 0.0))
        init = p.get("init_engine")
        if init is None:
            init = p.get("compile", 0.0) + p.get("profile", 0.0) + p.get("graph_capture", 0.0)
        return p.get("download", 0.0) + load + init

    @property
    def seconds(self) -> float:
        """The start-up's duration: the wall time to ready where known, else the phases' total; never
        less than vLLM's own timings of its phases (a log, an excerpt or a sidecar started --from-end
        may begin inside the start: its first line is not the start's)."""
        w = self.wall_seconds
        return max(w, self.phase_seconds) if w is not None else self.phase_seconds

    @property
    def begins_inside(self) -> bool:
        """The log shows less of the start than vLLM's own phase timings: it begins inside it."""
        w = self.wall_seconds
        return w is not None and self.phase_seconds > w

    @property
    def elapsed_seconds(self) -> float | None:
        """From the start's first line to its last event (a start that never served)."""
        return _since(self.started, self.last)

    @property
    def dominant(self) -> tuple[str, float] | None:
        """The longest single step: download, load, compile (Dynamo + torch.compile), graph capture,
        or the rest of engine init (profiling and KV cache allocation)."""
        p = self.phases
        if not p:
            return None
        steps = {
            "download": p.get("download", 0.0),
            "load": p.get("model_load", p.get("weights", 0.0)),
            "compile": p.get("compile", 0.0) + (p.get("dynamo", 0.0) if "compile" not in p else 0.0),
            "graph_capture": p.get("graph_capture", 0.0),
        }
        if "init_engine" in p:
            steps["profile"] = max(0.0, p["init_engine"] - steps["compile"] - steps["graph_capture"])
        else:
            steps["profile"] = p.get("profile", 0.0)
        name = max(steps, key=lambda k: steps[k])
        return (name, steps[name]) if steps[name] > 0 else None

    @property
    def dominant_step(self) -> str | None:
        dom = self.dominant
        return dom[0] if dom else None

    @property
    def dominant_seconds(self) -> float:
        dom = self.dominant
        return dom[1] if dom else 0.0

    @property
    def summary(self) -> str:
        """The timeline as one line: "weights load 118 s, torch.compile 45 s, ... ready after 212 s"."""
        parts = [f"{PHASE_LABELS[k]} {_secs(self.phases[k])}" for k, _ in PHASES if k in self.phases]
        if self.wall_seconds is not None:
            parts.append(f"ready after {'at least ' if self.begins_inside else ''}{_secs(self.seconds)}")
        elif self.ready is not None:
            parts.append("ready")
        return ", ".join(parts) if parts else "no timed phase logged"

    def to_dict(self) -> dict:
        dom = self.dominant
        return {
            "started": self.started, "lineno": self.lineno, "source": self.source, "ready": self.ready,
            "ready_lineno": self.ready_lineno, "wall_seconds": self.wall_seconds,
            "phase_seconds": round(self.phase_seconds, 3), "seconds": round(self.seconds, 3),
            "failed": self.failed, "served": self.ready is not None, "begins_inside": self.begins_inside,
            "phases": [{"phase": k, "label": PHASE_LABELS[k], "seconds": self.phases[k]} for k, _ in PHASES if k in self.phases],
            "dominant": dom[0] if dom else None,
        }


class Startups:
    """The starts of one deployment's log(s), newest last (bounded)."""

    def __init__(self) -> None:
        self.items: deque[Startup] = deque(maxlen=MAX_STARTS)
        self.total = 0  # starts seen, including those that fell out of the deque

    @property
    def current(self) -> Startup | None:
        return self.items[-1] if self.items else None

    def _begin(self, meta) -> Startup:
        s = Startup(meta.ts, meta.lineno, meta.source, last=meta.ts)
        self.items.append(s)
        self.total += 1
        return s

    def mark(self, meta, mark: str) -> None:
        """A start's mark: "api" (API server version line), "banner" (the ASCII banner), "args"
        (the args echo), "init" (the engine-init echo). A mark the current start already has, or
        any mark after it served or failed, begins a new start; engine-init echoes within
        :data:`SAME_START_SECONDS` of a start under way are its engines (data parallel)."""
        cur = self.current
        if cur is not None and mark == "init" and cur.ready is None and not cur.failed:
            if cur.started is None or meta.ts is None or meta.ts - cur.started <= SAME_START_SECONDS:
                cur.marks.add(mark)  # an engine core's echo of the start under way (one per DP engine)
                return
        if cur is None or mark in cur.marks or cur.ready is not None or cur.failed:
            cur = self._begin(meta)
        cur.marks.add(mark)

    def phase(self, e) -> None:
        cur = self.current
        if cur is None or cur.ready is not None:
            cur = self._begin(e.meta)  # timings without a start line (a cut log), or a restart without a banner
            cur.marks.add("phase")
        old = cur.phases.get(e.phase)
        if old is None or e.seconds > old:
            cur.phases[e.phase] = e.seconds

    def ready(self, meta, inferred: bool = False) -> None:
        """The current start served. ``inferred`` (the first stats line, no ready line): ready by
        the start's last line before it at the earliest we know, not at the stats line, which
        vLLM V1 prints only once load comes (minutes or hours later)."""
        cur = self.current
        if cur is not None and cur.ready is None:
            at = cur.before_last if inferred and cur.before_last is not None else meta.ts
            cur.ready = at if at is not None else cur.last
            cur.ready_lineno = meta.lineno

    def failed(self) -> None:
        cur = self.current
        if cur is not None and cur.ready is None:
            cur.failed = True

    def seen(self, ts: float | None) -> None:
        cur = self.current
        if cur is not None and ts is not None and (cur.last is None or ts > cur.last):
            cur.before_last, cur.last = cur.last, ts


def _since(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


def _secs(v: float) -> str:
    return f"{v:.1f} s" if v < 10 else f"{v:.0f} s"
