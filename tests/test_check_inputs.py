"""check: values vLLM's argparse rejects, an unbalanced quote, .env line numbers, and vllm-doctor's own
shipped alert rules and dashboards (zero findings where every series they query exists)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.check import check_files, check_text
from vllm_doctor.check.knowledge import _values

HERE = Path(__file__).parent
ROOT = HERE.parent
MODELS = HERE / "fixtures" / "models"


def found(text: str, name: str = "run.sh", version: str | None = "0.32.0", **kw):
    return [(f.rule_id, f.line, f.message) for f in check_text(text, name, vllm_version=version, **kw).findings]


# ---------------------------------------------------------------- values argparse rejects

@pytest.mark.parametrize("flag,value,words", [
    ("--max-model-len", "abc", "argument --max-model-len: invalid human_readable_int value: 'abc'"),
    ("--max-model-len", "1.5K", "invalid human_readable_int value: '1.5K'"),
    ("--max-num-batched-tokens", "8k8", "invalid human_readable_int value: '8k8'"),
    ("--seed", "x1", "argument --seed: invalid int value: 'x1'"),
    ("--max-num-seqs", "64.5", "must be a positive integer"),
    ("--swap-space", "4GiB", None),
    ("--kv-cache-dtype", "fp9", "argument --kv-cache-dtype: invalid choice: 'fp9' (choose from 'auto', 'bfloat16'"),
    ("--dtype", "bf16", "invalid choice"),
    ("--gpu-memory-utilization", "90%", "not a number"),
])
def test_every_value_argparse_rejects_is_vc006_naming_flag_value_and_type(flag, value, words):
    spec = _values()["versions"]["0.32.0"]
    if words is None:                                  # a flag not in 0.32's parser: judged by VC004, not here
        assert flag not in spec
        return
    f = [x for x in found(f"vllm serve m {flag} {value}\n") if x[0] == "VC006"]
    assert len(f) == 1 and f[0][1] == 1
    assert f[0][2].startswith(f"{flag} {value}") and words in f[0][2]


@pytest.mark.parametrize("flag,value", [("--max-model-len", "32k"), ("--max-model-len", "auto"), ("--max-model-len", "-1"),
                                        ("--max-model-len", "1K"), ("--max-num-batched-tokens", "16384"),
                                        ("--kv-cache-dtype", "fp8_e4m3"), ("--kv-cache-dtype", "fp8_per_token_head"),
                                        ("--kv-cache-memory-bytes", "8G"), ("--seed", "0"),
                                        ("--gpu-memory-utilization", "0.85"), ("--max-model-len", "$MAX_LEN")])
def test_values_argparse_accepts_are_no_finding(flag, value):
    assert [x for x in found(f"vllm serve m {flag} {value}\n") if x[0] == "VC006"] == []


def test_the_value_table_is_vllms_own_parser():
    d = _values()["versions"]
    assert {"0.32.0", "0.33.0"} <= set(d)
    assert d["0.32.0"]["--max-model-len"] == {"type": "human_int", "none": False, "auto": True}
    assert d["0.32.0"]["--gpu-memory-utilization"]["type"] == "float"
    assert d["0.32.0"]["--tensor-parallel-size"]["type"] == "int"
    assert {"auto", "fp8", "fp8_e5m2"} <= set(d["0.32.0"]["--kv-cache-dtype"]["choices"])
    assert "--kv-cache-dtype" not in d["0.33.0"]              # 0.33 passes any string to later validation


def test_choices_are_judged_where_the_release_has_them():
    # 0.33.0 passes any --kv-cache-dtype string to later validation; 0.32's choices do not apply there
    assert [x for x in found("vllm serve m --kv-cache-dtype fp9\n", version="0.33.0") if x[0] == "VC006"] == []
    assert [x[0] for x in found("vllm serve m --kv-cache-dtype fp9\n", version="0.32.1")] == ["VC006"]
    # a type is judged in every version that has the flag
    assert [x[0] for x in found("vllm serve m --seed x1\n", version="0.11.0")] == ["VC006"]


# ---------------------------------------------------------------- an unbalanced quote

def test_an_unbalanced_quote_is_its_own_finding_and_the_line_is_still_linted():
    text = ("vllm serve m --max-model-len abc --kv-cache fp8 --served-model-name \"my model\n"
            "vllm serve m --max-num-seqs 0\n")
    f = found(text)
    assert ("VC012", 1) in [(r, l) for r, l, _ in f]
    assert "No closing quotation" in next(m for r, l, m in f if r == "VC012")
    assert [(r, l) for r, l, _ in f if r != "VC012"] == [("VC002", 1), ("VC006", 1), ("VC006", 2)]


def test_an_unbalanced_quote_in_sh_c_still_lints_the_inner_command():
    f = found("docker run --gpus all vllm/vllm-openai:v0.32.0 sh -c \"vllm serve m --max-model-len abc\n")
    assert ("VC006", 1) in [(r, l) for r, l, _ in f]


# ---------------------------------------------------------------- .env line numbers

def test_dotenv_capacity_finding_is_on_the_variables_own_line():
    text = "VLLM_LOGGING_LEVEL=INFO\n# sizes\nMAX_MODEL_LEN=8192\n\nMAX_NUM_SEQS=512\n"
    cfg = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    f = found(text, "vllm.env", "0.11.0", model_config=cfg, gpu_memory=24 << 30)
    assert [(r, l) for r, l, _ in f] == [("VC010", 5)]
    assert f[0][2].startswith("--max-num-seqs 512 but the KV cache holds 32,912 tokens = 4.02 requests of 8,192 tokens")
    f = found("GPU_MEMORY_UTILIZATION=0.9\nMAX_MODEL_LEN=131072\n", "vllm.env", "0.11.0", model_config=cfg, gpu_memory=24 << 30)
    assert [(r, l) for r, l, _ in f] == [("VC010", 2)]          # the failure names max_model_len: its line
    assert "the estimated maximum model length is 42432" in f[0][2]


# ---------------------------------------------------------------- our own alert rules and dashboards

SHIPPED = sorted([*ROOT.glob("alerts/*.y*ml"), *ROOT.glob("dashboards/out/*.json"),
                  *ROOT.glob("deploy/kubernetes/base/generated/prometheusrule.yaml"),
                  *ROOT.glob("deploy/kubernetes/base/generated/dashboards/*.json")])


NEWER_FEATURES = {"vllm:admission_rejections_total", "vllm:nixl_num_failed_transfers_total"}


@pytest.mark.parametrize("version", [None, "0.11.0", "0.14.0", "0.20.0", "0.32.0"])
def test_shipped_alerts_and_dashboards_have_no_findings(version):
    """Each query serves every version from 0.11 on: renamed series are written `new or old`, and the
    recording rules the dashboards read are recorded by the shipped rule file."""
    assert len(SHIPPED) >= 8
    results = check_files([str(p) for p in SHIPPED], vllm_version=version)
    assert {r.kind for r in results} >= {"prometheus-rules", "grafana"}
    # the alerts on features a release lacks (admission control from 0.32, NIXL's counter from 0.11.2)
    # match nothing there and never fire: check says so, and nothing else
    assert [(f.file, f.line, f.rule_id, f.message[:80]) for r in results for f in r.findings
            if not (f.rule_id == "VM001" and f.message.split(":")[0] + ":" + f.message.split(":")[1] in NEWER_FEATURES)] == []


def test_shipped_rules_before_0_11_miss_only_the_per_request_tpot():
    """vllm:request_time_per_output_token_seconds (TPOT per request) is exported from 0.11.0; before, the
    TPOT recording rule matches nothing, and check says so, on the rule file and its Kubernetes copy."""
    results = check_files([str(p) for p in SHIPPED], vllm_version="0.9.2")
    found_ = {(Path(f.file).name, f.rule_id, f.message.split(":")[0] + ":" + f.message.split(":")[1])
              for r in results for f in r.findings}
    assert found_ == {(f, "VM001", s) for f in ("vllm-doctor.rules.yaml", "prometheusrule.yaml")
                      for s in ("vllm:request_time_per_output_token_seconds_bucket", *NEWER_FEATURES)}


def test_a_dashboard_alone_still_flags_a_series_that_never_existed():
    dash = {"panels": [{"targets": [{"expr": "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_percent"},
                                    {"expr": "vllm:gpu_cache_usage_perc"},
                                    {"expr": "rate(vllm:num_preemptions[5m]) or rate(vllm:num_preemptions_total[5m])"}]}]}
    r = check_text(json.dumps(dash, indent=1), "d.json", vllm_version="0.32.0")
    names = sorted(f.message.split(":")[0] + ":" + f.message.split(":")[1] for f in r.findings if f.rule_id == "VM001")
    # an `or` leg that no vLLM ever exported, and the old name alone, are still findings
    assert names == ["vllm:gpu_cache_usage_perc", "vllm:gpu_cache_usage_percent", "vllm:num_preemptions"]


def test_cli_checks_all_shipped_files_in_one_run():
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", "--fail-on", "note", *map(str, SHIPPED)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:]
    assert r.stdout.count(" 0 finding(s)") == len(SHIPPED)


# ---------------------------------------------------------------- what a newcomer feeds it

HELM = """---
# Source: vllm/templates/service.yaml
apiVersion: v1
kind: Service
metadata: {name: vllm}
spec:
  ports: [{port: 8000}]
