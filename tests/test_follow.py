"""The log follower against real files: rotation, copytruncate, truncation, delete/re-create,
late appearance, partial lines, checkpoint restarts and pipes. Each case proves that every
line written is delivered exactly once, in order."""

from __future__ import annotations

import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_doctor.ingest.follow import (
    FollowThread,
    LogFollower,
    PipeFollower,
    load_checkpoints,
    save_checkpoints,
)

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
REAL_LOG = FIXTURES / "cpu-preemption-tiny-kv-cache.log"
V0_STORM = FIXTURES / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log"


class Sink:
    """Records what a follower delivers; ``ends`` counts on_end calls."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ends = 0
        self.calls = 0

    def on_data(self, b: bytes) -> None:
        self.data += b
        self.calls += 1

    def on_end(self) -> None:
        """Like Pipeline.end: a flushed partial line is a line of its own."""
        self.ends += 1
        if self.data and not self.data.endswith(b"\n"):
            self.data += b"\n"

    @property
    def lines(self) -> list[bytes]:
        out = bytes(self.data).split(b"\n")
        return out[:-1] if out and out[-1] == b"" else out


def lines(n: int, start: int = 0, tag: str = "L") -> list[bytes]:
    return [f"INFO 11-30 09:11:{i % 60:02d} [loggers.py:335] {tag}{i} Running: {i} reqs\n".encode()
            for i in range(start, start + n)]


def append(path: Path, chunks) -> None:
    with open(path, "ab") as fh:
        for c in chunks:
            fh.write(c)


def follower(path: Path, sink: Sink, **kw) -> LogFollower:
    return LogFollower(path, sink.on_data, sink.on_end, **kw)


def test_starts_at_end_then_reads_appends(tmp_path):
    p = tmp_path / "vllm.log"
    append(p, lines(5))
    s = Sink()
    f = follower(p, s)
    assert f.poll() == 0 and s.lines == []
    append(p, lines(3, 5))
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in lines(3, 5)]
    assert f.stats.rotations == f.stats.truncations == 0 and f.stats.up


def test_from_start_reads_backlog_of_real_log(tmp_path):
    p = tmp_path / "vllm.log"
    shutil.copy(REAL_LOG, p)
    s = Sink()
    follower(p, s, from_start=True).poll()
    assert bytes(s.data) == REAL_LOG.read_bytes()
    assert len(s.lines) == 235


def test_partial_line_is_held_until_newline(tmp_path):
    p = tmp_path / "vllm.log"
    p.write_bytes(b"")
    s = Sink()
    f = follower(p, s)
    f.poll()
    append(p, [b"WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is pre"])
    f.poll()
    assert s.data == b""
    append(p, [b"empted by PreemptionMode.SWAP mode\nnext"])
    f.poll()
    assert s.lines == [b"WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is preempted by "
                       b"PreemptionMode.SWAP mode"]
    # a partial line present at start is read whole once completed
    s2 = Sink()
    f2 = follower(p, s2)
    f2.poll()
    append(p, [b" line\n"])
    f2.poll()
    assert s2.lines == [b"next line"]


def test_rename_create_rotation_drains_old_file(tmp_path):
    p = tmp_path / "vllm.log"
    written = lines(10)
    append(p, written)
    s = Sink()
    f = follower(p, s, from_start=True)
    f.poll()
    with open(p, "ab") as old_writer:  # vLLM keeps its handle while logrotate renames
        os.rename(p, tmp_path / "vllm.log.1")
        tail = lines(4, 10)
        for c in tail:
            old_writer.write(c)
        old_writer.write(b"partial-without-newline")
    f.poll()  # path missing: the old file is drained, nothing lost
    new = lines(6, 100)
    append(p, new)
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in written + tail] + [b"partial-without-newline"] + [
        x.rstrip(b"\n") for x in new]
    assert f.stats.rotations == 1 and s.ends == 1


def test_copytruncate_recovers_lines_written_before_copy(tmp_path):
    p = tmp_path / "vllm.log"
    a, b, c = lines(20), lines(7, 20), lines(5, 50)
    append(p, a)
    s = Sink()
    f = follower(p, s, from_start=True)
    f.poll()
    append(p, b)  # written, not yet read when logrotate copies + truncates
    shutil.copyfile(p, tmp_path / "vllm.log.1")
    with open(p, "r+b") as fh:
        fh.truncate(0)
    append(p, c)
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in a + b + c]
    assert f.stats.truncations == 1 and f.stats.rotations == 0
    assert f.stats.recovered_bytes == sum(map(len, b))


def test_truncation_without_copy_and_refill_larger(tmp_path):
    p = tmp_path / "vllm.log"
    append(p, lines(5))
    s = Sink()
    f = follower(p, s, from_start=True)
    f.poll()
    # truncated and refilled beyond the old size between two polls: only the tail check sees it
    with open(p, "r+b") as fh:
        fh.truncate(0)
    refill = lines(12, 200, tag="R")
    append(p, refill)
    assert p.stat().st_size > sum(map(len, lines(5)))
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in lines(5) + refill]
    assert f.stats.truncations == 1 and s.ends == 1


def test_delete_and_recreate(tmp_path):
    p = tmp_path / "vllm.log"
    append(p, lines(3))
    s = Sink()
    f = follower(p, s, from_start=True)
    f.poll()
    with open(p, "ab") as w:
        w.write(lines(1, 3)[0])
        os.unlink(p)
        w.write(lines(1, 4)[0])  # written to the deleted file while we still hold it
    f.poll()
    assert not f.stats.up
    append(p, lines(2, 10))
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in lines(5) + lines(2, 10)]
    assert f.stats.rotations == 1 and f.stats.up


def test_file_appearing_after_start_is_read_from_its_start(tmp_path):
    p = tmp_path / "late" / "vllm.log"
    s = Sink()
    f = follower(p, s)
    assert f.poll() == 0 and not f.stats.up
    p.parent.mkdir()
    append(p, lines(4))
    f.poll()
    assert s.lines == [x.rstrip(b"\n") for x in lines(4)]


def test_checkpoint_restart_neither_loses_nor_repeats(tmp_path):
    p, state = tmp_path / "vllm.log", tmp_path / "state" / "ck.json"
    append(p, lines(10))
    s1 = Sink()
    f1 = follower(p, s1, from_start=True)
    f1.poll()
    append(p, [b"half a li"])
    f1.poll()
    save_checkpoints(state, [f1])
    f1.close()
    append(p, [b"ne\n"] + lines(3, 10))  # written while the sidecar is down
    s2 = Sink()
    f2 = follower(p, s2, checkpoint=load_checkpoints(state)[str(p)])
    f2.poll()
    assert s2.lines == [b"half a line"] + [x.rstrip(b"\n") for x in lines(3, 10)]
    assert len(s1.lines) + len(s2.lines) == 14


def test_checkpoint_after_rotation_while_down(tmp_path):
    p, state = tmp_path / "vllm.log", tmp_path / "ck.json"
    append(p, lines(10))
    s1 = Sink()
    f1 = follower(p, s1, from_start=True)
    f1.poll()
    save_checkpoints(state, [f1])
    f1.close()
    append(p, lines(2, 10))  # still the old file
    os.rename(p, tmp_path / "vllm.log.1")
    append(p, lines(3, 20))  # the new file
    s2 = Sink()
    f2 = follower(p, s2, checkpoint=load_checkpoints(state)[str(p)])
    f2.poll()
    assert s2.lines == [x.rstrip(b"\n") for x in lines(2, 10) + lines(3, 20)]
    assert s2.ends == 1


def test_checkpoint_after_copytruncate_while_down(tmp_path):
    p, state = tmp_path / "vllm.log", tmp_path / "ck.json"
    append(p, lines(10))
    s1 = Sink()
    f1 = follower(p, s1, from_start=True)
    f1.poll()
    save_checkpoints(state, [f1])
    f1.close()
    append(p, lines(2, 10))
    shutil.copyfile(p, tmp_path / "vllm.log.1")
    os.truncate(p, 0)
    append(p, lines(1, 30))
    s2 = Sink()
    f2 = follower(p, s2, checkpoint=load_checkpoints(state)[str(p)])
    f2.poll()
    assert s2.lines == [x.rstrip(b"\n") for x in lines(2, 10) + lines(1, 30)]


def test_damaged_state_file_is_ignored(tmp_path):
    bad = tmp_path / "ck.json"
    bad.write_bytes(b"\x00{not json")
    assert load_checkpoints(bad) == {}
    assert load_checkpoints(tmp_path / "missing.json") == {}


def test_real_log_in_random_chunks_with_rotations(tmp_path):
    """A real vLLM log written in random pieces (cutting lines and UTF-8 characters), with a
    rename rotation and a copytruncate in between: the bytes delivered equal the bytes written."""
    data = REAL_LOG.read_bytes() + V0_STORM.read_bytes()
    rng = random.Random(7)
    p = tmp_path / "vllm.log"
    p.write_bytes(b"")
    s = Sink()
    f = follower(p, s)
    f.poll()
    pos, step = 0, 0
    while pos < len(data):
        n = rng.randint(1, 700)
        append(p, [data[pos:pos + n]])
        pos += n
        step += 1
        if step % 7 == 0:
            f.poll()
        if step == 25:
            os.rename(p, tmp_path / "vllm.log.1")
            p.write_bytes(b"")
        if step == 60:
            f.poll()
            shutil.copyfile(p, tmp_path / "vllm.log.2")
            os.truncate(p, 0)
    f.poll()
    f.close(flush=True)
    # a rotation or truncation flushes a partial line as its own line: compare lines, not bytes
    got = b"".join(bytes(s.data).split(b"\n"))
    assert got == b"".join(data.split(b"\n"))
    assert f.stats.rotations == 1 and f.stats.truncations == 1
    assert bytes(s.data).count(b"total_num_cumulative_preemption=151") == 1
    assert len(s.lines) == data.count(b"\n") + 2  # two partial lines flushed as lines


def test_pipe(tmp_path):
    r, w = os.pipe()
    s = Sink()
    pf = PipeFollower(r, s.on_data, s.on_end)
    pf.start()
    payload = REAL_LOG.read_bytes()
    for i in range(0, len(payload), 4096):
        os.write(w, payload[i:i + 4096])
    os.write(w, b"last line without newline")
    os.close(w)
    pf.join(10)
    os.close(r)
    assert not pf.stats.up and s.ends == 1
    assert bytes(s.data) == payload + b"last line without newline\n"


def test_follow_thread_wakes_on_inotify(tmp_path):
    """With a 30 s poll interval, only watchdog's inotify wake-up can deliver in time."""
    p = tmp_path / "vllm.log"
    append(p, lines(2))
    s = Sink()
    lock = threading.Lock()
    f = follower(p, s)
    f.poll()
    ft = FollowThread([f], lock, poll_interval=30.0, min_interval=0.0)
    ft.start()
    try:
        t0 = time.monotonic()
        append(p, lines(3, 2))
        while len(s.lines) < 3 and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert s.lines == [x.rstrip(b"\n") for x in lines(3, 2)]
        assert time.monotonic() - t0 < 5
    finally:
        ft.stop()
        f.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_follow_thread_reads_inotify_itself_and_merges_the_writes(tmp_path):
    """On Linux the follow thread reads inotify itself: it starts no other thread (watchdog's
    observer runs three, each woken by every event), a write wakes it within a 30 s poll
    interval, a line-by-line writer (vLLM's logging writes each line on its own) costs a few
    rounds, not one per write, a file beside the log wakes nothing, and stop() is prompt."""
    p = tmp_path / "vllm.log"
    p.write_bytes(b"")
    other = tmp_path / "other.txt"
    s = Sink()
    lock = threading.Lock()
    f = follower(p, s)
    f.poll()
    ft = FollowThread([f], lock, poll_interval=30.0, min_interval=0.2)
    before = threading.active_count()
    ft.start()
    try:
        assert ft.notifier == "inotify"
        assert threading.active_count() == before + 1  # the follow thread alone
        payload = lines(400)
        with open(p, "ab", buffering=0) as fh:
            for x in payload:
                fh.write(x)  # 400 write() calls
        deadline = time.monotonic() + 20
        while len(s.lines) < 400 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.lines == [x.rstrip(b"\n") for x in payload]
        time.sleep(0.5)  # events still queued are read by the next round
        rounds = ft.rounds
        assert rounds <= 10, rounds
        for _ in range(50):
            other.write_text("x")  # another file in the directory
        time.sleep(0.5)
        assert ft.rounds == rounds
    finally:
        ft.stop()
        f.close()
    assert not ft._thread.is_alive()  # stop() joined it (a write to the wake pipe ends its wait)


