"""Follow a vLLM log file (or a pipe) the way ``tail -F`` does, without losing or repeating a line.

Design (after google/mtail's ``logstream``): one :class:`LogFollower` per path does all the
work in :meth:`LogFollower.poll`, a single non-blocking step that tests drive directly; a
:class:`FollowThread` calls ``poll`` when inotify reports a change in the file's directory
(read by the thread itself; watchdog where inotify is not available), and at least every
``poll_interval`` seconds anyway (inotify misses events on some network and overlay file
systems, and a directory may appear late).

Each step compares the path's ``stat`` with the open file descriptor:

- **rename + create rotation** and **delete + re-create**: the path has a new inode. The old
  descriptor is read to its end first (vLLM may have written more before it reopened), the
  partial last line is flushed, ``on_end`` is called, and the new file is read from offset 0.
  While the path is missing (between the rename and the create) the old descriptor stays
  open and is drained. After the switch the rotated file stays open for ``rotated_grace``
  seconds and whole lines appended to it are still read: every vLLM process (API server,
  engine core) has its own logging handler, and a process that has not yet noticed the
  rotation keeps writing to the renamed file.
- **files we never opened**: a file created and rotated away between two polls (or while the
  sidecar was down, or before the followed file first appeared) is found among the siblings
  (``vllm.log.1``, ...) because its identity, ``(st_dev, st_ino)``, is none of the files the
  follower knows: the one it reads, the rotated ones it still reads, and the finished ones
  (closed rotated files; at the very first start, the backups already there, which are
  history). Such files are read whole, oldest first (numbered backups by number, other names
  by modification time), before the file at the path. The siblings are listed before and after
  the path is opened; if a rotation happened in between, it looks again, so a file rotated
  while we look is neither missed nor read out of order. Modification times never decide
  whether a file is new (they tie on coarse file systems, and copies can set them back).
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

The checkpoint (``--state-file``) records, per path, all three kinds of files: for each its
device, inode, the offset of the last whole line delivered and the 64 bytes before it (which
tell a file from a later one that got the same inode number after a deletion). The sidecar
writes it together with the state that exactly those lines produced. A restarted follower
resumes the files it knew, finishes the one it was reading if it was rotated meanwhile, then
reads every sibling it does not know and the file at the path: every byte written after the
checkpoint is read once, in order, whichever file it is in now. Only files the writer itself
deleted meanwhile (more rotations than backups) are lost, and that is logged.
"""

from __future__ import annotations

import json
import logging
import os
import select
import stat as stat_mod
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_doctor.ingest.statefile import STATE_VERSION

log = logging.getLogger(__name__)

OnData = Callable[[bytes], None]
OnEnd = Callable[[], None]

