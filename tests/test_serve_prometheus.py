"""A real Prometheus (Debian's ``prometheus`` package, /usr/bin/prometheus) scrapes the sidecar on
127.0.0.1 every second while a real vLLM log is appended to the followed file; the series are
read back through Prometheus's HTTP API."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
from serve_helpers import FIXTURES, free_port, live_sidecar, wait_for

from vllm_doctor.ingest.replay import restamp

PROMETHEUS = "/usr/bin/prometheus"
V1_RUN = (FIXTURES / "logs" / "cpu-preemption-tiny-kv-cache.log").read_bytes()
V0_STORM = (FIXTURES / "logs" / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()

pytestmark = pytest.mark.skipif(
    not os.access(PROMETHEUS, os.X_OK),
    reason="Debian package 'prometheus' is not installed (.ci/system-deps.sh installs it from "
           ".ci/apt-packages.txt)")


class Prometheus:
    """/usr/bin/prometheus scraping one target every second, its data in ``tmp``."""

    def __init__(self, tmp, target: str) -> None:
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "scrape_configs:\n  - job_name: vllm-doctor\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.args = [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        self.proc: subprocess.Popen | None = None
        self.logfile = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed in __exit__

    def __enter__(self) -> Prometheus:
        self.proc = subprocess.Popen(self.args, stdout=self.logfile, stderr=subprocess.STDOUT)
        wait_for(self._ready, 30, "Prometheus to be ready")
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logfile.close()

    def query(self, q: str) -> list[dict]:
        r = httpx.get(f"{self.api}/query", params={"query": q}, timeout=5).json()
        assert r["status"] == "success", r
        return r["data"]["result"]

    def scalar(self, q: str) -> float | None:
        res = self.query(q)
        return float(res[0]["value"][1]) if len(res) == 1 else None


def test_real_prometheus_scrapes_the_sidecar_while_a_log_grows(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    lines_q = f'vllm_doctor_log_lines_total{{job="vllm-doctor",source="{log}"}}'
    with live_sidecar({"logs": [str(log)], "eval_interval": 0.5}) as s, \
            Prometheus(tmp_path, s.base.removeprefix("http://")) as prom:
        wait_for(lambda: prom.scalar('up{job="vllm-doctor"}') == 1.0, 20, "the first good scrape")
        # a real V1 run (vLLM 0.32), in three parts, each seen by Prometheus before the next
        data = restamp(V1_RUN)  # same length: only the timestamps change
        cuts = [0, 9000, 18000, len(data)]  # 9000 and 18000 fall inside lines
        seen = []
        for a, b in zip(cuts, cuts[1:]):
            with open(log, "ab") as fh:
                fh.write(data[a:b])
            expect = data[:b].count(b"\n")  # whole lines only: a partial one waits for its end
            seen.append(wait_for(lambda e=expect: prom.scalar(lines_q) == e and e, 20, f"{expect} lines"))
        assert seen[-1] == 235.0 and seen[0] < seen[1] < seen[2]
        assert prom.scalar('vllm_kv_cache_tokens{job="vllm-doctor"}') == 4096.0
        assert prom.scalar('vllm_max_num_seqs{job="vllm-doctor"}') == 32.0
        # then a V0 preemption storm: the counter and the live finding
        with open(log, "ab") as fh:
            fh.write(restamp(V0_STORM))
        wait_for(lambda: prom.scalar('vllm_preemptions_total{job="vllm-doctor"}') == 151.0, 20, "151")
        wait_for(lambda: prom.scalar('vllm_doctor_finding_active{rule_id="VD001",name="preemption-storm"}')
                 == 1.0, 20, "preemption-storm active in Prometheus")
        assert prom.scalar(lines_q) == 238.0
        assert prom.scalar('vllm_doctor_source_up{source="%s"}' % log) == 1.0
        # the history is there: the line counter grew across scrapes, never went down
        rng = httpx.get(f"{prom.api}/query", params={"query": f"{lines_q}[1m]"}, timeout=5).json()
        vals = [float(v) for _, v in rng["data"]["result"][0]["values"]]
        assert vals == sorted(vals) and len(set(vals)) >= 4
        assert prom.scalar(f"resets({lines_q}[1m])") == 0.0
