"""The sidecar's start-up and health check never wait on a source (issue 10, item 5): a FIFO
with no writer, read by ``serve --log FIFO``; data arrives when writers come and go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from serve_helpers import free_port, value, wait_for

STATS = ("(APIServer pid=7) INFO 11-30 09:00:{s:02d} [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 "
         "tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, "
         "GPU KV cache usage: 10.0%, Prefix cache hit rate: 0.0%\n")


def test_serve_on_a_fifo_without_writer_answers_healthz_then_reads_each_writer(tmp_path):
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--log", str(fifo), "--metrics-url", "none", "--no-nvml",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
         "--state-file", str(tmp_path / "state.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_DOCTOR_CONFIG": ""})
    try:
        def health():
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                return r.status_code == 200 and r.json()
            except httpx.HTTPError:
                return None

        assert wait_for(health, 30, "/healthz with no writer on the FIFO")["status"] == "ok"

        def lines():
            try:
                return value(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text,
                             "vllm_doctor_log_lines_total", source=str(fifo))
            except httpx.HTTPError:
                return None

        for writer, n in enumerate((3, 4)):  # two writers one after the other
            with open(fifo, "w") as w:
                w.write("".join(STATS.format(s=writer * 10 + i) for i in range(n)))
            wait_for(lambda: lines() == (3 if writer == 0 else 7), 15, f"writer {writer}'s lines")
        assert health()["status"] == "ok"
        # a stop while the reader waits in open() for the next writer returns promptly
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its shutdown
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_fifo_follower_stop_releases_a_reader_waiting_for_a_writer(tmp_path):
    from vllm_doctor.ingest.follow import FifoFollower

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got: list[bytes] = []
    f = FifoFollower(fifo, got.append, lambda: got.append(b"<end>"), lock=threading.Lock())
    f.start()
    with open(fifo, "wb") as w:
        w.write(b"one\ntwo")
    wait_for(lambda: got[-1:] == [b"<end>"], 10, "the first writer's data and end")
    assert got == [b"one\n", b"two", b"<end>"]
    f.stop(5)
    assert not f._thread.is_alive()


def test_two_processes_rotating_one_log_lose_no_line(tmp_path):
    """vLLM's API server and engine core each hold a RotatingFileHandler on the same file (the
    shipped logging config): the one that rotates late renames the files again and keeps
    writing to a renamed file for a while. Two handlers in one process do the same here; the
    follower must deliver every line exactly once."""
    import json
    import logging
    import logging.handlers
    import re
    from pathlib import Path

    from vllm_doctor.ingest.follow import LogFollower

    cfg = json.loads((Path(__file__).resolve().parent.parent / "deploy/kubernetes/base/vllm-logging.json").read_text())
    spec = cfg["handlers"]["file"]
    assert spec["class"] == "logging.handlers.RotatingFileHandler"
    log = tmp_path / "vllm.log"
    log.write_text("")
    handlers = [logging.handlers.RotatingFileHandler(log, maxBytes=3000, backupCount=spec["backupCount"] + 20)
                for _ in range(2)]
    loggers = []
    for i, h in enumerate(handlers):
        lg = logging.getLogger(f"vd-test-proc{i}")
        lg.propagate = False
        lg.handlers[:] = [h]
        lg.setLevel(logging.INFO)
        loggers.append(lg)
    got: list[bytes] = []
    f = LogFollower(log, got.append, from_start=True)
    try:
        for i in range(400):
            loggers[i % 2 if i % 10 else (i // 10) % 2].info("line %d from a vLLM process %s", i, "x" * 40)
            if i % 3 == 0:
                f.poll()
        for _ in range(3):
            f.poll()
    finally:
        for h in handlers:
            h.close()
    ids = [int(x) for x in re.findall(rb"line (\d+) from", b"".join(got))]
    assert f.stats.rotations >= 5
    assert sorted(ids) == list(range(400))


def test_a_bad_log_level_is_a_usage_error_from_flag_env_and_config_file(tmp_path):
    """Issue 27: `serve --log-level loud` was 'internal error: KeyError: 'loud''; from the flag, the
    environment variable and the config file it is one line naming the setting and the choices, exit 2
    (errors.EXIT_USAGE), before anything is served. Case does not matter (INFO is info)."""
    from vllm_doctor.export.serve import load_config

    base = [sys.executable, "-m", "vllm_doctor", "serve", "--log", os.devnull, "--metrics-url", "none", "--no-nvml",
            "--host", "127.0.0.1", "--port", "0"]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("log_level: loud\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DOCTOR_")}
    for args, extra in (([ "--log-level", "loud"], {}), ([], {"VLLM_DOCTOR_LOG_LEVEL": "loud"}),
                        (["--config", str(cfg)], {})):
        p = subprocess.run(base + args, capture_output=True, text=True, timeout=60, env={**env, **extra})
        assert (p.returncode, p.stdout, p.stderr.splitlines()) == (2, "", [
            "vllm-doctor: invalid setting log_level='loud': Input should be 'debug', 'info', 'warning', 'error' "
            "or 'critical'"]), (args, extra)
    assert load_config({"log_level": "WARNING"}, env={}).log_level == "warning"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_cleanly_on_sigterm_and_on_sigint_inherited_as_ignored(tmp_path, sig):
    """Issue 27: a background job of a script inherits SIGINT as ignored; serve stops on it and on
    SIGTERM, exit 0, with its offsets checkpointed (the app's shutdown ran)."""
    from stop_signals import stop_with

    log = tmp_path / "vllm.log"
    log.write_text(STATS.format(s=1))
    state = tmp_path / "state.json"
    code, text = stop_with(sig, ["serve", "--log", str(log), "--metrics-url", "none", "--no-nvml", "--from-start",
                                 "--host", "127.0.0.1", "--port", "0", "--state-file", str(state)],
                           tmp_path / "serve.out", lambda out: "Uvicorn running on" in out or "Application startup complete" in out)
    assert code == 0, text[-2000:]
    assert "Traceback" not in text
    assert str(log.resolve()) in state.read_text() or str(log) in state.read_text()
