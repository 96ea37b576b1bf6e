"""`vllm-doctor bench`: the ladder against a streaming stand-in of vLLM (tests/bench_fake_vllm.py),
`compare` on real result files (tests/fixtures/bench/, recorded from vLLM 0.32 on CPU), and
`diagnose --bench`. The real vLLM ladder is tests/e2e/test_e2e_bench.py."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.loadtest.annotate import began_at
from vllm_doctor.loadtest.ladder import LadderConfig, find_knee, run_ladder
from vllm_doctor.loadtest.results import ResultError, Targets, compare, load_runs, pick

from bench_fake_vllm import FakeVllm

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "bench"
DOCTOR = [sys.executable, "-m", "vllm_doctor"]


def doctor(*args, timeout=120):
    return subprocess.run([*DOCTOR, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def saturating():
    """4 slots; requests beyond 4 in flight queue and are counted as preemptions."""
    with FakeVllm(slots=4, preempt_above=4, token_seconds=0.03) as fake:
        yield fake


@pytest.fixture(scope="module")
def ladder_result(saturating):
    before = saturating.preemptions_total()
    cfg = LadderConfig(url=saturating.url, levels=[1, 2, 4, 8], requests_per_level=16, input_len=20,
                       output_len=10, metrics_interval_seconds=0.05)
    res = asyncio.run(run_ladder(cfg))
    return res, saturating.preemptions_total() - before


def test_ladder_measures_every_level(ladder_result):
    res, _ = ladder_result
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2, 4, 8]
    for lv in res["levels"]:
        assert lv["requests"] == 16 and lv["completed"] == 16 and lv["errors"] == 0
        assert lv["output_tokens"] == 16 * 10          # the server's usage chunk, exact with ignore_eos
        assert lv["prompt_tokens"] == 16 * 20
        assert lv["mean_tokens_per_request"] == 30.0
        # TTFT is the first content chunk: one token time at least; TPOT about one token time
        assert lv["ttft_ms"]["p50"] >= 15
        assert 15 <= lv["tpot_ms"]["mean"] <= 200
    assert res["model"] == "fake-model"
    assert res["kv_cache_tokens"] == 32 * 16            # num_gpu_blocks x block_size of cache_config_info


def test_ladder_throughput_saturates_and_the_knee_is_the_slot_count(ladder_result):
    res, _ = ladder_result
    tp = {lv["concurrency"]: lv["output_throughput"] for lv in res["levels"]}
    assert tp[2] > 1.3 * tp[1] and tp[4] > 1.3 * tp[2]   # below the 4 slots: throughput scales
    assert tp[8] < 1.10 * tp[4]                          # beyond: flat
    p99 = {lv["concurrency"]: lv["ttft_ms"]["p99"] for lv in res["levels"]}
    assert p99[8] > 2 * p99[4]                           # half of them wait a whole request
    assert res["knee"]["concurrency"] == 4
    assert "from 4 to 8" in res["knee"]["reason"]


def test_ladder_preemptions_are_the_servers_counter_deltas(ladder_result, saturating):
    res, total_delta = ladder_result
    lv = {x["concurrency"]: x for x in res["levels"]}
    assert lv[1]["preemptions"] == lv[2]["preemptions"] == lv[4]["preemptions"] == 0
    assert lv[8]["preemptions"] > 0
    assert sum(x["preemptions"] for x in res["levels"]) == total_delta
    # consecutive levels: one level's "after" is the next one's "before" (no traffic in between)
    for a, b in zip(res["levels"], res["levels"][1:]):
        assert a["preemptions_after"] == b["preemptions_before"]
    assert lv[8]["max_waiting"] >= 1 and lv[8]["max_running"] == 4
    assert lv[8]["max_kv_cache_usage_ratio"] == 1.0


def test_ladder_recommends_max_num_seqs_with_its_reasons(ladder_result):
    rec = ladder_result[0]["recommendation"]
    assert rec["flag"] == "--max-num-seqs" and rec["value"] == 4
    text = "\n".join(rec["arithmetic"])
    assert "512 tokens / 30.0 tokens per request" in text and "= 17 sequences" in text
    assert "preemptions began at 8 concurrent requests; 4 ran without preemption" in text


def test_ladder_counts_errors_and_exits_1(tmp_path):
    with FakeVllm(slots=2, token_seconds=0.005, fail_every=4) as fake:
        r = doctor("bench", "ladder", "--url", fake.url, "--levels", "2", "--requests", "8", "--output-len", "4",
                   "--input-len", "5", "--output", str(tmp_path / "r.json"), "--format", "json")
    assert r.returncode == 1, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    lv = res["levels"][0]
    assert lv["requests"] == 8 and lv["errors"] == 2 and lv["completed"] == 6
    assert lv["error_examples"] and lv["error_examples"][0].startswith("HTTP 500")


def test_chat_ttft_skips_the_role_only_chunk():
    with FakeVllm(slots=1, token_seconds=0.05) as fake:
        res = asyncio.run(run_ladder(LadderConfig(url=fake.url, levels=[1], requests_per_level=2, input_len=3,
                                                  output_len=3, chat=True)))
    lv = res["levels"][0]
    assert lv["completed"] == 2 and lv["ttft_ms"]["p50"] >= 45    # the first token, not the role chunk


def test_cli_writes_result_chart_and_escapes_the_model_name(tmp_path):
    with FakeVllm(slots=2, token_seconds=0.005, model="<script>alert(1)</script>") as fake:
        r = doctor("bench", "ladder", "--url", fake.url, "--levels", "1,2,3", "--requests", "3", "--output-len", "3",
                   "--input-len", "4", "--output", str(tmp_path / "r.json"), "--chart", str(tmp_path / "c.html"))
    assert r.returncode == 0, r.stderr
    assert "Knee:" in r.stdout and "Do this: --max-num-seqs" in r.stdout
    page = (tmp_path / "c.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    pts = re.search(r'class="series-throughput" points="([^"]*)"', page).group(1).split()
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 2          # the wide chart and the narrow one (a phone's screen), one shown at a time
    assert len(pts) == 3 and all(svg.count('class="point-ttft"') == 3 for svg in svgs)


def test_unreachable_server_is_one_line_exit_2():
    r = doctor("bench", "ladder", "--url", "http://127.0.0.1:9", "--levels", "1", "--requests", "1")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vllm-doctor bench: http://127.0.0.1:9/v1/models")
    r = doctor("bench", "ladder", "--url", "http://127.0.0.1:9", "--levels", "8,x")
    assert r.returncode == 2 and "--levels" in r.stderr and "Traceback" not in r.stderr


def test_knee_needs_ttft_to_grow():
    from vllm_doctor.loadtest.ladder import LevelResult

    def lv(c, tp, p99):
        return LevelResult(c, 8, 8, 0, 1.0, 0, 1, 8, 8, 8.0, tp, 8.0, {"p99": p99}, {}, {}, {}, 0, 0, 0,
                           None, None, None)
    # flat throughput but TTFT did not grow: not a knee yet
    assert find_knee([lv(1, 100, 50), lv(2, 105, 40), lv(4, 200, 60)], 0.10).concurrency == 4
    assert find_knee([lv(1, 100, 50), lv(2, 105, 90)], 0.10).concurrency == 1


# ---- compare -------------------------------------------------------------------------------------

def test_load_real_vllm_bench_serve_result():
    runs = load_runs(str(FIX / "vllm-0.32-cpu-bench-serve-c4.json"))
    assert len(runs) == 1
    r = runs[0]
    doc = json.loads((FIX / "vllm-0.32-cpu-bench-serve-c4.json").read_text())
    assert r.format == "vllm-bench-serve" and r.concurrency == 4
    assert r.ttft_p99_ms == doc["p99_ttft_ms"] and r.tpot_mean_ms == doc["mean_tpot_ms"]
    assert r.output_throughput == doc["output_throughput"] and r.preemptions is None


def test_load_real_guidellm_report():
    """GuideLLM 0.8.1's report of a real run against vLLM 0.32 on CPU (concurrent@4 and @8; its
    own log said 614.33 and 369.43 output tokens/s)."""
    path = FIX / "guidellm-0.8.1-vllm-0.32-cpu.json"
    runs = load_runs(str(path))
    doc = json.loads(path.read_text())
    assert [(r.format, r.concurrency, r.completed, r.errors) for r in runs] == \
        [("guidellm", 4.0, 16, 0), ("guidellm", 8.0, 16, 0)]
    assert [round(r.output_throughput, 2) for r in runs] == [614.33, 369.43]
    m = doc["benchmarks"][1]["metrics"]
    assert runs[1].ttft_p99_ms == m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"]
    assert runs[1].tpot_mean_ms == m["time_per_output_token_ms"]["successful"]["mean"]
    r = doctor("bench", "compare", str(path), str(path), "--level", "8", "--ttft-p99-ms", "100000", "--format", "json")
    assert r.returncode == 3 and json.loads(r.stdout)["after"]["concurrency"] == 8.0


def test_compare_pass_fail_unknown(tmp_path, ladder_result):
    res = ladder_result[0]
    p = tmp_path / "ladder.json"
    p.write_text(json.dumps(res))
    runs = load_runs(str(p))
    at4, at8 = pick(runs, 4, runs), pick(runs, 8, runs)
    checks = {c.indicator: c for c in compare(at8, at4, Targets(ttft_p99_ms=10_000))}
    assert checks["preemptions"].status == "PASS" and checks["preemptions"].after == 0
    assert checks["TTFT p99"].status == "PASS"
    checks = {c.indicator: c for c in compare(at4, at8, Targets())}
    assert checks["preemptions"].status == "FAIL"
    with pytest.raises(ResultError, match="no run at concurrency 3"):
        pick(runs, 3, runs)


def test_compare_cli_exit_codes(tmp_path, ladder_result):
    p = tmp_path / "ladder.json"
    p.write_text(json.dumps(ladder_result[0]))
    r = doctor("bench", "compare", str(p), str(p), "--level", "8")
    assert r.returncode == 1 and "preemptions" in r.stdout and "Verdict: FAIL" in r.stdout
    r = doctor("bench", "compare", str(p), str(p), "--level", "4", "--ttft-p99-ms", "100000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Verdict: PASS" in r.stdout
    vb = FIX / "vllm-0.32-cpu-bench-serve-c4.json"
    r = doctor("bench", "compare", str(vb), str(vb), "--ttft-p99-ms", "100000", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["verdict"] == "UNKNOWN"
    assert [c["status"] for c in doc["checks"]] == ["PASS", "PASS", "PASS", "UNKNOWN"]
    r = doctor("bench", "compare", str(vb), str(tmp_path / "missing.json"))
    assert r.returncode == 2 and r.stderr.strip().endswith("missing.json: no such file")
    (tmp_path / "x.json").write_text('{"hello": 1}')
    r = doctor("bench", "compare", str(vb), str(tmp_path / "x.json"))
    assert r.returncode == 2 and "not a result of" in r.stderr and "Traceback" not in r.stderr


# ---- diagnose --bench ----------------------------------------------------------------------------

def test_diagnose_names_the_level_where_the_incident_began(tmp_path, ladder_result):
    p = tmp_path / "ladder.json"
    p.write_text(json.dumps(ladder_result[0]))
    log = ROOT / "tests" / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log"
    metrics = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt"
    r = doctor("diagnose", str(log), "--metrics", str(metrics), "--bench", str(p), "--format", "json")
    doc = json.loads(r.stdout)
    notes = {f["name"]: f["notes"] for f in doc["findings"]}
    pre = ladder_result[0]["levels"][3]["preemptions"]
    assert f"bench ladder: began at 8 concurrent requests (first level with preemptions ({pre}))" \
        in notes["preemption-storm"]
    r = doctor("diagnose", str(log), "--bench", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "nope.json: no such file" in r.stderr


def test_began_at_prefers_the_time_window():
    res = {"levels": [{"concurrency": 2, "started_at": 100.0, "ended_at": 200.0, "preemptions": 0},
                      {"concurrency": 4, "started_at": 200.0, "ended_at": 300.0, "preemptions": 5}]}
    assert "during the level of 2 concurrent" in began_at(res, "preemption-storm", 150.0)
    assert "began at 4 concurrent requests (first level with preemptions (5))" in \
        began_at(res, "preemption-storm", None)
    assert began_at(res, "nccl-failure", None) is None


def test_serve_bench_notes_the_level_on_live_findings(tmp_path):
    """The sidecar with --bench: a live preemption-storm (from the real /metrics timeline of the
    storm run) carries the ladder level where preemptions began (the recorded real ladder)."""
    from serve_helpers import Pages, live_sidecar, timeline_pages

    ladder = FIX / "ladder-vllm-0.32-cpu.json"
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with Pages(timeline_pages()) as vllm:
        with live_sidecar({"logs": [str(log)], "metrics_url": vllm.url, "scrape_interval": 3600,
                           "bench": str(ladder)}) as s:
            for _ in range(15):
                s.sidecar.scraper.scrape_once()
            s.sidecar.evaluate()
            storm = next(f for f in s.get("/api/findings").json()["findings"] if f["name"] == "preemption-storm")
    assert "bench ladder: began at 8 concurrent requests (first level with preemptions (3))" in storm["notes"]


def test_serve_rejects_a_bad_bench_file_in_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    r = doctor("serve", "--log", str(tmp_path / "v.log"), "--bench", str(bad), "--no-nvml", "--metrics-url", "none",
               "--port", "0")
    assert r.returncode == 2
    assert r.stderr.strip() == f"vllm-doctor: --bench {bad}: not a `vllm-doctor bench ladder` result"


class _HostileServer:
    """A TCP server on 127.0.0.1 that either never answers (``mode="silent"``: accepts, reads,
    says nothing) or answers 200 with an event stream that trickles an SSE comment every 0.2 s
    forever (``mode="drip"``: no token, no end). Neither is vLLM; the ladder must stay bounded."""

    def __init__(self, mode: str):
        import socket
        import threading

        self.mode, self.conns, self.stop = mode, [], threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        import threading
        import time as _t

        def drip(c):
            try:
                c.recv(65536)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                while not self.stop.is_set():
                    c.sendall(b"3\r\n:\n\n\r\n")
                    _t.sleep(0.2)
            except OSError:
                pass
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)
            if self.mode == "drip":
                threading.Thread(target=drip, args=(c,), daemon=True).start()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("mode", ["silent", "drip"])
def test_ladder_stays_bounded_against_a_server_that_never_finishes(mode):
    import time as _t

    with _HostileServer(mode) as srv:
        cfg = LadderConfig(url=srv.url, model="x", levels=[1, 2, 4], requests_per_level=3, input_len=2,
                           output_len=2, request_timeout_seconds=1.0, level_timeout_seconds=2.5)
        t0 = _t.monotonic()
        res = asyncio.run(run_ladder(cfg))
        took = _t.monotonic() - t0
    # level 1: 3 requests one after another, each cut at its 1 s total timeout (the level's 2.5 s cuts the
    # third); no request completed, so the higher levels (which can only do worse) are not run
    assert [lv["concurrency"] for lv in res["levels"]] == [1]
    lv = res["levels"][0]
    assert lv["completed"] == 0 and lv["errors"] == lv["requests"] >= 2
    assert any("timed out after 1 s" in e for e in lv["error_examples"])
    assert "stopped" in res["knee"]["reason"] or res.get("stopped")
    assert took < 8, took          # /metrics on the same server: read once, not once a second for 10 s each


def test_model_lookup_on_a_trickling_server_is_bounded():
    import time as _t

    from vllm_doctor.loadtest.ladder import BenchError

    with _HostileServer("drip") as srv:
        t0 = _t.monotonic()
        with pytest.raises(BenchError, match="no answer within 15 s"):
            asyncio.run(run_ladder(LadderConfig(url=srv.url, levels=[1], requests_per_level=1)))
        assert _t.monotonic() - t0 < 25


def test_deeply_nested_json_is_one_line_exit_2_for_compare_and_diagnose_bench(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    r = doctor("bench", "compare", str(deep), str(deep))
    assert r.returncode == 2 and "nested too deeply" in r.stderr and r.stderr.count("\n") == 1
    log = ROOT / "tests" / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log"
    r = doctor("diagnose", str(log), "--bench", str(deep))
    assert r.returncode == 2 and "nested too deeply" in r.stderr and "internal error" not in r.stderr


def test_compare_fails_a_run_whose_requests_failed(tmp_path, ladder_result):
    """A ladder level where requests failed must not PASS on its (meaningless) figures."""
    res = json.loads(json.dumps(ladder_result[0]))
    for lv in res["levels"]:
        lv["errors"] = 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(res))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(ladder_result[0]))
    r = doctor("bench", "compare", str(good), str(bad), "--level", "4", "--ttft-p99-ms", "100000")
    assert r.returncode == 1, r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("failed requests"))
    assert "0 -> 3" in " ".join(line.split()) and line.rstrip().endswith("FAIL")
    assert "preemptions" in r.stdout and "0.0" not in next(x for x in r.stdout.splitlines() if x.startswith("preemptions"))


# ---- objectives ----------------------------------------------------------------------------------

def _level(c, tp, ttft_ms, itl_ms=20.0):
    """A ladder level whose every request had the TTFT of ``ttft_ms`` (one value per request)."""
    from vllm_doctor.loadtest.ladder import LadderConfig, MetricsWindow, summarise
    from vllm_doctor.loadtest.client import RequestResult

    res = [RequestResult(ok=True, ttft_seconds=t / 1000, e2e_seconds=t / 1000 + 0.5, output_tokens=10,
                         prompt_tokens=20, itl_seconds=[itl_ms / 1000] * 9) for t in ttft_ms]
    lv = summarise(c, res, 0.0, len(res) * 10 / tp, MetricsWindow(), LadderConfig(url="http://x", levels=[c]))
    return lv


def test_recommendation_meets_every_objective_and_the_knee_is_a_separate_fact():
    """The README's ladder: the knee is 4 concurrent requests, where p99 TTFT was 2,093 ms, 4x the 500 ms
    objective. The recommendation is the highest level that met the objective (2), never the knee."""
    from vllm_doctor.loadtest.ladder import find_knee, recommend
    from vllm_doctor.loadtest.objectives import Objectives

    levels = [_level(1, 300, [150 + i for i in range(16)]), _level(2, 450, [250 + 5 * i for i in range(16)]),
              _level(4, 622, [1500 + 40 * i for i in range(16)]), _level(8, 250, [8000 + i for i in range(16)])]
    knee = find_knee(levels, 0.10)
    assert knee.found and knee.concurrency == 4
    rec = recommend(levels, knee, None, Objectives(ttft_p99_ms=500, itl_p99_ms=100))
    assert rec.value == 2
    text = "\n".join(rec.arithmetic)
    assert "knee (a separate fact): 4 concurrent requests" in text
    assert "2 concurrent requests is the highest level that met every objective (TTFT p99 <= 500 ms, " \
           "ITL p99 <= 100 ms); above it: 4 FAIL, 8 FAIL" in text
    # an ITL objective no level meets: nothing to recommend
    assert recommend(levels, knee, None, Objectives(ttft_p99_ms=500, itl_p99_ms=10)).value is None


def test_p99_has_a_bootstrap_interval_and_a_straddling_level_is_undecided():
    from vllm_doctor.loadtest.objectives import Objectives, judge, level_status, percentile_ci

    lo, hi = percentile_ci([float(i) for i in range(1, 9)], 99, seed=0)   # 8 requests: p99 is about the max
    assert hi == 8.0 and 5.0 <= lo < 8.0
    assert percentile_ci([float(i) for i in range(1, 9)], 99, seed=0) == (lo, hi)   # seeded
    big = percentile_ci([float(i) for i in range(1, 10_001)], 99, seed=1)
    assert 9_850 <= big[0] <= 9_900 <= big[1] <= 9_950                       # tight with 10,000 samples
    lv = _level(2, 450, [100.0] * 7 + [900.0])                               # one slow request in 8
    st = lv.ttft_ms
    assert st["p99_ci_low"] < 500 < st["p99_ci_high"] == 900.0
    from dataclasses import asdict
    v = judge(asdict(lv), Objectives(ttft_p99_ms=500, itl_p99_ms=None))
    assert v["ttft_p99_ms"]["status"] == "UNDECIDED" and level_status(v) == "UNDECIDED"
    assert level_status(judge(asdict(lv), Objectives(ttft_p99_ms=1000, itl_p99_ms=None))) == "PASS"
    assert level_status(judge(asdict(lv), Objectives(ttft_p99_ms=50, itl_p99_ms=None))) == "FAIL"


def test_ladder_prints_objectives_with_intervals(tmp_path):
    with FakeVllm(slots=2, token_seconds=0.005) as fake:
        r = doctor("bench", "ladder", "--url", fake.url, "--levels", "1,2", "--requests", "8", "--output-len", "3",
                   "--input-len", "4", "--ttft-p99-ms", "10000", "--e2e-p99-ms", "20000", "--output", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "Objectives: TTFT p99 <= 10,000 ms, ITL p99 <= 100 ms, E2E p99 <= 20,000 ms" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"\s+[12] .*\] ms PASS", ln)]
    assert len(rows) == 2 and rows[1].rstrip().endswith("PASS")
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["objectives"] == {"ttft_p99_ms": 10000.0, "itl_p99_ms": 100.0, "tpot_p99_ms": None, "e2e_p99_ms": 20000.0}
    assert res["levels"][1]["meets_objectives"] == "PASS" and res["recommendation"]["value"] == 2
    h = doctor("bench", "ladder", "--help")
    assert "--ttft-p99-ms" in h.stdout and "500" in h.stdout and "--itl-p99-ms" in h.stdout


# ---- compare: like with like ---------------------------------------------------------------------

def test_compare_refuses_every_unlike_pair_and_warns_with_allow_unlike(tmp_path, ladder_result):
    res = ladder_result[0]
    assert res["vllm_version"] == "0.0.0+fake"          # GET /version of the server, recorded in the result

    def write(name, doc):
        p = tmp_path / name
        p.write_text(json.dumps(doc))
        return str(p)

    base = write("base.json", res)
    other_version = write("v.json", {**res, "vllm_version": "0.33.0"})
    other_model = write("m.json", {**res, "model": "other-model"})
    longer = json.loads(json.dumps(res))
    for lv in longer["levels"]:
        lv["prompt_tokens"] *= 4
    longer = write("w.json", longer)
    c4, c8 = FIX / "vllm-0.32-cpu-bench-serve-c4.json", FIX / "vllm-0.32-cpu-bench-serve-c8.json"
    guide = FIX / "guidellm-0.8.1-vllm-0.32-cpu.json"
    cases = [((str(c4), str(c8)), "concurrency 4 vs 8"),
             ((str(c4), str(guide), "--level", "4"), "tool vllm-bench-serve vs guidellm"),
             ((base, other_model, "--level", "4"), "model fake-model vs other-model"),
             ((base, longer, "--level", "4"), "workload: 20 vs 80 prompt tokens per request"),
             ((base, other_version, "--level", "4"), "vLLM 0.0.0+fake vs 0.33.0")]
    for args, why in cases:
        r = doctor("bench", "compare", *args, "--ttft-p99-ms", "100000")
        assert r.returncode == 2 and why in r.stderr and "--allow-unlike" in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1
        r = doctor("bench", "compare", *args, "--ttft-p99-ms", "100000", "--allow-unlike")
        assert r.returncode in (0, 1, 3) and f"WARNING: unlike runs: {why}" in r.stdout, (args, r.stdout)
    r = doctor("bench", "compare", base, base, "--level", "4", "--format", "json")
    assert json.loads(r.stdout)["unlike"] == []


def test_compare_reports_each_change_with_its_interval_in_aligned_columns(tmp_path, ladder_result):
    p = tmp_path / "ladder.json"
    p.write_text(json.dumps(ladder_result[0]))
    r = doctor("bench", "compare", str(p), str(p), "--level", "4", "--ttft-p99-ms", "100000")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("indicator")))
    rows = [x for x in lines[head + 1:] if x and not x.startswith(("  ", "Verdict"))]
    assert [" ".join(x.split()[:2]) for x in rows] == ["TTFT p99", "TPOT mean", "output throughput", "preemptions 0",
                                                       "ITL p99", "TPOT p99", "E2E p99"]
    # the last three are reported, each with its interval
    assert all("overlap" in x for x in rows[4:]) and all(x.rstrip().endswith("INFO") for x in rows[4:])
    assert len({x.index("->") for x in rows}) == 1                   # the arrows, hence the columns, line up
    for col in ("change", "target", "result"):
        assert len({x.index(col) for x in [lines[head]]}) == 1
    assert {len(x) - len(x.lstrip()) for x in rows} == {0}
    ttft = rows[0]
    assert "no measurable change" in ttft and "overlap" in ttft
    # a real difference: the AFTER level's interval lies above BEFORE's
    a = json.loads(json.dumps(ladder_result[0]))
    for lv in a["levels"]:
        for k in ("p99", "p99_ci_low", "p99_ci_high"):
            lv["ttft_ms"][k] += 10_000
    q = tmp_path / "slow.json"
    q.write_text(json.dumps(a))
    r = doctor("bench", "compare", str(p), str(q), "--level", "4", "--ttft-p99-ms", "100000", "--format", "json")
    ch = json.loads(r.stdout)["checks"][0]["change"]
    assert ch.startswith("+10,000.0") and "[+" in ch and "no measurable" not in ch


# ---- chart ---------------------------------------------------------------------------------------

def test_bench_chart_rerenders_a_saved_ladder_with_legend_objective_and_preemption_marker(tmp_path):
    """The real ladder (vLLM 0.32 on CPU): preemptions began at 8 concurrent requests."""
    src = tmp_path / "ladder.json"
    src.write_text((FIX / "ladder-vllm-0.32-cpu.json").read_text())
    doc = json.loads(src.read_text())
    assert [lv["preemptions"] for lv in doc["levels"]][:3] == [0, 0, 0] and doc["levels"][3]["preemptions"] > 0
    r = doctor("bench", "chart", str(src))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "ladder.html").read_text()
    assert r.stdout.strip() == str(tmp_path / "ladder.html")
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):    # the wide and the narrow chart
        assert svg.count('class="legend"') == 1
        assert 'class="objective"' in svg and "TTFT p99 objective 500 ms" in svg
        assert 'class="preemption"' in svg and "preemption from 8" in svg
        assert svg.count('class="point-throughput"') == 4
    r = doctor("bench", "chart", str(src), "-o", str(tmp_path / "c.svg"))
    assert r.returncode == 0 and (tmp_path / "c.svg").read_text().startswith("<svg")
    for bad, why in ((FIX / "vllm-0.32-cpu-bench-serve-c4.json", "not a vllm-doctor bench ladder result"),
                     (tmp_path / "missing.json", "no such file")):
        r = doctor("bench", "chart", str(bad), "-o", str(tmp_path / "x.html"))
        assert r.returncode == 2 and why in r.stderr and r.stderr.count("\n") == 1


def test_a_level_whose_requests_ran_is_never_reported_as_up_to_0_running():
    """The e2e ladder against vLLM 0.32 on CPU printed "up to 0 running, KV cache up to 0 %" for levels
    whose requests ran: the sampler read /metrics once as the level began (before any request reached
    the server) and once after it (the server idle again), and took the peak of those. A level too short
    for one sample while its requests ran now says "not sampled" (None), never 0, and gives the mean
    numbers running and waiting from vLLM's own request-time histograms (Little's law)."""
    from vllm_doctor.loadtest.ladder import limit_of

    with FakeVllm(slots=4, token_seconds=0.01) as fake:
        cfg = LadderConfig(url=fake.url, levels=[2], requests_per_level=4, input_len=8, output_len=10,
                           metrics_interval_seconds=60.0)   # the level ends long before a first sample
        lv = asyncio.run(run_ladder(cfg))["levels"][0]
    assert lv["completed"] == 4 and lv["preemptions"] == 0
    assert lv["max_running"] is None and lv["max_kv_cache_usage_ratio"] is None and lv["max_waiting"] is None
    assert lv["metrics_samples"] == 0
    # 2 in flight back to back, never more than 2 slots: about 2 running on average, none waiting
    assert 1.0 <= lv["mean_running"] <= 2.0 and lv["mean_waiting"] == 0.0
    assert lv["limited_by"] == "compute"
    assert lv["limited_why"].startswith(f"on average {lv['mean_running']:.1f} running and 0.0 waiting "
                                        "(vllm:request_inference_time_seconds, vllm:request_queue_time_seconds "
                                        "over the level), nothing was preempted")
    assert lv["limited_why"].endswith("; nothing was preempted; running, waiting and KV cache usage not sampled "
                                      "(0 /metrics reads while its requests ran showed none of them: run the level "
                                      "longer (--requests))")
    assert "up to 0 running" not in lv["limited_why"]
    # a server without those histograms, read only where its gauges showed none of the requests: not sampled
    what, why = limit_of({**lv, "metrics_samples": 3, "mean_running": None, "mean_waiting": None})
    assert what is None and why.startswith("nothing was preempted; running, waiting and KV cache usage not "
                                           "sampled (3 /metrics reads")
    assert limit_of({**lv, "mean_running": 3.0, "mean_waiting": 2.5})[0] == "queue"


def test_the_level_counters_include_vllms_running_and_waiting_seconds():
    """vLLM 0.32's own /metrics (real, on CPU: tests/fixtures/metrics/vllm-0.32-cpu-preemption.txt): the
    histogram sums of the seconds finished requests spent RUNNING and WAITING, read in one parse."""
    from vllm_doctor.ingest.scrape import parse_metrics
    from vllm_doctor.loadtest.ladder import RECOMPUTED, RUNNING_SECONDS, WAITING_SECONDS, _counters

    text = (ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt").read_text()
    c = _counters(parse_metrics(text, source="fixture"), text)
    assert c[RUNNING_SECONDS] == pytest.approx(353.1403794500002)
    assert c[WAITING_SECONDS] == pytest.approx(237.72402132000013)
    assert c[RECOMPUTED] is None          # vLLM 0.32 does not export it


def test_the_peaks_are_sampled_while_the_levels_requests_are_in_flight():
    """Samples are taken only while requests are in flight: at 1 and 2 concurrent requests every sample
    shows them, so the peak is the level itself (the idle reads at the level's edges are no peak)."""
    with FakeVllm(slots=4, token_seconds=0.02) as fake:
        cfg = LadderConfig(url=fake.url, levels=[1, 2], requests_per_level=6, input_len=8, output_len=15,
                           metrics_interval_seconds=0.1)
        res = asyncio.run(run_ladder(cfg))
    for lv, level in zip(res["levels"], [1, 2], strict=True):
        assert lv["max_running"] == level and lv["max_waiting"] == 0
        assert lv["max_kv_cache_usage_ratio"] == level / 4      # the stand-in's KV usage: running / slots
        assert lv["metrics_samples"] >= 5
        assert f"up to {level} running" in lv["limited_why"]


def test_a_window_whose_samples_never_showed_the_requests_reports_no_peak():
    """vLLM sets running / waiting after each engine step: reads during a request's first (prefill) step
    show none of it. A level whose every sample showed 0 running and 0 waiting has no known peak."""
    from types import SimpleNamespace

    from vllm_doctor.loadtest.client import RequestResult
    from vllm_doctor.loadtest.ladder import MetricsWindow, summarise

    w = MetricsWindow(preemptions_before=0.0, preemptions_after=0.0)
    for _ in range(3):
        w.add(SimpleNamespace(num_running=0.0, num_waiting=0.0, kv_cache_usage_ratio=0.0))
    done = [RequestResult(ok=True, ttft_seconds=0.5, e2e_seconds=1.0, output_tokens=10)]
    cfg = LadderConfig(url="http://127.0.0.1:1", levels=[1])
    lv = summarise(1, done, 0.0, 1.0, w, cfg)
    assert (lv.max_running, lv.max_waiting, lv.max_kv_cache_usage_ratio, lv.metrics_samples) == (None, None, None, 3)
    w.add(SimpleNamespace(num_running=1.0, num_waiting=0.0, kv_cache_usage_ratio=0.25))
    lv = summarise(1, done, 0.0, 1.0, w, cfg)
    assert (lv.max_running, lv.max_waiting, lv.max_kv_cache_usage_ratio, lv.metrics_samples) == (1.0, 0.0, 0.25, 4)


def test_itl_is_per_token_when_chunks_arrive_together():
    """A loaded server's chunks reach the client in bursts (the e2e ladder against vLLM 0.32 on CPU: ITL
    p99 0 ms at 4 concurrent requests while TPOT was 2.7 ms). Timed one by one, the chunks of one network
    read showed gaps of microseconds (the parser's time); now they share the gap since the previous read,
    one value per token, as vLLM's own vllm:inter_token_latency_seconds is. The stream is vLLM's
    completion chunk shape, delivered in three reads by httpx's MockTransport."""
    import httpx

    from vllm_doctor.loadtest.client import request_body, stream_one

    def event(i: int) -> bytes:
        return b"data: " + json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": f" t{i}"}]}).encode() + b"\n\n"

    async def body():
        yield b"".join(event(i) for i in range(5))      # the first token and 4 more, in one read
        await asyncio.sleep(0.05)
        yield b"".join(event(i) for i in range(5, 10))  # 5 tokens read together, 50 ms later
        await asyncio.sleep(0.05)
        yield (b'data: {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 10, '
               b'"total_tokens": 13}}\n\ndata: [DONE]\n\n')

    async def run():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body()))
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_one(client, "http://vllm/v1/completions", request_body("m", "a b c", 10, False, True),
                                    False, 30.0)

    res = asyncio.run(run())
    assert res.ok and res.output_tokens == 10 and res.prompt_tokens == 3
    # 5 gaps (the second read's tokens), equal, their sum the 50 ms or more between the reads; the 4 chunks
    # that came with the first token have no gap of their own
    assert len(res.itl_seconds) == 5
    assert len(set(res.itl_seconds)) == 1 and sum(res.itl_seconds) >= 0.05
    assert min(res.itl_seconds) >= 0.01


