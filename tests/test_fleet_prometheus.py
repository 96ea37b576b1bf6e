"""``diagnose --prometheus`` against a real Prometheus (Debian's, from .ci/apt-packages.txt).

The Prometheus holds:

* three hours of 24 replicas, backfilled with ``promtool tsdb create-blocks-from openmetrics``
  from series built out of the real vLLM 0.32 /metrics captures and real logs
  (tests/fleet_history.py says which value comes from where): most replicas healthy, and at
  separate times 3 in a preemption storm, 3 bound by KV cache capacity, 2 with prefill blocking
  decode, 2 saturated while 4 others sit idle, one data-parallel replica whose engine 0 is full
  while engine 1 idles;
* two live replicas scraped now: a real vLLM 0.32 /metrics capture served over HTTP with its
  vllm-doctor sidecar following the real log of that run (healthy), and a sidecar following a
  real EngineDeadError log (its vLLM gone).

The diagnosis must name exactly the replicas in trouble and the right incident of each.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

import fleet_history
from monitoring_support import ROOT, promtool, tool
from test_alerting_e2e import FakeVllmMetrics, Processes, free_port, get_json, sidecar_command, wait_until

HOURS = 3.0
LOGS = ROOT / "tests" / "fixtures" / "logs"
DEAD_LOG = "043-v0.20.2-v1-enginedeaderror-apiserver.log"
HEALTHY_LOG = "cpu-basic-serve-and-load.log"
HEALTHY_CAPTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32-cpu-basic.txt"

EXPECTED = {  # replica -> the rules that must fire on it (and nothing else)
    **{f"fleet/vllm-{i:03d}": {"preemption-storm"} for i in (0, 1, 2)},
    # KV cache full with a queue while the healthy replicas ran at 30-60 % with none: also the hot
    # side of replica-imbalance (their kv-capacity-bound gives no capacity fix)
    **{f"fleet/vllm-{i:03d}": {"kv-capacity-bound"} for i in (3, 4, 5)},
    **{f"fleet/vllm-{i:03d}": {"prefill-blocking"} for i in (6, 7)},
    # saturated while others idle: their own KV cache is full with a queue (kv-capacity-bound),
    # and the fleet rule names them as the hot replicas of the imbalance
    **{f"fleet/vllm-{i:03d}": {"kv-capacity-bound"} for i in (8, 9)},
    # engine 0 full, engine 1 idle: VD026 per replica (from the first saturated sample, so no
    # kv-capacity-bound before it); engine-imbalance names it
    "fleet/vllm-014": {"data-parallel-imbalance"},
    "live/dead": {"engine-dead"},  # from its sidecar (vllm_doctor_finding_active)
}


def cli() -> str:
    exe = Path(sys.executable).parent / "vllm-doctor"
    if not exe.exists():
        pytest.skip("vllm-doctor is not installed in this environment")
    return str(exe)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[dict]:
    with fleet_prometheus(tmp_path_factory.mktemp("fleet")) as prom:
        yield prom


@contextmanager
def fleet_prometheus(tmp: Path) -> Iterator[dict]:
    """The Prometheus of this module's docstring, its files under ``tmp``: {url, start, tmp}, the
    processes stopped on exit (also README.md's fleet example: tests/record_fleet_example.py)."""
    prom = tool("prometheus", "apt-get install prometheus; listed in .ci/apt-packages.txt")
    promtool_ = promtool()
    serve = sidecar_command()
    data = tmp / "data"
    data.mkdir()
    now = time.time()
    start = (int(now) // 60) * 60 - int(HOURS * 3600) - 600  # history ends ~10 min ago
    reps = fleet_history.scenario(24, HOURS)
    fleet_history.backfill(promtool_, fleet_history.openmetrics(reps, start, HOURS), data, tmp)
    with ExitStack() as stack:
        procs = Processes(tmp)
        stack.callback(procs.stop)
        targets = []
        vllm = FakeVllmMetrics(HEALTHY_CAPTURE.read_bytes())
        stack.callback(vllm.close)
        targets.append(("vllm", vllm.url.split("/")[2], "healthy"))
        for pod, log, metrics_url in (("healthy", HEALTHY_LOG, vllm.url), ("dead", DEAD_LOG, "none")):
            port = free_port()
            cfg = tmp / f"{pod}.yaml"
            cfg.write_text(yaml.safe_dump({
                "logs": [str(LOGS / log)], "metrics_url": metrics_url, "nvml": False, "host": "127.0.0.1",
                "port": port, "eval_interval": 1, "scrape_interval": 1, "from_start": True,
            }))
            procs.start(f"doctor-{pod}", serve, env={"VLLM_DOCTOR_CONFIG": str(cfg)})
            targets.append(("vllm-doctor", f"127.0.0.1:{port}", pod))
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [addr], "labels": {"namespace": "live", "pod": pod}}
                                                     for j, addr, pod in targets if j == job]}
                for job in ("vllm", "vllm-doctor")
            ],
        }))
        procs.start("prometheus", [prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"])
        url = f"http://127.0.0.1:{prom_port}"
        wait_until("the live sidecar's engine-dead finding in Prometheus", lambda: get_json(
            f"{url}/api/v1/query?query=vllm_doctor_finding_active%7Bname%3D%22engine-dead%22%2Cpod%3D%22dead%22%7D%3D%3D1")
            ["data"]["result"], timeout=60)
        wait_until("the live vLLM scraped", lambda: get_json(
            f"{url}/api/v1/query?query=vllm:num_requests_running%7Bpod%3D%22healthy%22%7D")["data"]["result"], timeout=30)
        procs.check_alive()
        yield {"url": url, "start": start, "tmp": tmp}


def diagnose(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cli(), "diagnose", "--prometheus", url, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_names_exactly_the_replicas_in_trouble_and_their_incident(prometheus):
    since = f"{int(time.time() - prometheus['start'] + 60)}s"
    res = diagnose(prometheus["url"], "--since", since, "--step", "15s", "--format", "json")
    assert res.returncode == 1, res.stderr  # warnings and a critical: --fail-on warning
    rep = json.loads(res.stdout)
    rows = {r["replica"]: r for r in rep["replicas"] if r["engine"] is None}
    assert len([r for r in rows if r.startswith("fleet/")]) == 24
    assert {"live/healthy", "live/dead"} <= set(rows)
    troubled = {name: set(r["findings"]) for name, r in rows.items() if r["findings"]}
    assert troubled == EXPECTED
    # the storm's count is the real run's counter, replayed: hundreds per replica, none elsewhere
    assert all(rows[f"fleet/vllm-{i:03d}"]["preemptions"] > 100 for i in (0, 1, 2))
    assert all(r["preemptions"] in (0, None) for n, r in rows.items() if n not in
               {f"fleet/vllm-{i:03d}" for i in (0, 1, 2)} and n.startswith("fleet/"))
    fleet = {f["name"]: f for f in rep["findings"] if "VD020" <= f["rule_id"] <= "VD025"}  # rules/fleet/
    assert set(fleet) == {"replica-imbalance", "engine-imbalance", "latency-objective-missed"}
    imb = fleet["replica-imbalance"]
    # two episodes, each of saturated replicas beside others with room: 003-005 (KV cache full, 115
    # waiting, for 45 min) while the healthy ones ran at 30-60 % with no queue, the longest; 008-009
    # while 010-013 idled. Every saturated replica is the router's, not its KV cache's
    assert sorted(e["source"] for e in imb["evidence"]) == [f"prometheus:fleet/vllm-{i:03d}" for i in (3, 4, 5, 8, 9)]
    msg = " ".join(imb["message"].split())
    assert "For 45 min" in msg and "3 replica(s) (fleet/vllm-003, fleet/vllm-004, fleet/vllm-005)" in msg, msg
    assert "had room (KV cache 30-60 %, no request waiting) (2 such episodes; this is the longest)" in msg, msg
    routed = {f["values"]["replica"] for f in rep["findings"] if f["name"] == "kv-capacity-bound"
              and f["severity"] == "info" and not f["fixes"] and "(replica-imbalance): the router" in f["message"]}
    assert routed == {f"fleet/vllm-{i:03d}" for i in (3, 4, 5, 8, 9)}
    assert "fleet/vllm-014 engine(s) 0" in fleet["engine-imbalance"]["message"]
    assert "TTFT p99" in fleet["latency-objective-missed"]["message"]
    # the per-replica findings carry their replica and the fixes of the same rules as diagnose
    kv = [f for f in rep["findings"] if f["name"] == "kv-capacity-bound" and f["values"]["replica"] == "fleet/vllm-003"]
    assert len(kv) == 1 and "max_num_seqs=256" in kv[0]["message"]
    dp = [r for r in rep["replicas"] if r["replica"] == "fleet/vllm-014" and r["engine"] is not None]
    assert [r["engine"] for r in dp] == ["0", "1"] and dp[0]["saturated_ratio"] > 0 and dp[1]["idle_ratio"] > 0


def test_every_format_has_the_replica_table(prometheus):
    since = f"{int(time.time() - prometheus['start'] + 60)}s"
    res = diagnose(prometheus["url"], "--since", since, "--step", "60s", "--selector", 'pod=~"vllm-00[0-3]"')
    assert res.returncode == 1, res.stderr
    assert "Replicas (4)" in res.stdout and "fleet/vllm-003" in res.stdout and "fleet/vllm-004" not in res.stdout
    for fmt, marker in (("markdown", "## Replicas"), ("html", "<h2>Replicas</h2>")):
        out = diagnose(prometheus["url"], "--since", since, "--step", "60s", "--selector", '{pod="vllm-000"}',
                       "--format", fmt)
        assert out.returncode == 1 and marker in out.stdout and "fleet/vllm-000" in out.stdout, out.stderr


def test_the_prefilter_changes_no_finding(prometheus):
    from vllm_doctor.fleet import diagnose_prometheus

    kw = dict(since=f"{int(time.time() - prometheus['start'] + 60)}s", step="15s",
              selector='pod=~"vllm-00[0-9]|vllm-01[45]"')
    fast = diagnose_prometheus(prometheus["url"], **kw)
    full = diagnose_prometheus(prometheus["url"], prefilter=False, **kw)
    found = [(s.replica, s.findings) for s in fast.replicas]
    assert found == [(s.replica, s.findings) for s in full.replicas]
    assert sum(bool(f) for _, f in found) == 11  # every incident replica of the selection, found both ways


@pytest.mark.parametrize("args, message", [
    (["--selector", 'pod=~"('], "Prometheus rejected the query (bad_data)"),
    (["--since", "yesterday-ish"], "bad time 'yesterday-ish'"),
    (["--step", "0s"], "--step must be positive"),
    (["--selector", 'pod="no-such-pod"'], "no vLLM series"),
])
def test_bad_input_is_one_line_and_exit_2(prometheus, args, message):
    res = diagnose(prometheus["url"], *args)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_unreachable_or_not_prometheus_is_one_line_and_exit_2(prometheus):
    res = diagnose(f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unreachable" in res.stderr, res.stderr
    res = diagnose("prometheus:9090")
    assert res.returncode == 2 and "not an http(s) URL" in res.stderr
    sidecar = next(p for p in (prometheus["tmp"]).glob("dead.yaml"))
    port = yaml.safe_load(sidecar.read_text())["port"]
    res = diagnose(f"http://127.0.0.1:{port}")
    assert res.returncode == 2 and "not a Prometheus API response" in res.stderr, res.stderr


def test_fleet_is_diagnose_prometheus(prometheus):
    """Issue 27: `vllm-doctor fleet URL`, the name an operator looks for, runs the same code as
    `diagnose --prometheus URL`: the same report, the same exit code."""
    url, span = prometheus["url"], ["--since", str(prometheus["start"]), "--until", str(int(time.time()) - 5)]
    a = subprocess.run([cli(), "fleet", url, *span, "-f", "json"], capture_output=True, text=True, timeout=120)
    b = diagnose(url, *span, "-f", "json")
    assert a.returncode == b.returncode == 1, a.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert [(f["rule_id"], f["title"]) for f in ja["findings"]] == [(f["rule_id"], f["title"]) for f in jb["findings"]]
    assert ja["replicas"] == jb["replicas"] and len(ja["replicas"]) >= 24
    h = subprocess.run([cli(), "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "  fleet " in h
