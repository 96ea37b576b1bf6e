"""The catalogue of /metrics series: vLLM's (every release 0.2 .. newest) and vllm-doctor's sidecar's.

Data: ``vllm_doctor/data/vllm_metrics.json``. Its ``vllm`` part is generated from vLLM's released
wheels by ``tools/gen_metrics_catalogue.py`` (``make metrics``): every ``vllm:`` family with its
type, labels, unit, documentation, the examined releases it is defined in (``versions``: runs of
consecutive releases, each the newest patch of its minor), those where it sits behind
``--show-hidden-metrics-for-version`` and its renames. Its ``sidecar`` part is the sidecar's own
series (vllm_doctor/export/collectors.py builds its families and ``describe()`` from it).

A family is keyed by the name a query uses: a counter's ``_total`` name, a histogram's base name
(its samples add ``_bucket`` / ``_sum`` / ``_count``), an info's ``_info`` name.

No module spells a vLLM series name by hand: ``V.kv_cache_usage_perc`` is
``"vllm:kv_cache_usage_perc"`` (an ``AttributeError`` at import when the catalogue has no such
series), ``names(V.kv_cache_usage_perc)`` the name and its older names, newest first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from packaging.version import Version

from vllm_doctor.versions import parse_version

HIST_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Family:
    """One metric family as exposed (``name``: the name a query uses)."""

    name: str
    type: str  # gauge | counter | histogram | summary | info
    samples: tuple[str, ...]
    labels: tuple[str, ...]
    unit: str
    documentation: str
    versions: tuple[tuple[str, str], ...] = ()  # examined releases it is defined in (vLLM's series)
    hidden_versions: tuple[tuple[str, str], ...] = ()
    engines: tuple[str, ...] = ()
    defined_as: str = ""  # the name given to the client library (a counter's without _total)


@lru_cache(maxsize=1)
def data() -> dict:
    return json.loads(resources.files("vllm_doctor").joinpath("data/vllm_metrics.json").read_text())


def _family(name: str, d: dict) -> Family:
    return Family(name, d["type"], tuple(d.get("samples") or _samples(name, d["type"])), tuple(d.get("labels") or ()),
                  d.get("unit", ""), d.get("documentation", ""),
                  tuple(tuple(r) for r in d.get("versions", ())), tuple(tuple(r) for r in d.get("hidden_versions", ())),
                  tuple(d.get("engines", ())), d.get("defined_as") or name)


def _samples(name: str, kind: str) -> tuple[str, ...]:
    return tuple(name + s for s in HIST_SUFFIXES) if kind == "histogram" else (name,)


@lru_cache(maxsize=1)
def vllm_families() -> dict[str, Family]:
    """Every ``vllm:`` family of every examined release."""
    return {n: _family(n, d) for n, d in data()["vllm"].items()}


@lru_cache(maxsize=1)
def sidecar_families() -> dict[str, Family]:
    """The sidecar's own families (export/collectors.py)."""
    return {n: _family(n, d) for n, d in data()["sidecar"].items()}


@lru_cache(maxsize=1)
def _by_sample() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for fams in (vllm_families(), sidecar_families()):
        for f in fams.values():
            for s in f.samples:
                out.setdefault(s, f)
            if f.type == "counter":  # prometheus_client also exposes <name>_created
                out.setdefault(f.name[: -len("_total")] + "_created", f)
    return out


def family(name: str) -> Family | None:
    """The family a series name (a family's name or one of its samples) belongs to, else None."""
    return vllm_families().get(name) or sidecar_families().get(name) or _by_sample().get(name)


def versions_examined() -> list[str]:
    return list(data()["versions"])


def _minor(v: Version) -> tuple[int, int]:
    return (v.major, v.minor)


def in_ranges(ranges, version: str | None) -> bool:
    """Whether ``version`` falls in one of ``ranges`` (examined releases, one per minor: a range
    covers every patch of its first and last minor). An unknown version: the newest examined."""
    pv = parse_version(version) if version else None
    pv = pv or Version(versions_examined()[-1])
    return any(_minor(Version(a)) <= _minor(pv) <= _minor(Version(b)) for a, b in ranges)


def exported(name: str, version: str | None) -> bool:
    """Whether vLLM ``version`` exports the series ``name`` (a family or one of its samples)."""
    f = family(name)
    return f is not None and f.name in vllm_families() and in_ranges(f.versions, version)


def names_in(version: str | None) -> list[str]:
    """The vLLM families ``version`` exports."""
    return [n for n, f in vllm_families().items() if in_ranges(f.versions, version)]


