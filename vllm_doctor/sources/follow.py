"""Follow a vLLM log file (or a pipe) the way ``tail -F`` does, without losing or repeating a line.

Design (after google/mtail's ``logstream``): one :class:`LogFollower` per path does all the
work in :meth:`LogFollower.poll`, a single non-blocking step that tests drive directly; a
:class:`FollowThread` calls ``poll`` when watchdog (inotify) reports a change in the file's
directory, and at least every ``poll_interval`` seconds anyway (inotify misses events on
some network and overlay file systems, and a directory may appear late).

Each step compares the path's ``stat`` with the open file descriptor:

- **rename + create rotation** and **delete + re-create**: the path has a new inode. The old
  descriptor is read to its end first (vLLM may have written more before it reopened), the
  partial last line is flushed, ``on_end`` is called, and the new file is read from offset 0.
  While the path is missing (between the rename and the create) the old descriptor stays
  open and is drained. After the switch the rotated file stays open for ``rotated_grace``
  seconds and whole lines appended to it are still read: every vLLM process (API server,
  engine core) has its own logging handler, and a process that has not yet noticed the
  rotation keeps writing to the renamed file. Its own rotation, a moment later, can rename a
  file that was created and written between two polls: at each rotation the siblings written
  since the last poll are read too (from where they were left, by inode, or from the start).
- **truncation / copytruncate**: same inode, but the size is below our offset, or the bytes
  just before our offset no longer equal what we read there (truncated and refilled between
  two polls). With ``copytruncate`` logrotate first copies the file to a sibling
  (``vllm.log.1``, ``vllm.log-20261130``): the sibling whose bytes before our offset match
  ours is read from our offset to its end, so the lines written between our last read and
  the copy are not lost. (Lines written between logrotate's copy and its truncate are lost
  by ``copytruncate`` itself; logrotate's documentation says so.)
- **a file that appears after start** is read from its beginning; a file present at start is
  read from its end (the last complete line), unless ``from_start`` or a checkpoint says
  otherwise.
- **a partial last line** is held back until its newline arrives (or the file rotates), so
  ``on_data`` always receives whole lines, except a line longer than ``max_pending`` bytes,
  which is passed on in pieces (the pipeline caps line length itself).

The checkpoint (``--state-file``) records, per path, the device, inode, offset of the last
whole line delivered and the bytes before it; a restarted sidecar resumes there, and if
the file was rotated while it was down it first finishes the rotated file (found by inode
next to the path), so a restart neither loses nor double-counts lines.
"""

from __future__ import annotations

import json
import logging
import os
import stat as stat_mod
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

OnData = Callable[[bytes], None]
OnEnd = Callable[[], None]

TAIL_BYTES = 64
"""How many bytes before the read offset are kept to recognise truncate-and-refill."""


@dataclass
class FollowStats:
    """Counters of one follower. ``up``: the file is open; ``last_data_at``: time.monotonic()
    of the last bytes read (None before any)."""

    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    recovered_bytes: int = 0
    errors: int = 0
    up: bool = False
    last_data_at: float | None = None
    last_error: str | None = None


@dataclass
class _Open:
    fd: int
    dev: int
    ino: int
    offset: int  # bytes read from this file
    tail: bytes = b""  # the last <= TAIL_BYTES bytes read, ending at offset
    path: str = ""


