"""The fleet rules (rules/fleet/VD020+) and the series -> events step of ``diagnose --prometheus``,
without a Prometheus: every fleet rule fires on a fleet that has its problem and stays silent on
one that does not; counters become per-step increases (restarts included); the CLI's time and
selector arguments."""

from __future__ import annotations

import time

import pytest

from vllm_doctor.diagnosis import load_rules
from vllm_doctor.errors import InputError, RuleLoadError
from vllm_doctor.events import SchedulerStats
from vllm_doctor.fleet import (Replica, parse_duration, parse_time, replica_events, run_replica, selector_body,
                               summarize)
from vllm_doctor.fleet.rules import FleetRuleEngine, fleet_namespace, load_fleet_rules

RULESET = load_rules([])
T = RULESET.thresholds
FLEET = load_fleet_rules(T)
STEP = 15.0


def replica(pod: str, rows: list[tuple[float, float, float, float]], engine: str = "0", rep: Replica | None = None) -> Replica:
    """rows: (running, waiting, kv usage, preemptions_total) per step from t=0."""
    rep = rep or Replica(("llm", pod))
    v = rep.engines[engine].values
    for k, (running, waiting, kv, pre) in enumerate(rows):
        ts = 1_800_000_000 + k * STEP
        v["num_running"][ts] = running
        v["num_waiting"][ts] = waiting
        v["kv_cache_usage_ratio"][ts] = kv
        v["num_preemptions_total"][ts] = pre
    return rep


def judge(reps: list[Replica], latency: dict | None = None) -> dict[str, object]:
    start = 1_800_000_000
    end = start + STEP * (max(len(e.values["num_running"]) for r in reps for e in r.engines.values()) - 1)
    sums, engines = [], []
    by_key = {}
    for r in reps:
        pipe = run_replica(r, RULESET, start, STEP)
        sums.append(summarize(r, None, T, pipe))
        if len(r.engines) > 1:
            engines += [summarize(r, e, T, None) for e in sorted(r.engines)]
        by_key[r.key] = r
    eng = FleetRuleEngine(FLEET, fleet_namespace(sums, engines, by_key, T, start, end, latency or {}, STEP))
    return {f.name: f for f in eng.run(end)}


N = 80  # 20 minutes of 15 s steps
BUSY = [(10, 0, 0.85, 0)] * N  # near full, nothing waiting: no room to take a saturated replica's queue
ROOM = [(10, 2, 0.5, 0)] * N  # half its KV cache free, 2 waiting: room beside HOT's 40
IDLE = [(0, 0, 0.02, 0)] * N
HOT = [(35, 40, 1.0, 0)] * N


def storm() -> list:
    return [(8, 5, 0.97, 3 * k) for k in range(N)]  # 3 preemptions per step


def test_the_fleet_rules_load_with_the_same_schema_and_validation(tmp_path):
    assert [r.id for r in FLEET.rules] == ["VD020", "VD021", "VD022", "VD023", "VD024", "VD025"]
    (tmp_path / "VD099-bad.yaml").write_text(
        "id: VD099\nname: bad\ntitle: t\nseverity: warning\ncategory: fleet\nwhen: {all: ['no_such_name > 1']}\n"
        "message: m\ndocs: {why: w, example_log: e}\n")
    with pytest.raises(RuleLoadError, match="unknown name 'no_such_name'"):
        load_fleet_rules(T, tmp_path)


def test_diagnose_prometheus_says_when_the_installation_has_no_fleet_rule(tmp_path, monkeypatch):
    """An installation that lost rules/fleet/ (issue 27: the wheel left it out) is a one-line error
    naming the cause, before any query; never a fleet diagnosis that ran no fleet rule."""
    from typer.testing import CliRunner

    from vllm_doctor.cli import app
    from vllm_doctor.fleet import rules as fleet_rules_mod

    monkeypatch.setattr(fleet_rules_mod, "fleet_rules_dir", lambda: tmp_path / "fleet")
    r = CliRunner().invoke(app, ["diagnose", "--prometheus", "http://127.0.0.1:9"])
    assert r.exit_code == 2
    assert f"no fleet rule (VD020+) in {tmp_path / 'fleet'}: this installation of vllm-incident-doctor lacks its " \
           "package data" in r.output
    assert load_fleet_rules(T, tmp_path).rules == ()   # a directory of one's own may be empty


