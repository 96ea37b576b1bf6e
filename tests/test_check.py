"""check: the tuning note's templates, real launch commands from public issues, monitoring files.
Every input under tests/fixtures/launch is a real one (see the READMEs there)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.check import FORMATS, check_text
from vllm_doctor.plan.planner import load_config

HERE = Path(__file__).parent
NOTE = HERE / "fixtures" / "launch" / "tuning-note"
ISSUES = HERE / "fixtures" / "launch" / "issues"
MODELS = HERE / "fixtures" / "models"


def run(path: Path, version: str | None = None, **kw):
    return check_text(path.read_text(), str(path), vllm_version=version, **kw)


def ids(res) -> list[tuple[str, int, str | None]]:
    return [(f.rule_id, f.line, (f.fix or {}).get("setting")) for f in res.findings]


# ---------------------------------------------------------------- the tuning note: every invented setting

def test_note_docker_run_template():
    r = run(NOTE / "s8-docker-run.sh")
    assert r.kind == "shell" and r.launches == 1
    assert ids(r) == [("VC013", 1, "/bin/sh -c"), ("VC007", 2, "VLLM_USE_PREFILL"), ("VC008", 3, "image"),
                      ("VC001", 10, "--max-num-batched-tokens")]
    assert r.findings[1].fix == {"setting": "VLLM_USE_PREFILL", "value": None, "action": "delete"}
    assert r.findings[3].fix["value"] == "4096"


@pytest.mark.parametrize("version,said", [
    ("0.3.3", "vLLM 0.3.3 has no chunked prefill at all"),
    ("0.6.3", "this launch turns chunked prefill on with --enable-chunked-prefill, and the variable does not change that"),
    ("0.11.0", "(on vLLM 0.11.0's V1 engine it is always on for generative models anyway)"),
    ("0.33.0", "this launch turns chunked prefill on with --enable-chunked-prefill"),
])
def test_note_use_prefill_false_is_deleted_never_turned_into_a_disabling_flag(version, said):
    """VLLM_USE_PREFILL=False next to --enable-chunked-prefill: the variable does nothing; advising
    --no-enable-chunked-prefill contradicted the launch (and is overridden on V1 0.8-0.11)."""
    r = run(NOTE / "s8-docker-run.sh", version)
    f = next(f for f in r.findings if f.rule_id == "VC007")
    assert f.message.startswith("VLLM_USE_PREFILL is not read by any vLLM release: setting it does nothing")
    assert said in f.message and "--no-enable-chunked-prefill" not in f.message
    assert f.fix == {"setting": "VLLM_USE_PREFILL", "value": None, "action": "delete"}
    assert "-> delete VLLM_USE_PREFILL\n" in FORMATS["text"]([r])


@pytest.mark.parametrize("version,real", [
    ("0.3.3", None),                                                      # no chunked prefill at all
    ("0.4.3", None),                                                      # off unless the flag is given
    ("0.6.3", {"setting": "--enable-chunked-prefill", "value": "false"}),  # auto-on above 32768 tokens
    ("0.8.5", None),                                                      # V1: forced on, the flag is overridden
    ("0.11.0", None),
    ("0.12.0", {"setting": "--no-enable-chunked-prefill", "value": None}),
])
def test_use_prefill_false_alone_names_a_flag_only_where_it_turns_chunked_prefill_off(version, real):
    r = check_text("VLLM_USE_PREFILL=False\n", "a.env", vllm_version=version)
    (f,) = r.findings
    assert f.fix.get("and") == real and f.fix["action"] == "delete"
    if version in ("0.8.5", "0.11.0"):
        assert "no flag turns it off (--no-enable-chunked-prefill is overridden)" in f.message


def test_note_compose_template():
    r = run(NOTE / "s8.1-docker-compose.yml")
    assert r.kind == "compose"
    assert ids(r) == [("VC008", 3, "image"), ("VC013", 4, "vllm serve"), ("VC001", 11, "--max-num-batched-tokens")]


def test_note_start_sh_expands_its_variables():
    r = run(NOTE / "A5-start.sh")
    assert {f.rule_id for f in r.findings} == {"VC001", "VC007", "VC008", "VC013"}
    assert all(f.line == 7 for f in r.findings)


def test_note_dockerfile_env_and_ci():
    d = run(NOTE / "A10-Dockerfile")
    assert d.kind == "dockerfile" and ids(d) == [("VC008", 2, "image"), ("VC007", 3, "VLLM_USE_PREFILL")]
    e = run(NOTE / "A10.env")
    assert e.kind == "dotenv" and ids(e) == [("VC001", 5, "--max-num-batched-tokens")]
    ci = run(NOTE / "A17-gitlab-ci.yml")
    assert ci.kind == "ci" and ids(ci) == [("VC008", 4, "image"), ("VC013", 4, "/bin/sh -c"),
                                           ("VC011", 9, "vllm bench serve")]
    b = run(NOTE / "s9-bench.sh")
    assert ids(b) == [("VC011", 2, "vllm bench serve")]


def test_note_k8s_and_env_list():
    k = run(NOTE / "A20-deployment.yaml")
    assert k.kind == "kubernetes" and k.launches == 1 and ids(k) == [("VC008", 12, "image"), ("VC013", 13, "serve")]
    a = run(NOTE / "A25-env.txt")
    assert ids(a) == [("VC007", 1, "VLLM_USE_PREFILL"), ("VC007", 5, "VLLM_LOGGING_LEVEL")]


@pytest.mark.parametrize("version,rule,setting", [
    ("0.4.3", "VC003", "--num-gpu-blocks-override"),    # silently read as --kv-cache-dtype 500000
    ("0.10.1", "VC003", "--num-gpu-blocks-override"),
    ("0.10.2", "VC002", "--num-gpu-blocks-override"),   # ambiguous from 0.10.2 (--kv-cache-memory-bytes)
    ("0.32.0", "VC002", "--num-gpu-blocks-override"),
])
def test_note_kv_cache_flag_by_version(version, rule, setting):
    r = run(NOTE / "s3.3-kv-flags.sh", version)
    assert ids(r) == [(rule, 6, setting)]
    assert r.findings[0].fix["value"] == 31250          # 500,000 tokens / 16-token blocks


@pytest.mark.parametrize("version,blocks_flag,bytes_flag", [
    ("0.4.0", "--forced-num-gpu-blocks", False), ("0.4.3", "--num-gpu-blocks-override", False),
    ("0.10.1", "--num-gpu-blocks-override", False), ("0.11.0", "--num-gpu-blocks-override", True),
])
def test_kv_cache_token_count_without_a_model_shows_the_arithmetic_and_says_the_fit_is_unchecked(version, blocks_flag,
                                                                                                 bytes_flag):
    (f,) = run(NOTE / "s3.3-kv-flags.sh", version).findings[-1:]
    assert f.fix == {"setting": blocks_flag, "value": 31250, "alternatives": []}
    assert (f"for a KV cache of 500,000 tokens: {blocks_flag} 31250 (ceil(500,000 / 16 tokens per block, vLLM's CUDA "
            "default; MLA models use 64) = 31,250 blocks") in f.message
    assert ("or, instead: --kv-cache-memory-bytes = 500,000 x the model's KV bytes per token per GPU" in f.message) is bytes_flag
    assert "--gpu-memory-utilization" not in f.message      # sizes a fraction of memory, not a token count
    assert f.message.endswith("Not checked: whether 31,250 blocks fit in GPU memory (no --model-config given: each "
                              "block is 16 tokens x the model's KV bytes per token)")
    if version == "0.10.1":    # read as --kv-cache-dtype 500000, which vLLM rejects
        assert "so --kv-cache 500000 is --kv-cache-dtype 500000: not a KV cache dtype vLLM knows" in f.message


def test_kv_cache_token_count_with_the_notes_model_and_card_does_not_fit():
    """The note's 8B model (bf16 KV: 128 KiB/token, 2 MiB per 16-token block) on its A100 40 GB."""
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    (f,) = run(NOTE / "s3.3-kv-flags.sh", "0.11.0", model_config=cfg).findings[-1:]
    assert f.fix == {"setting": "--num-gpu-blocks-override", "value": 31250,
                     "alternatives": ["--kv-cache-memory-bytes 65536000000"]}      # 31,250 x 2,097,152 B
    assert "(31,250 blocks x 2,097,152 B per block = 61.04 GiB per GPU)" in f.message
    assert "Not checked: whether 61.04 GiB of KV cache fits next to the weights (no --gpu-memory given)" in f.message
    assert ("-> --num-gpu-blocks-override 31250 (option 1 of 2: pick one); --kv-cache-memory-bytes 65536000000 "
            "(option 2 of 2: pick one)\n") in FORMATS["text"]([run(NOTE / "s3.3-kv-flags.sh", "0.11.0", model_config=cfg)])
    (f,) = run(NOTE / "s3.3-kv-flags.sh", "0.11.0", model_config=cfg, gpu_memory=40 << 30).findings[-1:]
    assert f.level == "error" and f.fix == {"setting": "--kv-cache", "value": None, "action": "delete"}
    assert "It does not fit: 61.04 GiB of KV cache, but this GPU leaves 19.58 GiB for it" in f.message
    assert "about 10,025 blocks = 160,400 tokens here" in f.message
    (f,) = run(NOTE / "s3.3-kv-flags.sh", "0.11.0", model_config=cfg, gpu_memory=80 << 30).findings[-1:]
    assert "It does not fit: 61.04 GiB of KV cache, but this GPU leaves 52.09 GiB" in f.message