class LogFollower:
    """Follow one log file; deliver whole lines to ``on_data`` and call ``on_end`` at each
    rotation or truncation (after flushing the partial line).

    path: the file to follow (need not exist yet).
    on_data(bytes): receives raw bytes, always ending in ``\\n`` except for a flush before
      ``on_end`` or a piece of an over-long line.
    on_end(): the current file ended (rotated, truncated, deleted and re-created).
    from_start: read a file present at start from offset 0 instead of its end.
    checkpoint: a dict from :meth:`checkpoint` of a previous run (wins over from_start when
      it still applies).
    Not thread-safe: call :meth:`poll` from one thread (or under one lock).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_data: OnData,
        on_end: OnEnd | None = None,
        *,
        from_start: bool = False,
        checkpoint: dict | None = None,
        max_pending: int = 1 << 20,
        read_chunk: int = 1 << 20,
        max_read_per_poll: int = 16 << 20,
        rotated_grace: float = 30.0,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.on_data = on_data
        self.on_end = on_end or (lambda: None)
        self.stats = FollowStats()
        self._from_start = from_start
        self._checkpoint = checkpoint
        self._max_pending = max_pending
        self._read_chunk = read_chunk
        self._max_read_per_poll = max_read_per_poll
        self._cur: _Open | None = None
        self._pending = b""
        self._started = False
        self._absent_at_start = False
        self._rotated_grace = rotated_grace
        self._rotated: dict[tuple[int, int], tuple[_Open, float]] = {}  # rotated files still read: (file, last growth)
        self._done: dict[tuple[int, int], int] = {}  # (dev, ino) -> offset of rotated files closed since
        self._last_poll_wall = time.time()

    # -- public --------------------------------------------------------------------------

    def poll(self) -> int:
        """One step: detect rotation/truncation, read what is new, deliver whole lines.
        Returns the number of bytes read. Never raises for I/O errors (counted in stats)."""
        try:
            n = self._poll()
        except OSError as exc:  # permissions, EIO, a directory, ...: count, keep going
            self.stats.errors += 1
            self.stats.up = False
            msg = f"{type(exc).__name__}: {exc}"
            if msg != self.stats.last_error:  # once per distinct error, not once per poll
                log.warning("following %s: %s", self.path, msg)
            self.stats.last_error = msg
            return 0
        self.stats.last_error = None
        return n

    def prepare(self) -> None:
        """Decide where reading starts and open the file there, without reading (the sidecar
        writes a checkpoint between this and the first :meth:`poll`, so a kill before the first
        periodic checkpoint neither skips nor repeats a line). A no-op when a checkpoint applies
        (it already says where) or after the first poll. Never raises (errors are counted)."""
        if self._started or (self._checkpoint and self._checkpoint.get("path", self.path) == self.path):
            return
        try:
            st = _stat(self.path)
            if st is None:
                self._started = self._absent_at_start = True
                return
            start = 0 if self._from_start or not stat_mod.S_ISREG(st.st_mode) else _last_line_end(self.path, st.st_size)
            self._open(self.path, st, start)
            self._started = True
        except OSError as exc:
            self.stats.errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"

    def checkpoint(self) -> dict | None:
        """The resume point: ``{"path", "dev", "ino", "offset", "tail"}`` where offset is
        the end of the last whole line delivered; ``{"path", "absent": True}`` when the file did
        not exist at start (it will be read from its beginning when it appears); None when no
        file is open."""
        cur = self._cur
        if cur is None:
            if not self._started:
                return self._checkpoint
            return {"path": self.path, "absent": True} if self._absent_at_start else None
        delivered = cur.offset - len(self._pending)
        tail = self._tail_before(cur, delivered)
        ck = {"path": self.path, "dev": cur.dev, "ino": cur.ino, "offset": delivered, "tail": tail.hex()}
        if self._rotated:
            ck["rotated"] = [{"dev": o.dev, "ino": o.ino, "offset": o.offset, "tail": o.tail.hex()}
                             for o, _ in self._rotated.values()]
        return ck

    def close(self, flush: bool = False) -> None:
        """Close the file. flush=True delivers a held partial line and calls ``on_end``."""
        if flush and self._pending:
            self._deliver_all()
            self.on_end()
        for key in list(self._rotated):
            self._close_rotated(key)
        if self._cur is not None:
            os.close(self._cur.fd)
            self._cur = None
        self.stats.up = False

    # -- the step -------------------------------------------------------------------------

    def _poll(self) -> int:
        st = _stat(self.path)
        if not self._started:
            self._started = True
            return self._start(st)
        n_prev = self._read_rotated() if self._rotated else 0
        since, self._last_poll_wall = self._last_poll_wall, time.time()
        cur = self._cur
        self.stats.up = st is not None
        if cur is None:
            if st is None:
                return 0
            # appeared after start (or after a delete): everything in it is new
            self._open(self.path, st, 0)
            return self._read_available()
        if st is None or (st.st_dev, st.st_ino) != (cur.dev, cur.ino):
            try:
                n = self._read_available()  # drain what was written before the rename/delete
            except OSError as exc:  # the old file cannot be read (it was a directory, EIO, ...)
                self.stats.errors += 1
                log.warning("following %s: the replaced file could not be drained: %s", self.path, exc)
                n = 0
            if st is None:
                return n_prev + n  # renamed or deleted; wait for the new file, keep draining the old
            self._end_file(keep_reading=True)
            self.stats.rotations += 1
            log.info("%s rotated (new inode); reading the new file from the start", self.path)
            n += self._adopt_rotated_since(since - 1.0, (st.st_dev, st.st_ino))
            self._open(self.path, st, 0)
            return n_prev + n + self._read_available()
        if st.st_size < cur.offset or not self._tail_matches(cur):
            self._truncated(cur)
            return n_prev + self._read_available()
        if st.st_size == cur.offset:
            return n_prev
        return n_prev + self._read_available()

    def _read_rotated(self) -> int:
        """Whole lines appended to the rotated files still open (late writers); each is closed
        once it has not grown for ``rotated_grace`` seconds."""
        n = 0
        now = time.monotonic()
        for key, (o, seen) in list(self._rotated.items()):
            got = self._read_whole_lines(o)
            if got:
                self._rotated[key] = (o, now)
                n += got
            elif now - seen > self._rotated_grace:
                self._close_rotated(key)
        return n

    def _read_whole_lines(self, o: _Open) -> int:
        got = b""
        try:
            while len(got) < self._max_read_per_poll:
                chunk = os.pread(o.fd, self._read_chunk, o.offset + len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:
            return 0
        cut = got.rfind(b"\n") + 1
        if cut:
            o.offset += cut
            o.tail = (o.tail + got[:cut][-TAIL_BYTES:])[-TAIL_BYTES:]
            self.stats.bytes_read += cut
            self.stats.recovered_bytes += cut
            self.on_data(got[:cut])
        return cut

    def _keep_rotated(self, o: _Open) -> None:
        self._rotated[(o.dev, o.ino)] = (o, time.monotonic())

    def _close_rotated(self, key: tuple[int, int]) -> None:
        o, _ = self._rotated.pop(key)
        self._done[key] = o.offset
        while len(self._done) > 64:
            self._done.pop(next(iter(self._done)))
        try:
            os.close(o.fd)
        except OSError:
            pass

    def _adopt_rotated_since(self, since: float, new_key: tuple[int, int]) -> int:
        """Siblings modified since ``since`` (wall time) that are not being read: files created and
        rotated away between two polls by a second writer. Read from where they were left (a
        file read before, by inode) or from the start, and kept open like the rotated file."""
        n = 0
        for p in _siblings(self.path):
            st = _stat(p)
            if st is None or st.st_mtime < since or not stat_mod.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key == new_key or key in self._rotated:
                continue
            offset = self._done.pop(key, 0)
            try:
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                continue
            o = _Open(fd=fd, dev=st.st_dev, ino=st.st_ino, offset=offset, path=p)
            self._keep_rotated(o)
            n += self._read_whole_lines(o)
        return n

    def _start(self, st: os.stat_result | None) -> int:
        ck = self._checkpoint
        n = 0
        if ck and ck.get("absent"):  # absent at the last start: whatever is there now is new
            if st is None:
                self._absent_at_start = True
                return 0
            self._open(self.path, st, 0)
            return self._read_available()
        handled: set[str] = set()
        for pv in (ck or {}).get("rotated") or ():  # late lines of files rotated before the kill
            old = _find_by_inode(self.path, pv.get("dev"), pv.get("ino")) if isinstance(pv, dict) else None
            if old is not None:
                handled.add(old)
                n += self._read_rest_of(old, int(pv.get("offset", 0)), bytes.fromhex(pv.get("tail", "")),
                                        whole_lines=True)
        if ck and ck.get("path", self.path) == self.path:
            if st is not None and (st.st_dev, st.st_ino) == (ck["dev"], ck["ino"]):
                fd_stat_ok = st.st_size >= ck["offset"]
                self._open(self.path, st, ck["offset"], tail=bytes.fromhex(ck.get("tail", "")))
                if fd_stat_ok and self._tail_matches(self._cur):
                    log.info("%s: resuming at offset %d from the checkpoint", self.path, ck["offset"])
                    return self._read_available()
                # truncated while we were down: finish the copy if there is one, restart at 0
                self._truncated(self._cur)
                return self._read_available()
            # rotated while we were down: finish the old file (found by inode), then the new one
            old = _find_by_inode(self.path, ck["dev"], ck["ino"])
            if old is not None:
                n += self._read_rest_of(old, ck["offset"], bytes.fromhex(ck.get("tail", "")))
                # rotated more than once: the files rotated after it, oldest first, whole
                for newer in _rotated_after(self.path, old):
                    if newer not in handled:
                        n += self._read_rest_of(newer, 0, b"")
            if st is not None:
                self._open(self.path, st, 0)
                n += self._read_available()
            return n
        if st is None:
            log.info("%s does not exist yet; it will be read from its start when it appears", self.path)
            return 0
        start = 0 if self._from_start else _last_line_end(self.path, st.st_size)
        self._open(self.path, st, start)
        return self._read_available()

    # -- helpers --------------------------------------------------------------------------

    def _open(self, path: str, st: os.stat_result, offset: int, tail: bytes = b"") -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):  # replaced between stat and open
            st = fst
            offset, tail = 0, b""
        if not stat_mod.S_ISREG(fst.st_mode):
            offset, tail = 0, b""  # a FIFO or device: no offsets to keep
        self._cur = _Open(fd=fd, dev=st.st_dev, ino=st.st_ino, offset=offset, tail=tail, path=path)
        if not tail and offset:
            self._cur.tail = self._tail_before(self._cur, offset)
        self.stats.up = True

    def _tail_before(self, cur: _Open, offset: int) -> bytes:
        if offset <= 0:
            return b""
        if offset == cur.offset and cur.tail:
            return cur.tail
        start = max(0, offset - TAIL_BYTES)
        try:
            return os.pread(cur.fd, offset - start, start)
        except OSError:
            return b""

    def _tail_matches(self, cur: _Open | None) -> bool:
        if cur is None or not cur.tail:
            return True
        n = len(cur.tail)
        try:
            return os.pread(cur.fd, n, cur.offset - n) == cur.tail
        except OSError:
            return False

    def _read_available(self) -> int:
        cur = self._cur
        if cur is None:
            return 0
        total = 0
        while total < self._max_read_per_poll:
            chunk = os.pread(cur.fd, self._read_chunk, cur.offset)
            if not chunk:
                break
            cur.offset += len(chunk)
            cur.tail = (cur.tail + chunk[-TAIL_BYTES:])[-TAIL_BYTES:]
            total += len(chunk)
            self._deliver(chunk)
        if total:
            self.stats.bytes_read += total
            self.stats.last_data_at = time.monotonic()
        return total

    def _deliver(self, chunk: bytes) -> None:
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            self._pending += chunk
            if len(self._pending) > self._max_pending:
                self._deliver_all()
            return
        head = self._pending + chunk[:cut] if self._pending else chunk[:cut]
        self._pending = chunk[cut:]
        self.on_data(head)
        if len(self._pending) > self._max_pending:
            self._deliver_all()

    def _deliver_all(self) -> None:
        data, self._pending = self._pending, b""
        if data:
            self.on_data(data)

    def _end_file(self, keep_reading: bool = False) -> None:
        """The current file is finished: flush its partial line, tell the pipeline, close it
        (``keep_reading``: keep it open as the rotated file, for late lines)."""
        self._deliver_all()
        self.on_end()
        if self._cur is not None:
            if keep_reading:
                self._keep_rotated(self._cur)
            else:
                os.close(self._cur.fd)
            self._cur = None

    def _truncated(self, cur: _Open) -> None:
        self.stats.truncations += 1
        log.info("%s truncated (copytruncate?) at offset %d", self.path, cur.offset)
        copy = _find_copy(self.path, cur)
        if copy is not None:
            got = self._read_rest_of(copy, cur.offset, cur.tail, keep_pending=True)
            log.info("%s: read %d bytes written before the truncation from %s", self.path, got, copy)
        else:
            self._deliver_all()
            self.on_end()
        cur.offset, cur.tail = 0, b""

    def _read_rest_of(self, path: str, offset: int, tail: bytes, keep_pending: bool = False,
                      whole_lines: bool = False) -> int:
        """Read ``path`` from ``offset`` to its end (a rotated file or a copytruncate copy),
        continuing the pending partial line, then flush and call on_end (``whole_lines``: the
        late lines of a rotated file: a partial last line is dropped, no on_end)."""
        if not keep_pending:
            self._pending = b""
        total = 0
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._deliver_all()
            self.on_end()
            return 0
        try:
            n = len(tail)
            if n and os.pread(fd, n, offset - n) != tail:
                offset = 0  # the inode was reused by another file: all of it is new
            while True:
                chunk = os.pread(fd, self._read_chunk, offset + total)
                if not chunk:
                    break
                total += len(chunk)
                self._deliver(chunk)
        finally:
            os.close(fd)
        self.stats.recovered_bytes += total
        self.stats.bytes_read += total
        if whole_lines:
            self._pending = b""
            return total
        self._deliver_all()
        self.on_end()
        return total


class PipeFollower:
    """Read a pipe or stdin (``--log -``) until EOF in a background thread.

    Delivers whole lines to ``on_data``, the partial last one at EOF followed by ``on_end``.
    ``lock`` (optional) is held around each callback. ``stats.up`` is False after EOF.
    """

    def __init__(self, fd: int, on_data: OnData, on_end: OnEnd | None = None, *,
                 lock: threading.Lock | None = None, chunk: int = 1 << 16,
                 max_pending: int = 1 << 20) -> None:
        self.fd = fd
        self.path = "-"
        self.on_data = on_data
        self.on_end = on_end or (lambda: None)
        self.stats = FollowStats(up=True)
        self._lock = lock or threading.Lock()
        self._chunk = chunk
        self._max_pending = max_pending
        self._pending = b""
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-pipe", daemon=True)

    def start(self) -> None:
        """Start the reader thread."""
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for EOF."""
        self._thread.join(timeout)

    def checkpoint(self) -> None:
        """Pipes have no offsets to checkpoint."""
        return None

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, self._chunk)
            except InterruptedError:
                continue
            except OSError as exc:
                self.stats.errors += 1
                self.stats.last_error = str(exc)
                break
            if not chunk:
                break
            self.stats.bytes_read += len(chunk)
            self.stats.last_data_at = time.monotonic()
            buf = self._pending + chunk
            cut = buf.rfind(b"\n") + 1
            if len(buf) - cut > self._max_pending:
                cut = len(buf)
            self._pending = buf[cut:]
            if cut:
                with self._lock:
                    self.on_data(buf[:cut])
        with self._lock:
            if self._pending:
                self.on_data(self._pending)
                self._pending = b""
            self.on_end()
        self.stats.up = False


