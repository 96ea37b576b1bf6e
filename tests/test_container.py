"""deploy/Dockerfile, built and run: the image the deploy docs point to.

Engine: Debian's podman with Debian's runc (`--runtime /usr/sbin/runc`: crun refuses hybrid
cgroups on some hosts) and a CONTAINERS_CONF with `default_ulimits = []` (some hosts refuse to set
RLIMIT_NOFILE). No container registry needs to be reachable: the base image is a minimal Debian
(python3 + venv) made by mmdebstrap from Debian's packages and turned into an image by
`podman import`, passed to the Dockerfile's BASE_IMAGE build argument (its default stays the
public python slim image). The packages are in .ci/apt-packages.txt.

The container runs as the image's non-root user with a read-only root filesystem, follows a real
vLLM log mounted read-only, and its /metrics is read from outside through a port published on
127.0.0.1. Where no container can run (no podman, no root for mmdebstrap, no Debian mirror) the
tests are skipped with the reason.

The image is built from the wheel of this working tree (tests/wheel_build.py, as `make wheel`
makes it), in a build context of deploy/Dockerfile and dist/ only.

Cost: cold (no cache) about 2 min for the Debian rootfs + 1 min to build; warm (the rootfs tar in
$VLLM_DOCTOR_CONTAINER_CACHE, default ~/.cache/vllm-doctor-container, and podman's own image and
layer store) a few seconds.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import LOGS, ROOT
from wheel_build import build_wheel, dev_rule_ids

CACHE = Path(os.environ.get("VLLM_DOCTOR_CONTAINER_CACHE", str(Path.home() / ".cache" / "vllm-doctor-container")))
SUITE = "bookworm"                      # Debian 12: python3 3.11, as the package requires
BASE_PACKAGES = "python3,python3-venv"  # venv brings ensurepip's pip
BASE_TAG = f"localhost/vllm-doctor-base:{SUITE}"
IMAGE = "localhost/vllm-doctor:test"
RUNC = "/usr/sbin/runc"
LOG = LOGS / "cpu-startup-error-max-seq-len-larger-than-kv-cache-256k.log"


def _run(cmd: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def _tail(p: subprocess.CompletedProcess, n: int = 15) -> str:
    return "\n".join((p.stdout + p.stderr).strip().splitlines()[-n:])


class Podman:
    def __init__(self, conf: Path):
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run(["podman", "--runtime", RUNC, *args], timeout=timeout, env=self.env)


def _host_ca_bundle() -> str | None:
    """The CA bundle the host's pip trusts (a TLS-inspecting proxy's CA among them), if one is set."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    return None


def _base_image(podman: Podman, progress) -> None:
    """The Debian base image, from the cached rootfs tar (made by mmdebstrap when missing)."""
    if podman("image", "exists", BASE_TAG).returncode == 0:
        return
    tar = CACHE / f"debian-{SUITE}-{BASE_PACKAGES.replace(',', '-')}.tar"
    if not tar.exists():
        if os.geteuid() != 0:
            pytest.skip("mmdebstrap makes the Debian base image as root; run the tests as root to build the image")
        progress(f"container: mmdebstrap {SUITE} ({BASE_PACKAGES}) into {tar} (once, usually 2 min)")
        part = tar.with_suffix(".part")
        p = _run(["mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "--format=tar",
                  SUITE, str(part)], timeout=900)
        if p.returncode != 0:
            part.unlink(missing_ok=True)
            out = p.stdout + p.stderr
            if any(s in out for s in ("Could not resolve", "Failed to fetch", "Temporary failure", "Connection failed")):
                pytest.skip(f"mmdebstrap: no Debian mirror reachable: {_tail(p, 3)}")
            pytest.fail(f"mmdebstrap failed:\n{_tail(p)}", pytrace=False)
        part.rename(tar)
    p = podman("import", "--change", 'CMD ["/bin/bash"]', str(tar), BASE_TAG, timeout=300)
    assert p.returncode == 0, _tail(p)