def test_kv_cache_token_count_that_fits():
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    r = check_text("vllm serve m --kv-cache 500000 --kv-cache-dtype fp8\n", "a.sh", vllm_version="0.11.0",
                   model_config=cfg, gpu_memory=80 << 30)
    (f,) = r.findings
    assert f.fix["alternatives"] == ["--kv-cache-memory-bytes 32768000000"]     # fp8: 1 MiB per block
    assert f.message.endswith("It fits: 30.52 GiB of the 52.09 GiB this GPU leaves the KV cache")


def test_note_templates_on_an_old_version():
    """fp8 KV cache and the underscore-free names on 0.4.0: --kv-cache-dtype fp8 is an invalid choice."""
    r = run(NOTE / "s8-docker-run.sh", "0.4.0")
    got = {(f.rule_id, (f.fix or {}).get("setting")) for f in r.findings}
    assert ("VC006", "--kv-cache-dtype") in got
    assert any("vllm serve" in f.message and f.rule_id == "VC011" for f in r.findings)


def test_note_alert_rules_never_fire():
    r = run(NOTE / "s7.6-alert-rules.yml")
    assert r.kind == "prometheus-rules"
    assert ids(r) == [("VM001", 6, "vllm:num_preemptions_total"), ("VM004", 6, "increase"), ("VM005", 12, "deriv")]


def test_note_grafana_and_queries():
    g = run(NOTE / "A8-grafana.json")
    assert g.kind == "grafana"
    want = [("VM001", 6, "vllm:num_preemptions_total"), ("VM001", 10, "vllm:num_requests_running"),
            ("VM001", 10, "vllm:kv_cache_usage_perc"), ("VM005", 14, "deriv")]
    assert ids(g) == want
    q = run(NOTE / "A4-queries.promql")
    assert [(a, s) for a, _, s in ids(q)] == [(a, s) for a, _, s in want]


# ---------------------------------------------------------------- real launch commands from public issues

def test_issue_kimi_linear_abbreviation():
    r = run(ISSUES / "vllm-28228-kimi-linear-typo.sh", "0.11.0")
    assert ("VC003", 4, "--tensor-parallel-size") in ids(r)
    assert any(f.rule_id == "VC006" and "--port" in f.message for f in r.findings)