---
# Source: vllm/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm}
spec:
  template:
    spec:
      containers:
        - name: vllm
          image: "vllm/vllm-openai:v0.10.1"
          command: ["vllm", "serve"]
          args:
            - "meta-llama/Llama-3.1-8B"
            - "--tensor-parallel-size=4"
            - "--kv-cache"
            - "fp8"
          resources: {limits: {nvidia.com/gpu: 4}}
---
"""


def test_helm_rendered_multi_doc_on_stdin_is_kubernetes_not_shell():
    """`helm template ... | vllm-doctor check -`: no file name, a first line of `---`."""
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", "-", "-f", "github"], input=HELM,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert [ln.split("::")[1].split(",title=")[1] for ln in lines] == ["VC009 no-shared-memory", "VC003 abbreviated-flag"]
    assert lines[0].startswith("::error file=-,line=20,") and lines[1].startswith("::error file=-,line=23,")
    assert "Fix: --kv-cache-dtype fp8" in lines[1]


def test_a_kubernetes_list_is_read_item_by_item():
    text = """apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: vllm}
  spec:
    template:
      spec:
        containers:
        - name: vllm
          image: vllm/vllm-openai:v0.11.0
          args: ["--model", "m", "--chunked-prefill-size", "4096", "--max-model-len", "abc"]
          env:
          - {name: VLLM_LOG_LEVEL, value: DEBUG}
