"""Every page on any screen (issue 20, item 6), in a real headless Chromium at 1280 and 480 px:
the HTML report, the sidecar's page, the bench ladder page and the fleet report fit the screen
(nothing wider than the viewport), the sidecar's page updates in place (no reload: what the
reader opened stays open), a missing log is said at the top, and the fleet report opens with its
replica table and holds one card per finding across replicas, with charts from its series.

Screenshots of each page at both widths are written to ``$VLLM_DOCTOR_SCREENSHOTS`` when set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from browser import headless_chromium
from conftest import LOGS
from serve_helpers import live_sidecar, wait_for

from vllm_doctor.ingest.oneshot import diagnose
from vllm_doctor.loadtest.chart import html_page
from vllm_doctor.report.render import to_html

BENCH = Path(__file__).parent / "fixtures" / "bench" / "ladder-vllm-0.32-cpu.json"
WIDTHS = (1280, 480)


@pytest.fixture(scope="module", params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def browser(request):
    b = headless_chromium(width=request.param, height=1000)
    b.width = request.param
    yield b
    b.quit()


def overflow(browser) -> int:
    """How many CSS pixels the page is wider than the viewport (0: nothing cut off, no sideways
    scrolling of the whole page)."""
    return browser.execute_script(
        "return Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth")


def shoot(browser, name: str) -> None:
    out = os.environ.get("VLLM_DOCTOR_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        h = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(browser.width, min(max(h + 120, 600), 6000))
        browser.save_screenshot(str(Path(out) / f"{name}-{browser.width}.png"))
        browser.set_window_size(browser.width, 1000)


def recovered_log(tmp_path) -> Path:
    """Real vLLM 0.32 lines: a run that died (EngineDeadError), then vLLM started again an hour
    later and served a load with no incident."""
    dead = (LOGS / "cpu-request-errors-then-enginecore-killed.log").read_bytes()
    served = (LOGS / "cpu-basic-serve-and-load.log").read_bytes().replace(b"11-30 09:0", b"11-30 10:1")
    p = tmp_path / "recovered.log"
    p.write_bytes(dead + served)
    return p


@pytest.mark.parametrize("name", ["cpu-preemption-tiny-kv-cache.log", "071-v0.14-v1-dp8-waiting-stacked-on-two-engines.log",
                                  "011-v0.8.3-v1-1M-context-kv-needed-gt-available.log", "recovered"])
def test_report_fits_the_screen(browser, tmp_path, name):
    path = recovered_log(tmp_path) if name == "recovered" else LOGS / name
    page = tmp_path / "report.html"
    page.write_text(to_html(diagnose([str(path)])))
    browser.get(page.as_uri())
    assert browser.find_elements("css selector", 'meta[name="viewport"]')
    shoot(browser, f"report-{name.split('-')[0]}")
    assert overflow(browser) <= 0
    # the fix commands keep whole (a flag never breaks mid-name) and stay inside the page
    for code in browser.find_elements("css selector", "code.fix"):
        assert code.rect["x"] + min(code.rect["width"], browser.width) <= browser.width + 1
    svg = browser.find_elements("css selector", ".chart svg")
    assert all(s.size["width"] <= browser.width for s in svg)


def test_bench_ladder_page_fits_the_screen(browser, tmp_path):
    page = tmp_path / "ladder.html"
    page.write_text(html_page(json.loads(BENCH.read_text())))
    browser.get(page.as_uri())
    shoot(browser, "bench-ladder")
    assert overflow(browser) <= 0
    shown = [c for c in browser.find_elements("css selector", "svg.ladder-chart") if c.is_displayed()]
    assert len(shown) == 1       # the wide chart, or on a phone the narrow one drawn at its own size
    chart = shown[0]
    assert 200 < chart.size["width"] <= browser.width  # not cut off
    assert browser.find_elements("css selector", "svg.ladder-chart polyline")


def test_sidecar_page_updates_in_place_and_keeps_opened_evidence(browser, tmp_path, monkeypatch):
    from vllm_doctor.export import server

    monkeypatch.setattr(server, "REFRESH_SECONDS", 1)
    log = tmp_path / "vllm.log"
    log.write_bytes((LOGS / "cpu-preemption-tiny-kv-cache.log").read_bytes())
    missing = tmp_path / "other" / "vllm.log"  # a second log that is not there
    with live_sidecar({"logs": [str(log), str(missing)], "from_start": True}) as s:
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 235.0)
        s.sidecar.evaluate()
        browser.get(s.base + "/")
        shoot(browser, "serve")
        assert overflow(browser) <= 0
        # the missing log is said at the top, before the verdict
        banner = browser.find_element("css selector", ".missing")
        assert str(missing) in banner.text and "missing" in banner.text and "file not found" in banner.text
        verdict = browser.find_element("id", "verdict")
        assert banner.location["y"] < verdict.location["y"]
        # open a finding's evidence, then let the page update itself twice
        details = browser.find_element("css selector", "#live details[id]")
        did = details.get_attribute("id")
        browser.execute_script("arguments[0].open = true; window.__same_page = 1;", details)
        wait_for(lambda: int(browser.find_element("id", "live").get_attribute("data-updates") or 0) >= 2,
                 timeout=15, what="two in-place updates")
        assert browser.execute_script("return window.__same_page") == 1  # no reload
        assert browser.find_element("id", did).get_attribute("open") is not None
        assert overflow(browser) <= 0
        # only the sidecar's own script runs (a Content-Security-Policy allows no other)
        assert "script-src 'self'" in s.get("/").headers["content-security-policy"]
        assert browser.execute_script("return Array.from(document.scripts).map(s => s.getAttribute('src'))") == ["live.js"]
        assert "api/page" in s.get("/live.js").text
        page = s.get("/api/page").json()
        assert 'id="verdict"' in page["html"] and "<script" not in page["html"]


# ---- the fleet report ------------------------------------------------------------------------------
STEP = 15.0
T0 = 1_800_000_000
N = 80  # 20 minutes of 15 s steps
HOT = [(35, 40, 1.0, 0)] * N
IDLE = [(0, 0, 0.02, 0)] * N
BUSY = [(10, 0, 0.5, 0)] * N


def fleet_report(monkeypatch):
    """``diagnose --prometheus`` over eight replicas (three saturated with a queue, four idle, one
    busy), the series handed over as the Prometheus query would give them."""
    import vllm_doctor.fleet as fleet

    def replica(pod, rows):
        rep = fleet.Replica(("llm", pod))
        v = rep.engines["0"].values
        for k, (running, waiting, kv, pre) in enumerate(rows):
            ts = T0 + k * STEP
            v["num_running"][ts], v["num_waiting"][ts] = running, waiting
            v["kv_cache_usage_ratio"][ts], v["num_preemptions_total"][ts] = kv, pre
            v["prompt_tokens_total"][ts] = k * STEP * 40.0 * running  # tokens flow while requests run
            v["generation_tokens_total"][ts] = k * STEP * 10.0 * running
        return rep

    reps = [replica(f"hot-{i}", HOT) for i in range(3)] + [replica(f"idle-{i}", IDLE) for i in range(4)] + [
        replica("busy", BUSY)]

    class Client:
        warnings: list[str] = []  # PrometheusClient.warnings: no partial response here
        skipped: list[str] = []  # PrometheusClient.skipped: no bad series here

        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(fleet, "PrometheusClient", Client)
    monkeypatch.setattr(fleet, "fetch", lambda *a, **k: ({r.key: r for r in reps}, {}))
    monkeypatch.setenv("VLLM_DOCTOR_WORKERS", "1")
    return fleet.diagnose_prometheus("http://prometheus.invalid", since="20m", now=T0 + (N - 1) * STEP).report


def test_fleet_report_one_card_per_finding_replica_table_first_and_charts(browser, tmp_path, monkeypatch):
    rep = fleet_report(monkeypatch)
    kv = [f for f in rep.findings if f.name == "kv-capacity-bound"]
    assert sorted(f.values["replica"] for f in kv) == ["llm/hot-0", "llm/hot-1", "llm/hot-2"]
    page = tmp_path / "fleet.html"
    page.write_text(to_html(rep))
    browser.get(page.as_uri())
    shoot(browser, "fleet")
    assert overflow(browser) <= 0
    heads = [h.text for h in browser.find_elements("css selector", "h2")]
    assert heads.index("Replicas") < heads.index("Over time") < next(i for i, h in enumerate(heads) if h.startswith("Findings"))
    cards = browser.find_elements("css selector", "section.finding")
    names = [c.find_element("css selector", "h3 code").text for c in cards]
    assert names.count("kv-capacity-bound") == 1 and len(names) == len(set(names))
    card = cards[names.index("kv-capacity-bound")]
    assert "On 3 replicas: llm/hot-0, llm/hot-1, llm/hot-2" in card.text
    assert not card.find_element("css selector", "h3").text.split(": ", 1)[1].startswith("llm/")
    # the fleet's series: the sum of the eight replicas, and each replica with a finding
    lines = browser.find_elements("css selector", '#chart-requests polyline[data-series="running"]')
    legend = browser.find_element("css selector", "#chart-requests .legend").text
    assert len(lines) == 4 and "fleet (8 replicas)" in legend and "llm/hot-0" in legend
    pts = lines[0].get_attribute("points").split()
    assert len(pts) == N
    assert not browser.find_elements("css selector", "#chart-kv .empty")


def test_fleet_text_report_lists_each_finding_once_after_the_replica_table(monkeypatch):
    from vllm_doctor.report.render import to_markdown, to_text

    text = to_text(fleet_report(monkeypatch))
    # hot replicas beside idle ones: the headline names the imbalance, whose first step (route on load) is the
    # fix, and the hot replicas' kv-capacity-bound follows (issue 20 item 4)
    head = text.splitlines()[0]
    assert head.startswith("WARNING replica-imbalance: Some replicas are saturated while others have room"), head
    assert head.endswith("1 more finding: kv-capacity-bound"), head
    assert text.index("Replicas (8)") < text.index("Findings (")
    assert text.count("VD004 kv-capacity-bound") == 1
    assert "  on 3 replicas: llm/hot-0, llm/hot-1, llm/hot-2" in text
    md = to_markdown(fleet_report(monkeypatch))
    assert md.index("## Replicas (8)") < md.index("## Findings (")
    assert md.count("VD004 `kv-capacity-bound`") == 1 and "**On 3 replicas:** `llm/hot-0`, `llm/hot-1`, `llm/hot-2`" in md
