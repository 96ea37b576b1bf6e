"""``vllm-doctor watch LOG``: a live terminal view (rich) of a running vLLM.

It runs the same :class:`~vllm_doctor.export.serve.Sidecar` as ``serve`` (same sources, pipeline and
rules) without the HTTP server, and redraws every ``interval`` seconds: running, waiting
(and swapped on V0), KV cache usage, preemptions in the last interval and in total, TTFT
p50/p99 when /metrics is scraped, GPU memory and utilization, and the active findings with
their flag fixes.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from vllm_doctor.diagnosis.advice import fix_tag
from vllm_doctor.export.serve import ServeConfig, Sidecar, human_duration
from vllm_doctor.report.render import fix_command, fmt_span, fmt_time, live_verdict

GiB = float(1 << 30)


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "unknown"
    if pct:
        return f"{v * 100:.1f}%"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


class WatchView:
    """Builds one frame from a sidecar; remembers the preemption total between frames."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self._prev: tuple[float, int] | None = None

    def frame(self) -> Group:
        """The renderable of the current state (takes the sidecar's lock while reading)."""
        sc = self.sidecar
        with sc.lock:
            st = sc.pipeline.state
            facts = st.facts()
            stats = st.last_stats
            m = st.last_metrics if sc.metrics_live() else None
            preempt = st.preemptions_total if st.preemptions_reported else None
            inferred = bool(facts.get("preemptions_inferred"))
            gpus = [g for _, g in sorted(st.gpus.items())]
            clock = sc.clock_status()
            # the findings and fixes of the sidecar's page: the report's (a fix two findings share
            # listed once, options numbered); live: what is wrong now; an old log: all it shows
            rep = sc.pipeline.report()
            replay = clock["mode"] == "replay"
            active = [f for f in rep.findings if f.active or replay]
            v = live_verdict(rep, replay)
            model = st.config_value("model")
            version, engine = st.vllm_version, st.engine
            judged = sc.evaluations > 0
        now = time.monotonic()
        delta = None
        if self._prev is not None and preempt is not None:
            delta = (preempt - self._prev[1], now - self._prev[0])
        self._prev = (now, preempt) if preempt is not None else None

        def pick(mf: str, sf: str) -> Any:
            v = getattr(m, mf, None) if m is not None else None
            return v if v is not None else (getattr(stats, sf, None) if stats is not None else None)

        wall = time.time()
        log_at = clock.get("log_time")
        head = Text.assemble(("vllm-doctor watch", "bold"), "  vLLM ", version or "?",
                             f" ({engine})" if engine else "", f"  model {model}" if model else "",
                             "  ", (time.strftime("%H:%M:%S UTC", time.gmtime(wall)), "bold"),
                             f"  newest log line {fmt_time(log_at)} ({human_duration(clock['behind_seconds'] or 0.0)} "
                             "behind when read)" if log_at is not None else "  no log time yet")
        parts: list[Any] = []
        for s in sc.source_status():  # a missing or unreadable source first: what follows leaves it out
            if not s["up"]:
                parts.append(Text(f"{s['kind']} source {s['source']} is "
                                  f"{'missing' if s['detail'] == 'file not found' else 'down'}"
                                  + (f": {s['detail']}" if s["detail"] else "")
                                  + (f" (last data {human_duration(s['age_seconds'])} ago)" if s["age_seconds"] is not None
                                     else " (no data since start)"), style="bold red"))
        parts.append(head)
        vstyle = {"critical": "bold red", "warning": "bold yellow", "ok": "bold green"}.get(v["status"], "bold")
        verdict_text = Text(v["headline"] if judged else "judging the log read so far ...", style=vstyle)
        if judged and v["first"]:
            verdict_text.append(f"\n{v.get('first_label', 'Do this first')}: ", style="bold")
            verdict_text.append(v["first"])
        parts.append(verdict_text)
        ttft = sc.pipeline.state.signals.ttft_quantiles
        if preempt is None:
            pre = "unknown" + (", inferred from stats" if inferred else "")
        else:
            pre = f"{preempt}" + (f"  (+{delta[0]} in the last {delta[1]:.0f} s)" if delta else "")
        t = Table(show_header=False, box=None, padding=(0, 2))
        t.add_column(style="bold")
        t.add_column(justify="right")
        t.add_column(style="bold")
        t.add_column(justify="right")
        t.add_row("running", _fmt(pick("num_running", "num_running")),
                  "max_num_seqs", _fmt(facts.get("max_num_seqs")))
        t.add_row("waiting", _fmt(pick("num_waiting", "num_waiting")),
                  "max concurrency", _fmt(facts.get("max_concurrency")))
        t.add_row("swapped", "n/a on V1" if engine == "v1" else _fmt(pick("num_swapped", "num_swapped")),
                  "KV cache tokens", _fmt(facts.get("kv_cache_tokens")))
        t.add_row("KV cache usage", _fmt(pick("kv_cache_usage_ratio", "kv_cache_usage_ratio"), pct=True),
                  "TTFT p50 / p99",
                  f"{ttft['0.5']:.2f} s / {ttft['0.99']:.2f} s" if "0.5" in ttft and "0.99" in ttft else "-")
        t.add_row("preemptions", pre, "", "")
        parts.append(t)
        if gpus:
            g = Table(show_header=True, header_style="bold")
            for c in ("gpu", "model", "memory", "util", "power", "temp"):
                g.add_column(c, justify="right")
            for s in gpus:
                mem = ("-" if s.memory_used_bytes is None or not s.memory_total_bytes else
                       f"{s.memory_used_bytes / GiB:.1f}/{s.memory_total_bytes / GiB:.1f} GiB "
                       f"({s.memory_used_bytes / s.memory_total_bytes:.0%})")
                g.add_row(str(s.index), s.model, mem, _fmt(s.utilization_ratio, pct=True),
                          "-" if s.power_watts is None else f"{s.power_watts:.0f} W",
                          "-" if s.temperature_celsius is None else f"{s.temperature_celsius:.0f} C")
            parts.append(g)
        if active:
            for f in active:
                body = Text(f.message)
                for x in f.fixes:  # as the page lists them: the command, its relation, why, the arithmetic
                    label = fix_tag(x, f.fixes)
                    body.append(f"\n  {fix_command(x)}", style="bold")
                    body.append((f"  ({label})" if label else "") + f"\n      why: {x.why}")
                    if x.arithmetic:
                        body.append(f"\n      how: {x.arithmetic}", style="dim")
                for n in f.checks:
                    body.append(f"\n  check: {n}")
                style = {"critical": "red", "warning": "yellow"}.get(f.severity, "blue")
                over = "" if f.active else ", over before the log's end"
                when = ""
                if f.first_seen is not None:
                    end = f.last_seen if f.last_seen is not None else f.first_seen
                    when = f", {'since' if f.active else 'seen'} {fmt_span(f.first_seen, None if f.active else end)}" + (
                        f", {human_duration(end - f.first_seen)}" if end > f.first_seen else "")
                parts.append(Panel(body, title=Text(f"{f.rule_id} {f.name} ({f.severity}{over}{when})"),
                                   border_style=style, expand=False))
        elif judged:
            parts.append(Text("no finding" if clock["mode"] == "replay" else "no active finding", style="green"))
        if clock["mode"] == "replay":
            parts.append(Text(clock["message"], style="bold yellow"))
        src = ", ".join(f"{s['source']}: {s['status']}" + (" (replay/old log)" if s["kind"] == "log" and clock["mode"] == "replay" else "")
                        for s in sc.source_status())
        parts.append(Text(f"sources: {src}", style="dim"))
        return Group(*parts)


