"""The metric catalogue (vllm_doctor/data/vllm_metrics.json, tools/gen_metrics_catalogue.py) and
what reads it: check's PromQL lint, the scraper, the fleet queries, the monitoring bundle and the
sidecar's collector."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vllm_doctor import catalogue as cat
from vllm_doctor.catalogue import V
from vllm_doctor.check.monitoring import lint_promql

ROOT = Path(__file__).resolve().parent.parent


def test_catalogue_spans_every_release_and_holds_what_0_33_defines():
    versions = cat.versions_examined()
    assert versions[0].startswith("0.2.") and versions[-1] == "0.33.0", versions
    in_033 = cat.names_in("0.33.0")
    assert len(in_033) == 138  # every vllm: family vllm 0.33.0 defines (issue 22: the old table had 45)
    # the series the old table called "never exported"
    for name in ("vllm:nixl_num_failed_transfers_total", "vllm:admission_rejections_total",
                 "vllm:tool_call_parser_invocations_total"):
        assert name in in_033, name
    f = cat.vllm_families()["vllm:num_requests_running"]
    assert f.type == "gauge" and f.labels == ("engine", "model_name") and f.versions[0][0] == versions[0]
    ttft = cat.vllm_families()["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram" and ttft.unit == "seconds"
    assert ttft.samples == ("vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
                            "vllm:time_to_first_token_seconds_count")


def test_renames_and_their_ranges():
    fams = cat.vllm_families()
    assert cat.names(V.kv_cache_usage_perc) == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert cat.names(V.inter_token_latency_seconds) == ("vllm:inter_token_latency_seconds",
                                                        "vllm:time_per_output_token_seconds")
    assert cat.names(V.prefix_cache_hits_total)[1] == "vllm:gpu_prefix_cache_hits_total"
    assert cat.successor("vllm:gpu_cache_usage_perc") == "vllm:kv_cache_usage_perc"
    # the old KV usage name: every release until 0.11 (hidden behind --show-hidden-metrics-for-version at
    # the end), removed in 0.12; the new one from 0.9.2
    assert fams["vllm:gpu_cache_usage_perc"].versions[-1][1].startswith("0.11.")
    assert fams["vllm:kv_cache_usage_perc"].versions[0][0] == "0.9.2"
    assert cat.exported("vllm:gpu_cache_usage_perc", "0.10.1") and not cat.exported("vllm:gpu_cache_usage_perc", "0.12.0")
    assert cat.exported("vllm:time_per_output_token_seconds_bucket", "0.14.0")
    assert not cat.exported("vllm:time_per_output_token_seconds_bucket", "0.15.0")
    with pytest.raises(AttributeError):
        getattr(V, "num_preemptions")  # vLLM's counter is vllm:num_preemptions_total


def test_check_raises_no_false_never_exported_on_any_series_of_any_release():
    """Every series of every release, as a query for that release: no VM001."""
    false = []
    for version in cat.versions_examined():
        for name in cat.names_in(version):
            f = cat.vllm_families()[name]
            for sample in (f.name, *f.samples):
                out = [x for x in lint_promql(sample, version, "q", 1) if x.rule_id == "VM001"]
                if out:
                    false.append((version, sample, out[0].message))
    assert not false, false[:5]


def test_lint_still_catches_a_series_of_another_release():
    out = lint_promql("vllm:gpu_cache_usage_perc", "0.12.0", "q", 1)
    assert [x.rule_id for x in out] == ["VM001"] and "vllm:kv_cache_usage_perc" in out[0].message
    assert [x.rule_id for x in lint_promql("vllm:num_preemptions", "0.33.0", "q", 1)] == ["VM001"]


def _string_literals(path: Path):
    """(line, text) of the string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_module_spells_a_vllm_series_name_by_hand():
    """Every vLLM series name in the package comes from the catalogue (catalogue.V / names / either)."""
    known = {s for f in cat.vllm_families().values() for s in (f.name, *f.samples)}
    found = []
    for path in sorted((ROOT / "vllm_doctor").rglob("*.py")):
        if path.name == "catalogue.py":
            continue
        for line, text in _string_literals(path):
            for m in re.finditer(r"vllm:[a-z_]+", text):
                if m.group(0) in known or m.group(0) + "_total" in known:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert not found, found


def test_the_collector_describes_the_catalogues_sidecar_series():
    from prometheus_client import CollectorRegistry

    from vllm_doctor.export.collectors import SidecarCollector

    described = SidecarCollector(sidecar=None).describe()
    names = {f.name + ("_total" if f.type == "counter" else "_info" if f.type == "info" else "") for f in described}
    assert names == set(cat.sidecar_families())
    docs = {f.name: f.documentation for f in described}
    assert docs["vllm_doctor_finding_active"] == cat.sidecar_families()["vllm_doctor_finding_active"].documentation
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(sidecar=None))  # its names registered up front, no clash


def test_the_scrapers_renames_come_from_the_catalogue():
    from vllm_doctor.ingest.scrape import SAMPLE_FIELDS

    assert SAMPLE_FIELDS["vllm:gpu_cache_usage_perc"] == ("kv_cache_usage_ratio", 1)
    assert SAMPLE_FIELDS["vllm:kv_cache_usage_perc"] == ("kv_cache_usage_ratio", 0)
    assert SAMPLE_FIELDS["vllm:gpu_prefix_cache_queries_total"] == ("prefix_cache_queries_total", 1)


def test_fixes_panel_lists_every_rule_and_flag():
    import yaml

    from vllm_doctor.monitoring.bundle import fixes_table

    table = fixes_table()
    for path in sorted((ROOT / "rules").rglob("VD*.yaml")):
        doc = yaml.safe_load(path.read_text())
        row = next((r for r in table.splitlines() if r.startswith(f"| {doc['id']} ")), None)
        assert row is not None, doc["id"]
        for fix in doc.get("fixes") or []:
            assert f"`{fix['flag']}`" in row, (doc["id"], fix["flag"])
    assert "VD011" in table and "VD024" in table


def test_docs_metrics_md_is_the_catalogue():
    assert (ROOT / "docs" / "metrics.md").read_text() == cat.markdown(), "run: make metrics"


def test_a_renamed_series_is_suggested_under_its_new_name():
    out = lint_promql("histogram_quantile(0.99, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket[5m])))",
                      "0.15.0", "q", 1)
    assert [(x.rule_id, x.fix["setting"]) for x in out] == [("VM001", "vllm:inter_token_latency_seconds_bucket")]
    out = lint_promql("vllm:gpu_prefix_cache_hits_total", "0.12.0", "q", 1)
    assert out[0].fix["setting"] == "vllm:prefix_cache_hits_total"