@pytest.fixture(scope="module")
def image(tmp_path_factory, progress) -> Podman:
    missing = [t for t in ("podman", "mmdebstrap", RUNC) if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (Debian packages podman, runc, mmdebstrap: "
                    "`make system-deps` installs .ci/apt-packages.txt)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\n# this host refuses to set RLIMIT_NOFILE in a container\ndefault_ulimits = []\n")
    podman = Podman(conf)
    info = podman("info", timeout=60)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: {_tail(info, 3)}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:  # one build at a time on this machine
        fcntl.flock(lock, fcntl.LOCK_EX)
        _base_image(podman, progress)
        probe = podman("run", "--rm", "--network", "none", BASE_TAG, "python3", "-c", "print('ok')")
        if probe.returncode != 0 or probe.stdout.strip() != "ok":
            pytest.skip(f"podman cannot run a container here (runtime {RUNC}): {_tail(probe, 3)}")
        # the context as `make wheel` leaves it: deploy/Dockerfile and dist/ holding the wheel of this tree
        context = tmp_path_factory.mktemp("context")
        progress("container: pip wheel of the working tree into the build context (usually 15 s)")
        build_wheel(context / "dist", tmp_path_factory.mktemp("wheel"))
        (context / "deploy").mkdir()
        for name in ("Dockerfile", "Dockerfile.dockerignore"):
            shutil.copy2(ROOT / "deploy" / name, context / "deploy" / name)
        progress("container: podman build deploy/Dockerfile (cached layers: seconds; cold: about 1 min, "
                 "pip downloads the dependencies)")
        args = ["build", "--format", "docker", "--network", "host", "--ignorefile", "deploy/Dockerfile.dockerignore",
                "--build-arg", f"BASE_IMAGE={BASE_TAG}", "-f", "deploy/Dockerfile", "-t", IMAGE]
        ca = _host_ca_bundle()
        if ca:  # pip in the build trusts what the host trusts
            args += ["-v", f"{ca}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
        if os.environ.get("PIP_INDEX_URL", "").startswith("http"):
            args += ["--build-arg", f"PIP_INDEX_URL={os.environ['PIP_INDEX_URL']}"]
        t0 = time.monotonic()
        p = _run(["podman", "--runtime", RUNC, *args, str(context)], timeout=900, env=podman.env, cwd=str(context))
        assert p.returncode == 0, f"podman build failed:\n{_tail(p, 30)}"
        progress(f"container: image built in {time.monotonic() - t0:.0f} s")
    return podman


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


@pytest.fixture(scope="module")
def container(image: Podman):
    port = _free_port()
    name = f"vllm-doctor-test-{os.getpid()}"
    p = image("run", "-d", "--name", name, "--read-only", "-p", f"127.0.0.1:{port}:9401",
              "-v", f"{LOG.parent}:/var/log/vllm:ro", IMAGE,
              "--log", f"/var/log/vllm/{LOG.name}", "--metrics-url", "http://127.0.0.1:8000/metrics",
              "--no-nvml", "--from-start")
    assert p.returncode == 0, _tail(p)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(url + "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the container did not answer {url}/healthz in 60 s:\n"
                            + _tail(image("logs", name)), pytrace=False)
            time.sleep(0.5)
        yield image, name, url
    finally:
        image("rm", "-f", name, timeout=60)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_image_is_non_root_read_only_with_a_healthcheck(container):
    podman, name, _ = container
    img = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    assert img["Config"]["User"] == "10001:10001"
    assert img["Healthcheck"]["Test"][0] == "CMD"
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
    w = podman("exec", name, "sh", "-c", "touch /opt/vllm-doctor/x")
    assert w.returncode != 0 and "Read-only file system" in w.stderr
    hc = podman("healthcheck", "run", name, timeout=60)
    assert hc.returncode == 0, _tail(hc)


def test_image_holds_every_rule(container):
    """The image's package is the development setup's: the same rules, fleet rules included
    (issue 27: an image built from a wheel without rules/fleet/ listed 11)."""
    podman, _, _ = container
    dev = dev_rule_ids()
    p = podman("run", "--rm", "--network", "none", "--entrypoint", "vllm-doctor", IMAGE, "rules", "--format", "json")
    assert p.returncode == 0, _tail(p)
    assert [r["id"] for r in json.loads(p.stdout)] == dev


def test_container_serves_the_diagnosis_of_a_real_log(container):
    """The sidecar in the container reads the mounted real log (vLLM 0.32 refusing a 262,144-token
    max_model_len on CPU) and its /metrics, read from the host, say what `vllm-doctor diagnose`
    says of that log here."""
    _, _, url = container
    local = json.loads(_run([str(ROOT / ".venv" / "bin" / "vllm-doctor") if (ROOT / ".venv" / "bin" / "vllm-doctor").exists()
                             else "vllm-doctor", "diagnose", str(LOG), "--format", "json"]).stdout)
    assert [f["name"] for f in local["findings"]] == ["startup-oom"]
    deadline = time.monotonic() + 60
    while True:
        status, body = _get(url + "/metrics")
        m = _samples(body) if status == 200 else {}
        active = m.get(("vllm_doctor_finding_active", (("name", "startup-oom"), ("rule_id", "VD002"), ("severity", "critical"))))
        if active == 1 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status == 200
    assert active == 1, body[-3000:]
    assert m.get(("vllm_max_model_len", ())) == local["facts"]["max_model_len"] == 262144
    others = {lab for (n, lab), v in m.items() if n == "vllm_doctor_finding_active" and v == 1}
    assert len(others) == 1, others
