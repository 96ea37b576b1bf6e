"""Issue 20 item 8: the scenario suite. Each tests/scenarios/*.yaml is one incident an operator
meets, from a real log (tests/fixtures, with its provenance in tests/fixtures/logs/README.md) or a
log assembled from real lines (its `source` says which), with what an experienced vLLM operator
would do first and the actions that would do harm, written before the tool was run on it.

Each runs through `diagnose` (the report's verdict: its first step, the top finding, every fix of
every finding) and through the pipeline `serve` runs, fed line by line in chunks as a follower
feeds it (the findings active at the end: the same top finding, no harmful fix).

expect: finding (the verdict's finding, null: no incident) or finding_any; first_any (one of these
is in the verdict's first step); harmful (no fix of any finding is one: a bare flag is any value,
"--" any fix at all; a flag with a value is that command); grade (the first fix's evidence);
collect / message (text in the top finding's `collect` / message).

Each also runs through every other surface that can see it, with the same expectations: the text
and JSON reports of `diagnose`, the sidecar `serve` (its /api/state and its page, read in-process),
`watch --once` (its frame), and the fleet report (`diagnose --prometheus`, on a Prometheus double)
where the scenario has /metrics series (`fleet_series`: what vLLM's /metrics showed over time). A
surface that cannot see a scenario is named under `unseen_by` with the reason: never skipped
silently."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURES, diagnose_file

from vllm_doctor.diagnosis import load_rules
from vllm_doctor.findings import FlagFix as Fix
from vllm_doctor.pipeline import Pipeline
from vllm_doctor.report.render import verdict

FIX_FIELDS = {f.name for f in dataclasses.fields(Fix)}
SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def materialise(sc: dict, tmp_path: Path) -> tuple[Path, list[str]]:
    """The scenario's log file and /metrics files."""
    if "file" in sc:
        log = FIXTURES / sc["file"]
    else:
        log = tmp_path / f"{sc['name']}.log"
        log.write_text(sc["text"])
    metrics = []
    if sc.get("metrics"):
        metrics.append(str(FIXTURES / sc["metrics"]))
    if sc.get("metrics_text"):
        m = tmp_path / "metrics.txt"
        m.write_text(sc["metrics_text"])
        metrics.append(str(m))
    return log, metrics


def harmful_in(fixes, harmful: list[str]) -> list[str]:
    """The commands among ``fixes`` (Fix objects or commands as typed) that ``harmful`` names."""
    bad = []
    for fx in fixes:
        cmd = fx if isinstance(fx, str) else fx.command()
        for h in harmful:
            if h == "--" or cmd == h or (" " not in h and cmd.split(" ")[0] in (h, h + "=")) \
                    or (h.startswith("vllm") and cmd.startswith("pip install") and h in cmd):
                bad.append(cmd)
    return bad


def test_the_suite_is_large_enough_and_every_rule_with_fixes_is_in_it():
    assert len(SCENARIOS) >= 30
    named = {load(p)["expect"].get("finding") for p in SCENARIOS} | {
        n for p in SCENARIOS for n in load(p)["expect"].get("finding_any", [])}
    rules = {r.name for r in load_rules([]).rules}
    # every rule has an expert scenario (the ten rules of issue 25 got theirs in the second stop)
    assert rules - named == set(), rules - named


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_diagnose(path, tmp_path):
    sc = load(path)
    exp = sc["expect"]
    log, metrics = materialise(sc, tmp_path)
    rep = diagnose_file(log, metrics_files=metrics)
    if unseen(sc, "diagnose-text"):  # blind to it, as the scenario says: its finding is not there
        assert exp["finding"] not in [f.name for f in rep.findings]
        return
    v = verdict(rep)
    top = rep.findings[0] if rep.findings else None
    if "finding_any" in exp:
        assert top is not None and top.name in exp["finding_any"], (top and top.name, v["headline"])
    else:
        assert (top.name if top else None) == exp["finding"], v["headline"]
    if exp.get("first_any"):
        assert v["first"] and any(s in v["first"] for s in exp["first_any"]), v["first"]
    every = [fx for f in rep.findings for fx in f.fixes]
    assert harmful_in(every, exp.get("harmful", [])) == [], (v["first"], [fx.command() for fx in every])
    if exp.get("grade"):
        assert top.fixes[0].grade == exp["grade"], top.fixes[0]
    if exp.get("collect"):
        assert top.collect and exp["collect"] in top.collect and "Not enough evidence" in v["headline"]
    if exp.get("message"):
        assert exp["message"] in top.message


