"""One-shot reading for ``diagnose``: log files from start to end through the one pipeline.

Sources: a path (plain text or ``.gz``), or ``-`` for standard input. Several files of one
deployment are merged in time order. A single large plain file is scanned on all cores (worker
processes find the candidate lines of byte ranges; this process parses them in order);
``VLLM_DOCTOR_WORKERS=1`` keeps one process. ``--metrics FILE``: a saved vLLM /metrics capture adds what
logs cannot show (V1 preemptions).
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from vllm_doctor.diagnosis import load_rules
from vllm_doctor.errors import InputError
from vllm_doctor.pipeline import Pipeline, Report, Scanned, bom_encoding, file_year, file_year_month

CHUNK = 1 << 20


def _chunks(fh, first: bytes = b"") -> Iterator[bytes]:
    if first:
        yield first
    while True:
        b = fh.read(CHUNK)
        if not b:
            return
        yield b


def _looks_binary(head: bytes) -> bool:
    """Binary: NUL bytes, or mostly non-text bytes, in the first 8 KiB (UTF-16/32 text with a
    byte-order mark is text: the pipeline decodes it)."""
    if not head:
        return False
    enc = bom_encoding(head[:8192])
    if enc is not None:
        head = head[enc[1]:8192].decode(enc[0], "replace").encode("utf-8")
    sample = head[:8192]
    if b"\x00" in sample:
        return True
    text = sum(1 for b in sample if b >= 32 or b in (9, 10, 13, 27))
    return text / len(sample) < 0.85


def _read_some(fh, n: int) -> tuple[bytes, Exception | None]:
    """Up to n bytes; a truncated .gz gives what could be decompressed and the error (read in
    64 KiB pieces for that; a plain file in one read: no copy of a MiB out of 16 pieces)."""
    parts: list[bytes] = []
    got = 0
    piece = 65536 if isinstance(fh, gzip.GzipFile) else n
    try:
        while got < n:
            b = fh.read(min(piece, n - got))
            if not b:
                break
            parts.append(b)
            got += len(b)
    except (OSError, EOFError) as e:
        return b"".join(parts), e
    return b"".join(parts), None


@contextmanager
def _input_errors(path: str, kind: str) -> Iterator[None]:
    """OS errors while opening or reading a ``kind`` ("log" or "metrics") file -> InputError."""
    try:
        yield
    except FileNotFoundError:
        raise InputError(f"{path}: no such {'file' if kind == 'log' else kind + ' file'}") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a {kind} file") from None
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None


def check_readable(path: str, kind: str = "log") -> None:
    """InputError (the same words as reading it) unless ``path`` exists, is not a directory and can be
    read; never opens it (a FIFO without a writer would block)."""
    with _input_errors(path, kind):
        if Path(path).is_dir():
            raise IsADirectoryError(path)
        os.stat(path)
        if not os.access(path, os.R_OK):
            raise PermissionError(path)


def open_source(path: str) -> tuple[str, Iterator[bytes]]:
    """(display name, byte chunks) for a path, a pipe or FIFO (``<(kubectl logs ...)``), or "-".

    Raises InputError with a one-line reason: missing, a directory, permission denied, binary."""
    if path == "-":
        raw = sys.stdin.buffer
        name = "-"
    else:
        p = Path(path)
        with _input_errors(path, "log"):
            if p.is_dir():
                raise IsADirectoryError(path)
            raw = open(p, "rb")
        name = p.name if p.is_file() else path  # a pipe (/dev/fd/63) keeps its path
    with _input_errors(path, "log"):
        br = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)
        fh = gzip.GzipFile(fileobj=br, mode="rb") if br.peek(2)[:2] == b"\x1f\x8b" else br
        head, err = _read_some(fh, CHUNK)
        # A copytruncate hole: logrotate truncated the file while vLLM kept writing at its old
        # offset, so the file starts with NUL bytes, then the log (serve reads past them too).
        while head[:1] == b"\x00" and err is None:
            rest = head.lstrip(b"\x00")
            if rest:
                head = rest
                break
            head, err = _read_some(fh, CHUNK)
    if _looks_binary(head):
        raise InputError(f"{path}: binary data, not a text log")

    def gen() -> Iterator[bytes]:
        try:
            if head:
                yield head
            if err is None:
                while True:
                    b, e = _read_some(fh, CHUNK)
                    if b:
                        yield b
                    if e is not None:
                        raise e
                    if not b:
                        break
            else:
                raise err
        except (OSError, EOFError) as e:  # a truncated .gz: keep what was read
            print(f"vllm-doctor: {path}: input ends early ({e}); diagnosing what was read", file=sys.stderr)
        finally:
            fh.close()

    return name, gen()


PARALLEL_MIN_BYTES = 64 << 20  # below this one process is faster than starting workers
RANGE_BYTES = 2 << 20  # a worker's share at a time (bounds what one result holds)


def _scan_range(path: str, a: int, b: int) -> tuple[bytes, array, array, int]:
    """Worker: the candidate lines of bytes [a, b) of ``path`` (a and b at line starts), as one
    blob of the lines end to end, the end of each line in it, their line indexes within the range
    (from 0), and the number of lines in the range. Compact (no object per line, here or in the
    main process), so that results waiting to be parsed stay small."""
    from array import array

    from vllm_doctor.ingest.envelope import candidate_spans
    from vllm_doctor.parsers.records import keyword_scanner

    scanner = _worker_scanner.get("s") or _worker_scanner.setdefault("s", keyword_scanner())
    with open(path, "rb") as fh:
        fh.seek(a)
        buf = fh.read(b - a)
    end = len(buf) - 1 if buf.endswith(b"\n") else len(buf)
    starts, ends, idxs, n, _ = candidate_spans(scanner, buf, 0, end)
    if not buf:
        n = 0
    view = memoryview(buf)
    blob = bytearray()
    blob_ends = array("I")
    for s, e in zip(starts, ends):
        blob += view[s:e]
        blob_ends.append(len(blob))
    view.release()
    return bytes(blob), blob_ends, array("I", idxs), n


_worker_scanner: dict = {}


def _ranges(path: str, size: int) -> list[tuple[int, int]]:
    """Byte ranges of about RANGE_BYTES, each starting at a line start."""
    cuts = [0]
    with open(path, "rb") as fh:
        pos = RANGE_BYTES
        while pos < size:
            fh.seek(pos)
            fh.readline()  # to the end of the line that crosses the cut
            nxt = fh.tell()
            if nxt >= size:
                break
            if nxt > cuts[-1]:
                cuts.append(nxt)
            pos = nxt + RANGE_BYTES
    cuts.append(size)
    return [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def _parallel_source(path: str) -> bool:
    """A large plain (not gzip, not UTF-16/32) regular file, on a machine with more than one core."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not (os.path.isfile(path) and st.st_size >= PARALLEL_MIN_BYTES and (os.cpu_count() or 1) > 1):
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096)
    return head[:2] != b"\x1f\x8b" and bom_encoding(head) is None and not _looks_binary(head)


