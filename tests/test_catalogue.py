"""One rule catalogue: one Severity order, one loader for deployment and fleet rules (with scope and
aliases), a size limit on expressions, and sentences built by Python helpers registered once."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace as N

import pytest

from vllm_doctor.check.findings import check_rule
from vllm_doctor.diagnosis.loader import MAX_EXPRESSION_CHARS, builtin_rules_dir, load_rules, rule_expressions
from vllm_doctor.diagnosis.sentences import (SENTENCES, engine_death_cause, exception_origin, killed_by_signal,
                                             kv_capacity_buys, kv_running_shrank, request_too_long_text, sentence,
                                             startup_oom_after_weights, tensor_parallel_arithmetic, unknown_flag_notes)
from vllm_doctor.errors import RuleLoadError
from vllm_doctor.findings import SEVERITY_ORDER, Finding, Severity, by_severity
from vllm_doctor.fleet.rules import load_fleet_rules

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_doctor"


def test_severity_is_one_order_and_a_member_is_its_string():
    assert [s.value for s in Severity] == ["info", "warning", "critical"]
    assert SEVERITY_ORDER == {"info": 0, "warning": 1, "critical": 2}
    assert Severity.critical.rank == 2 and Severity("warning") == "warning"
    assert {"warning": 1}[Severity.warning] == 1 and f"{Severity.info:<8}|" == "info    |"
    fs = [Finding(rule_id=i, name=i, severity=s, title="", message="") for i, s in
          (("VD002", "warning"), ("VD001", "info"), ("VD003", Severity.critical), ("VD000", "warning"))]
    assert [f.rule_id for f in sorted(fs, key=by_severity)] == ["VD003", "VD000", "VD002", "VD001"]
    rs = load_rules()
    assert all(isinstance(r.severity, Severity) for r in rs.rules)


def test_no_module_spells_the_severity_order_again():
    spelt = re.compile(r"""["']info["']\s*:\s*\d|["']critical["']\s*:\s*\d|\(\s*["']info["'],\s*["']warning["'],\s*["']critical["']""")
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in PACKAGE.rglob("*.py") if p.name != "findings.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if spelt.search(line)]
    assert not found, found


def test_unknown_flag_is_one_rule_with_checks_id_as_its_alias():
    rs = load_rules()
    r = rs.by_key("VC001")
    assert r is not None and (r.id, r.name, r.aliases) == ("VD010", "unknown-flag", ["VC001"])
    assert rs.by_key("vc001") is r and check_rule("VC001").name == r.name  # the same name in check


def _user_rule(tmp_path: Path, text: str, name: str = "VD901-mine.yaml") -> Path:
    d = tmp_path / "rules"
    d.mkdir(parents=True, exist_ok=True)
    base = (builtin_rules_dir() / "VD031-log-unread.yaml").read_text()
    (d / name).write_text(base.replace("id: VD031", "id: VD901").replace("name: log-unread", "name: mine")
                          .replace("values:\n", "values:\n" + text))
    return d


def test_an_alias_that_is_another_rules_id_is_refused(tmp_path):
    d = _user_rule(tmp_path, "")
    p = d / "VD901-mine.yaml"
    p.write_text(p.read_text().replace("severity: warning", "severity: warning\naliases: [VD001]"))
    with pytest.raises(RuleLoadError, match=r"VD901-mine.yaml: alias VD001 is already the id, name or alias"):
        load_rules(extra_dirs=[d])


def test_an_expression_over_the_size_limit_is_refused_at_load_naming_the_rule(tmp_path):
    long = " + ".join(["1"] * 400)  # 1,597 characters
    d = _user_rule(tmp_path, f"  big: \"{long}\"\n")
    with pytest.raises(RuleLoadError) as e:
        load_rules(extra_dirs=[d])
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (f"{d / 'VD901-mine.yaml'}:11: values.big: rule VD901 mine: an expression of {len(long)} characters, "
                   f"over the limit of {MAX_EXPRESSION_CHARS}: build the sentence in Python "
                   "(vllm_doctor/diagnosis/sentences.py)")
    ok = " + ".join(["1"] * 100)
    load_rules(extra_dirs=[_user_rule(tmp_path / "ok", f"  big: \"{ok}\"\n")])