def test_issue_13061_capacity_predicts_the_start_up_failure():
    cfg, _ = load_config(str(MODELS / "qwen2.5-14b"))
    r = run(ISSUES / "vllm-13061-tp2-underscores.sh", "0.7.3", model_config=cfg, gpu_memory=int(23.99 * (1 << 30)))
    assert [f.rule_id for f in r.findings] == ["VC010"]
    assert "is larger than the maximum number of tokens that can be stored in KV cache" in r.findings[0].message
    assert r.findings[0].fix["setting"] == "--max-model-len" and r.findings[0].fix["value"] < 131072


def test_issue_commands_that_are_fine_stay_quiet():
    assert run(ISSUES / "vllm-21348-tp4-kv-transfer.sh", "0.10.0").findings == []
    assert run(ISSUES / "vllm-34076-pp2.sh", "0.15.0").findings == []
    assert run(ISSUES / "qwen-295-api-server.sh", "0.4.0").findings == []
    assert run(ISSUES / "vllm-4650-docker-engine-args.txt", "0.5.4").findings == []


# ---------------------------------------------------------------- every launch of the suite, with its real outcome

#: (file, the vLLM version it ran, what check must say: (rule, level, line, setting)); the outcome each issue
#: reports is in the file's first lines and in tests/fixtures/launch/issues/README.md
STARTED, FAILED = "started", "failed at start-up"
#: the issue's log shows a start, but its paste is not what ran: as written, argparse rejects it
PASTE_DIFFERS = "started; the paste as written would not"
#: the thread does not say; the launch cannot start by the container runtime's rules
NOT_REPORTED = "not reported"
LAUNCHES = [
    # arguments after the image that the image's ENTRYPOINT already runs: "unrecognized arguments"
    ("vllm-37133-image-then-vllm-serve.sh", "0.17.1", FAILED,
     [("VC013", "error", 2, "vllm serve"), ("VC008", "warning", 6, "image"), ("VC005", "warning", 15, "--swap-space")]),
    ("vllm-22072-compose-serve.yml", "0.10.0", FAILED,
     [("VC008", "warning", 6, "image"), ("VC013", "error", 21, "serve"), ("VC014", "error", 24, "--dtype")]),
    ("glm-ocr-39-compose-serve.yml", "0.16.0", FAILED, [("VC008", "warning", 5, "image"), ("VC013", "error", 23, "serve")]),
    ("vllm-32755-compose-bash-c.yml", "0.14.0", FAILED,
     [("VC008", "warning", 6, "image"), ("VC013", "error", 20, "bash -c"), ("VC001", "error", 23, None)]),
    # the image given by its ID: what it runs is not known, so a warning that names the check to make
    ("vllm-27389-image-id-then-serve.sh", "0.11.0", FAILED, [("VC013", "warning", 3, "serve")]),
    # host GPU indices inside a container that numbers its GPUs from 0
    ("vllm-9865-docker-run-visible-devices.sh", "0.6.6", FAILED,
     [("VC015", "error", 9, "CUDA_VISIBLE_DEVICES"), ("VC008", "warning", 12, "image")]),
    # the paste glues two flags: --port's value is "8111--gpu-memory-utilization" (the issue's log shows the
    # server up, so what ran had a space there; as pasted, argparse rejects --port's value)
    ("vllm-28228-kimi-linear-typo.sh", "0.11.0", PASTE_DIFFERS,
     [("VC003", "warning", 4, "--tensor-parallel-size"), ("VC006", "error", 4, "--port")]),
    # a whole command line as the one item of a pod's `command:`: exec'd as one executable's path
    ("vllm-4462-k8s-command-one-item.yaml", "0.4.1", NOT_REPORTED, [("VC014", "error", 32, "command:")]),
    # the KV cache too small for max_model_len: known only with the model and the GPU (test_issue_13061_...)
    ("vllm-13061-tp2-underscores.sh", "0.7.3", FAILED, []),
    ("qwen-295-api-server.sh", "0.4.0", FAILED, []),
    # started (or failed later for reasons of the host, the engine or a request, not of the launch)
    ("vllm-14403-compose.yml", "0.7.3", STARTED, [("VC008", "warning", 21, "image")]),
    ("vllm-16841-compose-service.yml", "0.8.4", STARTED, [("VC008", "warning", 5, "image")]),
    ("vllm-17366-docker-run-v1.sh", "0.8.5", STARTED, []),
    ("vllm-17676-docker-run-script.sh", "0.8.5", STARTED,
     [("VC008", "warning", 15, "image"), ("VC005", "warning", 26, None)]),
    ("vllm-20862-docker-run-b200.sh", "0.9.1", STARTED, []),
    ("vllm-21348-tp4-kv-transfer.sh", "0.10.0", STARTED, []),
    ("vllm-2235-docker-run-works.sh", "0.3.3", STARTED, [("VC008", "warning", 8, "image")]),
    ("vllm-34076-pp2.sh", "0.15.0", STARTED, []),
    ("vllm-46169-rocm-image.sh", "0.23.0", STARTED, []),
    ("vllm-4650-docker-engine-args.txt", "0.5.4", STARTED, []),
    ("vllm-5366-docker-run-no-tag.sh", "0.4.3", STARTED, [("VC008", "warning", 11, "image")]),
]


def test_the_suite_holds_every_launch_file_and_at_least_20():
    listed = {name for name, *_ in LAUNCHES}
    on_disk = {p.name for p in ISSUES.iterdir() if p.name != "README.md"}
    assert listed == on_disk and len([x for x in LAUNCHES if x[2] != NOT_REPORTED]) >= 20


@pytest.mark.parametrize("name,version,outcome,expected", LAUNCHES, ids=[x[0] for x in LAUNCHES])
def test_check_is_right_on_every_launch_of_the_suite(name, version, outcome, expected):
    r = run(ISSUES / name, version)
    assert r.launches >= 1                                # the launch is found, whatever its form
    assert [(f.rule_id, f.level, f.line, (f.fix or {}).get("setting")) for f in r.findings] == expected
    if outcome == STARTED:                                # no false error on a launch that started
        assert all(f.level != "error" for f in r.findings)
    number = re.search(r"-(\d+)-", name).group(1)        # provenance on line 1: the issue it comes from
    assert re.search(rf"#{number}\b", (ISSUES / name).read_text().splitlines()[0])