@pytest.mark.parametrize("over", [3 << 20])
def test_overlong_line_passes_in_pieces(tmp_path, over):
    p = tmp_path / "vllm.log"
    p.write_bytes(b"")
    s = Sink()
    f = follower(p, s, max_pending=1 << 20)
    f.poll()
    append(p, [b"x" * over])
    f.poll()
    assert over - (1 << 20) <= len(s.data) < over  # at most max_pending bytes held back
    append(p, [b"\n"] + lines(1))
    f.poll()
    assert len(s.data) == over + 1 + len(lines(1)[0])
    assert s.lines[-1] == lines(1)[0].rstrip(b"\n")


def test_unreadable_path_is_counted_not_fatal(tmp_path, caplog):
    d = tmp_path / "vllm.log"
    d.mkdir()  # a directory where the log should be
    s = Sink()
    f = follower(d, s, from_start=True)
    with caplog.at_level("WARNING", logger="vllm_doctor.ingest.follow"):
        for _ in range(5):
            assert f.poll() == 0
    assert f.stats.errors == 5 and not f.stats.up and "IsADirectoryError" in f.stats.last_error
    assert len([r for r in caplog.records if "following" in r.message]) == 1  # logged once
    d.rmdir()
    d.write_bytes(b"INFO 11-30 09:10:22 [api_utils.py:347] back\n")
    f.poll()
    assert s.lines == [b"INFO 11-30 09:10:22 [api_utils.py:347] back"] and f.stats.up
    assert f.stats.last_error is None