def test_fleet_rules_go_through_the_one_loader_with_their_scope(tmp_path):
    rs = load_rules()
    fleet = load_fleet_rules(rs.thresholds)
    assert {r.scope for r in rs.rules} == {"deployment"} and {r.scope for r in fleet.rules} == {"fleet"}
    src = (builtin_rules_dir() / "fleet" / "VD020-replica-imbalance.yaml").read_text()
    d = tmp_path / "fleet"
    d.mkdir()
    (d / "VD020-replica-imbalance.yaml").write_text(src.replace("  all:\n", "  all:\n    - stats\n", 1))
    with pytest.raises(RuleLoadError, match=r"unknown name 'stats'"):  # a deployment name is not a fleet name
        load_fleet_rules(rs.thresholds, d)


def test_sentences_are_registered_once_and_callable_from_rules():
    assert SENTENCES["unknown_flag_notes"] is unknown_flag_notes and SENTENCES["engine_death_cause"] is engine_death_cause
    with pytest.raises(ValueError, match="registered twice"):
        sentence(unknown_flag_notes)
    notes = load_rules().by_key("unknown-flag").values["notes"]
    assert notes == "unknown_flag_notes(uniq, vllm_version)"


# The wordings below are those the rules' YAML conditionals gave (checked against them when they
# moved to sentences.py): every branch, byte for byte.
@pytest.mark.parametrize("flag, real, version, note", [
    ("--kv-cache", "--no-such-thing", "0.5.4", "no vLLM version has this; meant: --no-such-thing"),
    ("--max_model_len", "--max-model-len", "0.4.2",
     "not a vLLM flag in this form: vLLM 0.4.2 has --max-model-len (0.3.3–0.33.0)"),
    ("--kv_cache", "--config", "0.4.2", "not a vLLM flag in this form: vLLM 0.4.2 lacks --config (0.6.0–0.33.0)"),
    ("--kv-cache", "--kv-cache-dtype", None, "not a vLLM flag in this form; vLLM has --kv-cache-dtype in 0.3.3–0.33.0"),
    ("--omni", None, "0.10.1", "no vLLM release has this flag (0.3.3-0.33.0 examined): a plugin or platform flag, "
                               "accepted only where that plugin is installed, or a typo"),
    ("--max-model-len", None, "0.5.4", "vLLM 0.5.4 has this flag, but the command that printed the error does not "
                                       "take it (another entry point or subcommand)"),
    ("--config", None, "0.5.4", "not in vLLM 0.5.4; vLLM has it in 0.6.0–0.33.0"),
    ("--config", None, None, "vLLM has it only in 0.6.0–0.33.0, so the vLLM that rejected it is outside those "
                             "versions (this log does not show which it is), or the command was another entry point"),
])
def test_unknown_flag_notes_each_case(flag, real, version, note):
    assert unknown_flag_notes([N(flag=flag, real_flag=real)], version) == f"{flag}: {note}"


def test_unknown_flag_notes_join_flags():
    got = unknown_flag_notes([N(flag="--omni", real_flag=None), N(flag="--config", real_flag=None)], "0.5.4")
    assert got.startswith("--omni: no vLLM release has this flag") and "; --config: not in vLLM 0.5.4;" in got