@pytest.mark.parametrize("path", [p for p in SCENARIOS if not load(p).get("metrics") and not load(p).get("metrics_text")
                                  and not load(p).get("host_memory")], ids=lambda p: p.stem)
def test_scenario_through_the_serve_pipeline(path, tmp_path):
    """The same log as the sidecar's follower feeds it: in chunks of a few lines, the rules run as
    they come due, then once at the end."""
    sc = load(path)
    exp = sc["expect"]
    log, _ = materialise(sc, tmp_path)
    pipe = Pipeline(load_rules([]), follow=False)
    lines = log.read_bytes().splitlines(keepends=True)
    for i in range(0, len(lines), 7):
        pipe.feed(log.name, b"".join(lines[i:i + 7]))
    pipe.end(log.name)
    pipe.evaluate()
    rep = pipe.report()
    names = [f.name for f in rep.findings]
    want = exp.get("finding_any") or ([exp["finding"]] if exp.get("finding") else [])
    if want:
        assert set(want) & set(names), names
    else:
        assert names == []
    every = [fx for f in rep.findings for fx in f.fixes]
    assert harmful_in(every, exp.get("harmful", [])) == [], [fx.command() for fx in every]


# -- every surface --------------------------------------------------------------------------------

SURFACES = ("diagnose-text", "diagnose-json", "serve", "watch", "fleet")


def unseen(sc: dict, surface: str) -> str | None:
    """The scenario's reason why ``surface`` cannot see it (None: it can)."""
    return (sc.get("unseen_by") or {}).get(surface)


def test_every_surface_a_scenario_leaves_out_is_named_with_its_reason():
    """No silent skip: a scenario the fleet report cannot see says why (it has no /metrics series),
    and one that has series is seen by it; the log surfaces see every scenario."""
    for path in SCENARIOS:
        sc = load(path)
        why = sc.get("unseen_by") or {}
        assert set(why) <= set(SURFACES) and all(isinstance(v, str) and len(v) > 20 for v in why.values()), path.name
        # a log surface is blind only to what the sidecar alone samples (host memory)
        assert not (set(why) & {"diagnose-text", "diagnose-json"}) or sc.get("host_memory"), path.name
        assert not (set(why) & {"serve", "watch"}), path.name
        assert ("fleet" in why) != bool(sc.get("fleet_series")), path.name


def fix_lines(text: str) -> list[str]:
    """The fix commands a text surface shows: each line followed by its ``why:`` line, less the
    label and a byte value's size in words."""
    lines = text.splitlines()
    out = []
    for a, b in zip(lines, lines[1:], strict=False):
        if b.strip().startswith("why: "):
            cmd = re.split(r"\s{2,}", a.strip())[0]
            out.append(re.sub(r" \(\d[\d.]* [KMGT]?i?B\)$", "", cmd))
    return out


