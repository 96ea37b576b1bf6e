"""The /metrics series vLLM exports, per version, as exposed (counters with ``_total``, histograms
with ``_bucket``/``_sum``/``_count``): a view of the catalogue (vllm_doctor/catalogue.py,
``data/vllm_metrics.json``, generated from every vLLM release's wheel by
tools/gen_metrics_catalogue.py). ``(type, [(first, last), ...])``; a range covers V0 and V1
releases alike (the union) and every patch of its first and last minor."""

from __future__ import annotations

from vllm_doctor import catalogue as cat

HIST_SUFFIXES = cat.HIST_SUFFIXES

#: family name -> (type, ranges of examined releases)
SERIES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    n: (f.type, [tuple(r) for r in f.versions]) for n, f in cat.vllm_families().items()}


def lookup(name: str) -> tuple[str, str, list] | None:
    """(family name, type, ranges) of an exposed series name, or None if vLLM never exports it.
    ``vllm:e2e_request_latency_seconds_bucket`` -> the histogram; a counter's ``_created`` too."""
    f = cat.family(name)
    if f is None or f.name not in cat.vllm_families():
        return None
    return f.name, f.type, list(f.versions)


def exported(name: str, version: str) -> bool:
    return cat.exported(name, version)


def names_in(version: str) -> list[str]:
    return cat.names_in(version)


def kind(name: str) -> str | None:
    """gauge | counter | histogram | ... (a ``_bucket``/``_sum``/``_count`` series: histogram) or None."""
    hit = lookup(name)
    return hit[1] if hit else None


#: Series vllm-doctor's own sidecar exports (the catalogue's ``sidecar`` part, from which
#: vllm_doctor/export/collectors.py builds its families). Some carry the names the tuning note
#: invented, so the note's queries match when Prometheus scrapes the sidecar (port 9401) rather than vLLM.
SIDECAR_SERIES: dict[str, str] = {}
for _f in cat.sidecar_families().values():
    for _s in (_f.name, *_f.samples):
        SIDECAR_SERIES.setdefault(_s, _f.type)
