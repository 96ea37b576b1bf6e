"""End to end: the shipped alert rules and Alertmanager config, with a REAL Prometheus and a REAL
Alertmanager on 127.0.0.1, scraping two real `vllm-doctor serve` sidecars every second.

- pod "storm": its vLLM /metrics (a tiny local HTTP server) serves the real vLLM 0.32 capture of a
  healthy server, then the capture of the same setup under a preemption storm, while the real
  preemption-storm log of vllm#5578 (../shared/fixtures) is appended to the file it follows.
  VllmPreemptionStorm must reach Alertmanager (read back through its API v2) within a bound.
- pod "healthy": the real healthy vLLM 0.32 log and /metrics capture; no alert fires, none is
  even pending (but VllmDoctorDown, which one slow scrape on a loaded machine may start).

Both pods share one Prometheus and one Alertmanager (two processes less on a 2-core machine).
Every process is started in its own session and ended in teardown, whatever happens.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from monitoring_support import ROOT, SHARED, tool

pytestmark = pytest.mark.slow

FIXTURES = SHARED / "fixtures"
STORM_LOG = "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log"
HEALTHY_LOG = "cpu-basic-serve-and-load.log"
HEALTHY_METRICS = "vllm-0.32-cpu-basic.txt"
STORM_METRICS = "vllm-0.32-cpu-preemption.txt"
ALERT_DEADLINE_S = 45  # from the incident in the log to the alert in Alertmanager
HEALTHY_SETTLE_S = 8  # healthy pod: evaluations after its replay with nothing raised


def fixture(kind: str, name: str) -> Path:
    for base in (FIXTURES / kind, ROOT / "tests" / "fixtures" / kind):
        if (base / name).is_file():
            return base / name
    pytest.skip(f"fixture {kind}/{name} not found in ../shared/fixtures or tests/fixtures")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 3) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(what: str, check, timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - not up yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def sidecar_command() -> list[str]:
    exe = shutil.which("vllm-doctor", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not exe:
        pytest.skip("vllm-doctor is not installed in this environment")
    probe = subprocess.run([exe, "serve", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"`vllm-doctor serve` is not available: {probe.stdout.strip()[-300:]}")
    return [exe, "serve"]


class Processes:
    """Started processes, each in its own session; stop() ends each one (SIGTERM, then SIGKILL)."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(self.logdir / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        out.close()
        self.procs.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.output(name)}")

    def output(self, name: str) -> str:
        return (self.logdir / f"{name}.out").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


class FakeVllmMetrics:
    """vLLM's /metrics as a tiny local HTTP server answering with a real capture (switchable)."""

    def __init__(self, body: bytes):
        self.body = body
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = outer.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def append_slowly(path: Path, text: str, chunks: int = 5, pause: float = 0.2) -> None:
    """Append a log as vLLM would write it: in pieces, a few hundred ms apart."""
    lines = text.splitlines(keepends=True)
    step = max(1, len(lines) // chunks)
    for i in range(0, len(lines), step):
        with path.open("a", encoding="utf-8", errors="surrogateescape") as f:
            f.write("".join(lines[i:i + step]))
        time.sleep(pause)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict]:
    prometheus = tool("prometheus", "apt-get install prometheus; listed in .ci/apt-packages.txt")
    alertmanager = tool("prometheus-alertmanager", "apt-get install prometheus-alertmanager")
    serve = sidecar_command()
    with ExitStack() as stack:
        procs = Processes(tmp_path)
        stack.callback(procs.stop)

        am_port = free_port()
        am = f"http://127.0.0.1:{am_port}"
        procs.start("alertmanager", [
            alertmanager, f"--config.file={ROOT / 'alerts' / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",  # no gossip port
        ])

        pods: dict[str, dict] = {}
        for pod, metrics in (("storm", HEALTHY_METRICS), ("healthy", HEALTHY_METRICS)):
            vllm = FakeVllmMetrics(fixture("metrics", metrics).read_bytes())
            stack.callback(vllm.close)
            log = tmp_path / f"{pod}-vllm.log"
            log.write_text("")
            port = free_port()
            cfg = tmp_path / f"{pod}-doctor.yaml"
            cfg.write_text(yaml.safe_dump({
                "logs": [str(log)], "metrics_url": vllm.url, "nvml": False, "host": "127.0.0.1",
                "port": port, "eval_interval": 1, "scrape_interval": 1, "poll_interval": 0.2,
                "state_file": str(tmp_path / f"{pod}-offsets.json"),
            }))
            procs.start(f"doctor-{pod}", serve, env={"VLLM_DOCTOR_CONFIG": str(cfg)})
            pods[pod] = {"vllm": vllm, "log": log, "url": f"http://127.0.0.1:{port}"}

        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(ROOT / "alerts" / "vllm-doctor.rules.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "vllm-doctor", "static_configs": [
                {"targets": [p["url"].removeprefix("http://")], "labels": {"namespace": "e2e", "pod": pod}}
                for pod, p in pods.items()
            ]}],
        }))
        procs.start("prometheus", [
            prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom'}", f"--web.listen-address=127.0.0.1:{prom_port}",
        ])

        def ready() -> bool:
            procs.check_alive()
            urllib.request.urlopen(f"{am}/-/ready", timeout=2)
            urllib.request.urlopen(f"{prom}/-/ready", timeout=2)
            for p in pods.values():
                urllib.request.urlopen(f"{p['url']}/healthz", timeout=2)
                # Warm up: the first /metrics of a cold process may outlast a 1 s scrape timeout.
                urllib.request.urlopen(f"{p['url']}/metrics", timeout=10)
            return True

        wait_until("Prometheus, Alertmanager and both sidecars to answer", ready, timeout=60)
        yield {"procs": procs, "am": am, "prom": prom, "pods": pods}


