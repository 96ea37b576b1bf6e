"""A fake of Prometheus' query API as Thanos Querier or Mimir answer it (a test double for
tests/test_fleet_partial_response.py): ``/api/v1/query_range`` and ``/api/v1/query`` over a fixed
set of series, every series carrying the store's external labels, and a partial response:
``status: success`` with ``warnings`` (a store that did not answer)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


class FakeQueryAPI:
    """series: [(labels with __name__, {epoch s: value})]; warnings: sent with every answer."""

    def __init__(self, series: list[tuple[dict[str, str], dict[float, float]]], warnings: list[str],
                 external_labels: dict[str, str]) -> None:
        self.series = [({**labels, **external_labels}, points) for labels, points in series]
        self.warnings = warnings
        self.queries: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
                kind = self.path.rsplit("/", 1)[-1]
                fake.queries.append((kind, form.get("query", "")))
                body = json.dumps(fake.answer(kind, form)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, kind: str, form: dict[str, str]) -> dict:
        """A plain selector ``{__name__=~"a|b", ...}`` returns the stored series of those names (in
        [start, end]); ``last_over_time(vllm:cache_config_info{...}[range])`` the stored info
        series; any other query (the latency queries) an empty result."""
        m = re.fullmatch(r'\{__name__=~"([^"]+)"(?:, .*)?\}', form.get("query", "").strip())
        result = []
        info = re.fullmatch(r"last_over_time\((vllm:cache_config_info)\{[^}]*\}\[\w+\]\)", form.get("query", "").strip())
        if info and kind == "query":  # an info series' labels, as its last value in the range
            for labels, points in self.series:
                if labels["__name__"] == info.group(1) and points:
                    t = max(points)
                    result.append({"metric": labels, "value": [t, str(points[t])]})
        if m and kind == "query_range":
            names = re.compile(m.group(1))
            start, end = float(form["start"]), float(form["end"])
            for labels, points in self.series:
                if names.fullmatch(labels["__name__"]):
                    values = [[t, str(v)] for t, v in sorted(points.items()) if start <= t <= end]
                    if values:
                        result.append({"metric": labels, "values": values})
        return {"status": "success", "warnings": self.warnings,
                "data": {"resultType": "matrix" if kind == "query_range" else "vector", "result": result}}

    def __enter__(self) -> FakeQueryAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