def test_engine_death_cause_each_case():
    assert engine_death_cause(None, None, None) is None
    assert engine_death_cause("illegal-memory-access", None, None) == (
        "Cause: a CUDA illegal memory access: a kernel read or wrote outside its memory (a kernel bug for this model, "
        "GPU, attention backend or quantization, more rarely faulty hardware); the CUDA context is lost and the engine "
        "cannot go on.")
    assert engine_death_cause("device-assert", None, None) == (
        "Cause: a CUDA device-side assert: a kernel's own check failed, mostly an index out of range (a token id "
        "outside the vocabulary, a bad sampling parameter or a kernel bug); the CUDA context is lost.")
    assert engine_death_cause("scheduler-assertion", "scheduler.py:412 schedule", None) == (
        "Cause: an assertion in vLLM's scheduler (scheduler.py:412 schedule) failed: its bookkeeping of requests or "
        "KV cache blocks broke, a bug of this vLLM version, not a capacity problem.")
    assert engine_death_cause("kv-connector", None, "NixlConnector") == (
        "Cause: the KV connector (NixlConnector) failed in the engine: its set-up, or a KV transfer to or from the "
        "other instance or store, did not complete.")


def test_the_expression_limit_is_the_longest_built_in_expression_plus_a_margin():
    rs = load_rules()
    exprs = [e for r in (*rs.rules, *load_fleet_rules(rs.thresholds).rules) for e in rule_expressions(r)]
    longest = max(len(e) for e in exprs)
    assert longest < MAX_EXPRESSION_CHARS <= 700 and MAX_EXPRESSION_CHARS - longest <= 150, (longest, MAX_EXPRESSION_CHARS)


@pytest.mark.parametrize("fn", [request_too_long_text, startup_oom_after_weights, tensor_parallel_arithmetic,
                                kv_capacity_buys, kv_running_shrank, exception_origin, killed_by_signal])
def test_each_long_sentence_is_a_registered_sentence_a_rule_calls(fn):
    rs = load_rules()
    assert SENTENCES[fn.__name__] is fn
    assert any(fn.__name__ + "(" in e for r in rs.rules for e in rule_expressions(r))


# The sentences below were conditionals of 600-900 characters in the rules' YAML; the wordings are
# those the YAML gave (each branch evaluated both ways by the rules' Evaluator when they moved),
# here for the branches the corpus logs do not reach.
def test_startup_oom_after_weights_each_case():
    assert startup_oom_after_weights(True, True, None, None, None, None, None) == (
        "The traceback runs through CUDA graph capture: the graphs did not fit next to the weights and the KV cache.")
    assert startup_oom_after_weights(True, False, 0.5, 1.0, 2.0, None, None) == (
        "The KV cache had been sized before it, so this is what comes after the profiling run: CUDA graph capture or "
        "warm-up.")
    head = ("No KV cache size was logged before it, so this is the profiling run of the longest batch (vLLM sizes the "
            "KV cache after it and captures CUDA graphs after that), not the weights nor CUDA graphs: its activations "
            "grow with the batch vLLM profiles (--max-num-batched-tokens, or --max-model-len where chunked prefill is "
            "off).")
    assert startup_oom_after_weights(False, False, None, 1.5, 3.25, None, None) == head
    assert startup_oom_after_weights(False, False, 0.437, 1.5, 3.25, 4096, None) == (
        head + " At most 43% of that batch fits in what was free (1.50 / 3.25 GiB).")
    assert startup_oom_after_weights(False, False, 0.437, 1.5, 3.25, 0, None) == (
        head + " At most 43% of that batch fits in what was free (1.50 / 3.25 GiB): this log shows neither value, so "
               "no size can be computed.")


def test_tensor_parallel_arithmetic_each_case():
    assert tensor_parallel_arithmetic(70.2, 1, 4, 0.9, 79.2, None, None) == (
        "70.20 GiB of weights per GPU x 1 GPUs / 4 GPUs = 17.55 GiB each, at most 90% of the 79.20 GiB device")
    tail = " (the size of the weights is not in this log)"
    assert tensor_parallel_arithmetic(None, 2, None, 0.9, 79.2, 2, 3) == (
        "the next power of two above tensor_parallel_size 2" + tail)
    assert tensor_parallel_arithmetic(None, 4, None, 0.9, 79.2, None, 3) == (
        "the next power of two above the 4 GPUs the worker processes show (at least 3)" + tail)
    assert tensor_parallel_arithmetic(None, 1, None, 0.9, 79.2, None, 0) == (
        "tensor_parallel_size 1 (the default; this log does not show it) x 2" + tail)


