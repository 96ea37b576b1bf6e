"""Runs a long-lived vllm-doctor command (`watch`, `serve`) as a script's background job runs it
(SIGINT inherited as ignored) and stops it with a signal; the child never outlives the test."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # what `cmd &` in a non-interactive shell does


def stop_with(sig: int, args: list[str], out: Path, ready: Callable[[str], bool], timeout: float = 60) -> tuple[int | None, str]:
    """Start ``python -m vllm_doctor *args`` with SIGINT ignored, output to ``out``; once ``ready(output)``
    send ``sig``; (its exit code, or None when it did not stop within 15 s, and the output). The
    process is killed in any case before returning."""
    with out.open("w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "vllm_doctor", *args], stdout=fh, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, preexec_fn=_ignore_sigint)
        try:
            deadline = time.monotonic() + timeout
            while not ready(out.read_text()) and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.2)
            assert p.poll() is None, f"exited before the signal:\n{out.read_text()[-2000:]}"
            p.send_signal(sig)
            try:
                code: int | None = p.wait(15)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return code, out.read_text()
