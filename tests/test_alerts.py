"""The alert rules and the Alertmanager example, checked with the real promtool and amtool.

- alerts/vllm-doctor.rules.yaml is what vllm_doctor.monitoring.bundle generates from rules/thresholds.yaml;
- `promtool check rules` and `promtool test rules` pass; every alert fires in a unit test on a
  series that should page and stays silent on one that should not;
- the units mistakes of the alerts in circulation are shown to be mistakes with promtool itself;
- every alert has a severity, a summary and a description with the value, a runbook that exists;
- `amtool check-config` passes and `amtool config routes test` routes as documented.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from monitoring_support import ROOT, amtool, known_metrics, metric_names, promtool, run, vllm_metrics_capture
from vllm_doctor.monitoring import bundle
RULES = ROOT / "alerts" / "vllm-doctor.rules.yaml"
UNIT_TESTS = ROOT / "alerts" / "tests" / "vllm-doctor.test.yaml"
UNIT_TEST_FILES = sorted((ROOT / "alerts" / "tests").glob("*.test.yaml"))
ALERTMANAGER = ROOT / "alerts" / "alertmanager.yml"
RUNBOOKS = ROOT / "docs" / "runbooks"
RUNBOOK_SECTIONS = ("## What it means", "## How to confirm", "## What to change")


def all_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def rules() -> list[dict]:
    """The alerting rules."""
    return [r for r in all_rules() if "alert" in r]


def records() -> list[dict]:
    """The recording rules."""
    return [r for r in all_rules() if "record" in r]


def alert_names() -> list[str]:
    return [r["alert"] for r in rules()]


# ------------------------------------------------------------------------------ generation

def test_committed_rule_file_is_what_the_bundle_generates():
    assert RULES.read_text() == bundle.export("alerts"), "run: python -m vllm_doctor.monitoring.bundle --write"


def test_thresholds_come_from_thresholds_yaml():
    t = bundle.load_thresholds(ROOT / "rules" / "thresholds.yaml")
    by_name = {r["alert"]: r["expr"] for r in rules()}
    assert by_name["VllmPreemptionStorm"].startswith(
        f"increase(vllm_preemptions_total[{bundle.duration(t['preemption_window_seconds'])}])"
        f" >= {t['preemption_storm_min']}\n"
    )
    assert f">= {t['kv_cache_full_ratio']}" in by_name["VllmKvCacheSaturated"]
    assert f"> {t['memory_leak_min_growth_bytes_per_hour']}" in by_name["VllmGpuMemoryGrowth"]
    assert f"> {bundle._num(t['ttft_p99_target_seconds'])}" in by_name["VllmTtftP99High"]
    assert f"{t['kv_capacity_far_below_ratio']} * max" in by_name["VllmKvCapacityBound"]
    # A changed threshold changes the alert: nothing is written twice.
    changed = dict(t, preemption_storm_min=7, preemption_window_seconds=600)
    exprs = {a.name: a.expr for group in bundle.alert_definitions(changed).values() for a in group}
    assert exprs["VllmPreemptionStorm"].startswith("increase(vllm_preemptions_total[10m]) >= 7\n")
    assert "increase(vllm:num_preemptions_total[10m])) >= 7" in exprs["VllmPreemptionStorm"]
    # room beside a saturated replica or engine: the fleet rules' balance_room_kv_ratio and balance_queue_ratio
    room = next(r["expr"] for r in records() if r["record"] == "namespace_model_name:vllm_replicas_room:count")
    for expr in (room, by_name["VllmEngineImbalance"]):
        assert f"< {t['balance_room_kv_ratio']}\n" in expr and f"({t['balance_queue_ratio']} * min by" in expr
    changed = dict(t, balance_room_kv_ratio=0.6, balance_queue_ratio=0.25)
    exprs = {a.name: a.expr for group in bundle.alert_definitions(changed).values() for a in group}
    assert "< 0.6\n" in exprs["VllmEngineImbalance"] and "(0.25 * min by" in exprs["VllmEngineImbalance"]
    assert any("< 0.6\n" in r["expr"] and "(0.25 * min by" in r["expr"] for r in bundle.recording_rules(changed))


def test_duration_formatting():
    assert [bundle.duration(s) for s in (300, 3600, 120, 90, 86400, 900)] == ["5m", "1h", "2m", "90s", "1d", "15m"]


# ------------------------------------------------------------------------------ promtool

def test_promtool_check_rules():
    result = run([promtool(), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout
    assert f"SUCCESS: {len(all_rules())} rules found" in result.stdout


def test_promtool_check_rules_on_the_prometheus_rule_object(tmp_path):
    obj = yaml.safe_load(bundle.export("prometheus-rule"))
    assert obj["kind"] == "PrometheusRule"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(obj["spec"]))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout
    assert obj["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


@pytest.mark.parametrize("tests", UNIT_TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(tests):
    result = run([promtool(), "test", "rules", tests.name], cwd=tests.parent, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "SUCCESS" in result.stdout


def test_every_alert_fires_and_stays_silent_in_the_unit_tests():
    """For each alert: a case where it fires, and a series of the same test (an instance) on
    which it does not fire, or an evaluation that expects no alert."""
    fires, silent = set(), set()
    groups = [g for path in UNIT_TEST_FILES for g in yaml.safe_load(path.read_text())["tests"]]
    for group in groups:
        # a scope: the instance of per-pod alerts, the model of the fleet-level ones
        scopes = {key: {m.group(1) for s in group["input_series"] if (m := re.search(key + r'="([^"]+)"', s["series"]))}
                  for key in ("instance", "model_name")}
        expected: dict[str, set[tuple[str, str]]] = {}
        for case in group.get("alert_rule_test", []):
            name = case["alertname"]
            exp = case.get("exp_alerts") or []
            for a in exp:
                key = "instance" if "instance" in a["exp_labels"] else "model_name"
                expected.setdefault(name, set()).add((key, a["exp_labels"][key]))
            expected.setdefault(name, set())
            if exp:
                fires.add(name)
                for a in exp:
                    assert "exp_annotations" in a, f"{name}: the test must check the annotations (the value)"
            else:
                silent.add(name)
        for name, got in expected.items():
            keys = {k for k, _ in got} or {"instance"}
            if any(scopes[k] - {v for kk, v in got if kk == k} for k in keys):
                silent.add(name)  # a pod (or model) of the same test on which it does not fire
    assert set(alert_names()) <= fires, f"never fires in a unit test: {set(alert_names()) - fires}"
    assert set(alert_names()) <= silent, f"never shown silent: {set(alert_names()) - silent}"


# ------------------------------------------------------------------------------ the mistakes

STORM_SERIES = "vllm_preemptions_total"
LABELS = {"job": "vllm-doctor", "instance": "a:9401", "pod": "p", "gpu": "0"}


def _promtool_test(tmp_path: Path, expr: str, metric: str, values: str, eval_time: str, fires: bool) -> str:
    """Run promtool's unit test for a one-alert rule file: expect it to fire or not."""
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "A", "expr": expr}]}]}))
    series = metric + "{" + ", ".join(f'{k}="{v}"' for k, v in LABELS.items()) + "}"
    exp = json.dumps([{"exp_labels": LABELS}]) if fires else "[]"
    (tmp_path / "t.yaml").write_text(textwrap.dedent(f"""\
        rule_files: [r.yaml]
        tests:
          - interval: 1m
            input_series:
              - series: '{series}'
                values: '{values}'
            alert_rule_test:
              - eval_time: {eval_time}
                alertname: A
                exp_alerts: {exp}
        """))
    return run([promtool(), "test", "rules", "t.yaml"], cwd=tmp_path).stdout