class FifoFollower(PipeFollower):
    """Follow a named pipe (``--log /path/to/fifo``): opened and read in its own thread, so a
    FIFO with no writer (whose ``open`` blocks until one appears) never blocks start-up or the
    health check. Each writer's data ends with ``on_end``; then the FIFO is opened again for the
    next writer, until :meth:`stop`."""

    def __init__(self, path: str | os.PathLike[str], on_data: OnData, on_end: OnEnd | None = None, *,
                 lock: threading.Lock | None = None, chunk: int = 1 << 16,
                 max_pending: int = 1 << 20) -> None:
        super().__init__(-1, on_data, on_end, lock=lock, chunk=chunk, max_pending=max_pending)
        self.path = os.path.abspath(os.fspath(path))
        self.stats.up = False
        self._stopping = threading.Event()
        self._thread.name = "vllm-doctor-fifo"

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # waits for a writer
            except OSError as exc:
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self._stopping.wait(1.0)
                continue
            if self._stopping.is_set():
                os.close(self.fd)
                break
            self.stats.up = True
            self.stats.last_error = None
            try:
                super()._run()  # reads until this writer closes; then flush + on_end
            finally:
                os.close(self.fd)
                self.fd = -1

    def stop(self, timeout: float = 2.0) -> None:
        """Stop reading. A thread waiting in ``open`` for a writer is released by opening the
        FIFO's write end for a moment (non-blocking: it fails harmlessly if nobody waits)."""
        self._stopping.set()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        self._thread.join(timeout)