def test_request_too_long_and_kv_capacity_sentences():
    assert request_too_long_text(1, None, 8192, True) == (
        "vLLM's scheduler ignored 1 request whose prompt alone was over its prompt limit of 8,192: each finished with "
        "no output. With chunked prefill off that limit is min(max_model_len, max_num_batched_tokens), so a limit "
        "below the model's context is max_num_batched_tokens.")
    assert request_too_long_text(3, 9000, None, False) == (
        "vLLM rejected 3 requests for length (the longest 9,000 tokens): each got an error (HTTP 400) instead of an "
        "answer.")
    assert kv_capacity_buys(None, 0.9, 0.95, "cuda", None, "auto", None, "") == (
        " --gpu-memory-utilization +0.05 buys 5% of the device's memory for KV cache blocks;"
        " a larger --tensor-parallel-size leaves each GPU less of the weights, the rest goes to KV cache blocks;")
    assert kv_capacity_buys(1 << 30, 0.9, 0.95, "CPU", 5, "fp8", 100000, " (x)") == (
        " another replica behind the load balancer adds its own 100,000 tokens (x).")
    assert kv_running_shrank(False, 0, 64, 12, 300) == ""
    assert kv_running_shrank(True, 7, 64, 12, 300) == " Running fell from 64 to 12 while the cache stayed full."
    assert exception_origin(None, "weird", False) == "raised in a vLLM process during weird"
    assert exception_origin(None, None, True) is None
    assert killed_by_signal(-15) == "signal 15 (see `kill -l 15`)" and killed_by_signal(None) is None


def test_check_rules_are_in_the_one_catalogue_with_scope_check_and_severity_as_sarif_level():
    from vllm_doctor.check import LEVEL_ORDER
    from vllm_doctor.check.findings import CheckFinding, load_check_rules
    from vllm_doctor.findings import SARIF_LEVELS

    check = load_check_rules()
    assert [r.id for r in check.rules][:3] == ["VC001", "VC002", "VC003"] and len(check.rules) == 21
    assert {r.scope for r in check.rules} == {"check"} and all(isinstance(r.severity, Severity) for r in check.rules)
    assert all(Path(r.source).parent == builtin_rules_dir() / "check" for r in check.rules)
    assert SARIF_LEVELS == {Severity.info: "note", Severity.warning: "warning", Severity.critical: "error"}
    assert LEVEL_ORDER == {"note": 0, "warning": 1, "error": 2}
    kv = check_rule("VC010")
    assert (kv.name, kv.severity, kv.title) == (
        "kv-capacity", Severity.critical, "The KV cache cannot hold what the launch asks for (plan's arithmetic).")
    assert CheckFinding("VC010", "m").level == "error" and CheckFinding("VM006", "m").level == "note"
    assert CheckFinding("VC003", "m").name == "abbreviated-flag"


def test_a_check_rule_holds_no_condition_and_other_rules_still_need_theirs(tmp_path):
    from vllm_doctor.diagnosis.loader import load_rule_file

    src = (builtin_rules_dir() / "check" / "VC008-unpinned-image.yaml").read_text()
    p = tmp_path / "VC008-unpinned-image.yaml"
    p.write_text(src + "when:\n  all: [n > 1]\n")
    with pytest.raises(RuleLoadError, match=r"VC008-unpinned-image.yaml: a check rule has no when, values"):
        load_rule_file(p, True, {}, scope="check")
    p.write_text(src)
    with pytest.raises(RuleLoadError, match=r"VC008-unpinned-image.yaml: when: Field required"):
        load_rule_file(p, True, {})  # scope "deployment"
