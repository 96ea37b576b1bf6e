"""Tie findings to a ladder: "this incident began at 8 concurrent requests".

``diagnose --bench RESULT`` and ``serve --bench RESULT`` read a ``bench ladder`` result and add a
note to each finding naming the level at which its incident began. The level is found two ways:

1. by time: the level whose wall-clock window (``started_at``..``ended_at``) holds the finding's
   first_seen (a live sidecar, or a log whose time stamps are the bench's);
2. by what the ladder itself measured, per incident: the first level with preemptions
   (preemption-storm), with a full KV cache (rules/thresholds.yaml ``kv_cache_full_ratio``) and a
   queue (kv-capacity-bound), with p99 TTFT over the ladder's ``--slo-ttft-ms`` (prefill-blocking), with failed requests (engine-dead, engine-stalled, runtime-oom).
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_doctor.loadtest.ladder import RESULT_KIND, level_key, level_name

_SLACK_SECONDS = 15.0  # vLLM logs its stats every 10 s: a line may trail its level a little


class BenchFileError(Exception):
    pass


def load_ladder(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise BenchFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchFileError(f"{path}: cannot read ({type(e).__name__})") from None
    except ValueError:
        raise BenchFileError(f"{path}: not JSON") from None
    except RecursionError:
        raise BenchFileError(f"{path}: JSON nested too deeply to be a bench ladder result") from None
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND or not isinstance(doc.get("levels"), list):
        raise BenchFileError(f"{path}: not a `vllm-doctor bench ladder` result")
    return doc


def _by_measure(name: str, levels: list[dict], slo_ttft_ms: float) -> tuple[dict, str] | None:
    from vllm_doctor.monitoring.bundle import load_thresholds

    full = load_thresholds()["kv_cache_full_ratio"]  # the rules' own "KV cache full"
    for lv in levels:
        pre = lv.get("preemptions") or 0
        kv = lv.get("max_kv_cache_usage_ratio") or 0.0
        waiting = lv.get("max_waiting") or 0.0
        errors = lv.get("errors") or 0
        p99 = (lv.get("ttft_ms") or {}).get("p99")
        if name == "preemption-storm" and pre > 0:
            return lv, f"first level with preemptions ({pre})"
        if name == "kv-capacity-bound" and ((kv >= full and waiting > 0) or pre > 0):
            return lv, (f"first level with the KV cache full ({kv * 100:.0f} %) and {waiting:.0f} waiting"
                        if kv >= full and waiting > 0 else f"first level with preemptions ({pre})")
        if name == "prefill-blocking" and p99 is not None and p99 > slo_ttft_ms:
            return lv, f"first level with p99 TTFT over {slo_ttft_ms:.0f} ms ({p99:.0f} ms)"
        if name in ("engine-dead", "engine-stalled", "runtime-oom") and errors > 0:
            return lv, f"first level with failed requests ({errors})"
    return None


def _order(lv: dict) -> float:
    """A level's place (its rate on a rate ladder); 0 for a level that does not say (a hand-made file)."""
    try:
        return level_key(lv)
    except (TypeError, ValueError):
        return 0.0


def began_at(result: dict, name: str, first_seen: float | None) -> str | None:
    """The note for one finding, or None when the ladder says nothing about it."""
    levels = sorted((lv for lv in result.get("levels", []) if isinstance(lv, dict)),
                    key=_order)
    if first_seen is not None:
        for lv in levels:
            s, e = lv.get("started_at"), lv.get("ended_at")
            if isinstance(s, (int, float)) and isinstance(e, (int, float)) and s <= first_seen <= e + _SLACK_SECONDS:
                return (f"bench ladder: began during the level of {level_name(lv)} "
                        f"(first seen inside that level's run)")
    slo = (result.get("config") or {}).get("slo_ttft_ms") or 500.0  # the ladder's own TTFT SLO
    hit = _by_measure(name, levels, float(slo))
    if hit:
        lv, why = hit
        return f"bench ladder: began at {level_name(lv)} ({why})"
    return None


def annotate(findings: list, result: dict) -> None:
    """Add the ladder note to each finding (``Finding.notes``), once."""
    for f in findings:
        note = began_at(result, f.name, f.first_seen)
        if note and note not in f.notes:
            f.notes.append(note)
