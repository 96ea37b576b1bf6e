"""Shared pieces of the serve tests: a sidecar on a real uvicorn server on 127.0.0.1, a tiny
stand-in for vLLM's /metrics, and polling helpers (no sleep used as synchronisation)."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from vllm_doctor.export.serve import Sidecar, load_config
from vllm_doctor.export.server import create_app

FIXTURES = Path(__file__).parent / "fixtures"


#: How much longer than its nominal bound a wait may take before it fails: the suite must pass on
#: a machine busy with another job of its size (load 4 on 2 cores). A wait is on a condition, so a
#: generous bound costs nothing when the condition comes; VLLM_DOCTOR_TEST_WAIT_SCALE overrides it.
WAIT_SCALE = float(os.environ.get("VLLM_DOCTOR_TEST_WAIT_SCALE", "6"))


def wait_for(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Poll ``cond`` every 20 ms until it returns a truthy value; fail after ``timeout`` s times
    :data:`WAIT_SCALE`."""
    t0 = time.monotonic()
    bound = timeout * WAIT_SCALE
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > bound:
            raise AssertionError(f"timed out after {bound:g} s waiting for {what}")
        time.sleep(0.02)


def end_process(p: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 60.0) -> int:
    """End a child the test started, pass or fail: ``sig``, up to ``grace`` s for it to exit
    (its own shutdown: a checkpoint, a last frame), then SIGKILL. Returns its exit status."""
    if p.poll() is None:
        try:
            p.send_signal(sig)
            return p.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        p.kill()
    return p.wait()


@contextlib.contextmanager
def child(args: list[str], sig: int = signal.SIGTERM, **kw) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(args, **kw)`` that is ended (:func:`end_process`) when the block
    leaves, whether it passed or failed: no test leaves a process running."""
    p = subprocess.Popen(args, **kw)
    try:
        yield p
    finally:
        end_process(p, sig)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(sample name, sorted label items): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, metric: str, /, **labels: str) -> float | None:
    return samples(text).get((metric, tuple(sorted(labels.items()))))


class LiveSidecar:
    """A :class:`Sidecar` served by uvicorn on 127.0.0.1 (OS-chosen port) in a thread."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self.server = uvicorn.Server(uvicorn.Config(create_app(sidecar, manage=True), host="127.0.0.1",
                                                    port=0, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.client = httpx.Client(timeout=10)
        self.base = ""

    def __enter__(self) -> LiveSidecar:
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "uvicorn to start")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(20)

    def get(self, path: str) -> httpx.Response:
        return self.client.get(self.base + path)

    def metric(self, metric: str, /, **labels: str) -> float | None:
        return value(self.get("/metrics").text, metric, **labels)


@contextlib.contextmanager
def live_sidecar(flags: dict, *, nvml=None, env: dict | None = None) -> Iterator[LiveSidecar]:
    """Start a sidecar with these settings (defaults: no /metrics, no NVML, slow evaluation so
    tests call ``evaluate()`` themselves)."""
    base = {"metrics_url": "none", "nvml": nvml is not None, "eval_interval": 3600, "poll_interval": 0.2}
    cfg = load_config({**base, **flags}, env=env or {})
    with LiveSidecar(Sidecar(cfg, nvml=nvml)) as live:
        yield live


class Pages:
    """A tiny vLLM /metrics stand-in on 127.0.0.1: serves the given pages one after another
    (the last one repeats); ``status`` can be changed to make scrapes fail."""

    def __init__(self, pages: list[str], status: int = 200) -> None:
        self.pages, self.i, self.status = pages, 0, status
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = outer.pages[min(outer.i, len(outer.pages) - 1)].encode()
                outer.i += 1
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.t = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Pages:
        self.t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def timeline_pages() -> list[str]:
    """metrics/vllm-0.32-cpu-preemption-timeline.txt (running / waiting / kv usage / preemptions
    sampled every 2 s from a real vLLM 0.32 run) as the /metrics pages vLLM served at those times."""
    types = {"num_requests_running": "gauge", "num_requests_waiting": "gauge",
             "kv_cache_usage_perc": "gauge", "num_preemptions_total": "counter"}
    pages = []
    for row in (FIXTURES / "metrics" / "vllm-0.32-cpu-preemption-timeline.txt").read_text().splitlines():
        kv = dict(x.split("=") for x in row.split()[1:])
        out = []
        for k, v in kv.items():
            fam = k.removesuffix("_total")
            out.append(f"# TYPE vllm:{fam} {types[k]}")
            out.append(f'vllm:{k}{{engine="0",model_name="tiny"}} {v}')
        pages.append("\n".join(out) + "\n")
    return pages
