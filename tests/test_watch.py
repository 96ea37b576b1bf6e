"""``vllm-doctor watch``: one frame of the live view on a real vLLM log, and the CLI wrapper."""

from __future__ import annotations

import re
import shutil
import signal
import threading
from pathlib import Path

import pytest

from fake_nvml import FakeGpu, FakeNvml
from stop_signals import stop_with
from rich.console import Console
from typer.testing import CliRunner

from vllm_doctor.cli import app
from vllm_doctor.export.serve import load_config
from vllm_doctor.ingest.replay import restamp
from vllm_doctor.report.watch import watch

LOGS = Path(__file__).parent / "fixtures" / "logs"


def test_one_frame_shows_state_gpu_and_findings(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(restamp((LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()))
    console = Console(record=True, width=120, color_system=None)
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "from_start": True, "nvml": True,
                       "eval_interval": 3600}, env={})
    gpu = FakeGpu(used=120 << 30, util=93)
    assert watch(cfg, once=True, console=console, nvml=FakeNvml([gpu])) == 0
    out = console.export_text()
    assert "vLLM 0.5.0 (v0)" in out
    for label, v in (("running", "37"), ("waiting", "9779"), ("swapped", "137"), ("KV cache usage", "76.6%"),
                     ("preemptions", "151")):
        line = next(x for x in out.splitlines() if label in x)
        assert v in line, (label, line)
    assert "120.0/140.4 GiB (85%)" in out and "93.0%" in out
    # 014: 34 ran when vLLM preempted and the never-preempt bound is not below it: no --max-num-seqs fix
    assert "VD001 preemption-storm (warning, since " in out and "--gpu-memory-utilization 0.95" in out
    # a clock, the verdict and the fixes as the sidecar's page gives them (relation, why, arithmetic)
    head = out.splitlines()[0]
    assert re.search(r"vllm-doctor watch  vLLM 0\.5\.0 \(v0\)  \d\d:\d\d:\d\d UTC  newest log line ", head), head
    assert out.splitlines()[1].startswith("WARNING preemption-storm: ")
    assert "--gpu-memory-utilization 0.95  (option 1 of 2: pick one; evidence: " in out and "how: min(0.9 + 0.05, 0.95) = 0.95" in out
    assert "--max-num-seqs" not in out


def test_cli_watch_once_and_usage_error(tmp_path):
    log = tmp_path / "vllm.log"
    shutil.copy(LOGS / "cpu-basic-serve-and-load.log", log)
    r = CliRunner().invoke(app, ["watch", str(log), "--once", "--no-nvml"])
    assert r.exit_code == 0, r.output
    assert "vLLM 0.32.0 (v1)" in r.output and "1048576" in r.output  # kv_cache_tokens
    r = CliRunner().invoke(app, ["watch"])
    assert r.exit_code == 2


def test_old_log_is_judged_on_its_clock_and_unknowns_say_unknown(tmp_path):
    """Issue 11: a log that is not live (here, as handed out: written on 11-30) gives what
    diagnose gives, says it is an old log, and a count no source reports is "unknown", not 0."""
    from vllm_doctor.ingest.oneshot import diagnose

    src = LOGS / "cpu-preemption-tiny-kv-cache.log"
    log = tmp_path / "vllm.log"
    shutil.copy(src, log)
    console = Console(record=True, width=120, color_system=None)
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "from_start": True, "nvml": False,
                       "eval_interval": 3600}, env={})
    assert watch(cfg, once=True, console=console) == 0
    out = console.export_text()
    assert "replay/old log, evaluated on the log's clock" in out
    expected = {f.rule_id for f in diagnose([str(src)]).findings}
    assert expected and all(f"{rid} " in out for rid in expected)  # not "no active finding"
    pre = next(x for x in out.splitlines() if "preemptions" in x and "vllm:num_preemptions_total" not in x)
    assert "unknown" in pre and " 0" not in pre  # V1 log, no /metrics: not reported
    swapped = next(x for x in out.splitlines() if "swapped" in x)
    assert "n/a on V1" in swapped


def test_live_log_is_not_called_old(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(restamp((LOGS / "cpu-preemption-tiny-kv-cache.log").read_bytes()))
    console = Console(record=True, width=120, color_system=None)
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "from_start": True, "nvml": False,
                       "eval_interval": 3600}, env={})
    assert watch(cfg, once=True, console=console) == 0
    assert "replay/old log" not in console.export_text()