TAIL_BYTES = 64
"""How many bytes before the read offset are kept to recognise truncate-and-refill (and a
file whose inode number was reused)."""
MAX_SIBLINGS = 128
"""Rotated files looked at next to a followed file (the newest)."""
MAX_KNOWN = 2 * MAX_SIBLINGS
"""Finished files remembered (and checkpointed) per followed file."""


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

    Every file is known by its identity, ``(st_dev, st_ino)``, checked against the bytes
    before the offset read in it (an inode number is reused once its file is deleted). The
    follower knows three kinds of files: the current one (``_cur``, at the path when last
    looked at), rotated ones still open for late lines (``_rotated``), and finished ones
    (``_done``: closed rotated files, and the backups present at the very first start, which
    are history). Any sibling that is none of these was created and rotated away since we
    last looked (between two polls, or while we were down): it is read whole, oldest first,
    before the file now at the path. The checkpoint holds all three, so a restart knows
    exactly which files are new.
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
        self._rotated_grace = rotated_grace
        self._rotated: dict[tuple[int, int], tuple[_Open, float]] = {}  # rotated files still read: (file, last growth)
        self._done: dict[tuple[int, int], tuple[int, bytes]] = {}  # finished files: (offset, tail before it)

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
        if self._started or self._checkpoint_applies():
            return
        try:
            self._fresh_start()
            self._started = True
        except OSError as exc:
            self.stats.errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"

    def checkpoint(self) -> dict | None:
        """The resume point: ``{"path", "dev", "ino", "offset", "tail"}`` where offset is the end
        of the last whole line delivered, or ``{"path", "absent": True}`` when no file is open
        (whatever appears at the path is new: read from its beginning); plus ``rotated`` (files
        rotated away, still read for late lines) and ``done`` (finished files), each
        ``{"dev", "ino", "offset", "tail"}``. Before the first poll: the checkpoint it was given."""
        if not self._started:
            return self._checkpoint
        cur = self._cur
        ck: dict = {"path": self.path}
        if cur is None:
            ck["absent"] = True
        else:
            delivered = cur.offset - len(self._pending)
            ck.update(dev=cur.dev, ino=cur.ino, offset=delivered, tail=self._tail_before(cur, delivered).hex())
        ck["rotated"] = [_entry(o.dev, o.ino, o.offset, o.tail) for o, _ in self._rotated.values()]
        ck["done"] = [_entry(k[0], k[1], off, tail) for k, (off, tail) in self._done.items()]
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
        if not self._started:
            self._started = True
            return self._start()
        n = self._read_rotated() if self._rotated else 0
        st = _stat(self.path)
        cur = self._cur
        self.stats.up = st is not None
        if cur is None:
            if st is None:
                return n
            return n + self._switch()  # appeared after start (or after a delete): all of it is new
        if st is None or (st.st_dev, st.st_ino) != (cur.dev, cur.ino):
            try:
                n += self._read_available(to_end=True)  # drain what was written before the rename/delete
            except OSError as exc:  # the old file cannot be read (it was a directory, EIO, ...)
                self.stats.errors += 1
                log.warning("following %s: the replaced file could not be drained: %s", self.path, exc)
            if st is None:
                return n  # renamed or deleted; wait for the new file, keep draining the old
            self._end_file(keep_reading=True)
            self.stats.rotations += 1
            log.info("%s rotated (new inode); reading the new file from the start", self.path)
            return n + self._switch()
        if st.st_size < cur.offset or not self._tail_matches(cur):
            self._truncated(cur)
            return n + self._read_available()
        if st.st_size == cur.offset:
            return n
        return n + self._read_available()

    def _checkpoint_applies(self) -> bool:
        ck = self._checkpoint
        return bool(ck) and ck.get("path", self.path) == self.path  # type: ignore[union-attr]

    def _fresh_start(self) -> None:
        """No checkpoint: open the file at its end (its start with ``from_start``); the backups
        next to it are history."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            log.info("%s does not exist yet; it will be read from its start when it appears", self.path)
            self._mark_history()
            return
        fst = os.fstat(fd)
        regular = stat_mod.S_ISREG(fst.st_mode)
        start = _last_line_end(fd, fst.st_size) if regular and not self._from_start else 0
        self._cur = _Open(fd=fd, dev=fst.st_dev, ino=fst.st_ino, offset=start, path=self.path)
        self._cur.tail = self._tail_before(self._cur, start)
        self.stats.up = True
        self._mark_history()

    def _start(self) -> int:
        if not self._checkpoint_applies():
            self._fresh_start()
            return self._read_available()
        ck: dict = self._checkpoint  # type: ignore[assignment]
        self._restore_known(ck)
        n = self._read_rotated() if self._rotated else 0  # late lines of files rotated before the kill
        if ck.get("absent"):  # no file was open: whatever is there now is new
            return n + self._switch()
        key, offset, tail = (ck["dev"], ck["ino"]), int(ck["offset"]), _unhex(ck.get("tail"))
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            fd = None
        if fd is not None:
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) == key:
                self._cur = cur = _Open(fd=fd, dev=key[0], ino=key[1], offset=offset, tail=tail, path=self.path)
                self.stats.up = True
                if fst.st_size >= offset and self._tail_matches(cur):
                    log.info("%s: resuming at offset %d from the checkpoint", self.path, offset)
                    return n + self._read_available()
                self._truncated(cur)  # truncated while we were down: finish the copy if any, restart at 0
                return n + self._read_available()
            os.close(fd)
        # rotated (or deleted) while we were down: finish that file, found by identity
        old = self._open_known(key, offset, tail)
        if old is not None:
            self._cur = old
            n += self._read_available(to_end=True)
            self._end_file(keep_reading=True)
            self.stats.rotations += 1
        else:
            log.warning("%s: the file being read at the last checkpoint is gone (deleted, or moved out of "
                        "its directory, while we were down); its lines after offset %d are lost", self.path, offset)
        return n + self._switch()

    def _restore_known(self, ck: dict) -> None:
        """The rotated and finished files of the checkpoint (a checkpoint of an older version
        has no ``done``: the siblings not modified after the checkpointed file are taken as
        finished)."""
        for e in ck.get("rotated") or ():
            try:
                key, off, tail = (int(e["dev"]), int(e["ino"])), int(e.get("offset", 0)), _unhex(e.get("tail"))
            except (KeyError, TypeError, ValueError):
                continue
            o = self._open_known(key, off, tail)
            if o is not None:
                self._keep_rotated(o)
        if "done" in ck:
            for e in ck.get("done") or ():
                try:
                    self._done[(int(e["dev"]), int(e["ino"]))] = (int(e["offset"]), _unhex(e.get("tail")))
                except (KeyError, TypeError, ValueError):
                    continue
            self._cap_done()
            return
        newer: set[str] = set()
        if not ck.get("absent"):
            old = _find_by_inode(self.path, ck.get("dev"), ck.get("ino"))
            newer = set(_rotated_after(self.path, old)) if old else set()
        skip = {(ck.get("dev"), ck.get("ino"))} | set(self._rotated)
        self._mark_history(lambda p, key: p not in newer and key not in skip)

    def _switch(self) -> int:
        """The file at the path is one we have not read. Read every sibling that is new to us
        (created and rotated away since we last looked: between two polls or while we were
        down) whole, oldest first, then the file at the path from its start.

        The siblings are listed before and after the path is opened, and the new ones are opened
        in between; until both lists agree (no rotation in between) it starts again, so a file
        rotated away while we look is neither missed nor read before an older one."""
        for attempt in range(8):
            before = _scan(self.path)
            try:
                fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                fd = None
            fst = os.fstat(fd) if fd is not None else None
            new_key = (fst.st_dev, fst.st_ino) if fst is not None else None
            opened, consistent = self._open_new(before, new_key)
            after = _scan(self.path)
            if (consistent and after.keys() == before.keys() and new_key not in after) or attempt == 7:
                break
            for o, _ in opened:
                os.close(o.fd)
            if fd is not None:
                os.close(fd)
        self._forget_missing(after.keys())
        n = 0
        for o, _ in _oldest_first(opened, os.path.basename(self.path)):
            self._keep_rotated(o)
            if o.offset == 0:
                log.info("%s: reading %s, rotated before we read it", self.path, o.path)
            n += self._read_whole_lines(o, limit=None)
        if fd is None:
            self.stats.up = False
            return n
        self._cur = _Open(fd=fd, dev=fst.st_dev, ino=fst.st_ino, offset=0, path=self.path)  # type: ignore[union-attr]
        self.stats.up = True
        return n + self._read_available()

    def _open_new(self, scan: dict, new_key: tuple[int, int] | None) -> tuple[list, bool]:
        """Open the siblings in ``scan`` that have lines we have not read: a file we do not know
        (from 0), or a finished one that grew (from where we stopped). Returns ``([(file, stat)],
        consistent)``; consistent is False when a name no longer held the file listed."""
        out = []
        for key, (p, st) in scan.items():
            if key == new_key or key in self._rotated or (self._cur and key == (self._cur.dev, self._cur.ino)):
                continue
            try:
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:  # renamed by a rotation since the listing
                return out, False
            except OSError as exc:  # unreadable (permissions): counted, the others are still read
                self.stats.errors += 1
                log.warning("following %s: cannot read the rotated file %s: %s", self.path, p, exc)
                continue
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != key:  # renamed by a rotation since the listing
                os.close(fd)
                return out, False
            o = _Open(fd=fd, dev=key[0], ino=key[1], offset=0, path=p)
            known = self._done.get(key)
            if known is not None and fst.st_size >= known[0] and _bytes_before(fd, known[0], known[1]):
                if fst.st_size == known[0]:
                    os.close(fd)
                    continue
                o.offset, o.tail = known  # a late writer added lines after we closed it
            out.append((o, fst))
        return out, True

    def _open_known(self, key: tuple[int, int], offset: int, tail: bytes) -> _Open | None:
        """The sibling with identity ``key`` whose bytes before ``offset`` are ``tail``, opened
        there; None when there is none (deleted, or its inode number now belongs to another file).
        A name that stops holding the file between the listing and the open (a rotation renamed
        it) is looked up again: the file must not be taken for a new one."""
        for _ in range(8):
            path = next((p for p, st in _siblings(self.path) if (st.st_dev, st.st_ino) == key), None)
            if path is None:
                return None
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                continue
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != key:
                os.close(fd)
                continue
            if fst.st_size >= offset and _bytes_before(fd, offset, tail):
                return _Open(fd=fd, dev=key[0], ino=key[1], offset=offset, tail=tail, path=path)
            os.close(fd)
            return None
        return None

    def _mark_history(self, keep: Callable[[str, tuple[int, int]], bool] | None = None) -> None:
        """Every sibling we are not reading is finished as it is now (at the first start: the
        backups before it are history; after a truncation: logrotate's copies of lines read).
        Listed again until no rotation renamed one while we looked (else a backup of the past
        would later be taken for a new file)."""
        cur = (self._cur.dev, self._cur.ino) if self._cur is not None else None
        for _ in range(8):
            scan, found, consistent = _scan(self.path), {}, True
            for key, (p, _st) in scan.items():
                if key == cur or key in self._rotated or key in self._done or (keep and not keep(p, key)):
                    continue
                try:
                    fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                except FileNotFoundError:
                    consistent = False
                    break
                except OSError:
                    continue
                try:
                    fst = os.fstat(fd)
                    if (fst.st_dev, fst.st_ino) != key:
                        consistent = False
                        break
                    start = max(0, fst.st_size - TAIL_BYTES)
                    found[key] = (fst.st_size, os.pread(fd, fst.st_size - start, start))
                except OSError:
                    continue
                finally:
                    os.close(fd)
            if consistent and _scan(self.path).keys() == scan.keys():
                break
        self._forget_missing(scan.keys())
        self._done.update(found)
        self._cap_done()

    def _forget_missing(self, present) -> None:
        """Finished files no longer next to the path are forgotten (their inode numbers may be reused)."""
        for key in [k for k in self._done if k not in present]:
            del self._done[key]

    def _cap_done(self) -> None:
        while len(self._done) > MAX_KNOWN:
            self._done.pop(next(iter(self._done)))

    def _read_rotated(self) -> int:
        """Whole lines appended to the rotated files still open (late writers); each is closed
        once it has not grown for ``rotated_grace`` seconds."""
        n = 0
        now = time.monotonic()
        for key, (o, seen) in list(self._rotated.items()):
            got = self._read_whole_lines(o, limit=self._max_read_per_poll)
            if got:
                self._rotated[key] = (o, now)
                n += got
            elif now - seen > self._rotated_grace:
                self._close_rotated(key)
        return n

    def _read_whole_lines(self, o: _Open, limit: int | None) -> int:
        """Whole lines of a rotated file from ``o.offset`` (at most about ``limit`` bytes; None:
        to its end); a partial last line stays unread (an over-long one passes in pieces)."""
        n = 0
        buf = b""
        try:
            while limit is None or n < limit:
                chunk = os.pread(o.fd, self._read_chunk, o.offset + len(buf))
                if not chunk:
                    break
                buf += chunk
                cut = buf.rfind(b"\n") + 1
                if not cut and len(buf) > self._max_pending:
                    cut = len(buf)
                if cut:
                    data, buf = buf[:cut], buf[cut:]
                    o.offset += cut
                    o.tail = (o.tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
                    n += cut
                    self.on_data(data)
        except OSError:
            pass
        if n:
            self.stats.bytes_read += n
            self.stats.recovered_bytes += n
            self.stats.last_data_at = time.monotonic()
        return n

    def _keep_rotated(self, o: _Open) -> None:
        self._done.pop((o.dev, o.ino), None)
        self._rotated[(o.dev, o.ino)] = (o, time.monotonic())

    def _close_rotated(self, key: tuple[int, int]) -> None:
        o, _ = self._rotated.pop(key)
        self._done[key] = (o.offset, o.tail)
        self._cap_done()
        try:
            os.close(o.fd)
        except OSError:
            pass

    # -- helpers --------------------------------------------------------------------------

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
        if cur is None:
            return True
        return _bytes_before(cur.fd, cur.offset, cur.tail)

    def _read_available(self, to_end: bool = False) -> int:
        """Read the current file from its offset: at most ``max_read_per_poll`` bytes, or all
        of it (``to_end``: a file rotated away is finished before the next one is read)."""
        cur = self._cur
        if cur is None:
            return 0
        total = 0
        while to_end or total < self._max_read_per_poll:
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
            fd, name = copy
            got = self._read_rest_of(fd, cur.offset)
            log.info("%s: read %d bytes written before the truncation from %s", self.path, got, name)
        else:
            self._deliver_all()
            self.on_end()
        cur.offset, cur.tail = 0, b""
        # the path kept its inode, so no file was rotated away: the siblings are copies of lines read
        self._mark_history()

    def _read_rest_of(self, fd: int, offset: int) -> int:
        """Read the copytruncate copy open as ``fd`` from ``offset`` (its bytes before it were
        checked) to its end, continuing the pending partial line, then flush, call on_end and
        close it."""
        total = 0
        try:
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
        self._deliver_all()
        self.on_end()
        return total


def _entry(dev: int, ino: int, offset: int, tail: bytes) -> dict:
    return {"dev": dev, "ino": ino, "offset": offset, "tail": tail.hex()}


def _unhex(s: object) -> bytes:
    try:
        return bytes.fromhex(s) if isinstance(s, str) else b""
    except ValueError:
        return b""


def _bytes_before(fd: int, offset: int, tail: bytes) -> bool:
    """True when the bytes of ``fd`` just before ``offset`` are ``tail`` (the file is the one
    read up to there)."""
    if not tail:
        return True
    n = len(tail)
    try:
        return offset >= n and os.pread(fd, n, offset - n) == tail
    except OSError:
        return False


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

    Wakes on a change in the followed files' directories and at least every ``poll_interval``
    seconds; polls at most once per ``min_interval`` seconds (batching bursts of writes: at
    0.25 s a busy log is read 4 times a second, each round's fixed cost (a wake-up, caches gone
    cold meanwhile) paid a fifth as often as at 0.05 s, for at most 0.2 s more latency). Each
    ``poll`` runs while holding ``lock``. On Linux the thread reads inotify itself
    (``inotify_simple``): no other thread, and however many ``write()`` calls the writer makes
    (vLLM's logging writes each line on its own), the kernel merges the events that arrive
    while a poll runs or the thread pauses, so a busy log costs at most one wake-up per
    ``min_interval``. Elsewhere, or when inotify cannot be had (its per-user instance limit),
    watchdog wakes it (its observer threads handle every event), else it only polls.
    ``after_poll()`` (optional) is called after each round, outside the lock;
    ``first_round()`` (optional) runs once in the thread before the first wait (the sidecar's
    first read), and :attr:`first_round_done` is set after it.
    """

    #: inotify events that can mean new bytes at a followed path: written, truncated, created,
    #: renamed away or to it, deleted (an overflowed queue is reported whatever the mask)
    INOTIFY_MASK = 0x2 | 0x40 | 0x80 | 0x100 | 0x200  # MODIFY, MOVED_FROM, MOVED_TO, CREATE, DELETE

    def __init__(self, followers: Iterable[LogFollower], lock: threading.Lock, *,
                 poll_interval: float = 1.0, min_interval: float = 0.25,
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
        self._inotify: Any = None  # inotify_simple.INotify, read by this thread
        self._poller: select.poll | None = None  # the inotify descriptor and the wake pipe
        self._wake_pipe: tuple[int, int] | None = None
        self._names = {os.path.basename(f.path) for f in self.followers}
        self._use_watchdog = use_watchdog
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-follow", daemon=True)
        self.rounds = 0

    @property
    def notifier(self) -> str:
        """What wakes the thread besides its timer: ``inotify``, ``watchdog`` or ``none``."""
        return "inotify" if self._inotify is not None else "watchdog" if self._observer is not None else "none"

    def start(self) -> None:
        """Start watching (inotify, else watchdog, if it can) and the polling thread."""
        if self._use_watchdog and not self._start_inotify():
            self._start_watchdog()
        self._thread.start()

    def wake(self) -> None:
        """Ask for a poll now (tests, and the watchdog handler)."""
        self._wake.set()
        if self._wake_pipe is not None:
            try:
                os.write(self._wake_pipe[1], b"w")
            except OSError:  # full (a wake-up is pending anyway) or closed (stopped)
                pass

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and the watching; the followers stay open (close them yourself)."""
        self._stop.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._observer = None
        if self._inotify is not None and not self._thread.is_alive():
            self._inotify.close()
            for fd in self._wake_pipe or ():
                os.close(fd)
            self._inotify = self._poller = self._wake_pipe = None

    def _start_inotify(self) -> bool:
        """Watch the followed files' directories with inotify, read by this thread; False
        where it cannot (not Linux, no directory yet, the per-user limit of inotify instances
        or watches reached)."""
        try:
            from inotify_simple import INotify
        except (ImportError, OSError):  # not Linux (inotify_simple is installed on Linux only)
            return False
        try:
            ino = INotify()
        except OSError as exc:  # EMFILE: fs.inotify.max_user_instances reached
            log.warning("inotify unavailable (%s); trying watchdog", exc)
            return False
        watched = 0
        for d in sorted({os.path.dirname(f.path) for f in self.followers}):
            if os.path.isdir(d):
                try:
                    ino.add_watch(d, self.INOTIFY_MASK)
                    watched += 1
                except OSError as exc:  # ENOSPC: fs.inotify.max_user_watches reached
                    log.warning("inotify cannot watch %s (%s); polling it every %.1f s", d, exc,
                                self.poll_interval)
        if not watched:
            ino.close()
            return False
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        poller = select.poll()
        poller.register(ino.fileno(), select.POLLIN)
        poller.register(r, select.POLLIN)
        self._inotify, self._poller, self._wake_pipe = ino, poller, (r, w)
        return True

    def _start_watchdog(self) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            log.warning("watchdog is not installed; polling every %.1f s", self.poll_interval)
            return
        names = self._names
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

    def _drain(self) -> bool:
        """Read what woke the poller: True when it is worth a poll (a change at a followed
        name, an overflowed event queue, a :meth:`wake`)."""
        woke = False
        if self._wake_pipe is not None:
            try:
                while os.read(self._wake_pipe[0], 512):
                    woke = True
            except BlockingIOError:
                pass
        for ev in self._inotify.read(timeout=0):
            if ev.mask & 0x4000 or ev.name in self._names:  # IN_Q_OVERFLOW: events were lost
                woke = True
        return woke

    def _wait(self, timeout: float) -> None:
        """Until a change, a :meth:`wake` or ``timeout`` seconds."""
        if self._poller is None:
            self._wake.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        while not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self._poller.poll(max(1, int(left * 1000))) or self._drain():
                return

    def _run(self) -> None:
        try:
            if self.first_round is not None:  # in this thread: a stalled file blocks nobody else
                self.first_round()
        except Exception:  # noqa: BLE001
            log.exception("first round failed")
        finally:
            self.first_round_done.set()
        last = 0.0
        busy = False  # the last round read bytes: a log being written has more min_interval later
        while not self._stop.is_set():
            if not busy:
                self._wait(self.poll_interval)
                if self._stop.is_set():
                    break
            pause = self.min_interval - (time.monotonic() - last)
            if pause > 0 and self._stop.wait(pause):  # the kernel merges the events of the writes meanwhile
                break
            self._wake.clear()
            if self._poller is not None and not busy:
                self._drain()  # what came before this poll is read by it
            last = time.monotonic()
            n = 0
            with self.lock:
                for f in self.followers:
                    n += f.poll()
            # while a log is being written, poll it every min_interval without reading inotify
            # (its events say what the next poll finds anyway); the first round that reads nothing
            # goes back to waiting on inotify (the events queued meanwhile cost one more round)
            busy = n > 0 and self._poller is not None
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


def save_checkpoints(path: str | os.PathLike[str], followers: Iterable[LogFollower],
                     extra: dict | None = None) -> None:
    """Write the followers' checkpoints to ``path`` atomically (temp file + rename), as state
    file version :data:`~vllm_doctor.ingest.statefile.STATE_VERSION`. ``extra``: more JSON
    sections stored beside ``files`` (the pipeline's snapshot: ``state``, ``sources``)."""
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
            json.dump({"version": STATE_VERSION, "files": files, **(extra or {})}, fh, indent=1, default=str)
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


def _last_line_end(fd: int, size: int, look_back: int = 1 << 16) -> int:
    """Offset just after the last newline in the final ``look_back`` bytes of ``fd`` (so a
    partial last line present at start is read whole once completed); ``size`` when there is
    none."""
    if size == 0:
        return 0
    start = max(0, size - look_back)
    data = os.pread(fd, size - start, start)
    i = data.rfind(b"\n")
    return size if i < 0 else start + i + 1


def _siblings(path: str) -> list[tuple[str, os.stat_result]]:
    """Files next to ``path`` whose name starts with its name (``vllm.log.1``,
    ``vllm.log-20261130``), with their ``stat``, newest first (at most ``MAX_SIBLINGS``),
    compressed ones left out."""
    d, base = os.path.split(path)
    out = []
    try:
        with os.scandir(d) as it:
            for e in it:
                if e.name != base and e.name.startswith(base) and not e.name.endswith(
                        (".gz", ".bz2", ".xz", ".zst")):
                    try:
                        out.append((e.path, e.stat()))
                    except OSError:
                        continue
    except OSError:
        return []
    out.sort(key=lambda ps: (ps[1].st_mtime_ns, ps[0]), reverse=True)
    return out[:MAX_SIBLINGS]


def _scan(path: str) -> dict[tuple[int, int], tuple[str, os.stat_result]]:
    """The regular sibling files of ``path`` by identity ``(st_dev, st_ino)``."""
    out: dict[tuple[int, int], tuple[str, os.stat_result]] = {}
    for p, st in _siblings(path):
        if stat_mod.S_ISREG(st.st_mode):
            out.setdefault((st.st_dev, st.st_ino), (p, st))
    return out


def _rotation_number(path: str, base: str) -> int | None:
    """``N`` of ``<base>.N`` (RotatingFileHandler's and logrotate's numbered backups)."""
    suffix = os.path.basename(path)[len(base):]
    return int(suffix[1:]) if suffix[:1] == "." and suffix[1:].isdigit() else None


def _oldest_first(files: list[tuple[_Open, os.stat_result]], base: str) -> list[tuple[_Open, os.stat_result]]:
    """Rotated files in the order they were written. Numbered backups of ``base`` (``.1`` the
    newest) are ordered by their number, which a rotation keeps exact; other names (dates) by
    modification time, then name (timestamps can tie on a coarse file system)."""
    nums = [_rotation_number(o.path, base) for o, _ in files]
    if all(n is not None for n in nums):
        return [f for _, f in sorted(zip(nums, files), key=lambda t: -t[0])]  # type: ignore[operator]
    return sorted(files, key=lambda f: (f[1].st_mtime_ns, f[0].path))


def _find_by_inode(path: str, dev: object, ino: object) -> str | None:
    for p, st in _siblings(path):
        if (st.st_dev, st.st_ino) == (dev, ino):
            return p
    return None


def _rotated_after(path: str, old: str) -> list[str]:
    """Rotated siblings of ``path`` written after ``old`` (by modification time): how a
    checkpoint without a list of finished files (an older version's) tells new files."""
    try:
        since = os.stat(old).st_mtime_ns
    except OSError:
        return []
    return [p for p, st in _siblings(path) if p != old and st.st_mtime_ns > since]


def _find_copy(path: str, cur: _Open) -> tuple[int, str] | None:
    """The copytruncate copy, opened: a sibling at least ``cur.offset`` long whose bytes before
    that offset equal the tail we read. Returns (descriptor, name)."""
    if cur.offset == 0 or not cur.tail:
        return None
    for p, st in _siblings(path):
        if st.st_size < cur.offset or (st.st_dev, st.st_ino) == (cur.dev, cur.ino):
            continue
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        if _bytes_before(fd, cur.offset, cur.tail):
            return fd, p
        os.close(fd)
    return None