# ---------------------------------------------------------------- how containers are launched

@pytest.mark.parametrize("path,version,expected", [
    # the tuning note: every launch file that runs the vllm-openai image wraps the server in a command
    (NOTE / "s8-docker-run.sh", None, [("VC013", 1, "/bin/sh -c")]),
    (NOTE / "s8.2-docker-run-tp4.sh", None, [("VC013", 1, "/bin/sh -c")]),
    (NOTE / "A5-start.sh", None, [("VC013", 7, "/bin/sh -c")]),
    (NOTE / "A17-gitlab-ci.yml", None, [("VC013", 4, "/bin/sh -c")]),
    (NOTE / "s8.1-docker-compose.yml", None, [("VC013", 4, "vllm serve")]),
    (NOTE / "A20-deployment.yaml", None, [("VC013", 13, "serve")]),
    # vllm#37133 on 0.17.1: "vllm: error: unrecognized arguments: serve /models/GLM-4.7-Flash-AWQ-4bit"
    (ISSUES / "vllm-37133-image-then-vllm-serve.sh", "0.17.1", [("VC013", 2, "vllm serve")]),
    # vllm#22072 (latest = 0.10.0 then): "unrecognized arguments" from api_server.py
    (ISSUES / "vllm-22072-compose-serve.yml", "0.10.0", [("VC013", 21, "serve"), ("VC014", 24, "--dtype")]),
    # launches that started: the arguments after the image are the server's flags
    (ISSUES / "vllm-4650-docker-engine-args.txt", "0.5.4", []),
])
def test_arguments_after_the_image_reach_its_entrypoint(path, version, expected):
    r = run(path, version)
    assert [x for x in ids(r) if x[0] in ("VC013", "VC014")] == expected


@pytest.mark.parametrize("version,entrypoint", [
    # each release's docker/Dockerfile, target vllm-openai (read from the sdists): api_server through 0.11.0
    ("0.10.0", "its ENTRYPOINT is `python3 -m vllm.entrypoints.openai.api_server` on vLLM 0.10.0"),
    ("0.11.0", "its ENTRYPOINT is `python3 -m vllm.entrypoints.openai.api_server` on vLLM 0.11.0"),
    ("0.11.1", "its ENTRYPOINT is `vllm serve` on vLLM 0.11.1"),
    ("0.13.0", "its ENTRYPOINT is `vllm serve` on vLLM 0.13.0"),
    ("0.17.1", "its ENTRYPOINT is `vllm serve` on vLLM 0.17.1"),
])
def test_the_entrypoint_named_is_the_versions(version, entrypoint):
    r = check_text(f"docker run --ipc=host vllm/vllm-openai:v{version} serve m --max-num-seqs 8\n", "run.sh")
    (f,) = r.findings
    assert f.rule_id == "VC013" and entrypoint in f.message and f.fix["action"] == "delete"


@pytest.mark.parametrize("cmd,expected", [
    # an entrypoint override runs the command: nothing is wrong with it
    ("docker run --ipc=host --entrypoint /bin/bash vllm/vllm-openai:v0.11.0 -c 'vllm serve m --max-num-seqz 8'\n",
     ["VC001"]),
    ("docker run --ipc=host --entrypoint vllm vllm/vllm-openai:v0.11.0 serve m --max-num-seqs 8\n", []),
    ("docker run --ipc=host vllm/vllm-openai:v0.11.0 python3 -m vllm.entrypoints.openai.api_server --model m\n",
     ["VC013"]),
    ("docker run --ipc=host vllm/vllm-openai:v0.11.0 --model m --max-num-seqs 8\n", []),
])
def test_docker_entrypoint_override(cmd, expected):
    assert [f.rule_id for f in check_text(cmd, "run.sh").findings] == expected


@pytest.mark.parametrize("text,name,expected", [
    # docker: --gpus device=2,3 gives two GPUs, numbered 0 and 1 inside
    ("docker run --ipc=host --gpus '\"device=2,3\"' -e CUDA_VISIBLE_DEVICES=2,3 vllm/vllm-openai:v0.8.5 --model m "
     "--tensor-parallel-size 2\n", "run.sh", [("VC015", "GPU 2,3 does not exist there", "vLLM sees 0 GPU(s) (none)")]),
    ("docker run --ipc=host --gpus '\"device=2,3\"' -e CUDA_VISIBLE_DEVICES=0,1 vllm/vllm-openai:v0.8.5 --model m "
     "--tensor-parallel-size 2\n", "run.sh", []),
    # all the host's GPUs: the host's indices are the container's
    ("docker run --ipc=host --gpus all -e CUDA_VISIBLE_DEVICES=2,3 vllm/vllm-openai:v0.8.5 --model m\n", "run.sh", []),
    # compose device_ids
    ("services:\n  v:\n    image: vllm/vllm-openai:v0.8.5\n    ipc: host\n    environment:\n"
     "      - CUDA_VISIBLE_DEVICES=0,3\n    deploy:\n      resources:\n        reservations:\n          devices:\n"
     "            - driver: nvidia\n              device_ids: ['2', '3']\n              capabilities: [gpu]\n"
     "    command: --model m --tensor-parallel-size 2\n", "compose.yml",
     [("VC015", "GPU 3 does not exist there", "vLLM sees 1 GPU(s) (0)")]),
    # a pod's nvidia.com/gpu: 2 is numbered 0 and 1 in the container
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: v}\nspec:\n  hostIPC: true\n  containers:\n  - name: v\n"
     "    image: vllm/vllm-openai:v0.8.5\n    env:\n    - {name: CUDA_VISIBLE_DEVICES, value: '4,5'}\n"
     "    args: [--model, m, --tensor-parallel-size, '2']\n    resources:\n      limits: {nvidia.com/gpu: 2}\n",
     "pod.yaml", [("VC015", "(nvidia.com/gpu)", "GPU 4,5 does not exist there")]),
])
def test_host_gpu_indices_inside_a_container(text, name, expected):
    r = check_text(text, name)
    got = [f for f in r.findings if f.rule_id == "VC015"]
    assert [f.rule_id for f in got] == [e[0] for e in expected]
    for f, (_, *said) in zip(got, expected, strict=True):
        assert all(x in f.message for x in said)
        assert f.fix == {"setting": "CUDA_VISIBLE_DEVICES", "value": None, "action": "delete"}


