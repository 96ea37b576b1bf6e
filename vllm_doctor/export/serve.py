"""``vllm-doctor serve``: the sidecar. Configuration, wiring of the sources to the pipeline, the
evaluation loop, the HTTP server and a clean shutdown.

Wiring (one lock around the pipeline; every source thread takes it to hand data over)::

    LogFollower(s) / PipeFollower --bytes--> Pipeline.feed / Pipeline.end
    MetricsScraper  --VllmMetricsSample-->  Pipeline.observe
    NvmlPoller      --GpuSample-------->    Pipeline.observe
    evaluation thread: Pipeline.evaluate(now) every ``eval_interval`` s; checkpoint every
    ``checkpoint_interval`` s and at shutdown
    HTTP (FastAPI + uvicorn): /metrics (SidecarCollector), /healthz, /readyz, /api/findings,
    /api/state, /  (see :mod:`vllm_doctor.export.server`)

Configuration precedence: command-line flags > ``VLLM_DOCTOR_*`` environment variables > the
YAML file (``--config`` / ``VLLM_DOCTOR_CONFIG``) > defaults. See docs/serve.md.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vllm_doctor.errors import VllmDoctorError
from vllm_doctor.ingest.follow import (
    FifoFollower,
    FollowStats,
    FollowThread,
    LogFollower,
    PipeFollower,
    is_fifo,
    load_checkpoints,
    save_checkpoints,
)
from vllm_doctor.ingest.hostmem import HostMemoryPoller
from vllm_doctor.ingest.nvml import NvmlPoller
from vllm_doctor.ingest.scrape import MetricsScraper
from vllm_doctor.units import human_duration

log = logging.getLogger(__name__)

DEFAULT_METRICS_URL = "http://127.0.0.1:8000/metrics"
#: Rule categories that judge the load (requests running, waiting, preempted): their findings are
#: over when the log shows nothing running nor waiting after their evidence (Sidecar._clear_on_log_clock).
LOAD_CATEGORIES = frozenset({"kv-cache", "latency", "scheduling"})
ENV_PREFIX = "VLLM_DOCTOR_"


class ConfigError(VllmDoctorError):
    """An invalid serve configuration (bad value, unreadable config file); exit code 2."""


class ServeConfig(BaseModel):
    """The sidecar's settings. Durations in seconds.

    logs: files to follow ("-" = stdin); metrics_url: vLLM's /metrics or None (off);
    nvml: poll NVML; host/port: where to serve; from_start: read files present at start from
    their beginning; state_file: offset checkpoint; rules: extra rule directories.
    """

    model_config = ConfigDict(extra="forbid")

    logs: list[str] = Field(default_factory=list)
    metrics_url: str | None = DEFAULT_METRICS_URL
    nvml: bool = True
    host: str = "0.0.0.0"
    port: int = Field(default=9401, ge=0, le=65535)
    from_start: bool = False
    state_file: str | None = None
    rules: list[str] = Field(default_factory=list)
    eval_interval: float = Field(default=5.0, gt=0)
    scrape_interval: float = Field(default=5.0, gt=0)
    scrape_max_bytes: int = Field(default=16 << 20, gt=0)  # one /metrics answer, decompressed
    scrape_deadline: float = Field(default=10.0, gt=0)  # one /metrics answer, from request to its last byte
    nvml_interval: float = Field(default=5.0, gt=0)
    host_memory: bool = True  # sample the container's cgroup memory (else /proc/meminfo): VD019
    host_memory_interval: float = Field(default=15.0, gt=0)
    host_memory_root: str = "/"  # where sys/fs/cgroup and proc are (tests: a stand-in tree)
    poll_interval: float = Field(default=1.0, gt=0)
    checkpoint_interval: float = Field(default=1.0, gt=0)
    start_wait: float = Field(default=2.0, ge=0)
    stale_after: float = Field(default=120.0, gt=0)
    ttft_window: float = Field(default=300.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    bench: str | None = None  # a `bench ladder` result: findings name the level where they began

    @field_validator("metrics_url", mode="before")
    @classmethod
    def _none_turns_off(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "off", "false")):
            return None
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("logs", "rules", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [p.strip() for p in v.split(",") if p.strip()]
        if isinstance(v, list):
            v = list(dict.fromkeys(str(x) for x in v))  # the same file twice is one source
        return v


_BOOL = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
         "off": False}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, f in ServeConfig.model_fields.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None and name == "logs":
            raw = env.get(ENV_PREFIX + "LOG")
        if raw is None:
            continue
        if f.annotation is bool:
            if raw.strip().lower() not in _BOOL:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r}: expected true or false")
            out[name] = _BOOL[raw.strip().lower()]
        else:
            out[name] = raw
    return out


def _from_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config file must be a mapping of settings")
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    if "log" in out and "logs" not in out:
        out["logs"] = out.pop("log")
    return out


def load_config(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                config_file: str | os.PathLike[str] | None = None) -> ServeConfig:
    """Merge the sources of configuration: ``flags`` (only those given on the command line; None
    values are ignored) > ``env`` (``VLLM_DOCTOR_*``, default os.environ) > the YAML file
    (``config_file`` or ``VLLM_DOCTOR_CONFIG``) > defaults. Raises ConfigError."""
    env = os.environ if env is None else env
    config_file = config_file or env.get(ENV_PREFIX + "CONFIG")
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(_from_file(config_file))
    merged.update(_from_env(env))
    merged.update({k: v for k, v in (flags or {}).items() if v is not None and v != []})
    try:
        return ServeConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        given = first.get("input")
        given = f"={given!r}" if isinstance(given, (str, int, float)) else ""
        raise ConfigError(f"invalid setting {where}{given}: {first['msg']}") from None


@dataclass
class LogSource:
    """One followed log: ``name`` is the source name in the pipeline and in metric labels (the
    path as configured); ``reader`` a LogFollower or PipeFollower."""

    name: str
    reader: LogFollower | PipeFollower | FifoFollower

    @property
    def stats(self) -> FollowStats:
        """The reader's counters (bytes, rotations, truncations, up, last data time)."""
        return self.reader.stats