def prom_query(prom: str, expr: str) -> list[dict]:
    data = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    return data["data"]["result"]


def am_alerts(am: str) -> list[dict]:
    return get_json(f"{am}/api/v2/alerts")


def test_preemption_storm_reaches_alertmanager_and_a_healthy_log_raises_none(stack):
    procs, am, prom, pods = stack["procs"], stack["am"], stack["prom"], stack["pods"]

    # The baseline: Prometheus has scraped both sidecars with their counters before the incident,
    # so that the storm is an increase Prometheus sees (as in production).
    def baseline() -> bool:
        procs.check_alive()
        rows = prom_query(prom, 'vllm_preemptions_total{job="vllm-doctor"}')
        return {r["metric"]["pod"] for r in rows} == {"storm", "healthy"} and all(
            float(r["value"][1]) == 0 for r in rows)

    wait_until("a first scrape of both sidecars with 0 preemptions", baseline, timeout=60)
    # (A pending VllmDoctorDown is possible here on a loaded machine: one scrape over its 1 s
    # timeout. Pending is not raised; firing would be.)
    assert prom_query(prom, 'ALERTS{alertstate="firing"}') == []

    # The incident: vLLM's /metrics now shows the storm, and the storm log is written.
    started = time.monotonic()
    pods["storm"]["vllm"].body = fixture("metrics", STORM_METRICS).read_bytes()
    append_slowly(pods["storm"]["log"], fixture("logs", STORM_LOG).read_text(errors="surrogateescape"))
    append_slowly(pods["healthy"]["log"], fixture("logs", HEALTHY_LOG).read_text(errors="surrogateescape"))
    healthy_written = time.monotonic()

    def storm_alert() -> dict | None:
        procs.check_alive()
        for a in am_alerts(am):
            if a["labels"].get("alertname") == "VllmPreemptionStorm" and a["labels"].get("pod") == "storm":
                return a
        return None

    alert = wait_until("VllmPreemptionStorm in Alertmanager", storm_alert, timeout=ALERT_DEADLINE_S)
    took = time.monotonic() - started
    print(f"VllmPreemptionStorm reached Alertmanager {took:.1f}s after the storm began")
    assert took < ALERT_DEADLINE_S
    assert alert["labels"]["severity"] == "warning"
    assert alert["labels"]["rule"] == "preemption-storm"
    assert alert["labels"]["namespace"] == "e2e" and alert["labels"]["job"] == "vllm-doctor"
    assert alert["status"]["state"] == "active"
    assert [r["name"] for r in alert["receivers"]] == ["tickets"]  # warning -> tickets
    # The value in the annotations: the preemptions Prometheus counted over the window.
    counted = float(prom_query(prom, 'increase(vllm_preemptions_total{pod="storm"}[5m])')[0]["value"][1])
    assert counted >= 5
    assert "preempted" in alert["annotations"]["summary"]
    assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks/vllm-preemption-storm.md")
    assert float(prom_query(prom, 'vllm_preemptions_total{pod="storm"}')[0]["value"][1]) >= 105

    # The names the alerts and dashboards query are the names the real sidecar exports (those a
    # storm log and a CPU vLLM capture can produce: no GPU, no TTFT window here).
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{pods['storm']['url']}/metrics", timeout=5) as r:
        exported = set()
        for fam in text_string_to_metric_families(r.read().decode()):
            exported.update(s.name for s in fam.samples)
    for name in ("vllm_preemptions_total", "vllm_kv_cache_usage_ratio", "vllm_running_sequences",
                 "vllm_pending_sequences", "vllm_oom_events_total", "vllm_doctor_finding_active",
                 "vllm_doctor_log_lines_total", "vllm_doctor_source_up", "vllm_doctor_build_info",
                 "vllm_doctor_scrape_errors_total"):
        assert name in exported, name

    # The healthy pod: its whole log was read, evaluations ran, and nothing is raised for it,
    # neither in Prometheus (pending or firing) nor in Alertmanager.
    wait_until("the healthy log to be read", lambda: float(prom_query(
        prom, 'sum(vllm_doctor_log_lines_total{pod="healthy"})')[0]["value"][1]) > 600, timeout=20)
    time.sleep(max(0.0, HEALTHY_SETTLE_S - (time.monotonic() - healthy_written)))
    assert prom_query(prom, 'ALERTS{pod="healthy", alertstate="firing"}') == []
    assert prom_query(prom, 'ALERTS{pod="healthy", alertname!="VllmDoctorDown"}') == []
    assert [a["labels"] for a in am_alerts(am) if a["labels"].get("pod") == "healthy"] == []
    procs.check_alive()