def test_replica_imbalance_fires_on_hot_while_idle_and_not_while_busy():
    got = judge([replica("hot", HOT), replica("idle", IDLE), replica("busy", BUSY)])
    assert set(got) == {"replica-imbalance"}
    f = got["replica-imbalance"]
    assert [e.source for e in f.evidence] == ["prometheus:llm/hot"]
    assert "1 replica(s) (llm/hot)" in f.message and "1 of 3 replicas (llm/idle) idled (KV cache 2 %, no request waiting)" \
        in " ".join(f.message.split())
    assert "replica-imbalance" not in judge([replica("hot", HOT), replica("busy", BUSY)])
    # its real first and last seen: hot only from step 20 to 59 of 80
    f = judge([replica("hot", BUSY[:20] + HOT[:40] + BUSY[:20]), replica("idle", IDLE)])["replica-imbalance"]
    assert (f.first_seen, f.last_seen) == (1_800_000_000 + 20 * STEP, 1_800_000_000 + 59 * STEP)
    # shorter than fleet_imbalance_min_seconds: not yet an imbalance
    short = int(T["fleet_imbalance_min_seconds"] / STEP) - 2
    assert "replica-imbalance" not in judge([replica("hot", HOT[:short] + BUSY[short:]), replica("idle", IDLE)])


def test_a_replica_with_room_that_does_not_idle_is_the_other_side_of_an_imbalance():
    """A replica at half its KV cache with 2 requests waiting beside one full with 40 waiting has
    room (the bench's stats8 shape across replicas): the router is the fault, though it never
    idled. With a queue of the same order (30 waiting) or its KV cache near full, it has none."""
    f = judge([replica("hot", HOT), replica("room", ROOM)])["replica-imbalance"]
    msg = " ".join(f.message.split())
    assert "1 of 2 replicas (llm/room) had room (KV cache 50 %, at most 2 waiting)" in msg, msg
    assert "replica-imbalance" not in judge([replica("hot", HOT), replica("queued", [(10, 30, 0.5, 0)] * N)])
    assert "replica-imbalance" not in judge([replica("hot", HOT), replica("busy", BUSY)])
    dp = replica("dp", HOT, engine="0")
    replica("dp", ROOM, engine="1", rep=dp)
    got = judge([dp])
    assert "had room (KV cache 50 %, at most 2 waiting) at the same moments" in " ".join(got["engine-imbalance"].message.split())


def test_imbalance_is_decided_at_a_moment_not_summed_over_the_range():
    """Issue 22: "idle" was counted over the whole range and separate incidents' minutes were added
    up. Two 6-minute imbalances an hour apart are no 10-minute imbalance; of two real episodes the
    finding names the replicas hot and idle in its own (the longest), not every replica that idled
    at some other time."""
    six = int(360 / STEP)
    gap = [(10, 0, 0.5, 0)] * 40
    hot = HOT[:six] + gap + HOT[:six] + gap
    idle = IDLE[:six] + gap + IDLE[:six] + gap
    assert "replica-imbalance" not in judge([replica("hot", hot), replica("idle", idle)])
    # episode 1: 15 min, "c" idles; episode 2: 12 min, "d" idles; each busy otherwise
    e1, e2 = int(900 / STEP), int(720 / STEP)
    hot = HOT[:e1] + gap + HOT[:e2]
    c = IDLE[:e1] + gap + BUSY[:e2]
    d = BUSY[:e1] + gap + IDLE[:e2]
    f = judge([replica("hot", hot), replica("c", c), replica("d", d)])["replica-imbalance"]
    msg = " ".join(f.message.split())
    assert msg.startswith("For 15 min from 2027-01-15 08:00 UTC 1 replica(s) (llm/hot)"), msg
    assert "1 of 3 replicas (llm/c) idled" in msg and "(2 such episodes; this is the longest)" in msg
    assert (f.first_seen, f.last_seen) == (1_800_000_000, 1_800_000_000 + (e1 + 40 + e2 - 1) * STEP)