def is_fifo(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a named pipe (followed with :class:`FifoFollower`)."""
    try:
        return stat_mod.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


class FollowThread:
    """Drive several :class:`LogFollower` objects from one thread.

    Wakes on watchdog events in the followed files' directories (inotify on Linux) and at
    least every ``poll_interval`` seconds; polls at most once per ``min_interval`` seconds
    (batching bursts of writes). Each ``poll`` runs while holding ``lock``.
    ``after_poll()`` (optional) is called after each round, outside the lock;
    ``first_round()`` (optional) runs once in the thread before the first wait (the sidecar's
    first read), and :attr:`first_round_done` is set after it.
    """

    def __init__(self, followers: Iterable[LogFollower], lock: threading.Lock, *,
                 poll_interval: float = 1.0, min_interval: float = 0.05,
                 use_watchdog: bool = True,
                 after_poll: Callable[[], None] | None = None,
                 first_round: Callable[[], None] | None = None) -> None:
        self.followers = list(followers)
        self.first_round = first_round
        self.first_round_done = threading.Event()
        self.lock = lock
        self.poll_interval = poll_interval
        self.min_interval = min_interval
        self.after_poll = after_poll
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer = None
        self._use_watchdog = use_watchdog
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-follow", daemon=True)
        self.rounds = 0

    def start(self) -> None:
        """Start watchdog (if it can) and the polling thread."""
        if self._use_watchdog:
            self._start_watchdog()
        self._thread.start()

    def wake(self) -> None:
        """Ask for a poll now (tests, and the watchdog handler)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and watchdog; the followers stay open (close them yourself)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._observer = None

    def _start_watchdog(self) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            log.warning("watchdog is not installed; polling every %.1f s", self.poll_interval)
            return
        names = {os.path.basename(f.path) for f in self.followers}
        wake = self._wake

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event):  # noqa: ANN001 - watchdog's signature
                for p in (getattr(event, "src_path", ""), getattr(event, "dest_path", "")):
                    if p and os.path.basename(os.fsdecode(p)) in names:
                        wake.set()
                        return

        observer = Observer()
        dirs = {os.path.dirname(f.path) for f in self.followers}
        scheduled = 0
        for d in sorted(dirs):
            if os.path.isdir(d):
                try:
                    observer.schedule(_Handler(), d, recursive=False)
                    scheduled += 1
                except OSError as exc:  # inotify watch limit, ...
                    log.warning("watchdog cannot watch %s (%s); polling it", d, exc)
        if not scheduled:
            return
        try:
            observer.start()
        except OSError as exc:
            log.warning("watchdog failed to start (%s); polling every %.1f s", exc, self.poll_interval)
            return
        self._observer = observer

    def _run(self) -> None:
        try:
            if self.first_round is not None:  # in this thread: a stalled file blocks nobody else
                self.first_round()
        except Exception:  # noqa: BLE001
            log.exception("first round failed")
        finally:
            self.first_round_done.set()
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.poll_interval)
            if self._stop.is_set():
                break
            pause = self.min_interval - (time.monotonic() - last)
            if pause > 0:
                self._stop.wait(pause)
            self._wake.clear()
            last = time.monotonic()
            with self.lock:
                for f in self.followers:
                    f.poll()
            self.rounds += 1
            if self.after_poll is not None:
                try:
                    self.after_poll()
                except Exception:  # noqa: BLE001 - a sink must not stop the follower
                    log.exception("after_poll failed")