@lru_cache(maxsize=1)
def renames() -> list[dict]:
    return list(data()["renames"])


def names(name: str) -> tuple[str, ...]:
    """``name`` and the names it had before (vLLM's renames), newest first:
    ``names(V.inter_token_latency_seconds)`` -> (inter_token_latency_seconds, time_per_output_token_seconds)."""
    if name not in vllm_families():
        raise KeyError(f"{name}: not in vLLM's metric catalogue")
    out = [name]
    i = 0
    while i < len(out):
        out += [r["old"] for r in renames() if r["new"] == out[i] and r["old"] not in out]
        i += 1
    return tuple(out)


def successor(name: str) -> str | None:
    """The newer name of a renamed series, else None."""
    return next((r["new"] for r in renames() if r["old"] == name), None)


class _Names:
    """``V.<family>`` -> ``"vllm:<family>"``, checked against the catalogue."""

    def __getattr__(self, attr: str) -> str:
        name = "vllm:" + attr
        if name not in vllm_families():
            raise AttributeError(f"{name}: not in vLLM's metric catalogue (vllm_doctor/data/vllm_metrics.json)")
        return name


class _Sidecar:
    """``S.<family>`` -> the sidecar's series name, checked against the catalogue."""

    def __getattr__(self, attr: str) -> str:
        if attr not in sidecar_families():
            raise AttributeError(f"{attr}: not a series of vllm-doctor's sidecar (vllm_doctor/data/vllm_metrics.json)")
        return attr


V = _Names()
S = _Sidecar()


def either(name: str, matcher: str = "", *, suffix: str = "", fn: str = "", window: str = "") -> str:
    """PromQL for vLLM's series ``name`` under every name it had (its renames), one leg per name
    joined with ``or``: ``rate(new_bucket{m}[5m]) or rate(old_bucket{m}[5m])`` (parenthesize it). ``or`` keeps a
    series' labels, so it picks one name per series (the newest where a pod exports both) and a
    pod exporting only an older name still counts: aggregate the result, never the legs
    (``sum(rate(new)) or sum(rate(old))`` drops every old pod once one pod has the new name)."""
    legs = []
    for n in names(name):
        sel = n + suffix + (f"{{{matcher}}}" if matcher else "")
        legs.append(f"{fn}({sel}[{window}])" if fn else sel)
    return " or ".join(legs)


def markdown() -> str:
    """docs/metrics.md: the catalogue as a table (``python -m vllm_doctor.catalogue > docs/metrics.md``)."""
    def rng(ranges) -> str:
        return ", ".join(a if a == b else f"{a}–{b}" for a, b in ranges)

    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    vs = versions_examined()
    out = ["# vLLM's /metrics series, every release", "",
           "Generated from `vllm_doctor/data/vllm_metrics.json` (`make metrics`: tools/gen_metrics_catalogue.py "
           "reads the metric definitions in vLLM's released wheels, the newest patch of each minor: "
           f"{', '.join(vs)}). Do not edit by hand.", "",
           "A range names the examined releases (one per minor) and covers every patch of its first and last "
           "minor. *hidden*: behind `--show-hidden-metrics-for-version` in those releases (vLLM's deprecation "
           "period). Counters are listed with `_total`, histograms by their base name (`_bucket`, `_sum`, "
           "`_count`).", "", "## Renames", "", "| old name | new name | note |", "|---|---|---|"]
    for r in renames():
        new = r["new"] + "".join(f", {x}" for x in r.get("related", []))
        out.append(f"| `{r['old']}` | `{new}` | {esc(r['note'])} |")
    out += ["", f"## vLLM ({len(vllm_families())} series)", "",
            "| series | type | labels | unit | releases | engine | documentation |", "|---|---|---|---|---|---|---|"]
    for f in vllm_families().values():
        hidden = f" (hidden {rng(f.hidden_versions)})" if f.hidden_versions else ""
        out.append(f"| `{f.name}` | {f.type} | {', '.join(f.labels)} | {f.unit} | {rng(f.versions)}{hidden} | "
                   f"{', '.join(f.engines)} | {esc(f.documentation)} |")
    out += ["", f"## vllm-doctor's sidecar ({len(sidecar_families())} series)", "",
            "| series | type | labels | unit | documentation |", "|---|---|---|---|---|"]
    for f in sidecar_families().values():
        out.append(f"| `{f.name}` | {f.type} | {', '.join(f.labels)} | {f.unit} | {esc(f.documentation)} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