def test_a_data_parallel_replica_with_one_full_engine_is_no_hot_replica():
    """Engine 0 full while engine 1 of the same replica idles is that replica's engine imbalance;
    the replica has room (its idle engine), so it is not the hot side of a replica imbalance."""
    dp = replica("dp", HOT, engine="0")
    replica("dp", IDLE, engine="1", rep=dp)
    got = judge([dp, replica("idle", IDLE)])
    assert "engine-imbalance" in got and "replica-imbalance" not in got


def test_engine_imbalance_within_one_replica():
    dp = replica("dp", HOT, engine="0")
    replica("dp", IDLE, engine="1", rep=dp)
    got = judge([dp, replica("busy", BUSY)])
    assert "engine-imbalance" in got and "llm/dp engine(s) 0" in got["engine-imbalance"].message
    both = replica("dp", HOT, engine="0")
    replica("dp", HOT, engine="1", rep=both)
    assert "engine-imbalance" not in judge([both, replica("busy", BUSY)])


def test_the_replica_row_shows_its_fullest_engine():
    """Issue 22: the replica row showed the mean of its engines (59 %) while engine 0 sat at 100 %."""
    dp = replica("dp", [(35, 40, 1.0, 0)] * N, engine="0")
    replica("dp", [(1, 0, 0.18, 0)] * N, engine="1", rep=dp)
    row = summarize(dp, None, T, None)
    assert row.kv_peak == 1.0 and row.kv_mean == pytest.approx(0.59)
    assert [summarize(dp, e, T, None).kv_peak for e in ("0", "1")] == [1.0, 0.18]


def test_fleet_preemptions_when_most_replicas_storm_not_one():
    got = judge([replica(f"s{i}", storm()) for i in range(3)] + [replica("busy", BUSY)])
    assert "fleet-preemptions" in got
    assert got["fleet-preemptions"].message.startswith("3 of 4 replicas had a preemption storm")
    assert "fleet-preemptions" not in judge([replica("s0", storm())] + [replica(f"b{i}", BUSY) for i in range(3)])


def test_fleet_kv_saturation_when_most_replicas_are_full():
    got = judge([replica(f"h{i}", HOT) for i in range(3)] + [replica("busy", BUSY)])
    assert "fleet-kv-saturation" in got and got["fleet-kv-saturation"].message.startswith("3 of 4 replicas")
    assert "fleet-kv-saturation" not in judge([replica("h0", HOT)] + [replica(f"b{i}", BUSY) for i in range(3)])


def test_latency_objective_from_the_summed_histograms():
    lat = {("ttft", "p99"): 4.0, ("ttft", "good"): 0.9, ("itl", "p99"): 0.05, ("itl", "good"): 0.999}
    got = judge([replica("busy", BUSY)], lat)
    assert "TTFT p99 4 s (target 2 s), 90.00% of requests within 2.5 s (objective 99.00%)" in got["latency-objective-missed"].message
    assert "ITL p99" not in got["latency-objective-missed"].message  # within its target
    ok = {("ttft", "p99"): 0.5, ("ttft", "good"): 0.999}
    assert "latency-objective-missed" not in judge([replica("busy", BUSY)], ok)


