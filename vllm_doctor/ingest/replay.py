"""Replay a recorded vLLM log as if it were being written now.

``serve`` judges a live log by wall-clock windows (the last 5 minutes, ...), so a recorded
log appended as is would be "months old" and no rule would fire on it. :func:`restamp` rewrites
vLLM's logger timestamps (``INFO 06-16 21:24:15 ...`` and ``(APIServer pid=1) INFO 11-30
09:10:22 [file.py:1] ...``, every version's prefix) to a given time, leaving everything else
byte for byte. Used by the tests, the benchmark and demos.
"""

from __future__ import annotations

import re
import time

TS_RE = re.compile(rb"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")


def restamp(data: bytes, now: float | None = None) -> bytes:
    """``data`` with every vLLM logger timestamp replaced by ``now`` (epoch seconds, UTC;
    default time.time()). Lines without one are unchanged."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(time.time() if now is None else now)).encode()
    return TS_RE.sub(lambda m: m.group(1) + b" " + stamp, data)
