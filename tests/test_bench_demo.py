"""`vllm-doctor bench demo` and what it shows: the bundled SIMULATED server (a cost model of vLLM's
scheduler and paged KV cache, vllm_doctor/loadtest/simulated.py), the workloads of the ladder
(fixed, ShareGPT-like, the 512/1024/2048 profile, a shared prefix), the adaptive stop, warm-up,
rate ladders and the resource that limits each level (from the server's own /metrics)."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest

from vllm_doctor.loadtest.ladder import LadderConfig, interval_enough, limit_of, run_ladder
from vllm_doctor.loadtest.objectives import Objectives
from vllm_doctor.loadtest.simulated import SIMULATION_NOTE, Engine, SimConfig, SimulatedServer
from vllm_doctor.loadtest.workload import Workload

ROOT = Path(__file__).resolve().parents[1]


def doctor(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# ---- the simulated engine, without HTTP -------------------------------------------------------------

def _run_engine(cfg: SimConfig, n: int, prompt_words: int, max_tokens: int) -> Engine:
    async def go():
        eng = Engine(cfg)
        seqs = [eng.submit([f"w{i}"] + ["x"] * (prompt_words - 1), max_tokens) for i in range(n)]
        for s in seqs:
            while await s.out.get() is not None:
                pass
        return eng
    return asyncio.run(go())


def _value(eng: Engine, name: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(eng.registry).decode()
    return sum(float(x) for x in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def test_preemption_begins_only_when_the_kv_cache_is_full():
    # 16 blocks of 4 tokens = 64 tokens; a sequence of 12 prompt + 8 output = 20 tokens holds 5 blocks
    cfg = SimConfig(num_gpu_blocks=16, block_size=4, step_seconds=0.0002, decode_seq_seconds=0.0,
                    prefill_token_seconds=0.0)
    fits = _run_engine(cfg, 3, 12, 8)          # 3 x 5 = 15 blocks: they all fit
    assert _value(fits, "vllm:num_preemptions_total") == 0
    assert _value(fits, "vllm:request_success_total") == 3
    assert _value(fits, "vllm:generation_tokens_total") == 3 * 8
    full = _run_engine(cfg, 5, 12, 8)          # 5 prompts of 3 blocks are admitted (15), then they grow
    assert _value(full, "vllm:num_preemptions_total") > 0
    assert _value(full, "vllm:prompt_tokens_recomputed_total") > 0
    assert _value(full, "vllm:request_success_total") == 5     # preempted, recomputed, finished
    assert full.free_blocks == cfg.num_gpu_blocks               # every block given back


def test_the_prefix_cache_serves_a_shared_prefix():
    cfg = SimConfig(num_gpu_blocks=64, block_size=4, step_seconds=0.0002)

    async def go():
        eng = Engine(cfg)
        shared = ["s"] * 16
        for i in range(3):
            seq = eng.submit(shared + [f"q{i}", "x", "y", "z"], 2)
            while await seq.out.get() is not None:
                pass
        return eng
    eng = asyncio.run(go())
    assert _value(eng, "vllm:prefix_cache_queries_total") == 3 * 20
    assert _value(eng, "vllm:prefix_cache_hits_total") == 2 * 16     # the 2nd and 3rd hit the 4 shared blocks


# ---- workloads ----------------------------------------------------------------------------------------

def test_workloads_fixed_sharegpt_profile_and_prefix():
    fixed = Workload(input_len=50, output_len=20)
    p, out = fixed.request(7)
    assert len(p.split()) == 50 and out == 20 and p.split()[0] == "7"
    assert fixed.request(7) == Workload(input_len=50, output_len=20).request(7)     # seeded
    assert fixed.request(7) != fixed.request(8)
    sg = Workload(input_len=200, output_len=100, lengths="sharegpt")
    ins = [len(sg.request(i)[0].split()) for i in range(2000)]
    outs = [sg.request(i)[1] for i in range(2000)]
    assert 170 <= statistics.mean(ins) <= 230 and 85 <= statistics.mean(outs) <= 115
    assert statistics.median(ins) < 150 and max(ins) > 600                         # long-tailed
    prof = Workload(profile="512-1024-2048")
    assert [len(prof.request(i)[0].split()) for i in range(6)] == [512, 1024, 2048] * 2
    pre = Workload(input_len=100, prefix_ratio=0.5)
    a, b = pre.request(1)[0].split(), pre.request(2)[0].split()
    assert a[:50] == b[:50] and a[50] == "1" and b[50] == "2" and len(a) == 100
    with pytest.raises(ValueError, match="--prefix-ratio applies to synthetic prompts"):
        Workload(prefix_ratio=0.2, prompts=("a real prompt",))


# ---- the adaptive stop and the limiting resource -------------------------------------------------------

def test_an_adaptive_level_stops_when_every_interval_is_decided():
    obj = Objectives(ttft_p99_ms=500, itl_p99_ms=None)
    far = {"ttft_ms": [0.05 + 0.001 * i for i in range(20)]}            # 50-69 ms: far under 500
    assert interval_enough(far, obj, 0.1, 0).startswith("its intervals were decided: TTFT p99")
    near = {"ttft_ms": [0.1] * 19 + [0.9]}                               # one slow request in 20: [100-900] straddles 500
    assert interval_enough(near, obj, 0.1, 0) is None
    assert interval_enough({"ttft_ms": []}, obj, 0.1, 0) is None


def test_the_limit_of_a_level_from_the_servers_metrics():
    assert limit_of({"preemptions": 3, "max_kv_cache_usage_ratio": 1.0, "max_waiting": 2})[0] == "kv-cache"
    assert limit_of({"preemptions": 0, "max_kv_cache_usage_ratio": 0.4, "max_waiting": 5, "max_running": 8})[0] == "queue"
    assert limit_of({"preemptions": 0, "max_kv_cache_usage_ratio": 0.4, "max_waiting": 0, "max_running": 4})[0] == "compute"
    assert limit_of({"preemptions": None, "max_kv_cache_usage_ratio": None, "max_waiting": None}) == (None, None)
    # one request that waited for an instant (1 sample in 20) is no queue; waiting in half the samples is
    blip = {"preemptions": 0, "max_kv_cache_usage_ratio": 0.45, "max_waiting": 1, "max_running": 7}
    assert limit_of({**blip, "waiting_sample_ratio": 0.05})[0] == "compute"
    assert limit_of({**blip, "waiting_sample_ratio": 0.5})[0] == "queue"


# ---- the ladder against the simulated server ---------------------------------------------------------

FAST = SimConfig(step_seconds=0.004, decode_seq_seconds=0.0004, prefill_token_seconds=0.00001)


def test_a_rate_ladder_with_poisson_arrivals_and_warm_up_left_out():
    with SimulatedServer(FAST) as sim:
        res = asyncio.run(run_ladder(LadderConfig(url=sim.url, levels=[1], rates=[5.0, 20.0], requests_per_level=10,
                                                  warmup_requests=3, input_len=40, output_len=8,
                                                  metrics_interval_seconds=0.2)))
    assert [lv["request_rate"] for lv in res["levels"]] == [5.0, 20.0]
    for lv in res["levels"]:
        assert lv["requests"] == 10 and lv["completed"] == 10 and lv["warmup_requests"] == 3 and lv["sent"] == 13
    assert res["simulated"] is True and "simulated" in res["vllm_version"]
    rec = res["recommendation"]
    assert rec["flag"] == "" and rec["value"] in (5.0, 20.0)          # a capacity in requests/s, not a flag


def test_bench_demo_runs_labelled_a_simulation_with_the_kv_cache_as_the_limit(tmp_path):
    r = doctor("bench", "demo", "--levels", "1,16", "--level-seconds", "5", "-o", str(tmp_path / "d.json"),
               "--chart", str(tmp_path / "d.html"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == SIMULATION_NOTE and lines[-1] == SIMULATION_NOTE
    res = json.loads((tmp_path / "d.json").read_text())
    assert res["simulated"] is True
    one, sixteen = res["levels"]
    assert one["preemptions"] == 0 and one["limited_by"] == "compute"
    assert sixteen["preemptions"] > 0 and sixteen["limited_by"] == "kv-cache"   # 16 sequences overflow 1,536 tokens
    assert sixteen["max_kv_cache_usage_ratio"] >= 0.9 and sixteen["prompt_tokens_recomputed"] > 0
    assert res["recommendation"]["limited_by"] == "kv-cache"
    assert "limited by the KV cache at 16 concurrent requests" in r.stdout
    assert all(lv["stop_reason"] for lv in res["levels"])            # adaptive: each says why it stopped
    page = (tmp_path / "d.html").read_text()
    assert escape(SIMULATION_NOTE) in page and "preemption from 16" in page


def test_the_chart_is_readable_at_480_px_in_chromium(tmp_path):
    """The narrow chart is drawn at its own size on a phone (not a 760 px chart shrunk to 60 %)."""
    from browser import headless_chromium

    from vllm_doctor.loadtest.chart import NARROW_W, html_page

    page = tmp_path / "ladder.html"
    page.write_text(html_page(json.loads((ROOT / "tests" / "fixtures" / "bench" / "ladder-vllm-0.32-cpu.json").read_text())))
    for width, shown in ((1280, 760), (480, NARROW_W)):
        b = headless_chromium(width=width, height=1000)
        try:
            b.get(page.as_uri())
            visible = [e for e in b.find_elements("css selector", "svg.ladder-chart") if e.is_displayed()]
            assert len(visible) == 1 and visible[0].size["width"] == shown
            assert b.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
        finally:
            b.quit()


# ---- compare: rate ladders and workloads are like-for-like too ----------------------------------------

def test_compare_warns_on_unlike_rates_and_workloads_and_reports_every_p99_with_its_interval(tmp_path):
    real = json.loads((ROOT / "tests" / "fixtures" / "bench" / "ladder-vllm-0.32-cpu.json").read_text())
    for lv in real["levels"]:     # recorded before the ladder gave intervals: one like today's
        p99 = lv["itl_ms"]["p99"]
        lv["itl_ms"].update(p99_ci_low=0.9 * p99, p99_ci_high=1.1 * p99)

    def write(name, doc):
        (tmp_path / name).write_text(json.dumps(doc))
        return str(tmp_path / name)

    base = write("a.json", {**real, "workload": "200-word prompts, 300 output tokens"})
    other = write("b.json", {**real, "workload": "profile 512-1024-2048 (prompts of 512, 1024, 2048 words in turn)"})
    rated = json.loads(json.dumps(real))
    for lv in rated["levels"]:
        lv["request_rate"] = float(lv["concurrency"])     # a rate ladder at 1, 2, 4, 8 req/s
    rated = write("r.json", rated)
    r = doctor("bench", "compare", base, other, "--level", "4")
    assert r.returncode == 2 and "workload: '200-word prompts, 300 output tokens' vs 'profile 512-1024-2048" in r.stderr
    r = doctor("bench", "compare", base, rated, "--level", "4", "--allow-unlike", "--ttft-p99-ms", "100000")
    assert "WARNING: unlike runs: request rate closed loop vs 4 req/s" in r.stdout
    r = doctor("bench", "compare", base, base, "--level", "4", "--format", "json")
    checks = {c["indicator"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["ITL p99"]["change"].startswith("no measurable change") and checks["ITL p99"]["status"] == "INFO"


def test_diagnose_bench_names_a_rate_ladders_level_by_its_rate():
    from vllm_doctor.loadtest.annotate import began_at

    res = {"levels": [{"concurrency": 256, "request_rate": 4.0, "preemptions": 2},
                      {"concurrency": 256, "request_rate": 1.0, "preemptions": 0}]}
    assert began_at(res, "preemption-storm", None) == "bench ladder: began at 4 req/s (first level with preemptions (2))"


@pytest.mark.parametrize("args,said", [(("--lengths", "foo"), "--lengths 'foo': one of fixed, sharegpt"),
                                       (("--profile", "x"), "--profile 'x': one of 512-1024-2048"),
                                       (("--rates", "1,x"), "--rates '1,x': comma-separated positive request rates"),
                                       (("--prefix-ratio", "1.5"), "--prefix-ratio: a ratio from 0 to below 1")])
def test_bad_workload_options_are_one_line_exit_2(args, said):
    r = doctor("bench", "ladder", "--url", "http://127.0.0.1:9", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