def test_how_a_launch_is_pasted_does_not_hide_it():
    """Compose services pasted without `services:` (vllm#16841), `...` for what the author left out
    (vllm#32755), a script's own VLLM_* variable that is not exported (vllm#17676), the ROCm image."""
    svc = "vllm:\n  image: vllm/vllm-openai:v0.11.0\n  ipc: host\n  command: serve m --max-num-seqz 8\n"
    assert [f.rule_id for f in check_text(svc, "fragment.yml").findings] == ["VC001", "VC013"]
    values = "vllm:\n  image:\n    repository: vllm/vllm-openai\n    tag: v0.11.0\n  command: [serve]\n"
    assert check_text(values, "values.yaml").kind != "compose"      # a Helm values file's image mapping
    elided = "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n...\n    ipc: host\n    command: serve m\n"
    r = check_text(elided, "compose.yml")
    assert r.kind == "compose" and [(f.rule_id, f.line) for f in r.findings] == [("VC013", 6)]
    script = "VLLM_VERSION=v0.11.0\ndocker run --ipc=host vllm/vllm-openai:$VLLM_VERSION --model m\n"
    assert check_text(script, "run.sh").findings == []
    assert [f.rule_id for f in check_text("VLLM_LOG_LEVEL=DEBUG\nvllm serve m\n", "run.sh").findings] == ["VC007"]
    rocm = check_text("docker run --ipc=host vllm/vllm-openai-rocm:v0.20.0 vllm serve m\n", "run.sh")
    assert [f.rule_id for f in rocm.findings] == ["VC013"] and rocm.vllm_version == "0.20.0"


def test_a_whole_command_line_as_one_list_item_of_the_command():
    """Compose `entrypoint:` and a pod's `command:` in list form exec their first item as a path; a whole
    command line there (vllm#4462) never starts. Its words are still checked as the launch."""
    compose = ('services:\n  v:\n    image: vllm/vllm-openai:v0.11.0\n    ipc: host\n'
               '    entrypoint: ["vllm serve"]\n    command: ["m", "--max-num-seqz", "8"]\n')
    r = check_text(compose, "compose.yml")
    assert [(f.rule_id, f.line, (f.fix or {}).get("value")) for f in r.findings] == [
        ("VC014", 5, '["vllm", "serve"]'), ("VC001", 6, None)]
    assert "is one item of `entrypoint:`" in r.findings[0].message
    ok = compose.replace('["vllm serve"]', '["vllm", "serve"]')
    assert [f.rule_id for f in check_text(ok, "compose.yml").findings] == ["VC001"]
    # docker takes --entrypoint as one executable, and a Dockerfile's exec-form ENTRYPOINT likewise
    run_ = 'docker run --ipc=host --entrypoint "vllm serve" vllm/vllm-openai:v0.11.0 m --max-num-seqs 8\n'
    assert [(f.rule_id, f.fix) for f in check_text(run_, "run.sh").findings] == [
        ("VC014", {"setting": "--entrypoint", "value": '["vllm", "serve"]'})]
    assert check_text(run_.replace('"vllm serve" vllm/vllm-openai:v0.11.0', "vllm vllm/vllm-openai:v0.11.0 serve"),
                      "run.sh").findings == []
    df = 'FROM vllm/vllm-openai:v0.11.0\nENTRYPOINT ["vllm serve"]\nCMD ["m", "--max-num-seqs", "8"]\n'
    assert [(f.rule_id, f.line) for f in check_text(df, "Dockerfile").findings] == [("VC014", 2)]


def test_a_dockerfile_entrypoint_replaces_the_images_and_its_cmd_is_appended():
    base = "FROM vllm/vllm-openai:v0.11.0\n"
    own = base + 'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]\nCMD ["--model", "m", "--max-num-seqz", "8"]\n'
    assert [f.rule_id for f in check_text(own, "Dockerfile").findings] == ["VC001"]
    assert check_text(base + 'ENTRYPOINT ["vllm", "serve"]\nCMD ["m", "--max-num-seqs", "8"]\n', "Dockerfile").findings == []
    alone = check_text(base + 'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "8"]\n',
                       "Dockerfile")
    assert alone.findings == [] and alone.launches == 1
    wrapped = check_text(base + 'CMD ["vllm", "serve", "m"]\n', "Dockerfile").findings
    assert [(f.rule_id, f.line) for f in wrapped] == [("VC013", 2)]


def test_kubernetes_command_overrides_the_entrypoint_and_list_items_hold_one_word():
    base = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: v}\nspec:\n  template:\n    spec:\n"
            "      hostIPC: true\n      containers:\n      - name: vllm\n        image: vllm/vllm-openai:v0.11.0\n")
    ok = check_text(base + '        command: ["vllm", "serve"]\n        args: ["m", "--max-num-seqs", "8"]\n', "d.yaml")
    assert ok.findings == []
    bad = check_text(base + '        args: ["m", "--max-num-seqs 8"]\n', "d.yaml")
    assert [(f.rule_id, f.fix) for f in bad.findings] == [("VC014", {"setting": "--max-num-seqs", "value": "8"})]


