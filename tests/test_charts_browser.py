"""Charts and escaping in a real headless Chromium (issue 11): the HTML report and the sidecar
page draw KV cache usage, running / waiting, throughput and preemptions as inline SVG with one
point per stats line of the log, shade each finding's span, and never run text from a log."""

from __future__ import annotations

import re
import time

import pytest

from browser import headless_chromium
from conftest import LOGS
from serve_helpers import Pages, live_sidecar, timeline_pages, wait_for

from vllm_doctor.ingest.oneshot import diagnose
from vllm_doctor.report.render import to_html

STATS_RE = re.compile(r"Running: \d+ reqs")
SERIES = {"kv": "kv", "running": "requests", "waiting": "requests", "prompt": "throughput",
          "generation": "throughput"}
# Client-controlled text (a request id) inside a real vLLM 0.5 preemption warning: it is quoted as
# evidence, and must show as text, never run.
HOSTILE_ID = ('cmpl-<script>window.__pwned=1;alert(1)</script><img/src=x/onerror=window.__pwned=2;alert(2)>'
              '"><svg/onload=window.__pwned=3>')


def stats_lines(path) -> int:
    return sum(1 for line in path.read_text(errors="replace").splitlines() if STATS_RE.search(line))


@pytest.fixture(scope="module")
def browser():
    b = headless_chromium()
    yield b
    b.quit()


def polyline_points(browser, chart: str, series: str) -> list[int]:
    """Point counts of the chart's polylines of that series, read from the rendered SVG."""
    els = browser.find_elements("css selector", f'#chart-{chart} polyline[data-series="{series}"]')
    return [len(e.get_attribute("points").split()) for e in els]


def assert_nothing_ran(browser) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    assert browser.execute_script("return window.__pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    # no script but the sidecar page's own live.js (its CSP allows no other)
    assert browser.execute_script("return Array.from(document.scripts).filter(s => s.getAttribute('src') !== 'live.js'"
                                  " || s.textContent).length") == 0
    assert not browser.find_elements("css selector", "img, iframe, object, embed, foreignObject")


@pytest.mark.parametrize("name", ["cpu-preemption-tiny-kv-cache.log",
                                  "052-v0.13-v1-single-long-generation-kv-grows.log",
                                  "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log"])
def test_report_charts_one_point_per_stats_line(browser, tmp_path, name):
    path = LOGS / name
    rep = diagnose([str(path)])
    page = tmp_path / "report.html"
    page.write_text(to_html(rep))
    browser.get(page.as_uri())
    n = stats_lines(path)
    assert n >= 2
    # one point per stats line; the line breaks where the log has no stats line for minutes (052
    # holds 13:32:40, then 13:36:00-13:36:30, then 13:39:40-13:40:20: no line drawn across a gap)
    segments = {"052-v0.13-v1-single-long-generation-kv-grows.log": [1, 4, 5]}.get(name, [n])
    for series, chart in SERIES.items():
        assert polyline_points(browser, chart, series) == segments, (series, n)
    # each finding's span is shaded on every chart that has data
    assert len(rep.findings) == len(browser.find_elements("css selector", "#chart-kv rect.span")) or not rep.findings
    svg = browser.find_element("css selector", "#chart-kv svg")
    assert svg.size["width"] > 300 and svg.size["height"] > 80  # actually laid out, not collapsed
    # the verdict comes first
    first = browser.find_element("css selector", "body > *:nth-child(2)")
    assert first.get_attribute("id") == "verdict"


def test_report_preemptions_per_interval_from_a_v0_log(browser, tmp_path):
    path = LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log"
    page = tmp_path / "report.html"
    page.write_text(to_html(diagnose([str(path)])))
    browser.get(page.as_uri())
    # V0: the cumulative counter (151) first appears between the two stats lines
    assert polyline_points(browser, "preemptions", "preemptions") == [1]
    labels = [t.text for t in browser.find_elements("css selector", "#chart-preemptions text")]
    assert "200" in labels  # the axis top, rounded up from 151


def hostile_log(tmp_path):
    src = (LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()
    log = tmp_path / "vllm.log"
    log.write_bytes(src.replace(b"Sequence group 165 ", b"Sequence group " + HOSTILE_ID.encode() + b" "))
    return log


def test_report_never_runs_log_text(browser, tmp_path):
    log = hostile_log(tmp_path)
    rep = diagnose([str(log)])
    assert any(HOSTILE_ID in e.text for f in rep.findings for e in f.evidence)  # it is quoted
    page = tmp_path / "report.html"
    page.write_text(to_html(rep))
    browser.get(page.as_uri())
    time.sleep(0.3)
    assert_nothing_ran(browser)
    assert HOSTILE_ID in browser.find_element("tag name", "body").text  # shown as text, escaped


def test_sidecar_page_charts_and_escaping(browser, tmp_path):
    log = hostile_log(tmp_path)
    with live_sidecar({"logs": [str(log)], "from_start": True}) as s:
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == 3.0)
        s.sidecar.evaluate()
        browser.get(s.base + "/")
        time.sleep(0.3)
        assert_nothing_ran(browser)
        assert HOSTILE_ID in browser.execute_script("return document.body.textContent")  # in <details>
        body = browser.find_element("tag name", "body").text
        # an old log: judged on its own clock, and the page says so instead of "live"
        assert "replay/old log, evaluated on the log's clock" in body
        assert browser.find_element("id", "clock").get_attribute("class") == "clock replay"
        row = browser.find_element("css selector", "#sources tr:nth-child(2)").text
        assert "replay/old log" in row and "live" not in row and "behind" in row
        for series, chart in SERIES.items():
            assert polyline_points(browser, chart, series) == [2], series
        assert browser.find_elements("css selector", "#chart-kv rect.span")  # the storm's span


def test_sidecar_page_charts_from_metrics_alone(browser):
    pages = timeline_pages()
    with Pages(pages) as vllm, live_sidecar({"metrics_url": vllm.url, "scrape_interval": 0.05}) as s:
        wait_for(lambda: vllm.i >= len(pages), what="every /metrics page scraped")
        s.sidecar.scraper.stop()  # no more samples while the page is compared with the state
        n = len(s.get("/api/state").json()["timeline"]["series"]["metrics"])
        assert n >= len(pages)
        s.sidecar.evaluate()
        active = [f["name"] for f in s.get("/api/findings").json()["findings"] if f["active"]]
        browser.get(s.base + "/")
        headline = browser.find_element("css selector", "#verdict .headline").text
        assert active and headline.split(":")[0].split()[1] == active[0]  # the verdict, not "nothing"
        assert "no log followed" in browser.find_element("id", "clock").text
        assert polyline_points(browser, "kv", "kv") == [n]
        assert polyline_points(browser, "requests", "waiting") == [n]
        # preemptions per interval from the counter's steps (the first sample has no interval)
        assert polyline_points(browser, "preemptions", "preemptions") == [n - 1]