# -- checkpoint file -----------------------------------------------------------------------


def load_checkpoints(path: str | os.PathLike[str] | None) -> dict[str, dict]:
    """Read a ``--state-file``: ``{followed path: checkpoint dict}``. A missing, empty or
    damaged file gives ``{}`` (logged), never an exception."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable state file %s: %s", path, exc)
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    good = {}
    for k, v in files.items():
        if isinstance(v, dict) and (v.get("absent") is True
                                    or all(isinstance(v.get(f), int) for f in ("dev", "ino", "offset"))):
            good[k] = v
    return good


def load_state_extra(path: str | os.PathLike[str] | None, key: str) -> dict:
    """Another section of a ``--state-file`` (written with ``save_checkpoints(extra=...)``);
    ``{}`` when absent or unreadable."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    v = data.get(key) if isinstance(data, dict) else None
    return v if isinstance(v, dict) else {}


def save_checkpoints(path: str | os.PathLike[str], followers: Iterable[LogFollower],
                     extra: dict | None = None) -> None:
    """Write the followers' checkpoints to ``path`` atomically (temp file + rename).
    ``extra``: more JSON sections stored beside ``files`` (e.g. the sticky facts)."""
    files = {}
    for f in followers:
        ck = f.checkpoint()
        if ck:
            files[f.path] = ck
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".vllm-doctor-state.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"version": 1, "files": files, **(extra or {})}, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- file system helpers -------------------------------------------------------------------


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _last_line_end(path: str, size: int, look_back: int = 1 << 16) -> int:
    """Offset just after the last newline in the final ``look_back`` bytes (so a partial last
    line present at start is read whole once completed); ``size`` when there is none."""
    if size == 0:
        return 0
    start = max(0, size - look_back)
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(size - start)
    i = data.rfind(b"\n")
    return size if i < 0 else start + i + 1