# ------------------------------------------------------------------------------ Alertmanager alone

def _alert(name: str, pod: str, severity: str, rule: str) -> dict:
    return {"labels": {"alertname": name, "severity": severity, "rule": rule, "namespace": "llm", "pod": pod,
                       "job": "vllm-doctor"}}


def test_alertmanager_inhibits_the_symptoms_of_a_dead_engine_and_routes_by_severity(tmp_path):
    """The shipped alertmanager.yml in a real Alertmanager: alerts posted to its API, their
    state (active / suppressed by inhibition) and receivers read back."""
    from vllm_doctor.monitoring import bundle
    alertmanager = tool("prometheus-alertmanager", "apt-get install prometheus-alertmanager")
    procs = Processes(tmp_path)
    try:
        port = free_port()
        am = f"http://127.0.0.1:{port}"
        procs.start("alertmanager", [
            alertmanager, f"--config.file={ROOT / 'alerts' / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ])
        wait_until("Alertmanager", lambda: procs.check_alive() or urllib.request.urlopen(f"{am}/-/ready", timeout=2),
                   timeout=30)
        symptoms = {
            "VllmPreemptionStorm": "preemption-storm", "VllmKvCacheSaturated": "kv-cache-saturated",
            "VllmKvCapacityBound": "kv-capacity-bound", "VllmTtftP99High": "prefill-blocking",
            "VllmDoctorFinding": "max-model-len-exceeds-model", "VllmDoctorSourceDown": "vllm-doctor",
            "VllmDoctorLogStale": "vllm-doctor",
        }
        assert set(symptoms) == set(bundle.SYMPTOM_ALERTS)
        posted = [_alert("VllmEngineDead", "dead", "critical", "engine-dead"),
                  _alert("VllmOutOfMemory", "dead", "critical", "out-of-memory")]
        posted += [_alert(name, pod, "warning", rule) for name, rule in symptoms.items() for pod in ("dead", "alive")]
        # A dedicated alert drops the generic finding of its rule; critical drops warning of a rule.
        posted += [_alert("VllmPreemptionStorm", "busy", "warning", "preemption-storm"),
                   _alert("VllmDoctorFinding", "busy", "warning", "preemption-storm"),
                   _alert("VllmGpuMemoryFullSoon", "leaky", "critical", "gpu-memory-leak"),
                   _alert("VllmGpuMemoryGrowth", "leaky", "warning", "gpu-memory-leak"),
                   _alert("VllmDoctorFinding", "info", "info", "unknown-flag")]
        req = urllib.request.Request(f"{am}/api/v2/alerts", data=json.dumps(posted).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=5)

        def states() -> dict:
            got = {(a["labels"]["alertname"], a["labels"]["pod"], a["labels"]["rule"]):
                   (a["status"]["state"], [r["name"] for r in a["receivers"]]) for a in am_alerts(am)}
            return got if len(got) == len(posted) else None

        wait_until("all alerts in Alertmanager", states, timeout=10)
        # Inhibition marks are set when the notification pipeline runs (after group_wait), so
        # the states settle a little after the alerts arrive: wait for that, then assert.
        expect_suppressed = [(n, "dead", r) for n, r in symptoms.items()] + [
            ("VllmDoctorFinding", "busy", "preemption-storm"), ("VllmGpuMemoryGrowth", "leaky", "gpu-memory-leak")]

        def settled() -> dict | None:
            got = states()
            return got if got and all(got[k][0] == "suppressed" for k in expect_suppressed) else None

        try:
            got = wait_until("inhibitions to settle", settled, timeout=30)
        except AssertionError:
            got = states()  # the asserts below say which one did not settle
        for name, rule in symptoms.items():
            assert got[(name, "dead", rule)][0] == "suppressed", name
            assert got[(name, "alive", rule)] == ("active", ["tickets"]), name
        assert got[("VllmEngineDead", "dead", "engine-dead")] == ("active", ["pager"])
        assert got[("VllmOutOfMemory", "dead", "out-of-memory")] == ("active", ["pager"])  # the cause stays
        assert got[("VllmDoctorFinding", "busy", "preemption-storm")][0] == "suppressed"
        assert got[("VllmPreemptionStorm", "busy", "preemption-storm")][0] == "active"
        assert got[("VllmGpuMemoryGrowth", "leaky", "gpu-memory-leak")][0] == "suppressed"
        assert got[("VllmGpuMemoryFullSoon", "leaky", "gpu-memory-leak")] == ("active", ["pager"])
        assert got[("VllmDoctorFinding", "info", "unknown-flag")] == ("active", ["blackhole"])
    finally:
        procs.stop()
