"""Fuzz the running sidecar: random bytes, invalid UTF-8, ANSI colours, a 10 MB line, a binary
file appended to the followed log. The sidecar stays up, /metrics answers after each, every
newline is counted exactly once, and a real stats line written afterwards is still understood."""

from __future__ import annotations

import random
import sys

from serve_helpers import live_sidecar, value, wait_for

from vllm_doctor.ingest.replay import restamp


def stats_line(running: int) -> bytes:
    return restamp(
        f"(APIServer pid=7) INFO 11-30 09:11:19 [loggers.py:335] Engine 000: Avg prompt throughput: "
        f"356.7 tokens/s, Avg generation throughput: 844.5 tokens/s, Running: {running} reqs, Waiting: "
        f"14 reqs, GPU KV cache usage: 77.4%, Prefix cache hit rate: 0.0%\n".encode())


def test_garbage_never_stops_the_sidecar(tmp_path):
    rng = random.Random(1234)
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    with open(sys.executable, "rb") as fh:
        binary = fh.read(3 << 20)
    prompt = b"x" * (10 << 20)
    payloads = [
        ("random bytes", bytes(rng.getrandbits(8) for _ in range(200_000))),
        ("invalid UTF-8", restamp(b"INFO 11-30 09:11:19 [loggers.py:335] \xff\xfe\xc3\x28 Running: \xed\xa0\x80"
                                  b" reqs \xf8\x88\x80\x80\x80\n") * 50),
        ("ANSI colours", b"\x1b[32m" + stats_line(3).replace(b"INFO", b"INFO\x1b[0m", 1) + b"\x1b[1;31m\x1b[K\n"),
        ("a 10 MB line", restamp(b"INFO 11-30 09:11:19 [logger.py:43] Received request cmpl-1: prompt: '")
         + prompt + b"', params: SamplingParams(n=1)\n"),
        ("a binary file", binary),
        ("NUL bytes and a CR storm", b"\x00" * 70_000 + b"\r" * 70_000 + b"\n"),
        ("half a line then its end", stats_line(5)[:40]),
    ]
    for _ in range(20):  # random mixes of real lines and noise, cut anywhere
        parts = [stats_line(rng.randint(0, 50)), bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 3000)))]
        rng.shuffle(parts)
        payloads.append(("mix", b"".join(parts)))
    newlines = 0
    with live_sidecar({"logs": [str(log)]}) as s:
        for what, data in payloads:
            with open(log, "ab") as fh:
                fh.write(data)
            newlines += data.count(b"\n")
            wait_for(lambda n=newlines: s.metric("vllm_doctor_log_lines_total", source=str(log)) == n,
                     30, f"{newlines} lines after {what}")
            assert s.get("/healthz").status_code == 200
        s.sidecar.evaluate()
        with open(log, "ab") as fh:
            fh.write(stats_line(42)[40:])  # completes the half line written above
            fh.write(stats_line(17))
        newlines += 2
        wait_for(lambda: s.metric("vllm_doctor_log_lines_total", source=str(log)) == newlines, 30)
        text = s.get("/metrics").text
        assert value(text, "vllm_running_sequences", engine="0") == 17.0  # still parsing real lines
        assert value(text, "vllm_doctor_source_up", source=str(log)) == 1.0
        assert s.get("/").status_code == 200 and s.get("/api/state").status_code == 200 and s.get("/api/page").status_code == 200
        assert s.sidecar.follow_thread._thread.is_alive()
        print("pipeline errors:", s.sidecar.pipeline_errors)
