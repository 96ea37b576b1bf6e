"""A scored fleet test (issue 22): ``diagnose --prometheus`` on a real Prometheus holding vLLM's
real series at vLLM's real density, each incident on a known replica, scored found / missed /
false on the right replica.

The history (tests/fleet_history.py: every ``vllm:`` series of the real vLLM 0.32 capture, 330 per
engine, every 15 s, for 16 replicas over 90 minutes; the incidents replayed from real runs and
logs) is backfilled with ``promtool tsdb create-blocks-from openmetrics``. The incidents:

=====  ==========================================  =============================================
pod    what happens                                 what a vLLM operator expects to be told
=====  ==========================================  =============================================
000    preemption storm (the real 0.32 timeline)    preemption-storm; its TTFT p99 over target
001    saturated (KV full, 40-50 waiting) ...       replica-imbalance names it hot; its own
002-3  ... while these two sit idle                 KV cache is full with a queue; TTFT p99
004    healthy load, TTFT 4-18 s for 20 min         its TTFT p99 over target (the fleet's p99
                                                    may hide it)
005    2 engines: engine 0 full, engine 1 idle,    data-parallel-imbalance, engine-imbalance;
       at the same time as 001-003                  not a hot replica (it has room: engine 1)
006    its series stop 18 min before the end        replica-down
007    vLLM 0.8.5 names, healthy                    nothing (the healthy control, old names)
008    vLLM 0.8.5 names, ITL 0.3-1.5 s for 20 min   its ITL p99 over target, read through
                                                    vllm:time_per_output_token_seconds
009+   healthy                                      nothing
=====  ==========================================  =============================================
"""

from __future__ import annotations

import math
import time

import pytest

import fleet_history
from monitoring_support import promtool, tool
from test_alerting_e2e import Processes, free_port, get_json, wait_until

HOURS = 1.5
PLAN = ["storm", "hot", "cold", "cold", "ttft", "dp", "dying", "healthy", "itl"]
WHEN = {"storm": (0.1, 0.35), "hot": (0.5, 0.75), "cold": (0.5, 0.75), "ttft": (0.3, 0.52),
        "dp": (0.5, 0.75), "dying": (0.8, math.inf), "itl": (0.3, 0.52)}
OLD = {7, 8}
N = 16