def test_rate_greater_than_5_is_per_second_and_misses_a_storm(tmp_path):
    # 2 preemptions a minute = 10 per 5 minutes: our alert pages (unit test "storm").
    out = _promtool_test(tmp_path, "rate(vllm_preemptions_total[5m]) > 5", STORM_SERIES, "0+2x20", "15m", fires=False)
    assert "SUCCESS" in out, out  # the tuning note's alert stays silent on the storm
    out = _promtool_test(tmp_path, "increase(vllm_preemptions_total[5m]) >= 5", STORM_SERIES, "0+2x20", "15m", fires=True)
    assert "SUCCESS" in out, out
    assert "rate(vllm_preemptions_total" not in RULES.read_text()


def test_per_second_slope_against_a_per_hour_threshold_misses_a_leak(tmp_path):
    leak = "gpu_memory_used_bytes"
    values = "70000000000+10485760x180"  # 600 MiB per hour
    out = _promtool_test(tmp_path, "deriv(gpu_memory_used_bytes[1h]) > 536870912", leak, values, "90m", fires=False)
    assert "SUCCESS" in out, out
    out = _promtool_test(tmp_path, "deriv(gpu_memory_used_bytes[1h]) * 3600 > 536870912", leak, values, "90m", fires=True)
    assert "SUCCESS" in out, out


