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

from .diagnosis import load_rules
from .errors import InputError
from .pipeline import Pipeline, Report, file_year, file_year_month

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
    """Binary: NUL bytes, or mostly non-text bytes, in the first 8 KiB."""
    if not head:
        return False
    sample = head[:8192]
    if b"\x00" in sample:
        return True
    text = sum(1 for b in sample if b >= 32 or b in (9, 10, 13, 27))
    return text / len(sample) < 0.85


def _read_some(fh, n: int) -> tuple[bytes, Exception | None]:
    """Up to n bytes; a truncated .gz gives what could be decompressed and the error."""
    parts: list[bytes] = []
    got = 0
    try:
        while got < n:
            b = fh.read(min(65536, n - got))
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
RANGE_BYTES = 64 << 20  # a worker's share at a time


def _scan_range(path: str, a: int, b: int) -> tuple[list[tuple[int, bytes]], int]:
    """Worker: the candidate lines of bytes [a, b) of ``path`` (a and b at line starts), numbered
    from 1 within the range, and the number of lines in the range. Memory: one chunk."""
    from .envelope import KeywordScanner, LineSplitter, candidate_lines

    scanner = _worker_scanner.get("s") or _worker_scanner.setdefault("s", KeywordScanner())
    sp = LineSplitter()
    out: list[tuple[int, bytes]] = []
    done = 0
    with open(path, "rb") as fh:
        fh.seek(a)
        left = b - a
        while True:
            chunk = fh.read(min(CHUNK * 4, left)) if left > 0 else b""
            left -= len(chunk)
            spans = sp.feed(chunk) if chunk else sp.flush()
            for buf, start, end in spans:
                cands, n = candidate_lines(scanner, buf, start, end)
                out.extend((done + i + 1, line) for i, line in cands)
                done += n
            if not chunk:
                return out, done


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
    """A large plain (not gzip, not CRI) regular file, on a machine with more than one core."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not (os.path.isfile(path) and st.st_size >= PARALLEL_MIN_BYTES and (os.cpu_count() or 1) > 1):
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096)
    from .envelope import CRI_RE

    first = head.split(b"\n", 1)[0][:200].decode("utf-8", "replace")
    return head[:2] != b"\x1f\x8b" and not _looks_binary(head) and not CRI_RE.match(first)


def _run_parallel(pipe: Pipeline, path: str, name: str) -> None:
    """The source stage on several cores: workers find candidate lines of byte ranges; this
    process feeds them, in file order, through the same envelope, parser, state and rules."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ranges = _ranges(path, os.stat(path).st_size)
    workers = min(os.cpu_count() or 2, 4, len(ranges))
    base = 0
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as ex:
        for cands, n in ex.map(_scan_range, [path] * len(ranges), *zip(*ranges)):
            pipe.feed_candidates(name, ((base + i, line) for i, line in cands), n)
            base += n
    pipe.end(name)


def diagnose(paths: list[str], rules_dirs=(), metrics_files=(), since: float | None = None,
             until: float | None = None) -> Report:
    """Diagnose vLLM logs. Returns the Report. Raises InputError, RuleLoadError.

    since / until: epoch seconds on the log's clock; only what happened between them is judged
    (the engine's start-up configuration is read wherever it is)."""
    if not paths:
        raise InputError("no input: give a log file, or - for standard input")
    ruleset = load_rules([Path(d) for d in rules_dirs])
    years = [file_year(p) for p in paths if p != "-"]
    pipe = Pipeline(ruleset, follow=False, base_year=next((y for y in years if y), None))
    pipe.time_range = (since, until)
    sources = [open_source(p) for p in paths]
    names = [n for n, _ in sources]
    if len(set(names)) != len(names):  # same base name in two folders: use the paths given
        sources = [(p, it) for p, (_, it) in zip(paths, sources)]
    for (name, _), path in zip(sources, paths):
        ym = file_year_month(path) if path != "-" else None
        if ym:
            pipe.source_times[name] = ym
    samples = [s for mf in metrics_files for s in load_metrics_file(mf)]
    # A capture is taken after the run it describes: it joins the state after the logs, and the
    # rules are judged once more with it (not before any log line was read).
    after = lambda: [pipe.observe(s) for s in samples]  # noqa: E731
    if len(paths) == 1 and paths[0] != "-" and os.environ.get("VLLM_DOCTOR_WORKERS") != "1" and _parallel_source(paths[0]):
        for _, it in sources:
            it.close()
        _run_parallel(pipe, paths[0], sources[0][0])
        after()
        pipe.active = pipe.engine.evaluate(pipe.state)
    else:
        pipe.run_files(sources, after=after)
    return pipe.report()


def load_metrics_file(path: str):
    """Samples in a saved vLLM /metrics capture (one exposition; ts = file mtime).

    Raises InputError if the file is missing or is not Prometheus text exposition."""
    from .sources.scrape import parse_metrics

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