def test_removed_and_v0_only_flags():
    r = check_text("vllm serve m --preemption-mode swap --max-num-seqs 64\n", "x.sh", vllm_version="0.9.2")
    assert [f.rule_id for f in r.findings] == ["VC005"]
    r = check_text("vllm serve m --preemption-mode swap\n", "x.sh", vllm_version="0.11.0")
    assert [f.rule_id for f in r.findings] == ["VC004"] and "0.5.4–0.10.2" in r.findings[0].message
    for version in ("0.11.0", "0.17.0"):      # no V0 left to fall back to (vllm#37133's --swap_space 16)
        r = check_text("vllm serve m --swap_space 16\n", "x.sh", vllm_version=version)
        (f,) = r.findings
        assert f.rule_id == "VC005" and "fall back" not in f.message and "falls back" not in f.message
        assert f"vLLM {version} has no V0 engine" in f.message and "V1 accepts the flag and ignores it" in f.message
        assert f.fix == {"setting": "--swap-space", "value": None, "action": "delete"}
    r = check_text("vllm serve m --swap-space 16\n", "x.sh", vllm_version="0.10.2")
    assert "makes vLLM fall back to the V0 engine" in r.findings[0].message
    r = check_text("vllm serve m --gpu-memory-utilization 90\n", "x.sh", vllm_version="0.11.0")
    assert r.findings[0].rule_id == "VC006" and r.findings[0].fix["value"] == 0.9


@pytest.mark.parametrize("text,name", [
    ("docker run --ipc=host -e VLLM_USE_V1=0 vllm/vllm-openai:v0.9.2 --model m --max-model-len 16384 "
     "--max-num-seqs 128\n", "run.sh"),
    ("services:\n  v:\n    image: vllm/vllm-openai:v0.9.2\n    ipc: host\n    environment:\n      VLLM_USE_V1: '0'\n"
     "    command: [--model, m, --max-model-len, '16384', --max-num-seqs, '128']\n", "compose.yml"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: v}\nspec:\n  containers:\n  - name: v\n"
     "    image: vllm/vllm-openai:v0.9.2\n    env:\n    - {name: VLLM_USE_V1, value: '0'}\n"
     "    args: [--model, m, --max-model-len, '16384', --max-num-seqs, '128']\n", "pod.yaml"),
])
def test_kv_capacity_is_planned_on_the_engine_the_launch_chooses(text, name):
    """VLLM_USE_V1=0 in the container's environment runs V0 on 0.9.2, whose overhead differs: VC010 plans
    that engine (155,072 KV tokens on the 8B model, 40 GiB: V0's profiling peak counts 3 x intermediate per
    token and its sorting sampler, as plan models it since the plan-accuracy suite) and says why; without it, V1 (165,152)."""
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    (f,) = [f for f in check_text(text, name, model_config=cfg, gpu_memory=40 * (1 << 30)).findings if f.rule_id == "VC010"]
    assert "the KV cache holds 155,072 tokens" in f.message and f.message.endswith("[V0 engine: VLLM_USE_V1=0]")
    v1 = text.replace("VLLM_USE_V1=0", "VLLM_X=0").replace("VLLM_USE_V1: '0'", "TZ: UTC").replace(
        "{name: VLLM_USE_V1, value: '0'}", "{name: TZ, value: UTC}")
    (g,) = [f for f in check_text(v1, name, model_config=cfg, gpu_memory=40 * (1 << 30)).findings if f.rule_id == "VC010"]
    assert "the KV cache holds 165,152 tokens" in g.message and "engine:" not in g.message


def test_max_num_seqs_above_the_kv_cache_at_max_model_len():
    """The note's 8B template on its own A100 40G: 128 sequences of 16,384 tokens would not fit, but
    that is the worst case (every request at max_model_len): stated as an assumption, a note with no
    value (before: a warning prescribing --max-num-seqs 128 -> 20)."""
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    r = run(NOTE / "s8-docker-run.sh", "0.11.0", model_config=cfg, gpu_memory=40 * (1 << 30))
    cap = [f for f in r.findings if f.rule_id == "VC010"]
    assert len(cap) == 1 and cap[0].level == "note" and cap[0].fix is None
    assert "= 20.16 requests of 16,384 tokens" in cap[0].message and "assumed the worst case" in cap[0].message
    # at the note's stated mean of 2,000 tokens the cache holds 165 at once: 128 fits, no finding
    r = run(NOTE / "s8-docker-run.sh", "0.11.0", model_config=cfg, gpu_memory=40 * (1 << 30), mean_request_tokens=2000)
    assert not [f for f in r.findings if f.rule_id == "VC010"]
    # at a mean of 5,000 tokens it holds 66: a warning with that value, the arithmetic shown
    r = run(NOTE / "s8-docker-run.sh", "0.11.0", model_config=cfg, gpu_memory=40 * (1 << 30), mean_request_tokens=5000)
    cap = [f for f in r.findings if f.rule_id == "VC010"]
    assert len(cap) == 1 and cap[0].level == "warning" and cap[0].fix["setting"] == "--max-num-seqs"
    assert cap[0].fix["value"] == 330320 // 16 // 313 and "at the mean request of 5,000 tokens" in cap[0].message


@pytest.mark.parametrize("path", sorted(p for p in NOTE.iterdir() if p.name != "README.md"), ids=lambda p: p.name)
def test_kv_capacity_states_the_assumption_or_uses_the_mean(path):
    """Issue 20's principle on every launch of the tuning note, on its own hardware (8B model, A100 40 GB):
    without a mean request length, --max-num-seqs above what fits at max_model_len is a note with no value
    (the worst case, said to be assumed); with the note's own mean of 2,000 tokens it is judged there: a
    warning whose value is what fits (blocks // blocks per request), or nothing when it fits."""
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    worst = [f for f in run(path, "0.11.0", model_config=cfg, gpu_memory=40 << 30).findings if f.rule_id == "VC010"]
    assert all(f.level == "note" and f.fix is None and "assumed the worst case" in f.message for f in worst)
    mean = [f for f in run(path, "0.11.0", model_config=cfg, gpu_memory=40 << 30, mean_request_tokens=2000).findings
            if f.rule_id == "VC010"]
    for f in mean:
        blocks = int(re.search(r"\(([\d,]+) blocks // ceil\(2,000 / 16\)", f.message).group(1).replace(",", ""))
        assert f.level == "warning" and f.fix["value"] == blocks // 125 and "at the mean request of 2,000 tokens" in f.message
    # the 128-sequence templates: fine at 2,000 tokens with the fp8 cache (165 fit), not with bf16 (82: A.20)
    assert [(f.fix or {}).get("value") for f in mean] == ([82] if path.name == "A20-deployment.yaml" else [])