def test_derivative_is_not_promql(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "Leak", "expr": "derivative(gpu_memory_used_bytes[1h]) > 0"}]}]}))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode != 0
    assert 'unknown function with name "derivative"' in result.stdout
    assert "derivative(" not in RULES.read_text()


def test_kv_usage_is_the_ratio_not_sequences_over_tokens():
    exprs = {r["alert"]: r["expr"] for r in rules()}
    for name in ("VllmKvCacheSaturated", "VllmKvCapacityBound"):
        assert "vllm_kv_cache_usage_ratio" in exprs[name]
        assert "vllm_kv_cache_tokens" not in exprs[name]
    assert not re.search(r"vllm_running_sequences\s*/\s*vllm_kv_cache_tokens", RULES.read_text())


def test_every_metric_an_alert_uses_is_exported():
    known = known_metrics()
    assert "vllm:num_preemptions_total" in known
    assert "vllm:num_preemptions" not in known  # the name vLLM's and llm-d's examples query
    recorded = {r["record"] for r in records()}
    used = set().union(*(metric_names(r["expr"]) for r in all_rules()))
    assert used, "no metric name found"
    assert used <= known | recorded, f"not exported by vllm-doctor or vLLM, nor recorded: {used - known - recorded}"
    assert metric_names('increase(vllm:num_preemptions_total{a="b"}[5m]) > on(pod) group_left x') == {
        "vllm:num_preemptions_total", "x"}


# ------------------------------------------------------------------------------ annotations

@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_alert_has_severity_summary_description_and_runbook(rule):
    labels, ann = rule["labels"], rule["annotations"]
    assert labels["severity"] in {"critical", "warning", "info", "{{ $labels.severity }}"}
    assert labels["rule"]
    assert ann["summary"] and ann["description"]
    assert "$value" in ann["summary"] + ann["description"], "the value must be in the annotations"
    expected = f"{bundle.RUNBOOK_BASE_URL}/"
    assert ann["runbook_url"].startswith(expected)
    runbook = RUNBOOKS / ann["runbook_url"][len(expected):]
    assert runbook.suffix == ".md" and runbook.is_file(), f"missing runbook {runbook}"
    text = runbook.read_text()
    assert text.startswith(f"# {rule['alert']}"), f"{runbook.name} must start with '# {rule['alert']}'"
    for section in RUNBOOK_SECTIONS:
        assert section in text, f"{runbook.name} lacks '{section}'"
    assert "--" in text.split("## What to change", 1)[1] or rule["labels"]["rule"] == "vllm-doctor", \
        f"{runbook.name} must name the vLLM flags to change"


def test_every_runbook_belongs_to_an_alert():
    names = {Path(r["annotations"]["runbook_url"]).name for r in rules()}
    assert {p.name for p in RUNBOOKS.glob("*.md")} - {"README.md"} == names


# ------------------------------------------------------------------------------ Alertmanager

def test_amtool_check_config():
    result = run([amtool(), "check-config", str(ALERTMANAGER)])
    assert result.returncode == 0, result.stdout
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=VllmEngineDead", "severity=critical", "pod=p", "rule=engine-dead"], "pager"),
    (["alertname=VllmPreemptionStorm", "severity=warning", "pod=p", "rule=preemption-storm"], "tickets"),
    (["alertname=VllmDoctorFinding", "severity=info", "pod=p", "rule=x"], "blackhole"),
])
def test_amtool_routes(labels, receiver):
    result = run([amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels])
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == receiver


def test_alertmanager_groups_by_pod_and_rule_and_inhibits_symptoms_while_engine_dead():
    cfg = yaml.safe_load(ALERTMANAGER.read_text())
    assert {"pod", "rule"} <= set(cfg["route"]["group_by"])
    names = set(alert_names())
    dead = [r for r in cfg["inhibit_rules"] if r["source_matchers"] == ['alertname="VllmEngineDead"']]
    assert len(dead) == 1 and set(dead[0]["equal"]) >= {"namespace", "pod"}
    target = re.fullmatch(r'alertname=~"(.*)"', dead[0]["target_matchers"][0]).group(1).split("|")
    assert set(target) == set(bundle.SYMPTOM_ALERTS)
    # Every alert named in the config exists.
    named = set(re.findall(r"Vllm[A-Za-z0-9]+", ALERTMANAGER.read_text()))
    assert named <= names, f"unknown alerts in alertmanager.yml: {named - names}"


# ------------------------------------------------------------------------------ export

