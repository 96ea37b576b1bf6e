"""Stage 2 of the pipeline: turn raw bytes of a log into records (one vLLM log message each).

What wraps a vLLM record, outermost first, and what this module strips:

* container runtimes: Kubernetes CRI lines (``2026-11-30T09:00:00.123456789Z stdout F msg``;
  ``P`` partial lines are joined with the following ``F`` line), docker's json-file driver
  (``{"log": "msg\\n", "stream": "stdout", "time": "..."}``), ``kubectl logs --timestamps``
  (an RFC 3339 time then a space) and bracketed times (``[2024-07-08 15:17:34] ``). Their
  timestamps carry the year, which vLLM's own timestamp lacks.
* ANSI colour codes (vLLM colours the process prefix cyan, and from 0.11 the level and file).
* process prefixes, possibly nested: ``(APIServer pid=N)``, ``(EngineCore_DP0 pid=N)``,
  ``(VllmWorker rank=0 pid=N)``, ``(VllmWorkerProcess pid=N)``, ``(RayWorkerWrapper pid=N,
  ip=...)``, ``(Worker_TP0 pid=N)`` (vllm/executor/multiproc_worker_utils.py 0.4–0.10,
  v1/executor/multiproc_executor.py, utils ``decorate_logs`` 0.10.2+, in the formatter 0.31+).
* vLLM's logger prefix (vllm/logger.py): ``INFO 07-10 10:23:45 file.py:123] msg`` (0.3.3–0.7.3),
  ``INFO 07-10 10:23:45 [file.py:123] msg`` (0.8+; a relative path such as
  ``v1/core/sched/scheduler.py`` when VLLM_LOGGING_LEVEL=DEBUG, 0.11+). The date has no year.

Damage from copy and paste is tolerated: several records glued on one line (tqdm progress text
before ``INFO``; newlines collapsed to spaces) are split at each embedded logger prefix, except
inside request-logging lines (``Received request ...: prompt: '...'``) whose text is user input.

Everything works on bytes until a line is known to matter: the :data:`PREFILTER` regex drops, at
C speed, lines that no parser could match (the bulk of a request-heavy log), which keeps
``diagnose`` near ``grep`` speed. Invalid UTF-8 is replaced, never raised; lines longer than
``max_line_bytes`` are cut (the rest of the line is counted but not kept).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

# Words that every line some parser could match contains. Lines without any are counted and
# dropped before decoding. Keep in sync with vllm_doctor.parsers (test_parsers checks it).
PREFILTER = re.compile(
    rb"throughput|KV cache|blocks|oncurrency|reempt|rror|xception|Traceback|File \"|"
    rb"out of memory|OOM|emory|dead|Dead|died|timed out|failed|Failed|NCCL|Watchdog|"
    rb"args|config|version|max_num|max model len|max_model_len|startup complete|Starting vLLM|Uvicorn running|"
    rb"running=|--kv-cache|--chunked-prefill-size|VLLM_USE_PREFILL|took|Killed|killed|"
    rb"block found|cache_config_info|shutdown|SIGTERM|SIGINT"
)

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CRI_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) (?P<stream>stdout|stderr) (?P<tag>[FP]) ?(?P<msg>.*)$",
    re.S,
)
ISO_PREFIX_RE = re.compile(
    r"^\[?(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?\s+"
)
# One process prefix; several may nest.
PROC_RE = re.compile(r"\(([A-Za-z][\w.-]*(?: [\w.=-]+)*?) pid=(\d+)(?:, ip=[^)]*)?\)\s?")
LEADING_PROCS_RE = re.compile(r"^\s*((?:\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+(?:, ip=[^)]*)?\)\s?)+)")
# vLLM's logger prefix. The level may be lost in a paste, the brackets exist from 0.8.
LOGGER_RE = re.compile(
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) )?"
    r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? "
    r"(?:\[?(?P<file>[\w.-]+(?:/[\w.-]+)*\.py|[\w.-]+(?:/[\w.-]+)*(?:/\.\.\.)?[\w.-]*):(?P<line>\d+)\] ?)?"
)
# A record boundary inside a line: optional process prefixes then a logger prefix with a level.
EMBEDDED_RE = re.compile(
    r"(?:\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+(?:, ip=[^)]*)?\)\s?)*"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\] ?"
)
REQUEST_LOG_RE = re.compile(r"^(?:Received request|Added request|Generated response|Request \S+ details)")


@dataclass(frozen=True, slots=True)
class Record:
    """One vLLM log message.

    lineno: 1-based line in the source; level: "INFO", ... or None; ts: epoch seconds (year
    inferred) or None; process: innermost process prefix name ("EngineCore_DP0") or None;
    pid: its pid or None; src: vLLM's ``file.py:123`` or None; msg: the message text.
    """

    lineno: int
    msg: str
    level: str | None = None
    ts: float | None = None
    process: str | None = None
    pid: int | None = None
    src: str | None = None


class LogClock:
    """Turns vLLM's year-less ``MM-DD HH:MM:SS`` into epoch seconds and keeps order across a
    new year: when the month goes back by six or more (December -> January) the year advances.
    Small backward steps (lines of several processes, pastes regrouped by hand) do not.
    Times are taken as UTC (vLLM prints local time without a zone; only differences matter).

    base_year: the year of the first line (from a container timestamp when there is one, else
    from the file's modification time, else today).
    """

    def __init__(self, base_year: int | None = None) -> None:
        self.year = base_year or time.gmtime().tm_year
        self._year_fixed = False
        self._last_month: int | None = None

    def set_year(self, year: int) -> None:
        """Adopt the year of a container timestamp (authoritative)."""
        self.year = year
        self._year_fixed = True

    def to_epoch(self, month: int, day: int, hms: str) -> float | None:
        """Epoch seconds of ``month-day hms`` in the inferred year, or None if invalid."""
        if self._last_month is not None and not self._year_fixed and month + 6 <= self._last_month:
            self.year += 1
        self._last_month = month
        try:
            h, m, s = (int(x) for x in hms.split(":"))
            return float(calendar.timegm((self.year, month, day, h, m, s, 0, 0, 0)))
        except (ValueError, OverflowError):
            return None


def _parse_iso(ts: str) -> datetime | None:
    ts = ts.replace(",", ".").replace(" ", "T")
    if ts.endswith("Z"):
        ts = ts[:-1] + "+00:00"
    m = re.match(r"^(.*?\.\d{1,6})\d*(.*)$", ts)  # Python takes at most 6 fraction digits
    if m:
        ts = m.group(1) + m.group(2)
    try:
        dt = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


class Envelope:
    """Stateful unwrapper for one log source: bytes lines in, :class:`Record` objects out.

    Usage: ``for rec in env.records(lineno, raw_line_bytes): ...``. It keeps the state that
    spans lines: CRI partial lines waiting for their ``F`` line, the log clock, and the last
    timestamp (carried to records that have none, so windows still work).
    """

    def __init__(self, clock: LogClock | None = None) -> None:
        self.clock = clock or LogClock()
        self._partial: list[str] = []
        self._partial_lineno = 0
        self.last_ts: float | None = None
        self.container_format: str | None = None  # "cri" | "docker" | None

    def records(self, lineno: int, raw: bytes) -> list[Record]:
        """Records in one raw line (usually one; several when records were glued together)."""
        text = raw.decode("utf-8", "replace")
        if text.endswith("\r"):
            text = text[:-1]
        if "\x1b" in text:
            text = ANSI_RE.sub("", text)
        outer_ts: float | None = None
        first = text[:1]
        if first == "{" and text.startswith('{"log":'):
            try:
                obj = json.loads(text)
                text = str(obj.get("log", "")).rstrip("\n").rstrip("\r")
                dt = _parse_iso(str(obj.get("time", "")))
                if dt:
                    outer_ts = dt.timestamp()
                    self.clock.set_year(dt.year)
                self.container_format = "docker"
                if "\x1b" in text:
                    text = ANSI_RE.sub("", text)
            except (ValueError, AttributeError):
                pass
        elif first.isdigit() or first == "[":
            m = CRI_RE.match(text)
            if m:
                self.container_format = "cri"
                dt = _parse_iso(m.group("ts"))
                if dt:
                    outer_ts = dt.timestamp()
                    self.clock.set_year(dt.year)
                if m.group("tag") == "P":
                    if not self._partial:
                        self._partial_lineno = lineno
                    if sum(len(p) for p in self._partial) < 1 << 20:
                        self._partial.append(m.group("msg"))
                    return []
                text = m.group("msg")
                if self._partial:
                    text = "".join(self._partial) + text
                    lineno = self._partial_lineno
                    self._partial = []
            else:
                m = ISO_PREFIX_RE.match(text)
                if m:
                    dt = _parse_iso(m.group("ts"))
                    if dt:
                        outer_ts = dt.timestamp()
                        self.clock.set_year(dt.year)
                    text = text[m.end():]
        if "\r" in text:  # tqdm redraws: each segment is its own record
            out: list[Record] = []
            for seg in text.split("\r"):
                if seg.strip():
                    out.extend(self._split(lineno, seg, outer_ts))
            return out
        return self._split(lineno, text, outer_ts)

    def _split(self, lineno: int, text: str, outer_ts: float | None) -> list[Record]:
        first = self._one(lineno, text, outer_ts)
        if first is None:
            return []
        if REQUEST_LOG_RE.match(first.msg):
            return [first]
        # Glued records: a second logger prefix inside the message.
        msg = first.msg
        cuts = [m.start() for m in EMBEDDED_RE.finditer(msg)]
        if not cuts:
            return [first]
        out = []
        head = msg[: cuts[0]].rstrip()
        if head:
            out.append(Record(lineno, head, first.level, first.ts, first.process, first.pid, first.src))
        for i, start in enumerate(cuts):
            end = cuts[i + 1] if i + 1 < len(cuts) else len(msg)
            rec = self._one(lineno, msg[start:end].rstrip(), outer_ts)
            if rec is not None:
                out.append(rec)
        return out

    def _one(self, lineno: int, text: str, outer_ts: float | None) -> Record | None:
        process = None
        pid = None
        m = LEADING_PROCS_RE.match(text)
        if m:
            procs = PROC_RE.findall(m.group(1))
            if procs:
                process, pid_s = procs[-1]
                pid = int(pid_s)
            text = text[m.end():]
        level = src = None
        ts = outer_ts
        lm = LOGGER_RE.search(text, 0, 4096)
        # The logger prefix must start the message, or follow non-vLLM text glued before it
        # (tqdm): accept it anywhere only when a level is present.
        if lm and (lm.start() == 0 or (lm.group("level") and lm.start() > 0)):
            if lm.start() > 0:
                head = text[: lm.start()]
                # A glued head (tqdm) is kept only if it is not whitespace.
                if head.strip():
                    # Emit the head as its own record is not needed: it is never a vLLM message.
                    pass
            level = lm.group("level") or None
            if level == "WARN":
                level = "WARNING"
            src = f"{lm.group('file')}:{lm.group('line')}" if lm.group("file") else "?"
            t = self.clock.to_epoch(int(lm.group("mon")), int(lm.group("day")), lm.group("hms"))
            if ts is None:
                ts = t
            text = text[lm.end():]
            # A process prefix may also follow the logger prefix in 0.31+ formatter order.
            m2 = LEADING_PROCS_RE.match(text)
            if m2 and process is None:
                procs = PROC_RE.findall(m2.group(1))
                if procs:
                    process, pid_s = procs[-1]
                    pid = int(pid_s)
                text = text[m2.end():]
        else:
            # 0.31+ puts "(Proc pid=N)" inside the formatter, before the level: handled above.
            # Lines with no logger prefix (print(), tracebacks from multiprocessing, pastes
            # without prefix) keep their text; strip the indentation marker only.
            pass
        if ts is None:
            ts = self.last_ts
        else:
            self.last_ts = ts
        return Record(lineno, text, level, ts, process, pid, src)

    def flush(self) -> list[Record]:
        """Records still held (a CRI partial line with no final ``F`` line)."""
        if not self._partial:
            return []
        text = "".join(self._partial)
        self._partial = []
        return self._split(self._partial_lineno, text, self.last_ts)


class LineSplitter:
    """Splits a byte stream into blocks of complete lines, numbering lines from 1.

    ``feed(data)`` returns ``(block, first_lineno, nlines)``: the complete lines of what was fed
    (joined by ``\n``, without the final newline; ``nlines`` of them, the first numbered
    ``first_lineno``). A partial last line waits for the next feed or for :meth:`flush`. A
    partial line longer than ``max_line_bytes`` is cut to that length while it waits (the rest
    is read and discarded), so memory stays bounded whatever the input (a 10 MB prompt echoed by
    --enable-log-requests, a binary file without newlines).
    """

    def __init__(self, max_line_bytes: int = 64 * 1024) -> None:
        self.max_line = max_line_bytes
        self._buf = b""
        self._buf_len = 0  # bytes of the current partial line seen so far (may exceed the buffer)
        self.lineno = 0  # number of complete lines returned so far

    @property
    def pending_bytes(self) -> int:
        """Bytes of a partial last line seen but not yet returned."""
        return self._buf_len

    def feed(self, data: bytes) -> tuple[bytes, int, int]:
        """(block of complete lines, number of its first line, count of lines)."""
        first = self.lineno + 1
        nl = data.rfind(b"\n")
        if nl < 0:
            self._append_partial(data)
            return b"", first, 0
        if self._buf_len:
            head_end = data.find(b"\n")
            room = max(0, self.max_line - len(self._buf))
            block = self._buf + data[: min(head_end, room)] + data[head_end:nl]
        else:
            block = data[:nl]
        self._buf = b""
        self._buf_len = 0
        self._append_partial(data[nl + 1 :])
        n = block.count(b"\n") + 1
        self.lineno += n
        return block, first, n

    def _append_partial(self, data: bytes) -> None:
        if not data:
            return
        room = self.max_line - len(self._buf)
        if room > 0:
            self._buf += data[:room]
        self._buf_len += len(data)

    def flush(self) -> tuple[bytes, int, int]:
        """The partial last line, if any, as a complete line (end of file)."""
        if not self._buf_len:
            return b"", self.lineno + 1, 0
        line = self._buf
        self._buf = b""
        self._buf_len = 0
        self.lineno += 1
        return line, self.lineno, 1