def watch(cfg: ServeConfig, *, interval: float = 2.0, once: bool = False,
          console: Console | None = None, nvml: Any = None) -> int:
    """Run the live view until SIGINT (Ctrl-C) or SIGTERM (or one frame with ``once``). Returns the
    exit code: 0 when stopped by either signal. With
    ``once`` a log that is missing, a directory or unreadable raises InputError (exit 2); live, a
    missing log is followed until it appears (its source shows as down)."""
    from rich.live import Live

    if once:  # one frame of logs none of which is there would read as a healthy server
        from vllm_doctor.errors import InputError
        from vllm_doctor.ingest.oneshot import check_readable

        unreadable: list[InputError] = []
        for path in cfg.logs:
            if path != "-":
                try:
                    check_readable(path)
                except InputError as e:
                    unreadable.append(e)
        if unreadable and len(unreadable) == len(cfg.logs):
            raise unreadable[0]  # some log is there: the frame says which are missing, at its top
    console = console or Console()
    sc = Sidecar(cfg, nvml=nvml)
    sc.start()
    view = WatchView(sc)
    try:
        if once:
            if sc.nvml is not None:
                sc.nvml.poll_once()
            if sc.hostmem is not None:  # one sample, so the frame does not call the source down
                sc.hostmem.poll()
            if sc.scraper is not None:
                sc.scraper.scrape_once()
            for s in sc.logs:  # a pipe: wait (bounded) for its end
                join = getattr(s.reader, "join", None)
                if join is not None:
                    join(10)
            sc.evaluate()
            console.print(view.frame())
            return 0
        sc.evaluate()  # the first frame judges what the first read brought (not "no active finding")
        stop = _stop_on_signals()
        if not console.is_terminal:   # a pipe or a file: Live would write nothing until it stops
            while not stop.is_set():
                sc.evaluate()
                console.print(view.frame())
                console.file.flush()
                stop.wait(interval)
            return 0
        with Live(view.frame(), console=console, refresh_per_second=4, transient=False) as live:
            while not stop.wait(interval):
                sc.evaluate()
                live.update(view.frame())
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _restore_signals()
        sc.stop()


_saved_handlers: dict[int, Any] = {}


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT. SIGINT's handler is installed even where the process
    inherited it as ignored (a background job of a script), where Python raises no
    KeyboardInterrupt: `kill -INT` and `kill` (SIGTERM) both stop the view cleanly. Off the main
    thread (signals cannot be caught there) only the event."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            _saved_handlers[sig] = signal.signal(sig, lambda *_: stop.set())
    return stop


def _restore_signals() -> None:
    while _saved_handlers:
        sig, handler = _saved_handlers.popitem()
        signal.signal(sig, handler)