@pytest.mark.parametrize("kind, committed", [
    ("alerts", "alerts/vllm-doctor.rules.yaml"),
    ("dashboards", "dashboards/out/vllm-doctor.json"),
    ("prometheus-rule", "deploy/kubernetes/base/generated/prometheusrule.yaml"),
])
def test_cli_export_prints_the_committed_files(kind, committed):
    exe = Path(sys.executable).parent / "vllm-doctor"
    if not exe.exists():
        pytest.skip("vllm-doctor is not installed in this environment")
    result = subprocess.run([str(exe), "export", kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / committed).read_text()


def test_bundle_check_reports_no_stale_file():
    assert bundle.main(["--check"]) == 0


@pytest.mark.slow
def test_an_installed_wheel_exports_the_same_bundle(tmp_path):
    """A user without the repository: build the wheel, install it alone in a folder, export."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    build = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)], timeout=300)
    assert build.returncode == 0, build.stdout[-3000:]
    install = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                   *map(str, wheels.glob("vllm_incident_doctor-*.whl"))], timeout=300)
    assert install.returncode == 0, install.stdout[-3000:]
    code = ("from vllm_doctor.monitoring import bundle; import sys; "
            "print(bundle.__file__); print(bundle.thresholds_path()); sys.stdout.write(bundle.export(sys.argv[1]))")
    for kind, committed in (("alerts", "alerts/vllm-doctor.rules.yaml"), ("dashboards", "dashboards/out/vllm-doctor.json")):
        result = subprocess.run([sys.executable, "-c", code, kind], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        module, thresholds, text = result.stdout.split("\n", 2)
        assert module.startswith(str(target)) and thresholds.startswith(str(target))  # not the checkout
        assert text == (ROOT / committed).read_text()


# ------------------------------------------------------------------------------ the catalogue and the latency layer

def _rule_names(rule: dict) -> set[str]:
    """The vllm-doctor rule(s) an alert names: its ``rule`` label, or where that label is taken
    from the series, the values its expression gives that label (``label_replace``)."""
    label = rule["labels"]["rule"]
    if label == "{{ $labels.rule }}":
        return set(re.findall(r'label_replace\(.*?"rule", "([^"]+)"', rule["expr"], re.S))
    return {label}


def test_every_alert_names_a_rule_of_the_catalogue():
    from vllm_doctor.diagnosis import load_rules
    from vllm_doctor.fleet.rules import load_fleet_rules

    rs = load_rules([])
    catalogue = {r.name for r in rs.rules} | {r.name for r in load_fleet_rules(rs.thresholds).rules}
    assert {"replica-imbalance", "engine-imbalance", "fleet-preemptions", "fleet-kv-saturation",
            "latency-objective-missed"} <= catalogue
    for r in rules():
        names = _rule_names(r)
        if r["labels"]["rule"] in ("vllm-doctor", "{{ $labels.name }}"):
            continue  # the sidecar's own health, or the finding the sidecar names itself
        assert names and names <= catalogue, f"{r['alert']}: rule {names - catalogue} is not in the catalogue"
    assert _rule_names(next(r for r in rules() if r["alert"] == "VllmOutOfMemory")) == {"runtime-oom", "startup-oom"}



def test_the_imbalance_alerts_fire_where_the_fleet_report_finds_an_imbalance():
    """VllmReplicaImbalance and VllmEngineImbalance fire on the models and pods of fleet.test.yaml
    where ``diagnose --prometheus`` (the fleet rules, BalanceCriteria) reports replica-imbalance and
    engine-imbalance on the same series: beside a saturated replica or engine, one that idles or
    has room (m6, dpr-room) counts, none near full with a similar queue (m5, dpr-near) or with a
    long queue (m2, dpr-queue) does."""
    from test_fleet_rules import N, judge, replica

    group = next(g for g in yaml.safe_load((ROOT / "alerts" / "tests" / "fleet.test.yaml").read_text())["tests"]
                 if any(c["alertname"] == "VllmReplicaImbalance" for c in g.get("alert_rule_test", [])))
    rows: dict[str, dict[str, dict[str, dict[str, float]]]] = {}  # model -> pod -> engine -> metric -> value
    for s in group["input_series"]:
        name, body = re.fullmatch(r"vllm:(\w+)\{(.*)\}", s["series"]).groups()
        if name in ("kv_cache_usage_perc", "num_requests_waiting", "num_requests_running"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', body))
            value, _ = str(s["values"]).split("x")  # one value held over the test
            rows.setdefault(labels["model_name"], {}).setdefault(labels["pod"], {}).setdefault(
                labels["engine"], {})[name] = float(value)
    fleet_replica, fleet_engine = set(), set()
    for model, pods in rows.items():
        reps = []
        for pod, engines in pods.items():
            rep = None
            for engine, m in engines.items():
                rep = replica(pod, [(m["num_requests_running"], m["num_requests_waiting"], m["kv_cache_usage_perc"], 0)] * N,
                              engine=engine, rep=rep)
            reps.append(rep)
        got = judge(reps)
        if "replica-imbalance" in got:
            fleet_replica.add(model)
        if "engine-imbalance" in got:
            fleet_engine |= {e.source.removeprefix("prometheus:llm/").split(" engine ")[0] for e in got["engine-imbalance"].evidence}
    expected = {c["alertname"]: c["exp_alerts"] for c in group["alert_rule_test"] if c["exp_alerts"]}
    assert {a["exp_labels"]["model_name"] for a in expected["VllmReplicaImbalance"]} == fleet_replica == {"m1", "m6"}
    assert {a["exp_labels"]["pod"] for a in expected["VllmEngineImbalance"]} == fleet_engine == {"dp", "dp2", "dpr-room"}

def test_vllm_example_preemption_name_never_fires_ours_does(tmp_path):
    """vLLM's and llm-d's example alerts query vllm:num_preemptions; vLLM exports
    vllm:num_preemptions_total (the real 0.32 counter values, a minute apart)."""
    real = "0 3 9 19 32 47 59 59 59"
    out = _promtool_test(tmp_path, "increase(vllm:num_preemptions[5m]) >= 5", "vllm:num_preemptions_total", real, "5m", fires=False)
    assert "SUCCESS" in out, out
    out = _promtool_test(tmp_path, "increase(vllm:num_preemptions_total[5m]) >= 5", "vllm:num_preemptions_total", real, "5m", fires=True)
    assert "SUCCESS" in out, out
    assert "vllm:num_preemptions[" not in RULES.read_text() and "vllm:num_preemptions_total" in RULES.read_text()


def test_latency_comes_from_histogram_buckets_not_a_per_pod_quantile():
    text = RULES.read_text()
    assert 'quantile="0.99"' not in text  # the per-pod quantile gauge cannot be aggregated
    recs = {r["record"]: r for r in records()}
    for sig, names in (("ttft", "vllm:time_to_first_token_seconds_bucket"), ("itl", "vllm:inter_token_latency_seconds_bucket"),
                       ("e2e", "vllm:e2e_request_latency_seconds_bucket"), ("queue", "vllm:request_queue_time_seconds_bucket")):
        expr = recs[f"namespace_model_name:vllm_{sig}_seconds:p99_rate5m"]["expr"]
        assert expr.startswith("histogram_quantile(0.99, sum by (namespace, model_name, le) (rate(" + names)
    assert "vllm:time_per_output_token_seconds_bucket" in recs["namespace_model_name:vllm_itl_seconds:p99_rate5m"]["expr"]
    # every SLO window of the workbook's four alerts is recorded, for each SLO
    slo = [r for r in records() if r["record"].startswith("namespace_model_name:vllm_latency_slo_errors:ratio_rate")]
    assert {(r["labels"]["slo"], r["record"].rsplit("rate", 1)[1]) for r in slo} == {
        (s, w) for s in ("ttft", "itl", "e2e", "queue") for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")}
    fast = next(r for r in rules() if r["alert"] == "VllmLatencySloBurnFast")["expr"]
    assert "ratio_rate1h > 0.144" in fast and "ratio_rate5m > 0.144" in fast and "ratio_rate6h > 0.06" in fast
    slow = next(r for r in rules() if r["alert"] == "VllmLatencySloBurnSlow")["expr"]
    assert "ratio_rate1d > 0.03" in slow and "ratio_rate3d > 0.01" in slow
    # the SLO bounds are bucket bounds of the real vLLM 0.32 histograms
    t = bundle.load_thresholds(ROOT / "rules" / "thresholds.yaml")
    capture = vllm_metrics_capture().read_text()
    for sig, hist in (("ttft", "time_to_first_token_seconds"), ("itl", "inter_token_latency_seconds"),
                      ("e2e", "e2e_request_latency_seconds"), ("queue", "request_queue_time_seconds")):
        assert f'vllm:{hist}_bucket{{engine="0",le="{float(t[f"slo_{sig}_seconds"])!r}"' in capture, sig