# -- the rotation matrix through the sidecar's wiring into the real pipeline -------------------

def v1_stats(i: int, preempted: int) -> bytes:
    """A V1 (0.11.1+) stats line; ``Preemptions: N`` is per interval, so the pipeline sums them:
    a line read twice would count its preemptions twice."""
    return (f"(APIServer pid=7) INFO 11-30 09:{i // 60 % 60:02d}:{i % 60:02d} [loggers.py:335] Engine 000: "
            f"Avg prompt throughput: 356.7 tokens/s, Avg generation throughput: 844.5 tokens/s, Running: 3 reqs, "
            f"Waiting: {i} reqs, Preemptions: {preempted}, GPU KV cache usage: 97.4%, Prefix cache hit rate: "
            f"0.0%\n").encode()


def _rename(p: Path) -> None:
    os.rename(p, p.with_name(p.name + ".1"))


def _copytruncate(p: Path) -> None:
    shutil.copyfile(p, p.with_name(p.name + ".1"))
    os.truncate(p, 0)


def _delete(p: Path) -> None:
    os.unlink(p)


@pytest.mark.parametrize("rotate", [_rename, _copytruncate, _delete, None],
                         ids=["rename-create", "copytruncate", "delete-recreate", "plain-append"])
@pytest.mark.parametrize("restart", [False, True], ids=["", "restart"])
def test_rotation_matrix_exact_counts_through_pipeline(tmp_path, rotate, restart):
    """Lines before the rotation (some read, some not yet), the rotation, lines after it; with
    ``restart`` the sidecar stops (checkpoint) before the rotation and a new one resumes after.
    Whatever happens: every line counted once, preemptions exactly the sum written (after a
    restart, by the resumed sidecar's own counters, restored from the checkpoint)."""
    from vllm_doctor.export.serve import Sidecar, load_config

    log, state = tmp_path / "vllm.log", tmp_path / "state.json"
    log.write_bytes(b"")
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "nvml": False,
                       "state_file": str(state)}, env={})
    sc = Sidecar(cfg)
    reader = sc.logs[0].reader
    reader.poll()
    rng = random.Random(3)
    written = lines_written = 0
    seen_lines = seen_pre = 0

    def write(n: int) -> None:
        nonlocal written, lines_written
        with open(log, "ab") as fh:
            for _ in range(n):
                k = rng.randint(0, 9)
                fh.write(v1_stats(lines_written, k))
                written += k
                lines_written += 1

    write(20)
    reader.poll()
    write(7)  # not read before the rotation
    if restart:  # the checkpoint carries the counters: the new sidecar continues them
        sc.save_checkpoint()
        reader.close()
    if rotate is not None:
        rotate(log)
        if rotate is _delete and not restart:
            reader.poll()  # the deleted file is drained while it is still open
    if rotate is _rename or rotate is _delete:
        log.write_bytes(b"")
    write(13)
    if restart:
        sc = Sidecar(cfg)
        reader = sc.logs[0].reader
    reader.poll()
    reader.poll()
    seen_lines += sc.pipeline.state.lines_total[str(log)]
    seen_pre += sc.pipeline.state.preemptions_total
    if rotate is _delete and restart:
        # deleted while the sidecar was down: the 7 unread lines went with the file
        assert seen_lines == lines_written - 7
        return
    assert seen_lines == lines_written == 40
    assert seen_pre == written
    assert sc.pipeline.unparsed(str(log)) == 0
    if rotate is not None and not restart:
        assert reader.stats.rotations + reader.stats.truncations == 1