#: Seconds a followed log stays quiet before a traceback it ends inside counts as complete (its
#: exception line cut off: a crash that took the writer down with it, a truncated copy).
TRACEBACK_QUIET_SECONDS = 5.0


class Sidecar:
    """The running sidecar without its HTTP server (``watch`` uses it as is).

    pipeline: a :class:`vllm_doctor.pipeline.Pipeline` (built from the config's rules unless
    given); nvml: an NVML module stand-in for tests (default: pynvml).
    Thread-safety: every access to the pipeline holds :attr:`lock`.
    """

    def __init__(self, cfg: ServeConfig, *, pipeline: Any = None, nvml: Any = None,
                 stdin_fd: int = 0) -> None:
        from vllm_doctor.pipeline import Pipeline, SidecarTime

        self.cfg = cfg
        self.lock = threading.RLock()
        self.rule_load_error: str | None = None
        self._feed_on_log: bool | None = None  # the clock of the feed in progress (fixed for it)
        self.log_behind: float | None = None  # how far the newest log time trailed the wall clock when read
        if pipeline is None:
            pipeline = Pipeline(self._load_rules(cfg.rules), clock=SidecarTime(self._on_log_clock),
                                base_year=time.gmtime().tm_year)
        self.pipeline = pipeline
        from vllm_doctor.state.signals import Signals

        self.pipeline.state.signals = Signals(cfg.ttft_window)  # before any sample: the window is a setting
        self.pipeline_errors = 0
        self.bench_result = None
        if cfg.bench:
            from vllm_doctor.loadtest.annotate import BenchFileError, load_ladder

            try:
                self.bench_result = load_ladder(cfg.bench)
            except BenchFileError as e:
                raise ConfigError(f"--bench {e}") from None
        self.started_at: float | None = None
        self.last_eval_at: float | None = None
        self.evaluations = 0
        self.eval_seconds_total = 0.0
        self.last_eval_seconds: float | None = None
        self._stop = threading.Event()
        self._eval_thread: threading.Thread | None = None
        from vllm_doctor.ingest.statefile import read_state_file

        saved, self.state_file_error = read_state_file(cfg.state_file)
        if self.state_file_error:
            log.warning("%s", self.state_file_error)
        checkpoints = load_checkpoints(cfg.state_file)
        resumed = any(os.path.abspath(p) in checkpoints for p in cfg.logs if p != "-")
        if resumed and saved is not None:
            # resuming mid-file: the start-up lines (sticky facts) were read by the previous run, and
            # the counters correspond to the checkpointed offsets (written together with them)
            self.pipeline.restore(saved.snapshot)
        self._bytes_checkpointed = -1
        self._last_ck = 0.0
        self.logs: list[LogSource] = []
        for path in cfg.logs:
            if path == "-":
                r: LogFollower | PipeFollower | FifoFollower = PipeFollower(
                    stdin_fd, self._on_data("-"), self._on_end("-"), lock=self.lock)
            elif is_fifo(path):
                r = FifoFollower(path, self._on_data(path), self._on_end(path), lock=self.lock)
            else:
                ck = checkpoints.get(os.path.abspath(path))
                r = LogFollower(path, self._on_data(path), self._on_end(path),
                                from_start=cfg.from_start, checkpoint=ck)
            self.logs.append(LogSource(path, r))
        files = [s.reader for s in self.logs if isinstance(s.reader, LogFollower)]
        self.clock_offset = 0.0
        self.clock_sync_gap = 5.0
        self._clock_seen: Any = None
        self._clock_candidate: tuple[float, float] | None = None  # (offset, wall time seen)
        self._log_ts_seen: float | None = None  # the newest log time read
        self.follow_thread = (FollowThread(files, self.lock, poll_interval=cfg.poll_interval,
                                           after_poll=self._after_poll, first_round=self._first_round)
                              if files else None)
        self.scraper = (MetricsScraper(cfg.metrics_url, self._observe, interval=cfg.scrape_interval,
                                       max_bytes=cfg.scrape_max_bytes, deadline=cfg.scrape_deadline,
                                       clock=self.now)
                        if cfg.metrics_url else None)
        self.nvml = (NvmlPoller(self._observe, interval=cfg.nvml_interval, nvml=nvml, clock=self.now)
                     if cfg.nvml else None)
        self.hostmem = (HostMemoryPoller(self._observe, interval=cfg.host_memory_interval,
                                         root=cfg.host_memory_root, clock=self.now)
                        if cfg.host_memory else None)

    # -- the log's clock ----------------------------------------------------------------------------

    def now(self) -> float:
        """Wall-clock time on the log's clock (epoch seconds): collector samples and rule
        evaluation use it, so that windows compare like with like. On an old or replayed log
        (:meth:`replaying`) it is the newest log time: the rules judge the log as ``diagnose``
        does, instead of finding nothing in windows that end hours after the data."""
        if self.replaying():
            return float(self._log_ts_seen)  # type: ignore[arg-type]
        return time.time() + self.clock_offset

    def replaying(self) -> bool:
        """True when the newest log line read was already more than ``stale_after`` seconds old
        (on the log's clock) when it was read: an old log, or one replayed from its start. A
        live log that has gone quiet is not replaying (its lines were fresh when read)."""
        return self.log_behind is not None and self.log_behind > self.cfg.stale_after

    def _track_log_time(self) -> None:
        """Note how far behind the wall clock the newest log time was when it was read."""
        with self.lock:
            lts = self.pipeline.state.timeline.log_ts
        if lts is not None and lts != self._log_ts_seen:
            self._log_ts_seen = lts
            self.log_behind = time.time() + self.clock_offset - lts

    def _on_log_clock(self) -> bool:
        """The pipeline's clock (:class:`~vllm_doctor.pipeline.SidecarTime`) asks: while an old log
        is read (and for the first data, until its age is known), the pipeline judges it as
        ``diagnose`` does: the rules run every few seconds of log time as the lines go by, so an
        incident early in a long old log is found, not only what the last window shows. A live
        log is judged on the evaluation timer. Decided once per feed, when it starts."""
        return self.replaying() if self._feed_on_log is None else self._feed_on_log

    def clock_status(self) -> dict[str, Any]:
        """Which clock the rules run on: ``mode`` live | replay | no-log-time, ``log_time`` (the
        newest log time, epoch s), ``behind_seconds`` (how old it was when read) and a one-line
        ``message`` for the page and ``watch``."""
        self._track_log_time()
        if self._log_ts_seen is None:
            return {"mode": "no-log-time", "log_time": None, "behind_seconds": None,
                    "message": ("no timestamped log line yet" if self.logs else "no log followed")
                    + ": evaluated on the wall clock"}
        behind = round(self.log_behind or 0.0, 3)
        if self.replaying():
            return {"mode": "replay", "log_time": self._log_ts_seen, "behind_seconds": behind,
                    "message": f"log time {human_duration(behind)} behind wall clock: replay/old log, "
                               "evaluated on the log's clock"}
        return {"mode": "live", "log_time": self._log_ts_seen, "behind_seconds": behind,
                "message": "live log: evaluated on the wall clock"
                           + (f" ({self.clock_offset / 3600:+.2f} h, vLLM's TZ)" if self.clock_offset else "")}

    def _sync_clock(self) -> None:
        """Learn the offset of the log's clock from the wall clock.

        vLLM prints local time without a zone and the envelope reads it as UTC, so a vLLM run
        with TZ=Europe/Paris logs two hours "ahead". When two stats lines that arrived live (at
        least ``clock_sync_gap`` s apart: a backlog arrives in one burst) agree on the offset,
        rounded to the 15 minutes time zones come in, and it is within a time zone's reach
        (14 h), the offset is adopted. With TZ=UTC it stays 0.
        """
        self._track_log_time()
        with self.lock:
            ls = self.pipeline.state.last_stats
        if ls is None or ls is self._clock_seen or ls.meta.ts is None:
            return
        self._clock_seen = ls
        wall = time.time()
        offset = round((ls.meta.ts - wall) / 900.0) * 900.0
        if abs(offset) > 14 * 3600:
            self._clock_candidate = None
            return
        cand = self._clock_candidate
        if cand is not None and cand[0] == offset and wall - cand[1] >= self.clock_sync_gap:
            if offset != self.clock_offset:
                log.info("the log's clock is %+.2f h from UTC (vLLM's TZ); windows use it", offset / 3600)
                self.clock_offset = offset
        elif cand is None or cand[0] != offset:
            self._clock_candidate = (offset, wall)

    # -- rules ----------------------------------------------------------------------------------

    def _load_rules(self, dirs: list[str]) -> Any:
        """The rules; a bad user rule directory degrades to the built-in rules (reported on
        /healthz and /api/findings) instead of stopping the sidecar."""
        from vllm_doctor.diagnosis.loader import load_rules
        from vllm_doctor.errors import RuleLoadError

        try:
            return load_rules(extra_dirs=[Path(d) for d in dirs])
        except RuleLoadError as exc:
            if not dirs:
                raise
            self.rule_load_error = str(exc)
            log.error("rules: %s; running the built-in rules only", exc)
            return load_rules()

    # -- callbacks (called with self.lock held) ---------------------------------------------------

    def _on_data(self, name: str):
        def on_data(data: bytes) -> None:
            self._feed_on_log = self.log_behind is None or self.replaying()
            try:
                self.pipeline.feed(name, data)
            except Exception:  # noqa: BLE001 - the sidecar never dies on input
                self._pipeline_failed(name)
            finally:
                self._feed_on_log = None
            self._track_log_time()
        return on_data

    def _on_end(self, name: str):
        def on_end() -> None:
            try:
                self.pipeline.end(name)
                reset = getattr(self.pipeline, "reset_source", None)
                if reset is not None:
                    reset(name)
            except Exception:  # noqa: BLE001
                self._pipeline_failed(name)
        return on_end

    def _observe(self, event: Any) -> None:
        with self.lock:
            try:
                self.pipeline.observe(event)
            except Exception:  # noqa: BLE001
                self._pipeline_failed(type(event).__name__)

    def _pipeline_failed(self, what: str) -> None:
        self.pipeline_errors += 1
        if self.pipeline_errors <= 10 or self.pipeline_errors % 1000 == 0:
            log.exception("pipeline failed on input from %s (%d so far); skipped", what,
                          self.pipeline_errors)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every configured source and the evaluation loop. The first read of the log
        files runs in the follow thread (a stalled file system or a FIFO never blocks start-up
        or /healthz): each file is opened where reading starts ("from the end" means the end at
        start), a checkpoint is written, then the first poll reads; ``start`` waits for that
        first round at most ``start_wait`` seconds."""
        self.started_at = time.monotonic()
        for s in self.logs:
            if isinstance(s.reader, PipeFollower):
                s.reader.start()
        if self.follow_thread is not None:
            self.follow_thread.start()
            self.follow_thread.first_round_done.wait(self.cfg.start_wait)
        if self.scraper is not None:
            self.scraper.start()
        if self.nvml is not None:
            self.nvml.start()
        if self.hostmem is not None:
            self.hostmem.start()
        self._eval_thread = threading.Thread(target=self._eval_loop, name="vllm-doctor-eval", daemon=True)
        self._eval_thread.start()
        log.info("vllm-doctor sidecar started: logs=%s metrics=%s nvml=%s", [s.name for s in self.logs],
                 self.cfg.metrics_url, self.cfg.nvml)

    def stop(self) -> None:
        """Stop every thread, read what is left, evaluate once more and write the checkpoint.
        Idempotent (a second call does nothing: it must not overwrite the checkpoint)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.follow_thread is not None:
            self.follow_thread.stop()
        for s in self.logs:
            if isinstance(s.reader, FifoFollower):
                s.reader.stop()
        if self.scraper is not None:
            self.scraper.stop()
        if self.nvml is not None:
            self.nvml.stop()
        if self.hostmem is not None:
            self.hostmem.stop()
        if self._eval_thread is not None:
            self._eval_thread.join(10)
        with self.lock:
            for s in self.logs:
                if isinstance(s.reader, LogFollower):
                    s.reader.poll()
            self.evaluate()
            self.save_checkpoint()
            for s in self.logs:
                if isinstance(s.reader, LogFollower):
                    s.reader.close()
        log.info("vllm-doctor sidecar stopped")

    def evaluate(self) -> list:
        """Run the rules now (see :meth:`now` for the clock); never raises (a failure is logged
        and counted)."""
        self._track_log_time()
        with self.lock:
            t0 = time.perf_counter()
            try:
                now = self.now()
                if self.replaying():  # the log's clock, even after evaluations on the wall clock
                    self.pipeline.state.now = now
                    # an old log: no one writes to it any more, so a traceback it ends inside is over
                    self.pipeline.end_tracebacks()
                else:  # Python writes a traceback at once: one still open after a quiet spell is over
                    quiet = [s.name for s in self.logs if s.stats.last_data_at is not None
                             and time.monotonic() - s.stats.last_data_at >= TRACEBACK_QUIET_SECONDS]
                    if quiet:
                        self.pipeline.end_tracebacks(quiet)
                out = self.pipeline.evaluate(now)
                if not self.replaying():
                    out = self.pipeline.active = self._clear_on_log_clock(out)
            except Exception:  # noqa: BLE001
                self._pipeline_failed("rules")
                return []
            self.last_eval_seconds = time.perf_counter() - t0
            self.eval_seconds_total += self.last_eval_seconds
            self.last_eval_at = time.monotonic()
            self.evaluations += 1
            if self.bench_result is not None:
                from vllm_doctor.loadtest.annotate import annotate

                annotate(out, self.bench_result)
            return out

    def _clear_on_log_clock(self, active: list) -> list:
        """Findings about the load (LOAD_CATEGORIES: KV cache, latency, scheduling) are over when
        the log shows the load stopped after their last evidence: the newest stats line of every
        engine (or the newest /metrics sample) has no request running or waiting. Live, the rules
        judge a window on the wall clock, which still holds the busy lines for minutes after the
        load stopped; the log's own lines say it is over. Such a finding is cleared (for every
        sink: the page, /api/findings, vllm_doctor_finding_active) and its last seen is its last
        evidence line, on the log's clock. The occurrence continues if the load comes back."""
        st = self.pipeline.state
        latest = [x for x in st.last_stats_by_engine.values() if x.meta.ts is not None]
        m = st.last_metrics
        if m is not None and m.meta.ts is not None and m.num_running is not None and (
                not latest or m.meta.ts > max(x.meta.ts for x in latest)):
            latest = [m]
        if not latest or any((x.num_running or 0) > 0 or (x.num_waiting or 0) > 0 for x in latest):
            return active
        quiet_since = min(x.meta.ts for x in latest)
        keep = []
        for f in active:
            rule = self.pipeline.engine.ruleset.by_key(f.rule_id)
            seen = [e.ts for e in f.evidence if e.ts is not None]
            if rule is not None and rule.category in LOAD_CATEGORIES and seen and max(seen) < quiet_since:
                f.active = False
                f.last_seen = max(seen)
            else:
                keep.append(f)
        return keep

    def _first_round(self) -> None:
        """In the follow thread: open each file where reading starts, checkpoint that point
        (before any line is read: a kill before the next checkpoint resumes exactly here), then
        read."""
        files = [s.reader for s in self.logs if isinstance(s.reader, LogFollower)]
        with self.lock:
            for f in files:
                f.prepare()
            self.save_checkpoint()
            for f in files:
                f.poll()
        self._after_poll()

    def _after_poll(self) -> None:
        self._sync_clock()
        read = sum(s.stats.bytes_read for s in self.logs if isinstance(s.reader, LogFollower))
        now = time.monotonic()
        if read != self._bytes_checkpointed and now - self._last_ck >= self.cfg.checkpoint_interval:
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Write the offsets of the followed files and the state they correspond to (the
        counters: preemptions, OOMs, lines; the sticky facts) to ``state_file``, together and
        atomically (temp file, fsync, rename; under the pipeline lock, so no line is half
        counted): a restart resumes both, so a ``kill -9`` at any moment neither loses nor
        double-counts (see docs/serve.md)."""
        if not self.cfg.state_file:
            return
        files = [s.reader for s in self.logs if isinstance(s.reader, LogFollower)]
        with self.lock:
            extra = self.pipeline.snapshot().model_dump(mode="json")  # {"state": ..., "sources": ...}
            try:
                save_checkpoints(self.cfg.state_file, files, extra=extra)
            except OSError as exc:
                log.warning("cannot write state file %s: %s", self.cfg.state_file, exc)
                return
            self._bytes_checkpointed = sum(f.stats.bytes_read for f in files)
            self._last_ck = time.monotonic()

    def _eval_loop(self) -> None:
        while not self._stop.wait(self.cfg.eval_interval):
            self._sync_clock()  # also for a pipe, which has no follow thread
            self.evaluate()
            if time.monotonic() - self._last_ck >= self.cfg.checkpoint_interval:
                self.save_checkpoint()

    # -- status -----------------------------------------------------------------------------------

    def log_sources(self) -> list[LogSource]:
        """The configured logs."""
        return list(self.logs)

    def metrics_live(self) -> bool:
        """True while the last /metrics scrape succeeded."""
        return self.scraper is not None and self.scraper.stats.up

    def source_status(self) -> list[dict[str, Any]]:
        """Each configured source: ``source`` (label value), ``kind`` (log|metrics|nvml), ``up``,
        ``status`` (live | stale: up but nothing new for ``stale_after`` s | down),
        ``age_seconds`` since its last data (None before any) and ``detail``."""
        now = time.monotonic()
        out = []

        def entry(source: str, kind: str, up: bool, last: float | None, detail: str | None) -> None:
            ref = last if last is not None else self.started_at
            age = None if last is None else round(now - last, 3)
            stale = ref is not None and now - ref > self.cfg.stale_after
            out.append({"source": source, "kind": kind, "up": bool(up),
                        "status": "down" if not up else ("stale" if stale else "live"),
                        "age_seconds": age, "detail": detail})

        for s in self.logs:
            st = s.stats
            entry(s.name, "log", st.up, st.last_data_at, st.last_error or (
                None if st.up else ("end of input" if s.name == "-" else "file not found")))
        if self.scraper is not None:
            st2 = self.scraper.stats
            entry("metrics", "metrics", st2.up, st2.last_ok_at, st2.last_error)
        if self.nvml is not None:
            st3 = self.nvml.stats
            entry("nvml", "nvml", st3.up, st3.last_ok_at, st3.last_error)
        if self.hostmem is not None:
            st4 = self.hostmem.stats
            entry("host", "host", st4.up, st4.last_ok_at, st4.last_error)
        return out

    def ready(self) -> tuple[bool, list[dict[str, Any]]]:
        """(ready, sources): ready from start until stop. A source that is down does not make
        the sidecar unready: it still answers scrapes (reporting the source down), and in a pod
        an unready sidecar would take vLLM itself out of its Service."""
        return self.started_at is not None and not self._stop.is_set(), self.source_status()


#: glibc malloc: blocks up to this size come from the heap (not a mapping of their own), and up to
#: MALLOC_KEEP_BYTES freed at its top stay there, instead of going back to the kernel.
MALLOC_HEAP_BLOCK_BYTES = 4 << 20
MALLOC_KEEP_BYTES = 8 << 20


def keep_freed_memory() -> bool:
    """Tune glibc's malloc (``mallopt``) for the sidecar's steady flow of large buffers (each read
    of the log and its pieces: up to 1 MiB): they are taken from the heap and freed memory stays
    in it, up to :data:`MALLOC_KEEP_BYTES` (RSS that much higher at most), instead of being mapped
    and unmapped again, each page faulted in anew: 2,400 page faults a second at 10 MB/s of log,
    60 after. False where the C library has no ``mallopt`` (musl, macOS): nothing is changed."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MALLOC_HEAP_BLOCK_BYTES)) and bool(mallopt(m_trim_threshold, MALLOC_KEEP_BYTES))


