"""How vllm-doctor writes quantities for people: bytes, durations. A leaf module (it imports
nothing of vllm-doctor), shared by the rules' functions, the report, the sidecar and its pages."""

from __future__ import annotations

GiB = 1 << 30


def gib(b: float | None) -> float | None:
    """Bytes -> GiB (float)."""
    return None if b is None else b / GiB


def thousands(x: float | None) -> str | None:
    """``79392`` -> ``"79,392"`` (the integer part); None if None."""
    return None if x is None else f"{int(x):,}"


def human_bytes(b: float | None) -> str | None:
    """Bytes as a person reads them: ``4.0 MiB``, ``24.00 GiB``; None if None."""
    if b is None:
        return None
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{int(b)} B"


def human_duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``15 h``, ``3.2 d``."""
    s = abs(seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.1f} d"