def test_shared_memory_for_multi_gpu():
    base = "docker run --gpus all {shm} vllm/vllm-openai:v0.11.0 --model m --tensor-parallel-size 4\n"
    r = check_text(base.format(shm=""), "run.sh")
    assert [f.rule_id for f in r.findings] == ["VC009"]
    assert r.vllm_version == "0.11.0" and r.version_source == "image tag"
    assert check_text(base.format(shm="--ipc=host"), "run.sh").findings == []
    assert check_text(base.format(shm="--shm-size 16g"), "run.sh").findings == []
    k8s = (NOTE / "A20-deployment.yaml").read_text().replace('"--enable-chunked-prefill"]', '"-tp", "2"]')
    k8s_findings = check_text(k8s, "d.yaml").findings
    assert [f.rule_id for f in k8s_findings] == ["VC008", "VC009", "VC013"]   # the note's `args: ["serve", ...]`
    # a Kubernetes pod has no --shm-size: its shared memory is a memory-backed emptyDir at /dev/shm
    assert r.findings[0].fix["setting"] == "--shm-size" and r.findings[0].fix["value"] == "16g"
    assert k8s_findings[1].fix["setting"].startswith("volumes: emptyDir {medium: Memory")
    assert k8s_findings[1].fix["alternatives"] == ["hostIPC: true"]
    compose = ("services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
               "    command: --model m --tensor-parallel-size 2\n")
    c = check_text(compose, "docker-compose.yml").findings
    assert [(f.rule_id, f.fix["setting"], f.fix["value"], f.fix["alternatives"]) for f in c] == [
        ("VC009", "shm_size:", "16g", ["ipc: host"])]


def test_series_by_version():
    q = "rate(vllm:num_preemptions_total[5m])\n\nvllm:gpu_cache_usage_perc > 0.9\n\nrate(vllm:num_preemptions[5m])\n"
    new = check_text(q, "q.promql", vllm_version="0.32.0")
    assert [(f.rule_id, f.line, (f.fix or {}).get("setting")) for f in new.findings] == [
        ("VM001", 3, "vllm:kv_cache_usage_perc"), ("VM001", 5, "vllm:num_preemptions_total")]
    old = check_text(q, "q.promql", vllm_version="0.6.3")
    assert [(f.rule_id, f.line) for f in old.findings] == [("VM001", 5)]


def test_rate_on_gauge_and_histogram_quantile():
    q = ("rate(vllm:num_requests_running[5m])\n\n"
         "histogram_quantile(0.99, rate(vllm:e2e_request_latency_seconds_sum[5m]))\n\n"
         "histogram_quantile(0.99, sum by (model_name) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))\n\n"
         "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))\n")
    r = check_text(q, "q.promql", vllm_version="0.32.0")
    assert [(f.rule_id, f.line) for f in r.findings] == [("VM002", 1), ("VM003", 3), ("VM003", 5)]
    bare = ("histogram_quantile(0.99, vllm:e2e_request_latency_seconds_bucket)\n\n"
            "histogram_quantile(0.9, sum by (le) (vllm:time_to_first_token_seconds_bucket{model_name=\"m\"}))\n\n"
            "histogram_quantile(0.9, sum by (le) (increase(vllm:time_to_first_token_seconds_bucket[1h])))\n\n"
            "histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m:1m])))\n")
    r = check_text(bare, "q.promql", vllm_version="0.32.0")
    assert [(f.rule_id, f.line, f.fix["setting"]) for f in r.findings] == [("VM003", 1, "rate"), ("VM003", 3, "rate")]
    assert "without rate()/increase()" in r.findings[0].message