def test_metrics_reader_retries_a_closed_connection_and_one_failed_read_is_not_the_runs_error():
    """vLLM may close a kept-alive connection between two /metrics reads (httpx: RemoteProtocolError): the
    read is tried once more. A read that fails among good ones is counted, and the run does not say
    "/metrics not read" (it did, on vLLM 0.32 on CPU, though every later read worked)."""
    import asyncio

    import httpx

    from vllm_doctor.loadtest.ladder import _MetricsReader

    body = (ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt").read_text()
    answers = iter(["closed", "ok", "500", "ok"])

    def handler(request):
        a = next(answers)
        if a == "closed":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(500 if a == "500" else 200, text=body)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = _MetricsReader(client, "http://vllm/metrics")
            first = await r.read()          # closed, then read again: a sample
            assert first is not None and first.sample.num_preemptions_total == 105
            assert (r.reads_ok, r.reads_failed, r.error) == (1, 0, None)
            assert await r.read() is None   # HTTP 500: one failed read
            assert await r.read() is not None
            return r

    r = asyncio.run(go())
    assert (r.reads_ok, r.reads_failed, r.error, r.last_error) == (2, 1, None, "http://vllm/metrics: HTTP 500")


def test_the_recommended_level_itself_met_the_objectives():
    """The highest level that passed (8) lies above an UNDECIDED one (4), and the KV cache holds 4 of these
    requests: min(8, 4) = 4 was recommended though level 4 did not clearly meet the objective (the e2e
    ladder against vLLM 0.32 on CPU did this). The answer is the highest level at or below it that did: 2."""
    from vllm_doctor.loadtest.ladder import find_knee, recommend
    from vllm_doctor.loadtest.objectives import Objectives

    levels = [_level(1, 300, [150] * 16), _level(2, 450, [250] * 16),
              _level(4, 600, [400] * 15 + [520]), _level(8, 700, [300] * 16)]
    obj = Objectives(ttft_p99_ms=500, itl_p99_ms=100)
    rec = recommend(levels, find_knee(levels, 0.10), 4 * 30, obj)   # 30 tokens a request: the KV cache holds 4
    text = "\n".join(rec.arithmetic)
    assert "= min(8 (the highest level that met every objective), 4 (what the KV cache holds for these requests)) = 4" in text
    assert "4 concurrent requests was UNDECIDED on the objectives: 2, the highest level below it that met them" in text
    assert rec.value == 2
