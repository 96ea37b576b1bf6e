"""Rule evaluation never silently skips (issue 10 item 4, issue 9 item 8): long windows are
evaluated, a rule that fails is a finding about vllm-doctor and a metric, and expressions are
checked at load for every field."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from vllm_doctor.diagnosis.evaluate import RULE_ERROR_ID
from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.pipeline import Pipeline

V0_STATS = ("INFO 11-21 00:12:{s:02d} llm_engine.py:624] Avg prompt throughput: {p}.0 tokens/s, Avg generation "
            "throughput: {g}.0 tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache "
            "usage: {kv}%, CPU KV cache usage: 0.0%\n")


def test_more_than_10000_stats_lines_in_a_window_are_evaluated_not_skipped():
    # 12,000 stats lines within one minute (many engines, or a flood): the whole window is judged
    lines = []
    for i in range(12_000):
        full = i % 3 == 0
        lines.append(V0_STATS.format(s=i // 200, p=2000 if full else 10, g=0 if full else 800, r=31,
                                     w=40 if full else 0, kv="99.5" if full else "40.0"))
    head = ("INFO 11-21 00:11:00 llm_engine.py:100] Initializing an LLM engine (v0.6.3) with config: "
            "model='m', max_seq_len=4096, enable_chunked_prefill=False\n"
            "INFO 11-21 00:11:01 gpu_executor.py:122] # GPU blocks: 8000, # CPU blocks: 2048\n")
    p = Pipeline(load_rules(), follow=False)
    p.run_files([("big.log", [(head + "".join(lines)).encode()])])
    rep = p.report()
    assert rep.rule_errors == {}
    assert p.engine.rule_errors_total == {}
    ids = {f.rule_id for f in rep.findings}
    assert RULE_ERROR_ID not in ids
    assert "VD003" in ids  # prefill stalls in 4,000 intervals: found over the whole window
    f = next(f for f in rep.findings if f.rule_id == "VD003")
    assert f.values["n_stalled"] == 4000


BROKEN = """\
id: XX001
name: broken-at-runtime
title: A user rule that fails when evaluated
severity: warning
category: test
when:
  any:
    - int(vllm_version) > 0
docs:
  why: test
  example_log: test
message: never
"""


def test_a_failing_rule_is_a_finding_and_a_metric(tmp_path):
    from vllm_doctor.export.serve import Sidecar, load_config
    from vllm_doctor.export.server import make_registry

    (tmp_path / "XX001-broken.yaml").write_text(BROKEN)
    log = tmp_path / "vllm.log"
    log.write_text("INFO 11-21 00:11:00 llm_engine.py:100] Initializing an LLM engine (v0.6.3) with config: "
                   "model='m'\n")
    cfg = load_config({"logs": [str(log)], "metrics_url": "none", "nvml": False, "rules": [str(tmp_path)],
                       "from_start": True}, env={})
    sc = Sidecar(cfg)
    sc.logs[0].reader.poll()
    active = sc.evaluate()
    sc.evaluate()
    err = next(f for f in active if f.rule_id == RULE_ERROR_ID)
    assert err.name == "rule-evaluation-failed" and err.severity == "warning"
    assert "XX001 (broken-at-runtime)" in err.message and "ValueError" in err.message
    text = generate_latest(make_registry(sc)).decode()
    assert 'vllm_doctor_rule_errors_total{rule_id="XX001"} 2.0' in text
    assert 'vllm_doctor_rule_errors_total{rule_id="VD001"} 0.0' in text


RULES = Path(__file__).resolve().parent.parent / "rules"


@pytest.mark.parametrize("rule,old,new,field", [
    ("VD009", "{rej.limit:,}", "{rej.limitt:,}", "message"),                      # a message template
    ("VD009", "value: rej.limit", "value: rej.limitt", "fixes[0].value"),         # a fix's value
    ("VD001", "- preempted >= t.preemption_storm_min", "- preemptd >= t.preemption_storm_min", "when[0]"),
    ("VD006", "e.kind == 'watchdog-timeout'", "e.kindd == 'watchdog-timeout'", "values.timeouts"),
    ("VD002", "want_len: small.max_model_len", "want_len: small.max_model_lenn", "values.want_len"),
    ("VD006", "evidence: [quoted]", "evidence: [quotd]", "evidence[0]"),
    ("VD001", 'arithmetic: "min({gpu_memory_utilization} + 0.05', 'arithmetic: "min({gpu_memory_utilisation} + 0.05',
     "fixes[2].arithmetic"),
    ("VD004", "num_waiting >= t.waiting_min and 1 <=", "num_waitin >= t.waiting_min and 1 <=", "windows.plateau.where"),
    ("VD004", "m_running: mfull.max('num_running')", "m_running: mfull.max('num_runing')", "values.m_running"),
    ("VD003", "fields: [prompt_tps, generation_tps", "fields: [prompt_tps, generation_tpz", "windows.stalled.fields"),
    ("VD003", "peak('generation_tps')", "peak('generation_tpz')", "windows.stalled.where"),
    ("VD005", "idle.slope_per_hour('kv_cache_usage_ratio')", "idle.slope_per_hours('kv_cache_usage_ratio')",
     "values.idle_slope"),
    ("VD001", "value: kv_bytes", "value: kv_byts", "fixes[1].value"),
    ("VD002", "if: oom_len is not None", "if: oom_lenn is not None", "fixes[12].if"),
])
def test_a_typo_in_any_field_is_a_load_error_with_file_and_line(tmp_path, rule, old, new, field):
    src = next(RULES.glob(f"{rule}-*.yaml"))
    text = src.read_text()
    assert old in text, "the case must mutate real rule text"
    bad = text.replace(old, new, 1).replace(f"id: {rule}", "id: XX" + rule[2:], 1)
    bad = bad.replace("\nname: ", "\nname: copy-of-", 1)
    (tmp_path / "copy.yaml").write_text(bad)
    line = bad[: bad.index(new)].count("\n") + 1
    with pytest.raises(RuleLoadError) as e:
        load_rules([tmp_path])
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'copy.yaml'}:{line}: {field}"), msg
    assert "\n" not in msg


def test_every_builtin_rule_passes_the_load_time_check():
    rs = load_rules()
    assert [r.id for r in rs.rules] == sorted(p.name[:5] for p in RULES.glob("VD*.yaml"))
