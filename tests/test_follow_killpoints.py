"""Exactly-once across a hard kill, at the follower's level and without timing (issue 10, item 3).

A kill -9 of the sidecar loses everything since its last checkpoint, which holds the followers'
offsets and the state that the lines read up to them produced (written together, under the
pipeline's lock, between two polls). Here that is modelled exactly: ``Run`` keeps the lines
delivered and, at each checkpoint, how many of them the checkpoint covers; a "kill" drops the
follower without closing it and cuts the delivered lines back to the checkpoint's count; the
restarted follower resumes from the checkpoint. The writer rotates like Python's
RotatingFileHandler (``.1`` -> ``.2`` ..., the log -> ``.1``, a new empty log), also from inside
a read (the writer does not wait for us), and can make every modification time equal (a
coarse-timestamp file system). After the last restart and a catch-up, the lines delivered must
equal the lines written, in order.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from vllm_doctor.ingest.follow import LogFollower

BACKUPS = 6
MODEL_BACKUPS = 60  # more than the rotations of a play: the model's writer never deletes a file


class Writer:
    """Appends numbered lines and rotates like RotatingFileHandler with ``BACKUPS`` backups."""

    def __init__(self, log: Path, backups: int = BACKUPS) -> None:
        self.log = log
        self.backups = backups
        self.n = 0
        self.written: list[bytes] = []
        self.rotations = 0
        self.deleted: list[list[bytes]] = []  # the lines of each backup the rotation deleted
        self._in_file: dict[str, list[bytes]] = {log.name: []}
        log.write_bytes(b"")

    def write(self, k: int) -> None:
        batch = []
        for _ in range(k):
            batch.append(f"INFO 11-30 09:11:{self.n % 60:02d} [loggers.py:335] line {self.n}\n".encode())
            self.n += 1
        with open(self.log, "ab") as fh:
            fh.write(b"".join(batch))
        self.written += batch
        self._in_file[self.log.name] += batch

    def rotate(self) -> None:
        name = self.log.name
        oldest = f"{name}.{self.backups}"
        if oldest in self._in_file:
            self.deleted.append(self._in_file.pop(oldest))
        for k in range(self.backups - 1, 0, -1):
            src = self.log.with_name(f"{name}.{k}")
            if src.exists():
                os.replace(src, self.log.with_name(f"{name}.{k + 1}"))
                self._in_file[f"{name}.{k + 1}"] = self._in_file.pop(f"{name}.{k}")
        os.replace(self.log, self.log.with_name(name + ".1"))
        self._in_file[name + ".1"] = self._in_file.pop(name)
        self.log.write_bytes(b"")
        self._in_file[name] = []
        self.rotations += 1

    def do(self, script: str) -> None:
        """``"3 R 5"``: write 3 lines, rotate, write 5 lines."""
        for step in script.split():
            self.rotate() if step == "R" else self.write(int(step))

    def coarse_mtimes(self) -> None:
        """Every file gets the same modification time (1-second or 2-second timestamps)."""
        t = int(os.stat(self.log).st_mtime)
        for p in self.log.parent.iterdir():
            if p.name.startswith(self.log.name):
                os.utime(p, (t, t))


class Run:
    """The sidecar as the checkpoint sees it: a follower, the lines it delivered, and the
    checkpoint (follower position + how many delivered lines the state then held)."""

    def __init__(self, log: Path, writer: Writer, rng: random.Random, meddle: float) -> None:
        self.log, self.writer, self.rng, self.meddle = log, writer, rng, meddle
        self.delivered: list[bytes] = []
        self._partial = b""
        self.ck: tuple[dict | None, int] = (None, 0)
        self.kills = 0
        self.meddled = 0
        self.f = self._new(None)

    def _new(self, ck: dict | None) -> LogFollower:
        f = LogFollower(self.log, self._on_data, self._on_end, checkpoint=ck)
        f.prepare()  # the sidecar's first round: prepare, checkpoint, then read
        self.checkpoint(f)
        return f

    def _on_data(self, b: bytes) -> None:
        data = self._partial + b
        *whole, self._partial = data.split(b"\n")
        self.delivered += [w + b"\n" for w in whole]
        if self.meddle and self.rng.random() < self.meddle:  # the writer goes on while we read
            self.meddled += 1
            self.writer.write(self.rng.randint(1, 5))
            if self.rng.random() < 0.6:
                self.writer.rotate()
                self.writer.write(self.rng.randint(0, 5))

    def _on_end(self) -> None:
        if self._partial:
            self.delivered.append(self._partial)
            self._partial = b""

    def checkpoint(self, f: LogFollower | None = None) -> None:
        f = f or self.f
        assert not self._partial, "the follower delivers whole lines"
        self.ck = (f.checkpoint(), len(self.delivered))

    def kill(self) -> None:
        """kill -9: the follower is dropped, its partial line undelivered (its descriptors are
        closed, as the kernel closes a dead process's); the state goes back to the checkpoint's."""
        self.kills += 1
        self.f.close(flush=False)
        ck, n = self.ck
        del self.delivered[n:]
        self._partial = b""
        self.f = self._new(ck)

    def during_read(self, call: int, script: str) -> list[int]:
        """The writer runs ``script`` inside the follower's ``call``-th delivery (1-based) of the
        next poll. Returns the list of calls seen."""
        calls: list[int] = []
        on_data = self.f.on_data

        def hooked(b: bytes) -> None:
            on_data(b)
            calls.append(1)
            if len(calls) == call:
                self.writer.do(script)

        self.f.on_data = hooked
        self.f.poll()
        self.f.on_data = on_data
        return calls

    def catch_up(self) -> None:
        """The writer stops; the follower reads what is left, then is closed."""
        self.meddle = 0.0
        for _ in range(3):
            self.f.poll()
        self.f.close()


def play(tmp_path: Path, seed: int, steps: int = 120, meddle: float = 0.15, coarse: bool = True) -> Run:
    rng = random.Random(seed)
    log = tmp_path / "vllm.log"
    w = Writer(log, backups=MODEL_BACKUPS)
    run = Run(log, w, rng, meddle)
    for _ in range(steps):
        op = rng.random()
        if op < 0.30:
            w.write(rng.randint(1, 12))
        elif op < 0.45:
            w.rotate()
        elif op < 0.70:
            run.f.poll()
        elif op < 0.82:
            run.checkpoint()
        elif op < 0.92:
            run.kill()
        elif coarse:
            w.coarse_mtimes()
    run.catch_up()
    return run


@pytest.mark.parametrize("seed", range(40))
def test_any_interleaving_of_writes_rotations_polls_checkpoints_and_kills(tmp_path, seed):
    run = play(tmp_path, seed)
    w = run.writer
    assert not w.deleted and w.rotations < MODEL_BACKUPS, "the model keeps every file"
    assert run.kills and w.rotations
    assert len(run.delivered) == len(w.written) and run.delivered == w.written, (
        seed, len(run.delivered), len(w.written))


def started(tmp_path: Path, read: int = 10, kill: bool = True) -> tuple[Path, Writer, Run]:
    """A follower that has read ``read`` lines; with ``kill``: checkpointed there and killed."""
    log = tmp_path / "vllm.log"
    w = Writer(log)
    run = Run(log, w, random.Random(0), meddle=0)
    w.write(read)
    run.f.poll()
    if kill:
        run.checkpoint()
        run.kill()
    return log, w, run


def test_rotated_again_while_the_restarted_follower_reads_the_old_file(tmp_path):
    """The kill loop's lost file: killed on file A; while down the log rotates once (B); the
    restarted follower finishes A, and while it does the log rotates again (B -> .1, C). B was
    at the path when the follower looked and is a backup when it opens the path."""
    _, w, run = started(tmp_path)
    w.do("3 R 7")  # A's last lines, B
    assert run.during_read(1, "2 R 4")  # B's last lines, C
    run.catch_up()
    assert run.delivered == w.written


def test_rotated_again_while_a_poll_reads_a_file_rotated_between_polls(tmp_path):
    _, w, run = started(tmp_path, kill=False)
    w.do("3 R 7 R 2")  # B was never seen by the follower; C
    assert len(run.during_read(2, "1 R 4")) >= 2  # 1: draining A; 2: reading B
    run.catch_up()
    assert run.delivered == w.written


def test_files_read_at_restart_are_not_read_again_at_the_next_rotation(tmp_path):
    _, w, run = started(tmp_path)
    w.do("3 R 5 R 6")
    run.f.poll()  # finishes A, reads B whole, then C
    assert run.delivered == w.written
    w.do("2 R 1")
    run.f.poll()
    run.checkpoint()
    run.kill()
    w.do("R 3")
    run.catch_up()
    assert run.delivered == w.written


@pytest.mark.parametrize("tie", ["equal", "backwards"])
def test_modification_times_do_not_decide_which_files_are_new(tmp_path, tie):
    """Rotated twice while down, on a file system whose timestamps tie (or a copy tool that set
    them back): the file between the checkpointed one and the current one is still read."""
    log, w, run = started(tmp_path)
    w.do("3 R 5 R 6")
    t = log.with_name("vllm.log.2").stat().st_mtime_ns
    os.utime(log.with_name("vllm.log.1"), ns=(t, t if tie == "equal" else t - 10**9))
    run.catch_up()
    assert run.delivered == w.written


def test_rotated_while_absent_before_the_first_open(tmp_path):
    """The log did not exist at start; before the first poll it was created, written and
    rotated (never opened by us): both files are read, the older first."""
    log = tmp_path / "vllm.log"
    f_lines: list[bytes] = []
    f = LogFollower(log, f_lines.append)
    f.prepare()
    ck = f.checkpoint()
    assert ck and ck.get("absent")
    w = Writer(log)
    w.write(4)
    w.rotate()
    w.write(2)
    f2 = LogFollower(log, f_lines.append, checkpoint=ck)  # a restart from that checkpoint
    f2.poll()
    assert b"".join(f_lines) == b"".join(w.written)


def test_history_present_at_start_is_not_read(tmp_path):
    """Backups present at the very first start are history: a rotation later does not read them."""
    log = tmp_path / "vllm.log"
    w = Writer(log)
    w.do("5 R 5 R 3")
    before = len(w.written)
    run = Run(log, w, random.Random(0), meddle=0)
    w.write(4)
    run.f.poll()
    w.do("R 2")
    run.f.poll()
    run.kill()
    w.do("R 1")
    run.catch_up()
    assert run.delivered == w.written[before:]


def test_more_rotations_than_backups_while_down_loses_only_the_deleted_files(tmp_path):
    """Rotated more often than there are backups while the sidecar was down: the writer itself
    deleted the checkpointed file and the next one; every line that still exists is read once,
    in order, and nothing else. (Say so in a test's truth, or keep enough backups.)"""
    log = tmp_path / "vllm.log"
    w = Writer(log, backups=2)
    run = Run(log, w, random.Random(0), meddle=0)
    w.write(6)
    run.f.poll()
    run.checkpoint()
    run.kill()
    w.do("3 R 3 R 3 R 3 R 2")
    run.catch_up()
    assert [len(x) for x in w.deleted] == [9, 3]
    # lines 0-5 were read before the checkpoint; 6-11 went with the deleted files
    assert run.delivered == w.written[:6] + w.written[12:]


def rotate_after_first(monkeypatch, name: str, w: Writer, script: str) -> list[int]:
    """Make the follower's ``name`` (a directory listing) run ``script`` right after its first
    call returns: a rotation between looking and opening."""
    from vllm_doctor.ingest import follow
    real, calls = getattr(follow, name), []

    def listing_then_rotate(path):
        out = real(path)
        if not calls:
            calls.append(1)
            w.do(script)
        return out

    monkeypatch.setattr(follow, name, listing_then_rotate)
    return calls


def test_rotated_between_listing_the_siblings_and_opening_the_path(tmp_path, monkeypatch):
    """The follower lists the siblings, then opens the path: a rotation in between makes it look
    again, so the file that was at the path is read, and before the newer one."""
    _, w, run = started(tmp_path, read=5, kill=False)
    w.do("R 3")  # B: at the path when the follower lists the siblings
    calls = rotate_after_first(monkeypatch, "_scan", w, "2 R 4")
    run.catch_up()
    assert calls and run.delivered == w.written


def test_checkpointed_file_renamed_while_the_restarted_follower_looks_it_up(tmp_path, monkeypatch):
    """At the restart the checkpointed file is found by identity among the siblings; a rotation
    renames it between that listing and the open: it is looked up again (taking it for a new
    file would read its first lines twice)."""
    _, w, run = started(tmp_path, read=6)
    w.do("2 R 3")
    calls = rotate_after_first(monkeypatch, "_siblings", w, "R 1")
    run.catch_up()
    assert calls and run.delivered == w.written


def test_checkpoint_of_an_older_version_without_finished_files(tmp_path):
    """A state file written before the finished files were recorded: the siblings modified
    after the checkpointed file are the new ones (the old rule); the older backups are not
    read again."""
    log = tmp_path / "vllm.log"
    w = Writer(log)
    w.do("4 R")  # a backup from before: history
    run = Run(log, w, random.Random(0), meddle=0)
    w.write(6)
    run.f.poll()
    run.checkpoint()
    ck, n = run.ck
    run.ck = ({k: v for k, v in ck.items() if k not in ("done", "rotated")}, n)
    run.kill()
    w.do("1 R 3 R 2")
    t = log.with_name("vllm.log.2").stat().st_mtime_ns
    os.utime(log.with_name("vllm.log.1"), ns=(t + 10**9, t + 10**9))
    run.catch_up()
    assert run.delivered == w.written[4:]
