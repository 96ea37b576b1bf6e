"""Issue 11, the advice half: fix values from what was observed (one calculation for every rule,
the method stated), fixes that say whether they are alternatives and appear once, incidents as
occurrences in time (restarts split them; --since / --until), per-engine state for data
parallel, engine-stalled, and evidence that supports the sentence it backs. Real logs and real
/metrics captures throughout (tests/fixtures/logs/README.md gives each one's provenance)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from conftest import LOGS, METRICS, diagnose_file, log
from serve_helpers import live_sidecar, value, wait_for

from vllm_doctor.diagnosis.advice import concurrency
from vllm_doctor.pipeline import Pipeline
from vllm_doctor.diagnosis import load_rules
from vllm_doctor.ingest.replay import restamp
from vllm_doctor.ingest.scrape import parse_metrics

DEMO = LOGS / "cpu-preemption-tiny-kv-cache.log"
DEMO_METRICS = METRICS / "vllm-0.32-cpu-preemption.txt"


def by_name(rep) -> dict:
    return {f.name: f for f in rep.findings}


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


# ---- one calculation: what ran when the KV cache was full ---------------------------------------
def test_the_issue_case_922496_tokens_182_running_is_not_cut_to_23(tmp_path):
    # The real 0.10.1 start-up of 039 (922,496 KV tokens, "Maximum concurrency for 40,000 tokens per
    # request: 23.06x") followed by a stats line in that version's format with what the operator
    # reported: 182 running at 99 % KV cache, requests waiting.
    start = (LOGS / "039-v0.10.1-v1-healthy-startup-kv-pool-init-engine.log").read_text()
    stats = ("(APIServer pid=1399300) INFO 08-19 15:10:02 [loggers.py:123] Engine 000: Avg prompt throughput: "
             "812.3 tokens/s, Avg generation throughput: 3410.9 tokens/s, Running: 182 reqs, Waiting: 57 reqs, "
             "GPU KV cache usage: 99.0%, Prefix cache hit rate: 12.1%\n")
    p = tmp_path / "vllm.log"
    p.write_text(start + stats)
    rep = diagnose_file(p)
    assert rep.facts["kv_cache_tokens"] == 922496 and rep.facts["max_model_len"] == 40000
    f = by_name(rep)["kv-capacity-bound"]
    mns = {x.flag: x for x in f.fixes}.get("--max-num-seqs")
    # 182 ran with the cache full: 182 is what vLLM already admits, no fix; and no preemption was
    # counted or inferred, so no cut to the never-preempt bound 922,496 / 40,000 = 23 either
    assert mns is None
    assert "23 sequences" not in f.message and "which held 182 running sequences when it was full" in f.message
    c = f.values["c"]
    assert c is not None
    pipe_c = _concurrency_of(p)
    assert (pipe_c.value, pipe_c.method, pipe_c.never_preempt) == (182, "running-at-full", 23)
    assert "never-preempt bound (every sequence at max_model_len) would be 922,496 / 40,000 = 23" in pipe_c.text


def _concurrency_of(path: Path):
    pipe = Pipeline(load_rules([]))
    pipe.feed(path.name, path.read_bytes())
    pipe.end(path.name)
    facts = pipe.state.facts()
    return concurrency(list(pipe.state.stats), [], facts["kv_cache_tokens"], facts["max_model_len"], 0.95,
                       facts["block_size"])


def test_demo_leads_with_the_bound_below_what_ran_and_both_rules_agree():
    rep = diagnose_file(DEMO, metrics_files=[str(DEMO_METRICS)])
    f = by_name(rep)
    storm, bound = f["preemption-storm"], f["kv-capacity-bound"]
    # vLLM never ran more than 4 (peak_num_running) and preempted 105 times: --max-num-seqs 4 is no
    # fix. The never-preempt bound 4,096 / 2,048 = 2 is below the 4 that ran at 100 % (line 138)
    assert (rep.facts["peak_num_running"], rep.facts["preemptions_total"]) == (4, 105)
    fx = {x.flag: x for x in storm.fixes}
    assert fx["--max-num-seqs"].value == "2"
    # requests really grew to 1,585 of max_model_len's 2,048 tokens (line 125): at that length the
    # cache holds 2, which is the never-preempt bound as well
    assert fx["--max-num-seqs"].arithmetic.startswith(
        "77.4% x 4,096 KV cache tokens / 2 running = 1,585 tokens per sequence at most")
    assert "never-preempt bound: 4,096 KV cache tokens / max_model_len 2,048 = 2" in fx["--max-num-seqs"].arithmetic
    assert "; 4 were running when the KV cache was full (100.0%, engine 0, cpu-preemption-tiny-kv-cache.log:138)" \
        in fx["--max-num-seqs"].arithmetic
    assert fx["--max-num-seqs"].also_for == ["kv-capacity-bound"]
    # the same calculation in both rules, so one value; listed once (under the first finding)
    assert storm.values["c"] == bound.values["c"]
    assert not any(x.flag == "--max-num-seqs" for x in bound.fixes)
    # a whole sentence that says where the fix is
    assert "--max-num-seqs 2 also fixes this; it is listed under preemption-storm (VD001)" in bound.notes
    # alternatives, not a set: admit fewer OR a larger explicitly sized KV cache (never both)
    assert {(x.flag, x.option, x.relation) for x in storm.fixes} == {
        ("--max-num-seqs", 1, "alternative"), ("--kv-cache-memory-bytes", 2, "alternative")}
    # the KV cache size is computed: 16 requests were running or waiting at once, 4 fit in 4 MiB
    assert fx["--kv-cache-memory-bytes"].value == str(16 << 20)
    assert fx["--kv-cache-memory-bytes"].arithmetic == "4,194,304 bytes x 16 sequences / 4 held = 16,777,216 (rounded up to a MiB)"


def test_the_demo_states_no_false_fact_and_quotes_only_what_supports_it():
    rep = diagnose_file(DEMO, metrics_files=[str(DEMO_METRICS)])
    f = by_name(rep)
    bound = f["kv-capacity-bound"]
    # "full (95 % or more) with up to N waiting": N is 12 (line 138 at 100 %), not 14 (line 125 at 77.4 %)
    assert "full (95% or more) with up to 12 requests waiting" in bound.message
    for e in bound.evidence:
        assert float(e.text.split("KV cache usage: ")[1].split("%")[0]) >= 95.0
    storm = f["preemption-storm"]
    # the storm's sentence names both peaks separately, each with the line that shows it
    assert "the KV cache peaked at 100.0% (4 running, 12 waiting) and up to 14 requests waited (KV cache 77.4%)" in storm.message
    assert [e.lineno for e in storm.evidence] == [125, 138]


def test_054_the_260_that_ran_at_full_is_no_fix():
    # 260 ran at 100 % and vLLM never ran more (peak_num_running 260): admitting 260 changes nothing,
    # and without the KV cache size in the log there is no never-preempt bound to lead with
    rep = diagnose_file(log("054"))
    f = by_name(rep)["kv-capacity-bound"]
    assert rep.facts["peak_num_running"] == 260 and f.values["c"]["value"] == 260
    assert "--max-num-seqs" not in {x.flag for x in f.fixes}
    assert "which held 260 running sequences when it was full" in f.message


def test_max_num_seqs_below_what_ran_only_reduces_preemption():
    # 40 ran when vLLM counted preemptions at 91 % (never full); the longest a sequence was seen to
    # hold fits 30; with no KV cache size there is no bound: 30 stops preemption at the lengths seen,
    # not for longer requests
    from vllm_doctor.diagnosis.advice import Concurrency

    c = Concurrency(30, "tokens-per-sequence", 40, 0.91, 100.0, None, 3000, None, None,
                    pressure_running=40, pressure_full=False, longest_per_sequence=100.0, longest_fit=30,
                    longest_sample=type("S", (), {"kv_cache_usage_ratio": 0.91, "num_running": 40, "meta": None})())
    assert (c.admit, c.admit_stops, c.admit_method) == (30, False, "longest-observed")
    assert "at the longest length observed (100 tokens a sequence); longer ones can still be preempted" in c.admit_why
    # at or above what ran: nothing to propose
    assert Concurrency(40, "running-at-full", 40, 1.0, pressure_running=40, longest_fit=40).admit is None
    # vLLM counted preemptions even with 9 running: a value at or above 9 stops nothing, so the
    # never-preempt bound (8) is the value, though the observed length would fit 20
    b = Concurrency(40, "running-at-full", 40, 1.0, never_preempt=8, kv_cache_tokens=65536, max_model_len=8192,
                    block_size=16, pressure_running=40, pressure_full=True, longest_fit=20, preempting_running=9)
    assert (b.admit, b.admit_stops, b.admit_method) == (8, True, "below-preempting")
    assert b.admit_text.startswith("never-preempt bound: 65,536 KV cache tokens / max_model_len 8,192 = 8 "
                                   "(4,096 blocks of 16 tokens / 512 blocks per sequence); vLLM counted preemptions with 9 running")
    # /metrics read every 2 s (the demo's, through the fleet): 2 running at the end of a step with
    # preemptions, after they shrank it; 2 is the never-preempt bound (no sequence of 2 can be
    # preempted), below the 6 that ran full: the fix, as diagnose gives it from the log
    m = Concurrency(6, "running-at-full", 6, 1.0, never_preempt=2, kv_cache_tokens=4096, max_model_len=2048,
                    block_size=128, pressure_running=6, pressure_full=True, longest_fit=2, longest_per_sequence=1651.6,
                    clean_running=6, preempting_running=2)
    assert (m.admit, m.admit_stops, m.admit_method) == (2, True, "longest-observed")
    # an interval where vLLM counted no preemption with 24 running: what the server ran cleanly
    d = Concurrency(40, "running-at-full", 40, 1.0, never_preempt=8, pressure_running=40, longest_fit=20,
                    clean_running=24)
    assert (d.admit, d.admit_method) == (24, "ran-without-preemption")
    # nothing seen running: the never-preempt bound, and only as an assumption
    e = Concurrency(8, "never-preempt-bound", never_preempt=8, kv_cache_tokens=65536, max_model_len=8192)
    assert (e.admit, e.admit_method) == (8, "never-preempt-bound") and e.admit_why.startswith("Assumed")


# ---- evidence and wording ------------------------------------------------------------------------
def test_nccl_evidence_quotes_the_error_and_nccl_debug_is_a_check_not_a_fix():
    f = by_name(diagnose_file(log("048")))["nccl-failure"]
    assert [e.text for e in f.evidence] == ["RuntimeError: NCCL error: unhandled system error (r"]
    assert "raise RuntimeError" not in f.message and "(RuntimeError: NCCL error: unhandled system error" in f.message
    assert "NCCL_DEBUG" not in {x.flag for x in f.fixes}
    assert any("NCCL_DEBUG=INFO" in c for c in f.checks)
    # 064: the error line itself is cut from the paste: the message names where it failed
    f = by_name(diagnose_file(log("064")))["nccl-failure"]
    assert "NCCL failed in ncclCommInitRank (the traceback's last frame" in f.message
    assert len(f.evidence) == 1


def test_engine_dead_never_points_above_when_the_traceback_is_below():
    # 069: the EngineDeadError is line 1, the EngineCore traceback follows it (and is cut)
    f = by_name(diagnose_file(log("069")))["engine-dead"]
    assert "above" not in f.message
    assert any("first exception there is the cause" in c for c in f.checks)


def test_old_version_gets_one_upgrade_fix_not_notes():
    f = by_name(diagnose_file(log("033")))["prefill-blocking"]
    up = f.fixes[0]
    assert (up.kind, up.flag, up.value) == ("upgrade", "vllm", ">=0.7.3")
    assert "upgrade to >= 0.7.3 and set --enable-chunked-prefill" in up.why
    assert all(x.option == up.option and x.relation == "set" for x in f.fixes) and not f.notes


def test_startup_oom_after_the_weights_names_the_batch_not_more_gpus():
    # #23230: "Model loading took 16.5557 GiB" on a 44.40 GiB GPU, then 33.75 GiB asked, 26.88 free
    f = by_name(diagnose_file(log("072")))["startup-oom"]
    assert "after the weights loaded: they take 16.56 GiB of the 44.40 GiB device" in f.message
    assert "33.75 GiB more with 26.88 GiB free" in f.message and "--max-model-len" in f.message
    # the weights fit: no tensor parallelism, no quantization; one 33.75 GiB allocation with no KV
    # cache size logged before it is the profiling run, not CUDA graphs: no --enforce-eager, and
    # nothing said about running eager. The log shows neither batch size: a check, with the share
    assert "profiling run" in f.message and "eager" not in f.message
    assert "At most 79% of that batch fits in what was free (26.88 / 33.75 GiB)" in f.message
    assert f.fixes == [] and f.checks and "at most 79% of it" in f.checks[0]


def test_startup_oom_without_the_weights_size_takes_the_parallel_size_from_the_workers():
    # #14095: 20 MiB more impossible on a 14.62 GiB GPU, two VllmWorkerProcess beside the driver (TP
    # >= 3, a power of two in practice: 4): the next size is 8, never 2; both it and fp8 weights rest
    # on what the log does not show (the weights' size): graded assumed
    f = by_name(diagnose_file(log("006")))["startup-oom"]
    got = {x.flag: (x.value, x.relation, x.grade) for x in f.fixes}
    assert got == {"--tensor-parallel-size": ("8", "alternative", "assumed"),
                   "--quantization": ("fp8", "alternative", "assumed")}
    # 004 (405B FP8 over 8 GPUs, the KV cache too small): no OOM, so no weight flags
    assert "--quantization" not in {x.flag for x in by_name(diagnose_file(log("004")))["startup-oom"].fixes}


# ---- engine-stalled -------------------------------------------------------------------------------
def test_engine_stalled_on_a_real_stall():
    rep = diagnose_file(log("070"))
    occ = [f for f in rep.findings if f.name == "engine-stalled"]
    f = occ[0]
    assert f.severity == "critical" and f.rule_id == "VD011"
    # 1 waiting, 0 running, 0.0 / 0.0 tokens/s at 16:47:46, 16:57:26, 17:07:26 (the client retried in
    # between), then nothing until 19:40:45: one incident; the stall after 19:41:05 is another
    assert [(o.occurrence, o.first_seen) for o in occ] == [(1, utc("2026-03-22T16:47:46")),
                                                           (2, utc("2026-03-22T19:41:05"))]
    # the message is the longest stall of the last evaluation (17:07:26 until 19:40:45), and the
    # evidence is the line that shows it (never lines of another window that could contradict it)
    assert [e.lineno for e in f.evidence] == [15]
    assert "for 153.3 min" in f.message
    assert all("Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s" in e.text
               and "Waiting: 1 reqs" in e.text for e in f.evidence)
    assert "engine 0 had 1 request waiting and 0 running for" in f.message
    assert f.checks == ["Before restarting, `py-spy dump --pid PID` the EngineCore and worker processes to see where they wait."]


def test_engine_stalled_since_until_and_its_duration():
    rep = diagnose_file(log("070"), until=utc("2026-03-22T16:50:00"))
    f = by_name(rep)["engine-stalled"]
    # the stall began 16:47:46 and was still on at --until 16:50:00: 2.2 min
    assert f.values["minutes"] == round((utc("2026-03-22T16:50:00") - utc("2026-03-22T16:47:46")) / 60, 6)
    assert "still stalled at the last data" in f.message
    assert [e.lineno for e in f.evidence] == [9]
    rep = diagnose_file(log("070"), since=utc("2026-03-22T19:00:00"))
    f = by_name(rep)["engine-stalled"]
    assert {e.lineno for e in f.evidence} <= {19, 22} and f.first_seen >= utc("2026-03-22T19:00:00")


def test_engine_stalled_silent_on_idle_healthy_and_prefill_heavy_logs():
    for name in ("025", "026", "037", "039", "041", "052", "066", "cpu-basic", "033", "034", "054", "cpu-preemption"):
        assert "engine-stalled" not in by_name(diagnose_file(log(name))), name


def test_engine_stalled_from_metrics_counters_that_do_not_move(tmp_path):
    # The real 0.32 capture, scraped three times 30 s apart with nothing processed in between:
    # the token counters stay put. The waiting gauge of that capture is 0 (the run had drained), so
    # it is set to 3 here: the one derived value of this test.
    page = (METRICS / "vllm-0.32-cpu-basic.txt").read_text().replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0')
    pipe = Pipeline(load_rules([]), follow=True)
    t0 = utc("2026-11-30T09:20:00")
    for i in range(4):
        pipe.observe(parse_metrics(page, now=t0 + 30 * i).sample)
    active = {f.name: f for f in pipe.evaluate(t0 + 90)}
    f = active["engine-stalled"]
    assert "3 requests waiting" in f.message and "/metrics scrapes" in f.message
    # the same scrapes with the counters moving: no stall
    pipe = Pipeline(load_rules([]), follow=True)
    for i in range(4):
        moving = page.replace('vllm:generation_tokens_total{engine="0",model_name="tiny"} 107648.0',
                              f'vllm:generation_tokens_total{{engine="0",model_name="tiny"}} {107648 + 500 * i}.0')
        pipe.observe(parse_metrics(moving, now=t0 + 30 * i).sample)
    assert "engine-stalled" not in {f.name for f in pipe.evaluate(t0 + 90)}


# ---- data parallel: every engine seen ---------------------------------------------------------------
def test_data_parallel_engines_are_judged_each_on_its_own():
    # vllm-project/vllm#36748: DP8 on 0.14, waiting stacked on engines 0 and 1
    rep = diagnose_file(log("071"))
    f = by_name(rep)["kv-capacity-bound"]
    assert rep.facts["peak_num_waiting"] == 117 and rep.facts["peak_num_running"] == 51
    # two engines' lines are not one engine dropping from 51 to 31 running: no inferred preemption
    assert rep.facts["preemptions_inferred"] is False and "inferred" not in f.message
    assert [e.lineno for e in f.evidence] == [1, 2]


def test_sidecar_exports_each_engine_with_an_engine_label(tmp_path):
    p = tmp_path / "vllm.log"
    p.write_bytes(b"")
    with live_sidecar({"logs": [str(p)]}) as s:
        with open(p, "ab") as fh:
            fh.write(restamp(log("071").read_bytes()))
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(p)) == 2.0, what="2 lines")
        text = s.get("/metrics").text
        # the saturated engine is not hidden behind the last line read
        assert value(text, "vllm_running_sequences", engine="0") == 51.0
        assert value(text, "vllm_pending_sequences", engine="0") == 117.0
        assert value(text, "vllm_running_sequences", engine="1") == 31.0
        assert value(text, "vllm_kv_cache_usage_ratio", engine="1") == 0.986


def test_metrics_engine_label_is_kept_per_engine():
    # The real 0.32 capture has engine="0"; a second engine's copy (engine="1", its waiting gauge
    # at 300) stands for a data-parallel server: the per-engine values stay apart, the sums stay sums.
    page = (METRICS / "vllm-0.32-cpu-basic.txt").read_text()
    second = "\n".join(ln.replace('engine="0"', 'engine="1"') for ln in page.splitlines()
                       if ln.startswith("vllm:num_requests_") or ln.startswith("vllm:kv_cache_usage_perc"))
    second = second.replace('vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0',
                            'vllm:num_requests_waiting{engine="1",model_name="tiny"} 300.0')
    s = parse_metrics(page + "\n" + second + "\n", now=0.0).sample
    assert s.num_waiting == 300.0
    assert [(e.engine_index, e.num_waiting) for e in s.engines] == [(0, 0.0), (1, 300.0)]


# ---- incidents are occurrences in time -------------------------------------------------------------
def test_a_restart_splits_incidents(tmp_path):
    # A crash loop: the real 0.32 start-up that fails (KV cache bigger than RAM), started twice.
    one = (LOGS / "cpu-startup-error-kv-cache-bigger-than-ram.log").read_text()
    n = one.count("\n")
    p = tmp_path / "crashloop.log"
    p.write_text(one + one)
    occ = [f for f in diagnose_file(p).findings if f.name == "startup-oom"]
    assert [(f.occurrence, f.run) for f in occ] == [(1, 0), (2, 1)]
    # each occurrence quotes its own run's lines, and the fix is listed once
    assert all(e.lineno <= n for e in occ[0].evidence) and all(e.lineno > n for e in occ[1].evidence)
    assert occ[0].fixes and not occ[1].fixes and "it is listed under occurrence 1 of this incident" in occ[1].notes[0]


def test_two_incidents_an_hour_apart_are_two(tmp_path):
    # The real 0.32 run, and the same stretch of its stats lines (115-170) again an hour later (no
    # restart in between: only the clock moves): two occurrences, each with its own time and lines.
    lines = DEMO.read_bytes().split(b"\n")[:-1]
    assert len(lines) == 235
    again = [ln.replace(b"11-30 09:1", b"11-30 10:1") for ln in lines[114:170]]
    p = tmp_path / "vllm.log"
    p.write_bytes(b"\n".join(lines + again) + b"\n")
    occ = [f for f in diagnose_file(p).findings if f.name == "kv-capacity-bound"]
    assert [(f.occurrence, f.run) for f in occ] == [(1, 0), (2, 0)]
    assert occ[1].first_seen - occ[0].first_seen == 3600.0
    assert [e.lineno for e in occ[0].evidence] == [138] and [e.lineno for e in occ[1].evidence] == [235 + 138 - 114]


def test_cli_since_until_and_bad_values(tmp_path):
    cmd = [sys.executable, "-m", "vllm_doctor", "diagnose", str(log("070")), "--format", "json", "--fail-on", "never"]
    r = subprocess.run(cmd + ["--until", "2026-03-22T16:47:40"], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["findings"] == []
    r = subprocess.run(cmd + ["--since", "2026-03-22 16:40", "--until", "2026-03-22T16:50"], capture_output=True,
                       text=True, check=True)
    assert [f["name"] for f in json.loads(r.stdout)["findings"]] == ["engine-stalled"]
    r = subprocess.run(cmd + ["--since", "yesterday"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--since 'yesterday': bad time 'yesterday'" in r.stderr
    r = subprocess.run(cmd + ["--since", "2026-03-23", "--until", "2026-03-22"], capture_output=True, text=True)
    assert r.returncode == 2 and "is after --until" in r.stderr
    # a duration counts back from now: this 2026-03 log has nothing in the last hour: nothing was
    # judged (exit 3, not the healthy 0, even with --fail-on never)
    r = subprocess.run(cmd + ["--since", "1h"], capture_output=True, text=True)
    d = json.loads(r.stdout)
    assert r.returncode == 3 and d["findings"] == [] and d["time_range"]["nothing_in_range"] is True


def test_reports_say_which_fixes_are_alternatives_and_show_checks():
    from vllm_doctor.report.render import FORMATS, to_text

    rep = diagnose_file(DEMO, metrics_files=[str(DEMO_METRICS)])
    text = to_text(rep, color=False)
    # each fix with its evidence grade, in every format: the cut is counted (vLLM's counter: 105)
    assert "--max-num-seqs 2   (option 1 of 2: pick one; evidence: counted)" in text
    assert "--kv-cache-memory-bytes 16777216 (16 MiB)   (option 2 of 2: pick one; evidence: counted)" in text
    html = FORMATS["html"](rep)
    assert "<code class=\"fix\">--max-num-seqs 2</code> <em>(option 1 of 2: pick one; evidence: counted)</em>" in html
    assert "`--max-num-seqs 2` (option 1 of 2: pick one; evidence: counted)" in FORMATS["markdown"](rep)
    doc = json.loads(FORMATS["json"](rep))
    assert [(x["flag"], x["grade"]) for x in doc["findings"][0]["fixes"]] == [
        ("--max-num-seqs", "counted"), ("--kv-cache-memory-bytes", "counted")]
    rep = diagnose_file(log("048"))
    assert "  check: Run once with NCCL_DEBUG=INFO" in to_text(rep, color=False)
    assert "Check: Run once with NCCL_DEBUG=INFO" in FORMATS["html"](rep)


def test_a_shared_fix_leaves_the_other_options_numbered_1_to_n_in_every_format():
    """Issue 27: two findings share a fix; the later one drops it and listed what remained under its
    old numbers: '--tensor-parallel-size 2 (option 4 of 2: pick one)', JSON "option": 4."""
    from vllm_doctor.diagnosis.advice import relate_fixes, share_fixes
    from vllm_doctor.findings import Finding, FlagFix
    from vllm_doctor.pipeline import Report
    from vllm_doctor.report.render import FORMATS, to_text

    def finding(rule_id: str, name: str, flags: list[tuple[str, str]]) -> Finding:
        fixes = [FlagFix(fl, v, f"because {fl}") for fl, v in flags]
        relate_fixes(fixes, [None] * len(fixes))
        return Finding(rule_id, name, "critical", f"{name} title", f"{name} message", fixes=fixes)

    storm = finding("VD001", "preemption-storm", [("--max-num-seqs", "8"), ("--gpu-memory-utilization", "0.95")])
    oom = finding("VD002", "startup-oom", [("--max-num-seqs", "8"), ("--gpu-memory-utilization", "0.95"),
                                           ("--max-model-len", "4096"), ("--tensor-parallel-size", "2")])
    first, second = share_fixes([storm, oom])
    assert [(x.flag, x.option, x.relation) for x in first.fixes] == [
        ("--max-num-seqs", 1, "alternative"), ("--gpu-memory-utilization", 2, "alternative")]
    assert [(x.flag, x.option, x.relation) for x in second.fixes] == [
        ("--max-model-len", 1, "alternative"), ("--tensor-parallel-size", 2, "alternative")]
    assert [o.option for o in oom.fixes] == [1, 2, 3, 4]   # the findings given are not changed
    rep = Report(vllm_version="0.10.0", vllm_version_source="banner", engine="v1", facts={}, facts_defaulted=[],
                 findings=[first, second], sources=[{"name": "vllm.log", "lines_total": 9, "unparsed_lines": 0,
                                                     "vllm_lines": 9}])
    text = to_text(rep)
    assert "--tensor-parallel-size 2   (option 2 of 2: pick one; evidence: inferred)" in text
    assert "option 4" not in text and "option 3" not in text
    assert [x["option"] for x in rep.to_dict()["findings"][1]["fixes"]] == [1, 2]
    assert "`--tensor-parallel-size 2` (option 2 of 2: pick one; evidence: inferred)" in FORMATS["markdown"](rep)
    assert "<code class=\"fix\">--tensor-parallel-size 2</code> <em>(option 2 of 2: pick one; evidence: inferred)</em>" in FORMATS["html"](rep)
    # one option left: the only thing to do, no "option 1 of 1"
    lone = share_fixes([storm, finding("VD004", "kv-capacity-bound", [("--max-num-seqs", "8"), ("--block-size", "32")])])[1]
    assert [(x.flag, x.option, x.relation) for x in lone.fixes] == [("--block-size", 1, "only")]


def test_one_sequence_is_singular():
    """Issue 27: 'the KV cache holds 1 sequences'."""
    from vllm_doctor.diagnosis.advice import Concurrency

    one = Concurrency(1, "running-at-full", running=1, usage_ratio=1.0, never_preempt=1, kv_cache_tokens=2048,
                      max_model_len=2048, block_size=16, pressure_running=3, pressure_full=True)
    assert one.admit == 1
    assert "the KV cache holds 1 sequence even if every one grows to max_model_len" in one.admit_why
    assert one.summary == "which held 1 running sequence when it was full"
    assert one.text.startswith("1 sequence was running when the KV cache was full (100.0%")
    assert "; 3 were running when the KV cache was full" in one.admit_text
    two = Concurrency(2, "never-preempt-bound", never_preempt=2, kv_cache_tokens=4096, max_model_len=2048)
    assert two.summary == "which holds 2 sequences of max_model_len (the never-preempt bound)"
def test_engine_dead_without_its_cause_says_not_enough_evidence_and_what_to_collect():
    # 043 (vllm-project/vllm#42362): EngineDeadError in the API server, the EngineCore's exception
    # is not in the paste: the verdict says so and names the one thing to collect
    from vllm_doctor.report.render import verdict

    rep = diagnose_file(log("043"))
    f = by_name(rep)["engine-dead"]
    assert f.collect.startswith("`kubectl logs POD --previous`")
    assert "Not enough evidence: `kubectl logs POD --previous`" in verdict(rep)["headline"]
    # a cause in the log needs nothing more: 044's NCCL watchdog, 069's OOM
    assert all(x.collect is None for x in diagnose_file(log("044")).findings)


def test_an_explained_engine_death_is_withdrawn_when_the_oom_arrives_after_it(tmp_path):
    # V1's "WorkerProc failed to start." comes before the worker's CUDA OOM line: engine-dead is
    # judged first, then startup-oom explains it (engine-dead's `unless`): one finding, not two
    import yaml

    sc = yaml.safe_load((Path(__file__).parent / "scenarios" / "v1-worker-2-oom-of-4-workers.yaml").read_text())
    p = tmp_path / "vllm.log"
    p.write_text(sc["text"])
    assert [f.name for f in diagnose_file(p).findings] == ["startup-oom"]