"""
    r = check_text(text, "list.yaml")
    assert r.kind == "kubernetes" and r.launches == 1
    assert [(f.rule_id, f.line) for f in r.findings] == [("VC001", 13), ("VC006", 13), ("VC007", 15)]


def test_compose_anchor_env_is_reported_once_on_the_anchor():
    text = """x-vllm: &vllm
  image: vllm/vllm-openai:v0.11.0
  ipc: host
  environment: &env
    VLLM_LOG_LEVEL: debug
services:
  a:
    <<: *vllm
    command: ["--model", "m", "--max-num-seqs", "abc"]
  b:
    <<: *vllm
    command: --model m --max-num-seqs 8
"""
    r = check_text(text, "compose.yml")
    assert r.kind == "compose" and r.launches == 2
    assert [(f.rule_id, f.line) for f in r.findings] == [("VC007", 5), ("VC006", 9)]


def test_a_file_without_a_launch_says_so(tmp_path):
    (tmp_path / "empty.sh").write_text("")
    (tmp_path / "notes.sh").write_text("echo hello\nls -l\n")
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(tmp_path / "empty.sh"), str(tmp_path / "notes.sh")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert r.stdout.count("0 finding(s); no vLLM launch found in it") == 2


def test_yaml_nested_beyond_libyaml_depth_is_one_line_exit_2(tmp_path):
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(tmp_path / "deep.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nested too deeply" in r.stderr


# ---------------------------------------------------------------- Markdown, the whole tuning note

def test_markdown_checks_tagged_code_blocks_on_the_files_lines():
    text = ("# Runbook\n\nStart it like this (prose with --kv-cache is not checked):\n\n"
            "```console\n$ docker run --gpus all vllm/vllm-openai:v0.11.0 \\\n    --model m --chunked-prefill-size 4096\n"
            "INFO output line --kv-cache\n```\n\n```\nvllm serve m --kv-cache fp8\n```\n\n"
            "```promql\nrate(vllm:num_preemptions[5m])\n```\n")
    r = check_text(text, "runbook.md")
    assert r.kind == "markdown" and r.vllm_version == "0.11.0" and r.version_source == "image tag (a code block)"
    assert [(f.rule_id, f.line, f.file) for f in r.findings] == [("VC001", 7, "runbook.md"), ("VM001", 16, "runbook.md")]


def test_our_own_docs_have_no_findings():
    results = check_files([str(p) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]])
    assert [(f.file, f.line, f.rule_id) for r in results for f in r.findings] == []


def test_vllm_variables_no_launch_receives_are_still_checked():
    text = "export VLLM_LOG_LEVEL=debug\nVLLM_USE_PREFILL=1 ./start.sh\nVLLM_MODEL=m docker compose up -d\n"
    assert [(r, l) for r, l, _ in found(text)] == [("VC007", 1), ("VC007", 2)]


def test_flags_continuing_a_benchmark_line_are_not_server_flags():
    text = ("    - python -m vllm.bench_serving --model m\n      --max-concurrency 16 --num-prompts 50\n"
            "vllm serve m\n  --max-concurrency 4\n")
    assert [(r, l) for r, l, _ in found(text)] == [("VC011", 1), ("VC001", 4)]


NOTE = ROOT.parent / "shared" / "reference" / "tuning-note.txt"


def test_the_whole_tuning_note_names_every_invented_setting_with_the_real_one():
    if not NOTE.is_file():
        pytest.skip("../shared/reference/tuning-note.txt is not next to this checkout")
    r = check_text(NOTE.read_text(), str(NOTE), vllm_version="0.11.0")
    fixes: dict[str, set] = {}
    for f in r.findings:
        fixes.setdefault(f.snippet.split("=")[0].split()[0] if f.rule_id == "VC007" else f.rule_id, set()).add(
            (f.fix or {}).get("setting"))
    assert fixes["VLLM_USE_PREFILL"] == {"VLLM_USE_PREFILL"}                 # delete it: it does nothing
    assert not [f for f in r.findings if "VLLM_USE_PREFILL" in f.snippet and "--no-enable-chunked-prefill" in str(f.fix)]
    assert fixes["VLLM_LOG_LEVEL"] == {"VLLM_LOGGING_LEVEL"}
    assert fixes["VC011"] == {"vllm bench serve"}                                  # python -m vllm.bench_serving
    assert {(f.fix or {}).get("setting") for f in r.findings if "--chunked-prefill-size" in f.message} == {"--max-num-batched-tokens"}
    assert {f.rule_id for f in r.findings if f.message.startswith("--kv-cache:")} == {"VC002"}   # ambiguous in 0.11
    assert not [f for f in r.findings if f.rule_id == "VC001" and "--chunked-prefill-size" not in f.message]


def test_model_config_without_gpu_memory_says_the_capacity_check_is_skipped():
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(HERE / "fixtures/launch/tuning-note/s8-docker-run.sh"),
                        "--model-config", str(MODELS / "llama-3.1-8b")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/nonexistent"})
    assert r.returncode == 1 and "VC010" not in r.stdout
    assert r.stderr.count("\n") == 1 and "the capacity check (VC010) runs only on launches that set" in r.stderr


def test_a_quoted_command_folded_over_lines_is_read_as_the_shell_reads_it():
    """The tuning note's A.17 (tests/fixtures/launch/tuning-note/A17-gitlab-ci.yml) pasted as plain
    text: ``sh -c "vllm serve ...`` goes on over the next line to its closing quote. The shell reads
    it as one command, so it is not unparsable and its flags are checked; an apostrophe inside a
    word of the prose around a command opens no quote."""
    yml = (HERE / "fixtures/launch/tuning-note/A17-gitlab-ci.yml").read_text()
    assert '/bin/sh -c "vllm serve' in yml and '--max-num-seqs 64"' in yml
    assert not [f for f in found(yml, "note.txt") if f[0] == "VC012"]
    bad = found(yml.replace("--max-num-seqs 64", "--max-num-seqs sixty"), "note.txt")
    assert [r for r, _, m in bad if "--max-num-seqs" in m and "sixty" in m] == ["VC006"], bad
    prose = "Don't do this:\nvllm serve m --max-num-seqs 64 --bogus-flag 1\nit's wrong.\n"
    assert [(r, line) for r, line, _ in found(prose, "note.txt")] == [("VC001", 2)]