def test_long_old_log_shows_its_early_incident(tmp_path):
    """An old log whose storm came an hour before its end: watch (and serve) judge it while it is
    read, every few seconds of log time, and show the storm as diagnose does (over by the end)."""
    import time as _time

    from vllm_doctor.ingest.oneshot import diagnose

    t0 = _time.time() - 10 * 3600
    storm = restamp((LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes(), now=t0)
    healthy = (b"INFO 06-16 21:24:25 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Avg generation "
               b"throughput: 12.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
               b"usage: 1.0%, CPU KV cache usage: 0.0%.\n")
    log = tmp_path / "vllm.log"
    log.write_bytes(storm + b"".join(restamp(healthy, now=t0 + 10 * i) for i in range(1, 361)))
    expected = {f.name for f in diagnose([str(log)]).findings}
    assert "preemption-storm" in expected
    console = Console(record=True, width=120, color_system=None)
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "from_start": True, "nvml": False,
                       "eval_interval": 3600}, env={})
    assert watch(cfg, once=True, console=console) == 0
    out = console.export_text()
    assert "replay/old log" in out
    assert "VD001 preemption-storm (warning, over before the log's end, seen " in out


def test_watch_into_a_pipe_prints_each_frame_as_it_goes(tmp_path):
    # `vllm-doctor watch LOG | tee` or `> file`: rich's Live draws nothing until it stops, so frames were never seen
    import signal
    import subprocess
    import sys

    from serve_helpers import child, wait_for

    log = tmp_path / "vllm.log"
    shutil.copy(LOGS / "cpu-preemption-tiny-kv-cache.log", log)
    out = tmp_path / "watch.out"
    with out.open("w") as fh, child([sys.executable, "-m", "vllm_doctor", "watch", str(log), "--no-nvml", "--interval",
                                     "0.5"], sig=signal.SIGINT, stdout=fh, stderr=subprocess.STDOUT) as p:
        # two frames, or the child's end (a generous bound: a loaded machine draws slowly)
        wait_for(lambda: out.read_text().count("vllm-doctor watch") >= 2 or p.poll() is not None, 50, "two frames")
    text = out.read_text()
    assert text.count("vllm-doctor watch  vLLM 0.32.0 (v1)") >= 2, text[-2000:]   # frames while it runs
    assert "VD004 kv-capacity-bound" in text and "Traceback" not in text


def test_a_missing_log_is_said_first_and_the_first_frame_is_judged(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_bytes(restamp((LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()))
    missing = tmp_path / "gone" / "vllm.log"
    console = Console(record=True, width=300, color_system=None)
    cfg = load_config({"logs": [str(log), str(missing)], "metrics_url": "none", "from_start": True, "nvml": False,
                       "eval_interval": 3600}, env={})
    assert watch(cfg, once=True, console=console) == 0
    lines = console.export_text().splitlines()
    assert lines[0] == f"log source {missing} is missing: file not found (no data since start)"
    assert lines[1].startswith("vllm-doctor watch")


def test_the_first_frame_of_the_live_view_holds_the_logs_finding(tmp_path, monkeypatch):
    """The live view's first frame judges what was read: it never says "no active finding" for a
    log that holds one (it did for 5-10 s, until the first evaluation)."""
    import vllm_doctor.report.watch as w

    log = tmp_path / "vllm.log"
    log.write_bytes(restamp((LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log").read_bytes()))
    console = Console(record=True, width=120, color_system=None, force_terminal=False)
    frames = []

    class StopAfterTheFirstFrame(threading.Event):  # watch's stop event (SIGTERM/SIGINT): set after one frame
        def wait(self, timeout=None):
            frames.append(console.export_text(clear=True))
            self.set()
            return True

    monkeypatch.setattr(w, "_stop_on_signals", StopAfterTheFirstFrame)
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "from_start": True, "nvml": False,
                       "eval_interval": 3600}, env={})
    assert watch(cfg, console=console) == 0
    assert "VD001 preemption-storm (warning, since " in frames[0] and "no active finding" not in frames[0]
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_watch_stops_cleanly_on_sigterm_and_on_sigint_inherited_as_ignored(tmp_path, sig):
    """Issue 27: run by a script as a background job, watch inherits SIGINT as ignored (Python then
    raises no KeyboardInterrupt) and did not stop on SIGTERM either: it ran on after the test."""
    log = tmp_path / "vllm.log"
    shutil.copy(LOGS / "cpu-preemption-tiny-kv-cache.log", log)
    code, text = stop_with(sig, ["watch", str(log), "--no-nvml", "--interval", "0.5"], tmp_path / "watch.out",
                           lambda out: out.count("vllm-doctor watch") >= 2)
    assert code == 0, text[-2000:]
    assert "Traceback" not in text


def test_watch_once_on_a_missing_file_is_an_error_not_a_healthy_server(tmp_path):
    """Issue 27: a typo in the path gave 'no active finding' and exit 0. Now the reason on one line,
    exit 2 (errors.EXIT_USAGE, as diagnose on a missing file); a directory likewise."""
    import subprocess
    import sys

    for path, why in ((tmp_path / "vllm.lgo", "no such file"), (tmp_path, "is a directory, not a log file")):
        p = subprocess.run([sys.executable, "-m", "vllm_doctor", "watch", "--once", "--no-nvml", str(path)],
                           capture_output=True, text=True, timeout=60)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", f"vllm-doctor: {path}: {why}\n")