def test_sarif_and_github_output():
    r = run(NOTE / "s7.6-alert-rules.yml")
    sarif = json.loads(FORMATS["sarif"]([r]))
    assert sarif["version"] == "2.1.0"
    res = sarif["runs"][0]["results"]
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert [x["ruleId"] for x in res] == ["VM001", "VM004", "VM005"]
    assert all(rules[x["ruleIndex"]]["id"] == x["ruleId"] for x in res)
    assert res[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 6
    gh = FORMATS["github"]([r]).splitlines()
    assert gh[0].startswith(f"::error file={r.file},line=6,title=VM001 series-never-exported::")


def test_cli_exit_codes(tmp_path):
    cmd = [sys.executable, "-m", "vllm_doctor", "check"]
    bad = subprocess.run(cmd + [str(NOTE / "s8-docker-run.sh"), "-f", "github"], capture_output=True, text=True)
    assert bad.returncode == 1 and "::error file=" in bad.stdout
    ok = subprocess.run(cmd + [str(ISSUES / "vllm-34076-pp2.sh"), "--vllm-version", "0.15.0"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    warn_only = subprocess.run(cmd + ["-", "--fail-on", "error"], input="FROM vllm/vllm-openai:latest\n",
                               capture_output=True, text=True)
    assert warn_only.returncode == 0 and "VC008" in warn_only.stdout
    missing = subprocess.run(cmd + [str(tmp_path / "nope.sh")], capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_sidecar_series_table_matches_the_collector():
    """check's table of the sidecar's own series is the collector's: both are the catalogue's."""
    from vllm_doctor.check.metric_names import SIDECAR_SERIES
    from vllm_doctor.export.collectors import SidecarCollector

    for fam in SidecarCollector(sidecar=None).describe():
        assert fam.name in SIDECAR_SERIES or fam.name + "_total" in SIDECAR_SERIES or fam.name + "_info" in SIDECAR_SERIES


def test_the_projects_own_monitoring_is_clean():
    """vllm-doctor's alert rules and dashboard (written for vLLM and its sidecar) have no errors."""
    from vllm_doctor.check import worst

    root = Path(__file__).parent.parent
    res = [run(root / "alerts" / "vllm-doctor.rules.yaml"), run(root / "dashboards" / "out" / "vllm-doctor.json")]
    assert [r.kind for r in res] == ["prometheus-rules", "grafana"]
    assert worst(res) < 2, [f.message for r in res for f in r.findings if f.level == "error"]


def test_vllm_config_yaml():
    """vLLM's --config YAML: keys are flag names (underscores or dashes), judged like the flags."""
    text = "model: meta-llama/Llama-3.1-8B-Instruct\nmax_num_seqs: 128\nkv-cache: fp8\npreemption_mode: swap\n"
    r = check_text(text, "serve.yaml", vllm_version="0.11.0")
    assert r.kind == "vllm-config"
    assert [(f.rule_id, f.line) for f in r.findings] == [("VC002", 3), ("VC004", 4)]
    r = check_text(text, "serve.yaml", vllm_version="0.9.2")
    assert [(f.rule_id, f.line, (f.fix or {}).get("setting")) for f in r.findings] == [
        ("VC003", 3, "--kv-cache-dtype"), ("VC005", 4, None)]


def _check_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "vllm_doctor", "check", *args], capture_output=True, text=True,
                          timeout=60, input=stdin)


@pytest.mark.parametrize("name,body", [
    ("binary.sh", b"docker run vllm/vllm-openai:latest\n\x00\x01\x02\xff" * 10),
    ("deep.json", b"[" * 100000 + b"]" * 100000),
    ("deep-grafana.json", b'{"panels": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("deep.yaml", b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, 3000))),
    ("huge.sh", b"# " + b"a" * (17 << 20) + b"\n"),
])
def test_what_is_no_config_is_one_line_exit_2(tmp_path, name, body):
    (tmp_path / name).write_bytes(body)
    r = _check_cli(str(tmp_path / name))
    assert r.returncode == 2 and r.stdout == "", r.stdout[:300]
    assert r.stderr.count("\n") == 1 and name in r.stderr and "internal error" not in r.stderr


def test_heredoc_bodies_are_data_not_commands():
    text = ("cat <<'EOT' > /etc/notes\n--chunked-prefill-size 99\nVLLM_USE_PREFILL=1\nEOT\n"
            "cat <<-END\n\tvllm serve m --kv-cache 1\n\tEND\n"
            "vllm serve m --chunked-prefill-size 4096 <<< 'here-string is not a heredoc'\n")
    r = check_text(text, "start.sh", vllm_version="0.11.0")
    assert [(f.rule_id, f.line) for f in r.findings] == [("VC001", 8)]


def test_capacity_is_not_sized_with_a_default_in_place_of_an_unusable_value():
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    for bad in ("--max-num-seqs 0", "--max-model-len abc", "--tensor-parallel-size x"):
        r = check_text(f"vllm serve m {bad} --max-num-seqs 512\n" if "seqs" not in bad else f"vllm serve m {bad}\n",
                       "s.sh", vllm_version="0.11.0", model_config=cfg, gpu_memory=80 << 30)
        assert not [f for f in r.findings if f.rule_id == "VC010"], (bad, [f.message for f in r.findings])
    r = check_text("vllm serve m --max-num-seqs 0 --gpu-memory-utilization 1.5\n", "s.sh", vllm_version="0.11.0")
    fixes = {f.snippet: f.fix for f in r.findings if f.rule_id == "VC006"}
    assert fixes["--max-num-seqs"] is None                                   # no empty "-> --max-num-seqs"
    assert fixes["--gpu-memory-utilization"]["value"] == 0.9                 # 1.5 is no percentage: not 0.01
    r = check_text("vllm serve m --gpu-memory-utilization 90\n", "s.sh", vllm_version="0.11.0")
    assert [f.fix["value"] for f in r.findings if f.rule_id == "VC006"] == [0.9]


def test_grafana_findings_name_the_line_of_the_expression_and_odd_panels_are_skipped():
    dash = {"panels": [1, "x", {"panels": "y", "targets": [2, {"expr": 5}]},
                       {"title": "KV", "targets": [{"expr": 'vllm_kv_cache_tokens{pod=~"$pod"}'}]}]}
    text = json.dumps(dash, indent=2)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "vllm_kv_cache_tokens" in l)
    assert line > 1
    r = check_text(text, "d.json", vllm_version="0.11.0")
    assert r.kind == "grafana" and [(f.rule_id, f.line) for f in r.findings] == [("VM001", line)]
    assert check_text('{"dashboard": [1]}', "e.json").findings == []


def test_a_version_newer_than_any_known_is_said_and_never_pinned():
    """Issue 27: `check --vllm-version 0.99` told the user to pin vllm/vllm-openai:v0.99, a release
    that does not exist. Now a warning names the release it is judged as, and the pin is that one."""
    f = NOTE / "s8-docker-run.sh"
    p = subprocess.run([sys.executable, "-m", "vllm_doctor", "check", str(f), "--vllm-version", "0.99", "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert p.stderr == ("vllm-doctor: warning: vLLM 0.99 is newer than any release vllm-doctor knows (the newest is "
                        "0.33.0): judged as 0.33.0\n")
    pins = [x["fix"]["value"] for r in json.loads(p.stdout) for x in r["findings"] if x["rule_id"] == "VC008"]
    assert pins == ["vllm/vllm-openai:v0.33.0"]
    assert [x.fix["value"] for x in run(f, "0.11.0").findings if x.rule_id == "VC008"] == ["vllm/vllm-openai:v0.11.0"]