def test_one_replicas_latency_breach_is_found_when_the_fleet_meets_its_target():
    """Issue 22: one replica's TTFT p99 of 9.5 s among many fast ones: the fleet's p99 (buckets
    summed) is within target, the replica's own is not: a finding naming that replica."""
    ok = {("ttft", "p99"): 0.8, ("ttft", "good"): 0.995, ("itl", "p99"): 0.05, ("itl", "good"): 0.999}
    reps = [replica(f"fast-{i}", BUSY) for i in range(7)] + [replica("slow", BUSY)]
    for r in reps:
        r.latency_p99 = {"ttft": 9.5 if r.name == "llm/slow" else 0.6, "itl": 0.05}
    got = judge(reps, ok)["latency-objective-missed"]
    assert got.message.startswith("The fleet met its latency targets over the range, but 1 of 8 replica(s) did not "
                                  "on their own (each replica's own histogram buckets): llm/slow: TTFT p99 9.5 s (target 2 s).")
    assert [e.text.split(":")[0] for e in got.evidence] == ["llm/slow"]
    for r in reps:
        r.latency_p99["ttft"] = 0.6
    assert "latency-objective-missed" not in judge(reps, ok)


def test_a_replica_that_stops_reporting_is_down():
    """Issue 22: a replica that dies leaves no incident in its own series; they stop. Its last step
    10 min before the end of the range: replica-down names it; a full set of steps does not."""
    dying = BUSY[:40]  # 40 of 80 steps: silent for the last 40 x 15 s
    got = judge([replica("ok", BUSY), replica("dying", dying)])["replica-down"]
    assert got.severity == "critical"
    assert "1 of 2 replica(s) stopped exporting vLLM's series while the others went on: llm/dying silent " \
           "for the last 10 min." in got.message
    assert [e.text.split(":")[0] for e in got.evidence] == ["llm/dying"]
    # first seen: the dying replica's last sample; last seen: the fleet's newest (not both the range's end)
    assert (got.first_seen, got.last_seen) == (1_800_000_000 + 39 * STEP, 1_800_000_000 + 79 * STEP)
    assert "replica-down" not in judge([replica("ok", BUSY), replica("also-ok", BUSY)])
    # most replicas stopped at the same time (a scrape or Prometheus gap): not called dead
    assert "replica-down" not in judge([replica(p, BUSY[:40]) for p in "abc"] + [replica("d", BUSY)])


def test_a_replica_whose_target_is_down_is_named_even_when_its_last_values_linger():
    """Prometheus' up == 0 of the replica's vLLM target: down since its last good scrape (a query
    range repeats a stopped series' last value for 5 minutes), or down over the whole range (no
    vLLM series at all): replica-down names it, with its last good scrape as first seen."""
    hung = replica("hung", BUSY)
    hung.up_last_ok, hung.up_down_at_end = 1_800_000_000 + 50 * STEP, True
    never = Replica(("llm", "never"))
    never.up_down_at_end = True
    got = judge([replica("ok", BUSY), replica("ok2", BUSY), hung, never])["replica-down"]
    assert sorted(e.text.split(":")[0] for e in got.evidence) == ["llm/hung", "llm/never"]
    assert "llm/hung silent for the last 7 min" in got.message
    assert got.first_seen == 1_800_000_000  # "never" answered no scrape in the range
    assert "replica-down" not in judge([replica("ok", BUSY), replica("fine", BUSY)])


def test_counters_become_per_step_increases_and_a_restart_is_not_negative():
    rep = replica("r", [(1, 0, 0.1, 10), (1, 0, 0.1, 14), (1, 0, 0.1, 2), (1, 0, 0.1, 5)])
    stats = [e for e in replica_events(rep, 1_800_000_000, STEP) if isinstance(e, SchedulerStats)]
    assert [s.preemptions for s in stats] == [0, 4, 2, 3]  # 14 -> 2: vLLM restarted, 2 new
    assert summarize(rep, None, T, None).preemptions == 9
    assert all(s.meta.source == "prometheus:llm/r" and "Running: 1 reqs" in s.meta.text for s in stats)


def test_the_rules_of_diagnose_run_on_the_series():
    pipe = run_replica(replica("s", BUSY[:20] + storm()[:40] + BUSY[:20]), RULESET, 1_800_000_000, STEP)
    assert {f.name for f in pipe.engine.findings.values()} >= {"preemption-storm"}
    quiet = run_replica(replica("q", BUSY), RULESET, 1_800_000_000, STEP)
    assert not quiet.engine.findings