EXPECTED = {  # replica -> what must be found on it (and nothing else, on it or on any other)
    "fleet/vllm-000": {"preemption-storm", "latency-objective-missed"},
    # its own KV cache is full with a queue while two replicas idle: the fleet rule names it, and
    # its kv-capacity-bound finding gives no capacity fix (routing is the fix)
    "fleet/vllm-001": {"replica-imbalance", "kv-capacity-bound", "latency-objective-missed"},
    "fleet/vllm-004": {"latency-objective-missed"},
    # engine 1 idles beside full engine 0: routing, not KV cache size (kv-capacity-bound fired for the
    # incident's first minutes while data-parallel-imbalance waited for half its window to be hot)
    "fleet/vllm-005": {"data-parallel-imbalance", "engine-imbalance", "latency-objective-missed"},
    "fleet/vllm-006": {"replica-down"},
    "fleet/vllm-008": {"latency-objective-missed"},
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict:
    prom = tool("prometheus", "apt-get install prometheus; listed in .ci/apt-packages.txt")
    tmp = tmp_path_factory.mktemp("scored")
    data = tmp / "data"
    data.mkdir()
    start = (int(time.time()) // 60) * 60 - int(HOURS * 3600) - 600
    reps = fleet_history.scenario(N, HOURS, plan=PLAN, when=WHEN, old=OLD)
    src = tmp / "fleet.om.txt"
    with src.open("w") as out:
        samples = fleet_history.write_openmetrics(reps, start, HOURS, out, density="real")
    fleet_history.backfill(promtool(), src, data, tmp)
    src.unlink()
    procs = Processes(tmp)
    try:
        port = free_port()
        (tmp / "empty.yml").write_text("global: {}\n")  # only the backfilled history is queried
        procs.start("prometheus", [prom, f"--config.file={tmp / 'empty.yml'}", f"--storage.tsdb.path={data}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"])
        url = f"http://127.0.0.1:{port}"
        wait_until("the backfilled history in Prometheus", lambda: get_json(
            f"{url}/api/v1/query?query=count(vllm:num_requests_running)&time={start + 600}")["data"]["result"],
            timeout=60)
        from vllm_doctor.fleet import diagnose_prometheus

        end = start + int(HOURS * 3600)
        res = diagnose_prometheus(url, since=str(start), until=str(end), step="15s")
        yield {"url": url, "start": start, "end": end, "samples": samples, "result": res}
    finally:
        procs.stop()


def replicas_of(finding: dict) -> set[str]:
    """The replicas a finding is about: a per-replica finding's own, a fleet finding's evidence."""
    if finding.get("values", {}).get("replica"):
        return {finding["values"]["replica"]}
    return {e["source"].removeprefix("prometheus:").split(" engine ")[0] for e in finding.get("evidence", [])
            if e.get("source", "").startswith("prometheus:")}


def score(findings: list[dict]) -> tuple[set, set, set]:
    got = {(r, f["name"]) for f in findings for r in replicas_of(f)}
    want = {(r, name) for r, names in EXPECTED.items() for name in names}
    return got & want, want - got, got - want


def test_every_incident_is_found_on_its_replica_and_nothing_else(fleet):
    assert fleet["samples"] > 16 * 330 * 360  # vLLM's real density: every series, every 15 s
    rep = fleet["result"].report.to_dict()
    found, missed, false = score(rep["findings"])
    print(f"\nscore: {len(found)} found, {len(missed)} missed {sorted(missed)}, {len(false)} false {sorted(false)}")
    assert not missed and not false
    assert len(found) == sum(len(v) for v in EXPECTED.values())


def test_each_finding_carries_when_it_happened(fleet):
    start, end = fleet["start"], fleet["end"]
    h = end - start
    res = fleet["result"]
    by = {(f.name, f.values.get("replica")): f for f in res.report.findings}
    storm = by[("preemption-storm", "fleet/vllm-000")]
    assert start + 0.1 * h <= storm.first_seen <= storm.last_seen <= start + 0.35 * h + 60
    imb = by[("replica-imbalance", None)]
    assert start + 0.5 * h <= imb.first_seen <= imb.last_seen <= start + 0.75 * h
    # the replicas hot and with room at those moments, no other: the two idle ones (002, 003) and the
    # healthy ones with KV cache to spare and no queue; not 005 (its engine 0 full: no room in it)
    msg = " ".join(imb.message.split())
    assert "1 replica(s) (fleet/vllm-001)" in msg and "14 of 16 replicas (fleet/vllm-000, fleet/vllm-002, fleet/vllm-003," in msg
    assert "had room (KV cache 0-60 %, no request waiting)" in msg and "vllm-005" not in msg, msg
    down = by[("replica-down", None)]
    assert start + 0.8 * h - 15 <= down.first_seen <= start + 0.8 * h + 300  # its last sample (Prometheus' 5 min lookback)
    # over the latency targets: the storm, the hot and DP replicas, the TTFT and ITL breaches (10 % to
    # 75 % of the range), read from each replica's p99 per 5 min; not the end of the range
    lat = by[("latency-objective-missed", None)]
    assert start + 0.1 * h - 300 <= lat.first_seen < start + 0.1 * h + 300
    assert start + 0.75 * h - 300 < lat.last_seen <= start + 0.75 * h + 300
    eng = by[("engine-imbalance", None)]
    assert start + 0.5 * h <= eng.first_seen <= eng.last_seen <= start + 0.75 * h


def test_the_replica_table_shows_each_engine_and_reads_old_names(fleet):
    rows = fleet["result"].report.replicas
    # each replica, its engines right under it (the DP replica's two)
    assert [(r["replica"], r["engine"]) for r in rows[4:8]] == [
        ("fleet/vllm-004", None), ("fleet/vllm-005", None), ("fleet/vllm-005", "0"), ("fleet/vllm-005", "1")]
    assert len(rows) == N + 2
    dp = {r["engine"]: r for r in rows if r["replica"] == "fleet/vllm-005" and r["engine"] is not None}
    assert dp["0"]["kv_cache_usage_peak_ratio"] == 1.0 and dp["0"]["saturated_ratio"] > 0.2
    assert dp["1"]["idle_ratio"] > 0.2
    old = {r["replica"]: r for r in rows if r["engine"] is None}
    # vLLM 0.8.5's KV cache usage (vllm:gpu_cache_usage_perc) and ITL (vllm:time_per_output_token_seconds)
    assert 0.3 <= old["fleet/vllm-007"]["kv_cache_usage_peak_ratio"] <= 0.6
    assert old["fleet/vllm-008"]["itl_p99_seconds"] > 0.2 > old["fleet/vllm-007"]["itl_p99_seconds"]


def test_hot_and_idle_replicas_the_verdict_leads_with_the_router(fleet):
    """Issue 20 item 4: the hot replica beside the two idle ones (a selector picks them out of the
    scored fleet, as an operator would for one service). Its KV cache is full with a queue, but the
    fleet had room: the headline names replica-imbalance, the first step is the router's, and the
    hot replica's kv-capacity-bound offers no capacity (no fix, no "To add capacity") there."""
    from vllm_doctor.fleet import diagnose_prometheus
    from vllm_doctor.report.render import verdict

    res = diagnose_prometheus(fleet["url"], selector='pod=~"vllm-00[123]"', since=str(fleet["start"]),
                              until=str(fleet["end"]), step="15s")
    v = verdict(res.report)
    assert v["headline"].startswith("WARNING replica-imbalance:"), v["headline"]
    assert "kv-capacity-bound" in v["headline"]  # still said, after it
    assert v["first"].startswith("Route on load"), v["first"]
    kv = [f for f in res.report.findings if f.name == "kv-capacity-bound"]
    assert [f.values["replica"] for f in kv] == ["fleet/vllm-001"]
    assert kv[0].fixes == [] and "To add capacity" not in kv[0].message and "--kv-cache-dtype" not in kv[0].message
    assert kv[0].message.endswith("the router, not this replica's KV cache, is the fix; see that finding.")
    assert kv[0].severity == "info"


def test_kv_capacity_bound_of_an_unbalanced_replica_offers_no_capacity(fleet):
    """Issue 20 item 4: the hot replica of the imbalance (001) and the data-parallel replica whose
    engine 0 was full beside an idle engine 1 (005): their full KV cache is a routing fault, so
    their kv-capacity-bound gives no fix (were: --kv-cache-memory-bytes 10 MiB and --kv-cache-dtype
    fp8 on 005) and says where the fix is."""
    kv = {f.values["replica"]: f for f in fleet["result"].report.findings if f.name == "kv-capacity-bound"}
    # 005: data-parallel-imbalance holds from its first saturated sample, so its kv-capacity-bound never fires
    assert set(kv) == {"fleet/vllm-001"}
    for f in kv.values():
        assert f.fixes == [] and "To add capacity" not in f.message and f.severity == "info", f.message
    assert "(replica-imbalance): the router" in kv["fleet/vllm-001"].message
