"""Read series from Prometheus (or Thanos Querier, Mimir, Cortex, VictoriaMetrics: anything that
serves Prometheus' HTTP API, ``/api/v1/query`` and ``/api/v1/query_range``).

Why plain httpx and not a Prometheus API client: the maintained Python client,
``prometheus-api-client``, pulls pandas, numpy, matplotlib and dateparser (well over 100 MB) to
return DataFrames we would convert back; the official ``prometheus-client`` exposes metrics but
cannot query. The two endpoints we use are small, stable and documented
(https://prometheus.io/docs/prometheus/latest/querying/api/), and httpx is already a dependency.

A partial response (Thanos with ``--query.partial-response``, Mimir when a store or ingester fails)
is ``status: success`` with ``warnings``: they are kept in :attr:`PrometheusClient.warnings` and
the report says the data may be incomplete. Thanos' external labels (``cluster``, ``replica``)
ride along on every series; a replica is keyed by ``(namespace, pod)`` or ``instance`` alone, so
they neither split nor merge replicas (keep Thanos' deduplication on for an HA pair).

Queries are POSTed as form data (long selectors fit; Thanos and Mimir accept POST). Mimir needs
a tenant header (``X-Scope-OrgID``): pass it with ``headers``. Basic auth (``user:password`` in
the URL or ``basic_auth``) and a bearer token (``bearer_token``) are supported.

Every failure is an :class:`~vllm_doctor.errors.InputError` with a one-line message (unreachable,
not a Prometheus API, bad selector or query, a query that timed out).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from vllm_doctor.errors import InputError
from vllm_doctor.ingest.scrape import ScrapeLimit, read_bounded


MAX_ANSWER_BYTES = 256 << 20
ANSWER_DEADLINE_SECONDS = 120.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clean_label(v: object) -> str:
    """A label value as text to show: control characters (a terminal's escapes, newlines) removed,
    at most 200 characters."""
    return _CONTROL.sub("", str(v))[:200]


def _env_number(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return v if v > 0 else default


MAX_WARNINGS = 20
#: queries in flight at once against the query API (a Prometheus on the same small host, or a
#: shared Thanos / Mimir, should not see a fleet diagnosis as a burst)
MAX_IN_FLIGHT = 4


@dataclass(frozen=True)
class Series:
    """One series of a query result: its labels and its (epoch seconds, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


class PrometheusClient:
    """A small client of Prometheus' HTTP API.

    url: the base URL (``http://prometheus:9090``, ``https://thanos/`` or a Mimir
    ``.../prometheus`` prefix); ``/api/v1/...`` is appended.
    """

    def __init__(self, url: str, *, headers: dict[str, str] | None = None, bearer_token: str | None = None,
                 basic_auth: tuple[str, str] | None = None, timeout: float = 30.0,
                 max_bytes: int | None = None, deadline: float | None = None) -> None:
        import httpx

        # one answer's bounds (VLLM_DOCTOR_PROMETHEUS_MAX_BYTES, _DEADLINE): a fleet's week of
        # 15 s steps is tens of MB; a query never takes minutes
        self.max_bytes = int(max_bytes or _env_number("VLLM_DOCTOR_PROMETHEUS_MAX_BYTES", MAX_ANSWER_BYTES))
        self.deadline = deadline or _env_number("VLLM_DOCTOR_PROMETHEUS_DEADLINE", ANSWER_DEADLINE_SECONDS)
        self.skipped: list[str] = []  # series left out of a result, and why (a bad one never aborts the report)

        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(f"--prometheus {url!r}: not an http(s) URL (e.g. http://prometheus:9090)")
        if parts.username is not None and basic_auth is None:
            basic_auth = (parts.username, parts.password or "")
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        self.base = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        hdrs = {"Accept": "application/json", **(headers or {})}
        if bearer_token:
            hdrs["Authorization"] = f"Bearer {bearer_token}"
        self._client = httpx.Client(timeout=timeout, headers=hdrs, auth=basic_auth, follow_redirects=True)
        #: the API's ``warnings`` (Thanos / Mimir partial responses: a store or ingester did not answer,
        #: so some series may be missing), each once, at most MAX_WARNINGS
        self.warnings: list[str] = []

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, path: str, form: dict[str, str]) -> dict:
        import httpx

        url = f"{self.base}/api/v1/{path}"
        try:
            with self._client.stream("POST", url, data=form) as resp:
                content = read_bounded(resp, self.max_bytes, time.monotonic() + self.deadline,
                                       "VLLM_DOCTOR_PROMETHEUS_MAX_BYTES", "VLLM_DOCTOR_PROMETHEUS_DEADLINE")
        except ScrapeLimit as e:
            raise InputError(f"Prometheus at {self.base}: {e}") from None
        except httpx.TimeoutException:
            raise InputError(f"Prometheus at {self.base}: timed out") from None
        except httpx.HTTPError as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"Prometheus at {self.base} unreachable: {reason}") from None
        try:
            body = json.loads(content)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise InputError(f"{url}: HTTP {resp.status_code}, not a Prometheus API response "
                             "(is this the Prometheus / Thanos / Mimir query URL?)")
        if body["status"] != "success":
            err = str(body.get("error", "")).splitlines()[0][:300]
            raise InputError(f"Prometheus rejected the query ({body.get('errorType', resp.status_code)}): {err}")
        warnings = body.get("warnings")
        for w in warnings if isinstance(warnings, list) else []:
            text = " ".join(str(w).split())[:300]
            if text not in self.warnings and len(self.warnings) < MAX_WARNINGS:
                self.warnings.append(text)
        return body["data"]

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query (``/api/v1/query``) at epoch seconds ``at``."""
        data = self._post("query", {"query": expr, "time": f"{at:.3f}"})
        if data.get("resultType") == "scalar":
            return self._series(expr, [{"metric": {}, "value": data.get("result")}], "value")
        return self._series(expr, data.get("result"), "value")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (``/api/v1/query_range``)."""
        data = self._post("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                          "step": f"{step:g}"})
        return self._series(expr, data.get("result"), "values")

    def _series(self, expr: str, result: object, key: str) -> list[Series]:
        """The well-formed series of a result: labels as text without control characters (a label
        is shown in a terminal), points with finite values (NaN, +Inf are no sample). A series
        that is not ``{"metric": {...}, "value(s)": [[t, "v"], ...]}`` is left out and noted in
        :attr:`skipped`, never the whole report."""
        out = []
        for r in result if isinstance(result, list) else [result]:
            try:
                pts = [r[key]] if key == "value" else r[key]
                points = [(float(t), float(v)) for t, v in pts]
                labels = {clean_label(k): clean_label(v) for k, v in dict(r["metric"]).items()}
            except (KeyError, TypeError, ValueError, IndexError):
                self.skipped.append(f"{expr[:60]}: a malformed series")
                continue
            points = [(t, v) for t, v in points if math.isfinite(t) and math.isfinite(v)]
            out.append(Series(labels, points))
        return out

    def _one(self, call: tuple) -> list[Series]:
        return self.query_range(*call[1:]) if call[0] == "range" else self.query(*call[1:])

    def many(self, calls: list[tuple]) -> list[list[Series]]:
        """Several queries, at most :data:`MAX_IN_FLIGHT` at once: each call is
        ``("range", expr, start, end, step)`` or ``("instant", expr, at)``."""
        return [res for _, res in sorted(self.each(calls), key=lambda x: x[0])]

    def each(self, calls: list[tuple]):
        """``(index, result)`` of each call as it completes, at most MAX_IN_FLIGHT queries in flight
        (``VLLM_DOCTOR_PROMETHEUS_CONCURRENCY``): the caller folds an answer and drops it before
        more arrive, so memory holds a few answers, never the fleet's."""
        from concurrent.futures import FIRST_COMPLETED, wait

        limit = max(1, int(_env_number("VLLM_DOCTOR_PROMETHEUS_CONCURRENCY", MAX_IN_FLIGHT)))
        with ThreadPoolExecutor(min(limit, len(calls)) or 1) as ex:
            pending = {}
            todo = iter(enumerate(calls))
            for i, call in todo:
                pending[ex.submit(self._one, call)] = i
                if len(pending) >= limit:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    yield i, fut.result()
                    nxt = next(todo, None)
                    if nxt is not None:
                        pending[ex.submit(self._one, nxt[1])] = nxt[0]