@pytest.mark.parametrize("text, seconds", [("15s", 15), ("5m", 300), ("4h30m", 16200), ("1d", 86400), ("90", 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_times_and_selectors():
    now = time.time()
    assert parse_time("6h", now) == now - 21600
    assert parse_time("1800000000", now) == 1_800_000_000
    assert parse_time("2027-01-15T10:00:00Z", now) == 1_800_007_200
    assert parse_time("2027-01-15T10:00:00", now) == 1_800_007_200  # no zone: UTC
    with pytest.raises(InputError, match="bad time"):
        parse_time("yesterday", now)
    assert selector_body('{namespace="prod", model_name=~"llama.*"}') == 'namespace="prod", model_name=~"llama.*"'
    assert selector_body('namespace="prod"') == 'namespace="prod"'
    with pytest.raises(InputError, match="label matchers only"):
        selector_body('vllm:num_requests_running{namespace="prod"}')


def test_thanos_mimir_headers_bearer_and_basic_auth_reach_the_query_api(monkeypatch):
    """The same HTTP API with a tenant header (Mimir), a bearer token or basic auth from the URL;
    an empty answer is a one-line "no vLLM series" error."""
    import base64
    import http.server
    import json
    import threading

    from vllm_doctor.fleet import diagnose_from_env

    seen: list[dict] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                         "tenant": self.headers.get("X-Scope-OrgID"), "body": body})
            kind = "matrix" if self.path.endswith("query_range") else "vector"
            out = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        monkeypatch.setenv("VLLM_DOCTOR_PROMETHEUS_HEADERS", "X-Scope-OrgID: tenant-1")
        monkeypatch.setenv("VLLM_DOCTOR_PROMETHEUS_TOKEN", "s3cret")
        with pytest.raises(InputError, match="no vLLM series"):
            diagnose_from_env(f"http://127.0.0.1:{port}/prometheus", selector='namespace="llm"', since="1h")
        assert seen and all(s["path"].startswith("/prometheus/api/v1/query") for s in seen)
        assert all(s["tenant"] == "tenant-1" and s["auth"] == "Bearer s3cret" for s in seen)
        assert any("namespace%3D%22llm%22" in s["body"] for s in seen)
        seen.clear()
        monkeypatch.delenv("VLLM_DOCTOR_PROMETHEUS_TOKEN")
        with pytest.raises(InputError, match="no vLLM series"):
            diagnose_from_env(f"http://ops:pw@127.0.0.1:{port}", since="1h")
        assert seen[0]["auth"] == "Basic " + base64.b64encode(b"ops:pw").decode()
    finally:
        srv.shutdown()
        srv.server_close()


def test_kv_capacity_bound_never_says_preempted_where_the_counter_rose_by_0():
    # issue 20: a replica at a full KV cache whose running dips (182 -> 178) while requests wait,
    # and whose vllm:num_preemptions_total stays 0: requests finished, none was preempted; no
    # --max-num-seqs cut, and the finding says the counter did not move
    rows = [(182 - (k % 5), 30, 0.98, 0) for k in range(N)]
    pipe = run_replica(replica("full", rows), RULESET, 1_800_000_000, STEP)
    kv = [f for f in pipe.engine.all_occurrences() if f.name == "kv-capacity-bound"]
    assert kv, [f.name for f in pipe.engine.all_occurrences()]
    for f in kv:
        assert "were preempted" not in f.message and "probably preempted" not in f.message
        assert "vLLM counted no preemption" in f.message
        assert "--max-num-seqs" not in {x.flag for x in f.fixes}


def test_a_hot_replica_of_an_imbalance_gets_routing_not_more_kv_cache():
    from vllm_doctor.fleet import _routing_not_capacity, _scoped

    reps = [replica("hot", HOT), replica("idle-a", IDLE), replica("idle-b", IDLE)]
    fleet = list(judge(reps).values())
    assert "replica-imbalance" in {f.name for f in fleet}
    per = [_scoped(f, r.name) for r in reps for f in run_replica(r, RULESET, 1_800_000_000, STEP).engine.findings.values()]
    before = [f for f in per if f.name == "kv-capacity-bound"]
    assert before and before[0].fixes  # the replica alone: more KV cache
    after = [f for f in _routing_not_capacity(per, fleet) if f.name == "kv-capacity-bound"]
    assert after[0].fixes == [] and "the router, not this replica's KV cache, is the fix" in after[0].message


def test_a_column_holds_a_series_on_its_step_grid():
    """The fetched series are columns (8 bytes a step), read as {ts: value} of the steps with a sample:
    two series of one field and engine add up, KV cache usage keeps the larger, an impossible value
    and a point off the grid are no sample."""
    from vllm_doctor.fleet import Column

    t0 = 1_800_000_000.0
    c = Column(t0, 15.0, 5)
    c.fold([(t0, 2.0), (t0 + 30, 3.0), (t0 + 7, 9.0), (t0 + 60, -1.0)], "num_running")
    c.fold([(t0, 1.0)], "num_running")
    assert dict(c) == {t0: 3.0, t0 + 30: 3.0} and len(c) == 2
    assert t0 + 15 not in c and c.get(t0 + 15) is None and c.get(t0 + 45, 0.0) == 0.0
    kv = Column(t0, 15.0, 2)
    kv.fold([(t0, 0.4), (t0 + 15, 1.7)], "kv_cache_usage_ratio")
    kv.fold([(t0, 0.9)], "kv_cache_usage_ratio")
    assert dict(kv) == {t0: 0.9}
    assert len(c.a) * c.a.itemsize == 40


def test_the_fleet_runs_the_one_pipeline_and_the_rules_schedule():
    """Each replica runs in Pipeline(ruleset, clock=LogTime(), schedule=Schedule(ruleset, step)):
    the rules come due on the series' clock at the query step, as diagnose's do on log time; a quiet
    stretch asks the same schedule for its long-window rules only."""
    from vllm_doctor.diagnosis.schedule import Schedule
    from vllm_doctor.pipeline import LogTime

    pipe = run_replica(replica("busy", BUSY), RULESET, 1_800_000_000, STEP)
    assert isinstance(pipe.clock, LogTime) and pipe.schedule.eval_interval == STEP
    long_ids = frozenset(r.id for r in RULESET.rules if (RULESET.window_seconds(r) or 0) >= 1800)
    sched = Schedule(RULESET, STEP)
    assert long_ids and sched.due(0.0, long_ids) == set(long_ids)
    assert sched.due(STEP, long_ids) == set()  # run: not due again before half their window
    # the fleet rules, through a Schedule of what they read ('*': the fleet namespace), all run
    assert {r.reads for r in FLEET.rules} == {frozenset({"*"})}
    assert "replica-imbalance" in judge([replica("hot", HOT), replica("idle", IDLE)])


def test_a_replica_whose_samples_repeat_with_requests_running_is_no_stall():
    """A range past a replica's last sample: Prometheus repeats it for its 5 min lookback, requests
    running and token counters flat. From queried series a stall needs a queue that stays (a stats
    line of a log, written only when vLLM writes it, counts a running request alone: vllm#17972)."""
    from vllm_doctor.events import QUERIED_SOURCE_PREFIX, Meta
    from vllm_doctor.state.core import stalls

    def line(src: str, t: float, waiting: int) -> SchedulerStats:
        return SchedulerStats(Meta(source=src, ts=t, text=""), prompt_tps=0.0, generation_tps=0.0,
                              num_running=12, num_waiting=waiting, num_swapped=None, kv_cache_usage_ratio=0.4,
                              preemptions=None, engine_index=0)

    queried = f"{QUERIED_SOURCE_PREFIX}fleet/vllm-010"
    assert stalls([line(queried, 1000.0 + 15 * k, 0) for k in range(20)], [], 1300.0, 3) == []
    assert len(stalls([line(queried, 1000.0 + 15 * k, 5) for k in range(20)], [], 1300.0, 3)) == 1
    assert len(stalls([line("vllm.log", 1000.0 + 10 * k, 0) for k in range(4)], [], 1040.0, 3)) == 1