def _siblings(path: str) -> list[str]:
    """Files next to ``path`` whose name starts with its name (``vllm.log.1``,
    ``vllm.log-20261130``), newest first, compressed ones left out."""
    d, base = os.path.split(path)
    out = []
    try:
        with os.scandir(d) as it:
            for e in it:
                if e.name != base and e.name.startswith(base) and not e.name.endswith(
                        (".gz", ".bz2", ".xz", ".zst")):
                    try:
                        out.append((e.stat().st_mtime, e.path))
                    except OSError:
                        continue
    except OSError:
        return []
    out.sort(reverse=True)
    return [p for _, p in out[:32]]


def _find_by_inode(path: str, dev: int, ino: int) -> str | None:
    for p in _siblings(path):
        st = _stat(p)
        if st is not None and (st.st_dev, st.st_ino) == (dev, ino):
            return p
    return None


def _rotated_after(path: str, old: str) -> list[str]:
    """Rotated siblings of ``path`` written after ``old`` (by modification time), oldest first:
    the files a log went through while the sidecar was down when it rotated more than once."""
    try:
        since = os.stat(old).st_mtime_ns
    except OSError:
        return []
    out = []
    for p in _siblings(path):
        st = _stat(p)
        if p != old and st is not None and st.st_mtime_ns > since:
            out.append((st.st_mtime_ns, p))
    return [p for _, p in sorted(out)]


def _find_copy(path: str, cur: _Open) -> str | None:
    """The copytruncate copy: a sibling at least ``cur.offset`` long whose bytes before that
    offset equal the tail we read."""
    if cur.offset == 0 or not cur.tail:
        return None
    n = len(cur.tail)
    for p in _siblings(path):
        st = _stat(p)
        if st is None or st.st_size < cur.offset or (st.st_dev, st.st_ino) == (cur.dev, cur.ino):
            continue
        try:
            with open(p, "rb") as fh:
                fh.seek(cur.offset - n)
                if fh.read(n) == cur.tail:
                    return p
        except OSError:
            continue
    return None
