"""The Grafana dashboards: regeneration changes nothing, every PromQL expression parses with
promtool, every metric it names is exported by vllm-doctor or by vLLM, and the panels the issue
asks for are there."""

from __future__ import annotations

import json
import re
import runpy

import pytest
import yaml

from monitoring_support import ROOT, grafana_to_promql, known_metrics, metric_names, promtool, run
from vllm_doctor.monitoring import bundle
OUT = ROOT / "dashboards" / "out"


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))}


def panels(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p.get("type") != "row"]


def exprs(dash: dict) -> list[str]:
    """Every PromQL expression: panel targets, and the selectors of the query variables
    (``label_values(SELECTOR, label)``)."""
    found = [t["expr"] for p in panels(dash) for t in p.get("targets", []) if t.get("expr")]
    found += [a["expr"] for a in dash.get("annotations", {}).get("list", []) if a.get("expr")]
    for var in dash["templating"]["list"]:
        if var.get("type") == "query":
            query = var["query"]
            assert query.startswith("label_values(") and query.endswith(")"), query
            found.append(query[len("label_values("):-1].rsplit(",", 1)[0])
    return found


def test_regeneration_changes_nothing():
    generated = bundle.dashboards_json()
    assert set(generated) == {p.name for p in OUT.glob("*.json")}
    for name, text in generated.items():
        assert (OUT / name).read_text() == text, "run: python -m vllm_doctor.monitoring.bundle --write"
        assert (ROOT / "deploy/kubernetes/base/generated/dashboards" / name).read_text() == text


def test_grafanalib_entry_point_builds_the_same_dashboard():
    from grafanalib._gen import DashboardEncoder

    module = runpy.run_path(str(ROOT / "dashboards" / "vllm-doctor.dashboard.py"))
    data = json.loads(json.dumps(module["dashboard"].to_json_data(), cls=DashboardEncoder))
    assert data == dashboards()["vllm-doctor.json"]


def test_every_promql_expression_parses_with_promtool(tmp_path):
    unique = sorted({grafana_to_promql(e) for dash in dashboards().values() for e in exprs(dash)})
    rules = [{"record": f"dashboard:expr_{i}", "expr": expr} for i, expr in enumerate(unique)]
    assert len(rules) >= 20
    path = tmp_path / "dashboard-exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def recorded() -> set[str]:
    """The fleet-level series the shipped recording rules write (alerts/vllm-doctor.rules.yaml)."""
    doc = yaml.safe_load((ROOT / "alerts" / "vllm-doctor.rules.yaml").read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def test_every_metric_name_is_exported_by_vllm_doctor_or_vllm():
    # vLLM 0.32's and the sidecar's names, the shipped recording rules, Prometheus's ALERTS
    known = known_metrics() | recorded() | {"ALERTS"}
    for dash in dashboards().values():
        used = set().union(*(metric_names(e) for e in exprs(dash)))
        assert used <= known, f"unknown metrics: {used - known}"
        assert "vllm:num_preemptions" not in used


def test_the_panels_the_issue_asks_for():
    dash = dashboards()["vllm-doctor.json"]
    titles = {p["title"]: p for p in panels(dash)}
    text = json.dumps(dash)
    # KV cache usage is the ratio, never sequences over tokens.
    kv = " ".join(t["expr"] for t in titles["KV cache usage"]["targets"])
    assert "vllm_kv_cache_usage_ratio" in kv and "vllm_kv_cache_tokens" not in kv
    assert titles["KV cache usage"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    running = " ".join(t["expr"] for t in titles["Running vs waiting vs limits"]["targets"])
    for name in ("vllm_running_sequences", "vllm_pending_sequences", "vllm_max_num_seqs", "vllm_max_concurrency"):
        assert name in running
    storm = " ".join(t["expr"] for t in titles["Preemptions per 5m"]["targets"])
    assert "increase(vllm_preemptions_total" in storm and "rate(vllm_preemptions_total" not in storm
    ttft = " ".join(t["expr"] for t in titles["Time to first token"]["targets"])
    assert 'quantile=~"0.5|0.99"' in ttft and "histogram_quantile(0.99" in ttft
    assert "vllm_prompt_throughput_tokens_per_second" in text and "vllm_generation_throughput_tokens_per_second" in text
    slope = titles["GPU memory slope (per hour)"]["targets"][0]["expr"]
    assert slope.startswith("deriv(gpu_memory_used_bytes") and slope.endswith("* 3600")
    assert "gpu_utilization_ratio" in text
    assert "vllm_doctor_finding_active" in titles["Active findings"]["targets"][0]["expr"]
    assert "Fixes" in titles
    assert not any("derivative(" in e for e in exprs(dash))


def test_templated_by_namespace_pod_and_gpu():
    dash = dashboards()["vllm-doctor.json"]
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "namespace", "pod", "gpu"]
    for p in panels(dash):
        for t in p.get("targets", []):
            assert 'namespace=~"$namespace"' in t["expr"] and 'pod=~"$pod"' in t["expr"], (p["title"], t["expr"])
            if re.search(r"(?<![\w:])gpu_", t["expr"]):
                assert 'gpu=~"$gpu"' in t["expr"]
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize("expr, names", [
    ('sum by (namespace, pod) (rate(vllm:prompt_tokens_total{pod=~"$pod"}[$__rate_interval]))', {"vllm:prompt_tokens_total"}),
    ("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > on(pod) group_left b", {"a_bucket", "b"}),
    ('vllm_x{quantile="0.99"} > 2 and on(job) up == 0', {"vllm_x", "up"}),
])
def test_metric_name_extraction(expr, names):
    assert metric_names(expr) == names


def test_the_fleet_overview_and_the_drill_down():
    fleet = dashboards()["vllm-doctor-fleet.json"]
    titles = {p["title"]: p for p in panels(fleet)}
    stats = [p for p in panels(fleet) if p["type"] == "stat"]
    assert len(stats) == 8  # p99 and SLO tiles of TTFT, ITL, e2e, queue time
    assert all("namespace_model_name:" in p["targets"][0]["expr"] for p in stats)
    balance = json.dumps(titles["Replicas saturated / with room"])  # the series VllmReplicaImbalance reads
    assert "vllm_replicas_saturated:count" in balance and "vllm_replicas_room:count" in balance
    pre = " ".join(t["expr"] for t in titles["Preemptions per 5m"]["targets"])
    assert "increase(vllm:num_preemptions_total" in pre and "vllm:num_preemptions{" not in pre
    anns = {a["name"]: a for a in fleet["annotations"]["list"]}
    assert anns["vllm-doctor findings"]["expr"].startswith("vllm_doctor_finding_active")
    assert anns["vLLM alerts"]["expr"].startswith('ALERTS{alertname=~"Vllm.*"')
    drill = dashboards()["vllm-doctor-replicas.json"]
    assert [v["name"] for v in drill["templating"]["list"]] == ["datasource", "namespace", "model_name", "pod", "engine"]
    for p in panels(drill):
        for t in p.get("targets", []):
            assert 'pod=~"$pod", engine=~"$engine"' in t["expr"], (p["title"], t["expr"])
    ttft = panels(drill)[[p["title"] for p in panels(drill)].index("TTFT p99")]["targets"][0]["expr"]
    assert ttft.startswith("histogram_quantile(0.99, sum by (namespace, pod, le) (rate(vllm:time_to_first_token_seconds_bucket")
    # every recorded series a fleet panel reads is written by the shipped recording rules
    used = set().union(*(metric_names(e) for e in exprs(fleet)))
    assert {n for n in used if n.startswith("namespace_model_name:")} <= recorded()