def check_surface(surface: str, exp: dict, names: list[str], first: str | None, commands: list[str]) -> None:
    """The surface's top finding (or findings), its first step and its fix commands hold the
    scenario's expectations."""
    want = exp.get("finding_any") or ([exp["finding"]] if exp.get("finding") else [])
    if want:
        assert names and names[0] in want, (surface, names)
    else:
        assert names == [], (surface, names)
    if exp.get("first_any"):
        assert first and any(s in first for s in exp["first_any"]), (surface, first)
    assert harmful_in(commands, exp.get("harmful", [])) == [], (surface, first, commands)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_diagnose_text_and_json(path, tmp_path):
    from vllm_doctor.cli import app
    from typer.testing import CliRunner

    sc = load(path)
    exp = sc["expect"]
    log, metrics = materialise(sc, tmp_path)
    if unseen(sc, "diagnose-text"):  # covered above: diagnose is blind to it
        exp = {"finding": None, "harmful": exp.get("harmful", [])}
    args = ["diagnose", str(log)] + [x for m in metrics for x in ("--metrics", m)]
    text = CliRunner().invoke(app, args + ["--fail-on", "never"])
    assert text.exit_code == 0, text.output
    out = text.output.splitlines()
    first = next((ln.split(": ", 1)[1] for ln in out[1:3] if ln.startswith(("Do this first: ", "Against a repeat: "))),
                 None)
    names = re.findall(r"^(?:CRITICAL|WARNING|INFO) VD\d+ (\S+):", text.output, re.M)
    check_surface("diagnose-text", exp, names, first, fix_lines(text.output))
    js = CliRunner().invoke(app, args + ["--format", "json", "--fail-on", "never"])
    assert js.exit_code == 0, js.output
    d = json.loads(js.output)
    fixes = [Fix(**{k: v for k, v in fx.items() if k in FIX_FIELDS}) for f in d["findings"] for fx in f["fixes"]]
    first_fix = next((f["fixes"][0] for f in d["findings"][:1] if f["fixes"]), None)
    check_surface("diagnose-json", {**exp, "first_any": None}, [f["name"] for f in d["findings"]], None,
                  [fx.command() for fx in fixes])
    if exp.get("first_any") and first_fix is not None and first_fix["kind"] != "step":
        cmd = Fix(**{k: v for k, v in first_fix.items() if k in FIX_FIELDS}).command()
        assert cmd in (first or ""), (cmd, first)


def _sidecar(sc: dict, log: Path, metrics_url: str, tmp_path: Path):
    """The sidecar's settings and a sidecar for the scenario: its log, its /metrics, and its host
    memory as a cgroup v2 tree under ``tmp_path`` (host memory off where it has none)."""
    from vllm_doctor.export.serve import Sidecar, load_config

    hm = sc.get("host_memory")
    root = tmp_path / "host"
    if hm:
        cg = root / "sys/fs/cgroup"
        cg.mkdir(parents=True)
        (cg / "memory.current").write_text(f"{hm['current_bytes']}\n")
        (cg / "memory.max").write_text(f"{hm['max_bytes']}\n")
    cfg = load_config({"logs": [str(log)], "metrics_url": metrics_url, "from_start": True, "nvml": False,
                       "host_memory": bool(hm), "host_memory_root": str(root), "eval_interval": 3600,
                       "poll_interval": 0.2}, env={})
    return cfg, Sidecar(cfg)


def _metrics_pages(sc: dict, metrics: list[str]):
    from serve_helpers import Pages

    return Pages([Path(m).read_text() for m in metrics] or ["# no /metrics\n"])


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_serve(path, tmp_path, monkeypatch):
    """The sidecar as `serve` runs it (follower, scraper, rules, page), read in-process: /api/state
    (diagnose's schema) and the page's verdict. The log is whole when read: a traceback it ends
    inside is complete at once (live, after TRACEBACK_QUIET_SECONDS of quiet)."""
    monkeypatch.setattr("vllm_doctor.export.serve.TRACEBACK_QUIET_SECONDS", 0.0)
    from html import unescape

    from serve_helpers import wait_for
    from starlette.testclient import TestClient

    from vllm_doctor.export.server import create_app, page_context

    sc = load(path)
    exp = sc["expect"]
    log, metrics = materialise(sc, tmp_path)
    with _metrics_pages(sc, metrics) as pages:
        _, side = _sidecar(sc, log, pages.url if metrics else "none", tmp_path)
        side.start()
        try:
            size = log.stat().st_size
            wait_for(lambda: all(s.stats.bytes_read >= size for s in side.logs), 20, "the log read to its end")
            if side.scraper is not None:
                side.scraper.scrape_once()
            if side.hostmem is not None:
                side.hostmem.poll()
            side.evaluate()
            with TestClient(create_app(side)) as client:
                state = client.get("/api/state").json()
                html = client.get("/").text
            v = page_context(side)["verdict"]
        finally:
            side.stop()
    fs = state["findings"]
    commands = [Fix(**{k: v for k, v in fx.items() if k in FIX_FIELDS}).command() for f in fs for fx in f["fixes"]]
    check_surface("serve", exp, [f["name"] for f in fs if f.get("active") or state["clock"]["mode"] == "replay"],
                  v["first"], commands)
    if not unseen(sc, "diagnose-text"):  # the same first step as diagnose gives
        assert v["first"] == verdict(diagnose_file(log, metrics_files=metrics))["first"]
    if v["first"]:  # the page shows it (its words, less the markup)
        words = " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())
        assert " ".join(v["first"].split()) in words, v["first"]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_watch(path, tmp_path, monkeypatch):
    monkeypatch.setattr("vllm_doctor.export.serve.TRACEBACK_QUIET_SECONDS", 0.0)  # the log is whole
    from rich.console import Console

    from vllm_doctor.report.watch import watch

    sc = load(path)
    exp = sc["expect"]
    log, metrics = materialise(sc, tmp_path)
    console = Console(record=True, width=2000, color_system=None)
    with _metrics_pages(sc, metrics) as pages:
        cfg, _ = _sidecar(sc, log, pages.url if metrics else "none", tmp_path)
        assert watch(cfg, once=True, console=console) == 0
    out = console.export_text()
    lines = out.splitlines()
    first = next((ln.split(": ", 1)[1] for ln in lines if ln.startswith(("Do this first: ", "Against a repeat: "))),
                 None)
    names = re.findall(r"VD\d+ (\S+) \((?:critical|warning|info)", out)
    check_surface("watch", exp, names, first, fix_lines(out))
    if not unseen(sc, "diagnose-text"):  # the same first step as diagnose gives
        assert first == verdict(diagnose_file(log, metrics_files=metrics))["first"]


