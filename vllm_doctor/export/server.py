"""The sidecar's HTTP API (FastAPI, served by uvicorn).

=================  ==========================================================================
``GET /metrics``   Prometheus text exposition of :class:`~vllm_doctor.export.collectors.SidecarCollector`
                   (and the process collector: CPU, RSS, fds of the sidecar itself)
``GET /healthz``   200 ``{"status": "ok"}`` while the process serves; also the rule-load error
                   and pipeline error count
``GET /readyz``    200 from start until shutdown (503 before and during it); each source with
                   ``status`` live | stale | down and the age of its last data; ``degraded``
                   when one is down
``GET /api/findings``  the findings (active and cleared), the JSON of ``diagnose --format json``
``GET /api/state`` the whole report: ``Pipeline.report().to_dict()`` plus ``sources``
``GET /``          an HTML page (jinja2, autoescaped, no external assets): facts, live findings
                   with their fixes, recent stats, sources
=================  ==========================================================================

Everything taken from a log is escaped on the page: prompts are user input and reach logs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from vllm_doctor.about import __version__
from vllm_doctor.export.collectors import SidecarCollector
from vllm_doctor.report.render import fmt_time, jinja_env  # one environment (autoescaped, fix_label) for both pages
from vllm_doctor.units import human_duration



def make_registry(sidecar: Any) -> CollectorRegistry:
    """A fresh registry with the sidecar collector and the process collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(sidecar))
    ProcessCollector(registry=reg)
    return reg


def _findings(sidecar: Any) -> list[dict]:
    with sidecar.lock:
        rep = sidecar.pipeline.report()
        return rep.to_dict()["findings"]


def state_dict(sidecar: Any) -> dict:
    """``Pipeline.report().to_dict()`` (the diagnose JSON schema) plus the live parts: ``sources``
    status as ``live_sources``, ``last_stats``, ``ttft_seconds`` quantiles, ``gpus``."""
    with sidecar.lock:
        d = sidecar.pipeline.report().to_dict()
        st = sidecar.pipeline.state
        ls = st.last_stats
        d["last_stats"] = None if ls is None else {
            "num_running": ls.num_running, "num_waiting": ls.num_waiting, "num_swapped": ls.num_swapped,
            "kv_cache_usage_ratio": ls.kv_cache_usage_ratio, "prompt_tps": ls.prompt_tps,
            "generation_tps": ls.generation_tps, "prefix_cache_hit_ratio": ls.prefix_cache_hit_ratio,
            "ts": ls.meta.ts}
        d["gpus"] = [{"index": g.index, "uuid": g.uuid, "model": g.model,
                      "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
                      "utilization_ratio": g.utilization_ratio, "power_watts": g.power_watts,
                      "temperature_celsius": g.temperature_celsius,
                      "processes": [{"pid": p, "name": n, "used_bytes": u} for p, n, u in g.processes]}
                     for _, g in sorted(st.gpus.items())]
    d["ttft_seconds"] = dict(sidecar.scraper.ttft_quantiles) if sidecar.scraper is not None else {}
    d["live_sources"] = sidecar.source_status()
    d["clock"] = sidecar.clock_status()
    d["rule_load_error"] = sidecar.rule_load_error
    return d


def create_app(sidecar: Any, manage: bool = False) -> FastAPI:
    """The FastAPI app for a :class:`vllm_doctor.export.serve.Sidecar`.

    manage: start the sidecar on the app's startup and stop it (checkpoint written) on
    shutdown, as ``vllm-doctor serve`` does; tests that drive the sidecar themselves pass False.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage:
            sidecar.start()
        try:
            yield
        finally:
            if manage:
                sidecar.stop()

    app = FastAPI(title="vllm-doctor", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    registry = make_registry(sidecar)

    @app.get("/metrics")
    def metrics() -> Response:
        """Prometheus text exposition (format 0.0.4)."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict:
        """Alive: 200 while the process serves."""
        return {"status": "ok", "version": __version__, "rule_load_error": sidecar.rule_load_error,
                "pipeline_errors": sidecar.pipeline_errors}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        """Ready (200) from start until shutdown; each source live / stale / down."""
        ok, sources = sidecar.ready()
        return JSONResponse({"ready": ok, "degraded": any(not s["up"] for s in sources), "sources": sources},
                            status_code=200 if ok else 503)

    @app.get("/api/findings")
    def findings() -> dict:
        """Findings, active and cleared (diagnose's JSON schema)."""
        fs = _findings(sidecar)
        return {"findings": fs, "active": [f["rule_id"] for f in fs if f.get("active")],
                "rule_load_error": sidecar.rule_load_error}

    @app.get("/api/state")
    def state() -> dict:
        """The whole report plus the live parts (see :func:`state_dict`)."""
        return state_dict(sidecar)

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        """The HTML page (autoescaped)."""
        from vllm_doctor.report.timeline import charts, finding_spans

        import dataclasses

        from vllm_doctor.report.render import fmt_fact, verdict

        d = state_dict(sidecar)
        with sidecar.lock:
            recent = list(sidecar.pipeline.state.stats)[-15:]
            model = sidecar.pipeline.state.config_value("model")
            rep = sidecar.pipeline.report()
        # the page opens with what is wrong now (the active findings); on an old log, with what
        # the log shows (every finding, as diagnose reports it)
        v = verdict(rep if d["clock"]["mode"] == "replay" else
                    dataclasses.replace(rep, findings=[f for f in rep.findings if f.active]))
        chs = charts(d["timeline"], finding_spans(d["findings"]), d["facts"].get("preemptions_total"), live=True)
        # the findings from the report the verdict reads, with their fixes as diagnose numbers them
        html = jinja_env().get_template("serve.html.j2").render(
            d=d, findings=rep.findings, recent=recent, model=model, version=__version__, charts=chs, fmt_dur=human_duration, when=fmt_time, verdict=v, fmt_fact=fmt_fact,
            now=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
        return HTMLResponse(html)

    return app
