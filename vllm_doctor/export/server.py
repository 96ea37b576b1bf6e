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
                   with their fixes, recent stats, sources; it updates in place from
``GET /api/page``  its live part as JSON (``html``: rendered and escaped as on ``/``), fetched by
``GET /live.js``   the page's only script (a Content-Security-Policy allows no other)
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
        d["ttft_seconds"] = dict(st.signals.ttft_quantiles)
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
        """The HTML page (autoescaped). It updates its live part in place from /api/page
        (live.js): no reload, so what the reader opened stays open."""
        html = jinja_env().get_template("serve.html.j2").render(**page_context(sidecar))
        return HTMLResponse(html, headers={"Content-Security-Policy": PAGE_CSP})

    @app.get("/api/page")
    def page() -> JSONResponse:
        """The page's live part (``#live``), rendered and escaped as on ``/``, for live.js."""
        ctx = page_context(sidecar)
        tmpl = jinja_env().get_template("serve.html.j2")
        html = "".join(tmpl.blocks["live"](tmpl.new_context(ctx)))
        return JSONResponse({"html": html, "generated": ctx["now"], "title": page_title(ctx["model"])})

    @app.get("/live.js")
    def live_js() -> Response:
        """The page's only script (no inline script: the CSP allows this file alone)."""
        return Response(LIVE_JS, media_type="text/javascript")

    return app


#: The page runs this sidecar's live.js only, fetches only from it, loads nothing else: even
#: text from a log that escaped the escaping could not run.
PAGE_CSP = ("default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
            "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
REFRESH_SECONDS = 10


def _live_js() -> str:
    from importlib.resources import files

    return files("vllm_doctor").joinpath("templates/live.js").read_text(encoding="utf-8")


LIVE_JS = _live_js()


def page_title(model: str | None) -> str:
    return "vllm-doctor" + (f" · {model}" if model else "")


def page_context(sidecar: Any) -> dict:
    """What serve.html.j2 renders: the state, the verdict (of what is wrong now), the charts."""
    from vllm_doctor.report.render import fmt_fact, fmt_span, live_verdict
    from vllm_doctor.report.timeline import charts, finding_spans

    d = state_dict(sidecar)
    with sidecar.lock:
        recent = list(sidecar.pipeline.state.stats)[-15:]
        model = sidecar.pipeline.state.config_value("model")
        rep = sidecar.pipeline.report()
    v = live_verdict(rep, d["clock"]["mode"] == "replay")
    chs = charts(d["timeline"], finding_spans(d["findings"]), d["facts"].get("preemptions_total"), live=True)
    # the findings from the report the verdict reads, with their fixes as diagnose numbers them
    return dict(d=d, findings=rep.findings, recent=recent, model=model, version=__version__, charts=chs,
                fmt_dur=human_duration, when=fmt_time, verdict=v, fmt_fact=fmt_fact, span=fmt_span,
                refresh_seconds=REFRESH_SECONDS, now=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
