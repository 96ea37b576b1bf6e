"""Issue 25 item 4: the start-up timeline (report, serve page, sidecar metrics), the host-memory
source and the client-text guard of the new matchers."""

from __future__ import annotations

import json
import shutil

from conftest import FIXTURES, diagnose_file
from serve_helpers import live_sidecar, wait_for

from vllm_doctor.ingest.hostmem import read_host_memory
from vllm_doctor.pipeline import Pipeline
from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.report.render import to_html, to_text

STARTUP_LOG = FIXTURES / "corpus" / "logs" / "206-v0.9-runai-streamer-startup-compile-46s-graphs-37s-healthy.log"
HOSTMEM = FIXTURES / "hostmem"


def test_startup_timeline_in_the_report_from_a_real_start():
    rep = diagnose_file(STARTUP_LOG)
    [s] = rep.to_dict()["startup"]
    assert {p["phase"]: p["seconds"] for p in s["phases"]} == {"compile": 45.81, "graph_capture": 37.0,
                                                               "init_engine": 90.84}
    assert s["served"] and s["ready_lineno"] == 11  # "Starting vLLM API server"
    assert s["phase_seconds"] == 90.84 and s["dominant"] == "compile"  # 45.81 of the 90.84 s
    text = to_text(rep)
    assert "Start-up (1 engine start)" in text
    assert "torch.compile 46 s, CUDA graph capture 37 s, engine init (profile, KV cache, warm-up) 91 s" in text
    # the excerpt begins 39 s before ready, inside a start whose engine init alone took 90.84 s
    assert s["wall_seconds"] == 39.0 and s["seconds"] == 90.84 and s["begins_inside"]
    assert "ready after at least 91 s" in text
    html = to_html(rep)
    assert "<h2>Start-up</h2>" in html and "<td>46 s</td>" in html and "<td>≥ 91 s</td>" in html


def test_host_memory_from_cgroup_v2_and_from_meminfo():
    cg = read_host_memory(HOSTMEM / "cgroup-v2", ts=1.0)
    assert (cg.source, cg.used_bytes, cg.limit_bytes) == ("cgroup", 125627793408, 137438953472)
    mi = read_host_memory(HOSTMEM / "meminfo-only", ts=1.0)
    assert (mi.source, mi.used_bytes, mi.limit_bytes) == ("meminfo", (263855128 - 27398412) * 1024, 263855128 * 1024)
    assert read_host_memory(HOSTMEM / "no-such-tree") is None


def test_sidecar_exports_the_startup_phases_and_host_memory(tmp_path):
    log = tmp_path / "vllm.log"
    shutil.copy(STARTUP_LOG, log)
    flags = {"logs": [str(log)], "from_start": True, "host_memory_root": str(HOSTMEM / "cgroup-v2"),
             "host_memory_interval": 0.2}
    with live_sidecar(flags) as s:
        wait_for(lambda: s.metric("vllm_doctor_startup_phase_seconds", phase="compile") is not None, 10, "the phases")
        assert s.metric("vllm_doctor_startup_phase_seconds", phase="compile") == 45.81
        assert s.metric("vllm_doctor_startup_phase_seconds", phase="graph_capture") == 37.0
        assert s.metric("vllm_doctor_startup_ready") == 1.0
        assert s.metric("vllm_doctor_startup_seconds") == 90.84  # vLLM's own timings, not the 39 s this log shows
        assert s.metric("vllm_doctor_engine_starts_total") == 1.0
        wait_for(lambda: s.metric("host_memory_used_bytes") is not None, 10, "a host-memory sample")
        assert s.metric("host_memory_used_bytes") == 125627793408.0
        assert s.metric("host_memory_limit_bytes") == 137438953472.0
        assert {"source": "host", "kind": "host"}.items() <= next(
            x for x in s.get("/readyz").json()["sources"] if x["kind"] == "host").items()
        page = s.get("/").text
        assert "Start-up" in page and "torch.compile 46 s" in page and "≥ 91 s" in page


def test_client_text_never_makes_an_incident():
    """A prompt or request id quoting the new wordings is the client's text: no event, no finding."""
    lines = [
        "INFO 05-06 10:02:11 logger.py:39] Received request cmpl-1: prompt: 'Input prompt (9000 tokens) is too long "
        "and exceeds limit of 8192 / no kernel image is available for execution on the device / NIXL transfer failure: "
        "x / Graph capturing finished in 9999 secs', params: SamplingParams(n=1)",
        "INFO 05-06 10:02:12 async_llm_engine.py:211] Added request Releasing expired KV blocks for request x which were "
        "retrieved by 0 decode worker(s) within 120 seconds.",
    ]
    p = Pipeline(load_rules(), follow=False, base_year=2025)
    seen = []
    p.on_event = seen.append
    p.run_files([("vllm.log", ["\n".join(lines).encode() + b"\n"])])
    kinds = {type(e).__name__ for e in seen}
    assert not kinds & {"RequestTooLong", "GpuUnsupported", "KvTransferFailure", "StartupPhase"}, kinds
    assert p.report().findings == []
    assert json.loads(json.dumps(p.report().to_dict()))["startup"] == []