def _die_with_parent(parent: int) -> None:
    """A scan worker ends when diagnose ends, however it ends (SIGTERM, SIGKILL): Linux's
    PR_SET_PDEATHSIG sends it SIGTERM when its parent dies; elsewhere the pool's own shutdown
    is all there is."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


def scan_parallel(path: str, workers: int | None = None) -> Iterator[Scanned]:
    """The source stage on several cores: workers find the candidate lines of byte ranges; the
    blocks come back in file order, at most two per worker waiting, so memory stays bounded
    whatever the file (a record split over lines at a range boundary is whole in neither range:
    ranges start at line starts, and CRI/docker pieces are rare and short)."""
    import gc
    import multiprocessing
    from array import array
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    from vllm_doctor.parsers.records import keyword_scanner

    ranges = _ranges(path, os.stat(path).st_size)
    workers = workers or min(os.cpu_count() or 2, 4, len(ranges))
    keyword_scanner()  # its database built here, once: the forked workers inherit it
    # The workers are forked: they share this process's pages until either side writes to them.
    # The objects that exist now (modules, the rules, the pipeline) are put out of the garbage
    # collector's reach (gc.freeze) while the workers live, so that a collection in either
    # process does not write to them and the shared pages stay shared (counted once in the
    # process tree's PSS).
    gc.freeze()
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                 initializer=_die_with_parent, initargs=(os.getpid(),)) as ex:
            pending: deque = deque()
            it = iter(ranges)
            for a, b in it:
                pending.append(ex.submit(_scan_range, path, a, b))
                if len(pending) >= 2 * workers:
                    break
            while pending:
                blob, ends, idx, n = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(ex.submit(_scan_range, path, *nxt))
                yield Scanned(blob, array("I", [0]) + ends[:-1] if ends else ends, ends, idx, n)
    finally:
        gc.unfreeze()


def _pipeline(paths: list[str], ruleset, year: int | None = None) -> tuple[Pipeline, list]:
    """The pipeline for ``paths`` and its sources: the one intake of every one-shot command
    (one file, several merged, stdin, .gz, a large file scanned on all cores).
    year: the year of vLLM's year-less timestamps (default: each file's modification time)."""
    if not paths:
        raise InputError("no input: give a log file, or - for standard input")
    years = [file_year(p) for p in paths if p != "-"] if year is None else [year]
    pipe = Pipeline(ruleset, base_year=next((y for y in years if y), None))
    sources = [open_source(p) for p in paths]
    names = [n for n, _ in sources]
    if len(set(names)) != len(names):  # same base name in two folders: use the paths given
        sources = [(p, it) for p, (_, it) in zip(paths, sources)]
    if year is None:
        for (name, _), path in zip(sources, paths):
            ym = file_year_month(path) if path != "-" else None
            if ym:
                pipe.source_times[name] = ym
    if len(paths) == 1 and paths[0] != "-" and os.environ.get("VLLM_DOCTOR_WORKERS") != "1" and _parallel_source(paths[0]):
        for _, it in sources:
            it.close()
        sources = [(sources[0][0], scan_parallel(paths[0]))]
    return pipe, sources


def diagnose(paths: list[str], rules_dirs=(), metrics_files=(), since: float | None = None,
             until: float | None = None) -> Report:
    """Diagnose vLLM logs. Returns the Report. Raises InputError, RuleLoadError.

    since / until: epoch seconds on the log's clock; only what happened between them is judged
    (the engine's start-up configuration is read wherever it is)."""
    ruleset = load_rules([Path(d) for d in rules_dirs])
    pipe, sources = _pipeline(paths, ruleset)
    pipe.time_range = (since, until)
    samples = [s for mf in metrics_files for s in load_metrics_file(mf)]
    # A capture is taken after the run it describes: it joins the state after the logs, and the
    # rules are judged once more with it (not before any log line was read).
    after = lambda: [pipe.observe(s) for s in samples]  # noqa: E731
    pipe.run(sources, after=after)
    if (mixed := pipe.mixed_servers()) is not None:
        raise InputError(mixed)
    return pipe.report()


def events(paths: list[str], sink, year: int | None = None) -> None:
    """Every typed event the logs give, in pipeline order, to ``sink(event)`` (the ``events``
    command). The same intake and stages as :func:`diagnose`; no rules."""
    from vllm_doctor.diagnosis.loader import RuleSet

    pipe, sources = _pipeline(paths, RuleSet((), {}), year)
    pipe.on_event = sink
    pipe.run(sources)


def event_dict(e) -> dict:
    """A typed event as plain JSON values: ``event`` (its class name, the kind the rules name), where it came from, then
    its fields (tuples as lists, None kept)."""
    import dataclasses

    meta = e.meta
    out: dict = {"event": type(e).__name__, "source": meta.source, "lineno": meta.lineno,
                 "end_lineno": meta.end_lineno, "ts": meta.ts, "process": meta.process, "level": meta.level}
    for f in dataclasses.fields(e):
        if f.name != "meta":
            out[f.name] = _plain(getattr(e, f.name))
    out["text"] = meta.text
    return out


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def load_metrics_file(path: str):
    """Samples in a saved vLLM /metrics capture (one exposition; ts = file mtime).

    Raises InputError if the file is missing or is not Prometheus text exposition."""
    from vllm_doctor.ingest.scrape import parse_metrics

    p = Path(path)
    with _input_errors(path, "metrics"):
        text = p.read_text(errors="replace")
    try:
        ts = os.stat(p).st_mtime
    except OSError:
        ts = time.time()
    if "vllm:" not in text:
        raise InputError(f"{path}: not a vLLM /metrics capture (no vllm: series)")
    sample = parse_metrics(text, now=ts, source=p.name).sample
    # No timestamp: a capture belongs to the whole log, whatever its file time.
    return [replace(sample, meta=replace(sample.meta, ts=None))]