#: Seconds between the HTTP server's housekeeping wake-ups (uvicorn's own loop wakes every 0.1 s).
SERVER_TICK_SECONDS = 1.0


def _server(config: Any) -> Any:
    """A uvicorn server whose housekeeping loop (it notices a stop signal and refreshes the Date
    header) wakes every :data:`SERVER_TICK_SECONDS` instead of ten times a second: the sidecar
    idles between scrapes, and a stop is noticed within a second. Requests are served as soon as
    they arrive either way (the event loop waits on the sockets, not on this loop)."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def main_loop(self) -> None:
            counter = 0
            while not await self.on_tick(counter):  # True once a stop was asked for
                await asyncio.sleep(SERVER_TICK_SECONDS)
                counter = (counter + 10) % 864000  # on_tick's once-a-second work runs on multiples of 10

    return Server(config) if hasattr(uvicorn.Server, "on_tick") else uvicorn.Server(config)


def run(cfg: ServeConfig) -> int:
    """Serve until SIGTERM / SIGINT (uvicorn's handlers, SIGINT even where it was inherited as
    ignored; the sidecar is stopped and its checkpoint written in the app's shutdown). Returns the
    exit code: 0 after a stop by either signal."""
    import uvicorn

    from vllm_doctor.export.server import create_app

    logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sidecar = Sidecar(cfg)
    app = create_app(sidecar, manage=True)
    # What exists now (modules, rules, the compiled scanner, the app: about 90k objects) lives as
    # long as the process: out of the collector's sight, a full collection no longer walks it
    # (it took 0.1 s of CPU about every 20 s at 10 MB/s of log: 0.5 % of a core)
    gc.collect()
    gc.freeze()
    keep_freed_memory()
    server = _server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                                    access_log=False, lifespan="on"))
    # uvicorn catches SIGINT and SIGTERM while serving (SIGINT too where it was inherited as ignored),
    # shuts down, then raises the signal again under the handlers it found: by default that kills the
    # process (-15) or raises KeyboardInterrupt (130) after a clean stop. The handlers it finds are
    # these, so a stop by either signal is exit 0.
    stopped_by: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, _frame: stopped_by.append(sig))
                for sig in (signal.SIGINT, signal.SIGTERM)} if threading.current_thread() is threading.main_thread() else {}
    try:
        server.run()
    except SystemExit as e:   # uvicorn exits 3 when it cannot bind (port in use, an address not this host's)
        if e.code in (0, None):
            raise
        print(f"vllm-doctor: cannot serve on {cfg.host}:{cfg.port} (the port is in use or the address is not "
              f"this host's: see uvicorn's error above)", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