FLEET_SCENARIOS = [p for p in SCENARIOS if load(p).get("fleet_series")]


@pytest.mark.parametrize("path", FLEET_SCENARIOS, ids=[p.stem for p in FLEET_SCENARIOS])
def test_scenario_through_the_fleet_report(path, tmp_path):
    """`diagnose --prometheus` over the scenario's /metrics series as Prometheus returns them
    (tests/fake_prometheus_api.py), the vLLM cache_config_info of its capture included."""
    from fake_prometheus_api import FakeQueryAPI

    from vllm_doctor.fleet import diagnose_prometheus
    from vllm_doctor.report.render import to_text

    sc = load(path)
    over = sc.get("fleet_expect") or {}
    assert not over or len(over.get("reason", "")) > 20, "a fleet expectation of its own says why"
    exp = {**sc["expect"], **{k: v for k, v in over.items() if k != "reason"}}
    end = 1_767_225_600.0
    text = sc["fleet_series"]
    if "\n" not in text.strip():  # a timeline file under tests/fixtures
        text = (FIXTURES / text).read_text()
    rows = [{k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)} for line in text.strip().splitlines()]
    step = float(sc.get("fleet_step", 10))
    times = [end - step * (len(rows) - 1 - i) for i in range(len(rows))]
    labels = {"job": "vllm", "namespace": "scenario", "pod": sc["name"][:40], "instance": "10.0.0.1:8000",
              "engine": "0", "model_name": "m"}
    series = [({"__name__": f"vllm:{k}", **labels}, {t: r[k] for t, r in zip(times, rows, strict=True) if k in r})
              for k in rows[0]]
    _, metrics = materialise(sc, tmp_path)
    for m in metrics:  # the capture's configuration (vllm:cache_config_info), over the same range
        info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", Path(m).read_text(), re.M)
        if info:
            cc = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
            series.append(({"__name__": "vllm:cache_config_info", **cc, **labels}, dict.fromkeys(times, 1.0)))
    with FakeQueryAPI(series, [], {}) as api:
        res = diagnose_prometheus(api.url, since=str(times[0]), until=str(end), step=f"{step:g}s", now=end)
    rep = res.report
    v = verdict(rep)
    text = to_text(rep)
    check_surface("fleet", exp, [f.name for f in rep.findings], v["first"], fix_lines(text))
    if exp.get("message"):  # e.g. the counter's 0 read as no preemption, on the fleet too
        assert exp["message"] in rep.findings[0].message, rep.findings[0].message
