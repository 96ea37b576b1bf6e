"""plan: the verdict first, a model whose weights do not fit the GPU, and config.json input that is not a
real model's (every sizing field mutated to what a hand-edited or corrupted config holds)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.plan import capacity as cap
from vllm_doctor.check import check_text
from vllm_doctor.errors import InputError
from vllm_doctor.plan.planner import PlanInputs, load_config, make_plan, to_markdown, to_text, validate_config

HERE = Path(__file__).parent
MODELS = HERE / "fixtures" / "models"


def _plan(model: str, **kw):
    cfg, _ = load_config(str(MODELS / model))
    return make_plan(PlanInputs(config=cfg, **kw))


# ---------------------------------------------------------------- weights larger than the GPU

def test_weights_larger_than_the_gpu_fail_at_load_with_the_arithmetic():
    p = _plan("qwen3-32b", gpu_memory_bytes=48 * cap.GiB, max_model_len=32768)   # 61.02 GiB of bf16 weights
    assert p.startup["fails"] and p.startup["stage"] == "load"
    msg = p.startup["messages"][0]
    assert "CUDA out of memory" in msg and "61.02 GiB per GPU" in msg and "48.00 GiB total" in msg
    assert "0.92 x 48.00 GiB = 44.16 GiB" in msg                                    # gpu_memory_utilization x total
    assert not any("No available memory" in m for m in p.startup["messages"])       # not the KV cache message
    fixes = {f["flag"]: f for f in p.fixes}
    assert fixes["--tensor-parallel-size"]["value"] == 2 and fixes["--pipeline-parallel-size"]["value"] == 2
    # alternatives, numbered as diagnose numbers them: one option each, pick one
    assert [(f["flag"], f["option"], f["relation"]) for f in p.fixes][:2] == [
        ("--tensor-parallel-size", 1, "alternative"), ("--pipeline-parallel-size", 2, "alternative")]
    assert fixes[None]["hardware"] == "a GPU with at least 82 GiB"
    # every fix it names is the smallest that starts: apply it and the plan starts
    assert not _plan("qwen3-32b", gpu_memory_bytes=48 * cap.GiB, max_model_len=32768, tensor_parallel_size=2).startup["fails"]
    assert not _plan("qwen3-32b", gpu_memory_bytes=48 * cap.GiB, max_model_len=32768, pipeline_parallel_size=2).startup["fails"]
    assert not _plan("qwen3-32b", gpu_memory_bytes=82 * cap.GiB, max_model_len=32768).startup["fails"]
    assert _plan("qwen3-32b", gpu_memory_bytes=81 * cap.GiB, max_model_len=32768).startup["fails"]


def test_fp8_weights_are_offered_when_they_fit():
    # Qwen3-14B: 27.5 GiB of bf16 weights on a 24 GiB GPU; fp8 linear layers bring them to ~14.6 GiB
    p = _plan("qwen3-14b", gpu_memory_bytes=24 * cap.GiB, max_model_len=8192)
    assert p.startup["stage"] == "load"
    q = next(f for f in p.fixes if f["flag"] == "--quantization")
    assert q["value"] == "fp8" and q["relation"] == "alternative" and q["option"] > 1
    assert not _plan("qwen3-14b", gpu_memory_bytes=24 * cap.GiB, max_model_len=8192, quantization="fp8").startup["fails"]


def test_weights_that_load_but_exceed_the_budget_are_explained():
    p = _plan("qwen3-32b", gpu_memory_bytes=64 * cap.GiB, max_model_len=32768)
    assert p.startup["stage"] == "kv_cache"
    assert p.startup["messages"][0].startswith("No available memory for the cache blocks.")
    assert "they alone exceed gpu_memory_utilization 0.92 x 64.00 GiB = 58.88 GiB" in p.startup["messages"][0]


# ---------------------------------------------------------------- the verdict comes first

def test_text_and_markdown_start_with_the_verdict():
    p = _plan("llama-3.1-8b", gpu_memory_bytes=80 * cap.GiB, mean_request_tokens=2000)
    text, md = to_text(p), to_markdown(p)
    lines = text.splitlines()
    assert lines[2] == "Verdict"
    assert lines[3] == ("  starts; max concurrency 3.36x requests of 131,072 tokens (439,856 KV cache tokens, "
                        "27,491 blocks per GPU)")
    assert lines[4] == "    at a mean request of 2,000 tokens: 219 requests at once"
    assert text.index("Verdict") < text.index("Weights (per GPU)") < text.index("KV cache pool")
    assert md.splitlines()[2] == "## Verdict" and md.index("## Verdict") < md.index("## Weights (per GPU)")
    bad = _plan("qwen3-32b", gpu_memory_bytes=48 * cap.GiB, max_model_len=32768)
    t = to_text(bad).splitlines()
    assert t[3] == "  start-up FAILS while loading the weights:"
    assert t[4].startswith("    Loading the weights fails: torch.OutOfMemoryError: CUDA out of memory.")
    n = len({f["option"] for f in bad.fixes})
    assert t[6] == f"Flags ({n} options: pick one)"
    assert to_text(bad).index(f"a GPU with at least 82 GiB (option {n} of {n}: pick one)") < to_text(bad).index("Weights")


# ---------------------------------------------------------------- config.json that is not a model's

BAD = [0, -1, "32", 1.5, 1e30, 10 ** 12, True, [], {}]
FIELDS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "vocab_size", "intermediate_size", "max_position_embeddings"]


@pytest.mark.parametrize("field", FIELDS)
def test_each_sizing_field_out_of_range_is_one_line_naming_it(field):
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    for bad in BAD:
        c = copy.deepcopy(cfg)
        c[field] = bad
        with pytest.raises(InputError) as e:
            make_plan(PlanInputs(config=c, gpu_memory_bytes=80 * cap.GiB))
        assert f"config.json: {field} is {json.dumps(bad)}" in str(e.value), (field, bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("cfg,words", [
    ([], "not a JSON object"), ("llama", "not a JSON object"), (None, "not a JSON object"),
    ({}, "no num_hidden_layers"), ({"num_hidden_layers": 32}, "no hidden_size"),
    ({"num_hidden_layers": 2, "hidden_size": 100, "num_attention_heads": 3}, "hidden_size 100 is not divisible by num_attention_heads 3"),
    ({"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 4},
     "num_key_value_heads 4 is more than num_attention_heads 2"),
    ({"num_hidden_layers": 2, "hidden_size": 128, "architectures": "LlamaForCausalLM"}, "architectures is \"LlamaForCausalLM\", not a list"),
    ({"num_hidden_layers": 2, "hidden_size": 128, "text_config": 5}, "text_config is 5, not an object"),
    ({"num_hidden_layers": 2, "hidden_size": 128, "quantization_config": {"quant_method": "awq", "bits": "4"}},
     "quantization_config.bits is \"4\""),
    ({"text_config": {"num_hidden_layers": -2, "hidden_size": 128}}, "text_config: num_hidden_layers is -2"),
])
def test_configs_that_are_no_model_are_refused(cfg, words):
    with pytest.raises(InputError) as e:
        validate_config(cfg)
    assert words in str(e.value)


def test_every_field_of_real_configs_mutated_never_raises_anything_but_input_error():
    """Each key of each fixture config set to each bad value: a plan, or one InputError; never a TypeError,
    ZeroDivisionError or MemoryError from inside the arithmetic."""
    n_err = 0
    for path in sorted(MODELS.glob("*/config.json")):
        cfg = json.loads(path.read_text())
        tc = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and cfg["text_config"].get("num_hidden_layers") else cfg
        for key in list(tc):
            for bad in BAD:
                c = copy.deepcopy(cfg)
                (c["text_config"] if tc is not cfg else c)[key] = bad
                try:
                    make_plan(PlanInputs(config=c, gpu_memory_bytes=80 * cap.GiB))
                except InputError as e:
                    n_err += 1
                    assert "\n" not in str(e)
    assert n_err > 500


def test_cli_plan_and_check_refuse_a_bad_config_with_exit_2(tmp_path):
    cfg, _ = load_config(str(MODELS / "llama-3.1-8b"))
    cfg["num_key_value_heads"] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "run.sh").write_text("vllm serve m --max-num-seqs 64\n")
    for args in (["plan", str(tmp_path), "--gpu-memory", "80GiB"],
                 ["check", str(tmp_path / "run.sh"), "--model-config", str(tmp_path), "--gpu-memory", "80GiB"]):
        r = subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == "", args
        assert r.stderr.count("\n") == 1 and "num_key_value_heads is 0, not a count in 1..65,536" in r.stderr
    with pytest.raises(InputError):            # the library entry point too, not only the CLI's loader
        check_text("vllm serve m --max-num-seqs 64\n", "run.sh", model_config=cfg, gpu_memory=80 * cap.GiB)
    (tmp_path / "config.json").write_text("[1, 2]")
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "plan", str(tmp_path), "--gpu-memory", "80GiB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a JSON object" in r.stderr


# ---------------------------------------------------------------- max_model_len above the model's

def test_max_model_len_above_max_position_embeddings_is_fixed_with_the_models_length():
    # vLLM refuses it at config validation: the fix is the model's 40,960, never the value it refused
    p = _plan("qwen3-32b", gpu_memory_bytes=80 * cap.GiB, tensor_parallel_size=2, max_model_len=131072)
    assert p.startup["fails"] and p.startup["stage"] == "config"
    fixes = [f for f in p.fixes if not f.get("informational")]
    assert [(f["flag"], f["value"]) for f in fixes] == [("--max-model-len", 40960)]   # memory is not the problem
    assert "max_position_embeddings (40,960)" in fixes[0]["why"]
    # also short of KV cache at 40,960 on a 24 GiB GPU: the cap is what the KV cache holds, still no fp8 for a config error
    p = _plan("qwen3-8b", gpu_memory_bytes=24 * cap.GiB, max_model_len=65536)
    # two options, each whole: the length the KV cache holds, or an fp8 KV cache at the model's own length
    assert [(f["option"], f["flag"], f["value"]) for f in p.fixes] == [
        (1, "--max-model-len", 37456), (2, "--max-model-len", 40960), (2, "--kv-cache-dtype", "fp8")]
    assert not _plan("qwen3-8b", gpu_memory_bytes=24 * cap.GiB, max_model_len=40960, kv_cache_dtype="fp8").startup["fails"]
    assert _plan("qwen3-8b", gpu_memory_bytes=24 * cap.GiB, max_model_len=40960).startup["fails"]
    # and the weights do not fit either: more GPUs, sized at the model's length, are needed as well (not instead)
    p = _plan("qwen3-32b", gpu_memory_bytes=24 * cap.GiB, tensor_parallel_size=2, max_model_len=131072)
    fixes = {f["flag"]: f for f in p.fixes}
    assert fixes["--max-model-len"]["value"] == 40960 and fixes["--tensor-parallel-size"]["value"] == 4
    # the model's cap goes with every option: TP 4 is applied together with it
    tp4 = next(f for f in p.fixes if f["flag"] == "--tensor-parallel-size")
    assert {(f["flag"], f["value"]) for f in p.fixes if f["option"] == tp4["option"]} >= {
        ("--max-model-len", 40960), ("--tensor-parallel-size", 4)}
    assert tp4["relation"] == "set"
    assert "one 40,960-token request" in fixes["--tensor-parallel-size"]["why"]
    # the same through check, on a Kubernetes container asking for 131072
    cfg, _ = load_config(str(MODELS / "qwen3-32b"))
    k8s = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: v}\nspec:\n  template:\n    spec:\n      containers:\n"
           "        - name: vllm\n          image: vllm/vllm-openai:v0.11.0\n"
           "          args: [\"--model=Qwen/Qwen3-32B\", \"--max-model-len=131072\", \"-tp\", \"2\"]\n")
    vc010 = [f for f in check_text(k8s, "d.yaml", model_config=cfg, gpu_memory=80 * cap.GiB).findings if f.rule_id == "VC010"]
    assert [(f.fix["setting"], f.fix["value"]) for f in vc010] == [("--max-model-len", 40960)]


# ---------------------------------------------------------------- flags for a target concurrency

_FIELD = {"--tensor-parallel-size": "tensor_parallel_size", "--max-model-len": "max_model_len",
          "--kv-cache-dtype": "kv_cache_dtype", "--gpu-memory-utilization": "gpu_memory_utilization",
          "--max-num-seqs": "max_num_seqs"}


def _conc(p) -> float:
    """The plan's own max concurrency at max_model_len, unrounded (blocks / blocks per request)."""
    return cap.max_concurrency(p.pool["num_gpu_blocks"], p.concurrency["blocks_per_request"])


def _options(p) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for f in p.fixes:
        if not f.get("informational"):
            assert f["flag"] not in out.setdefault(f["option"], {}), ("a flag twice in one option", p.fixes)
            out[f["option"]][f["flag"]] = f["value"]
    return out


def _apply(model, option: dict, **kw):
    return _plan(model, **{**kw, **{_FIELD[k]: v for k, v in option.items()}})


def test_target_tp_is_the_smallest_whose_own_concurrency_reaches_it():
    kw = dict(gpu_memory_bytes=40 * cap.GiB, max_model_len=16384)
    conc = {t: _conc(_plan("llama-3.1-8b", tensor_parallel_size=t, **kw)) for t in (1, 2, 4, 8)}
    smallest = min(t for t, c in conc.items() if c >= 64)
    assert smallest == 8 and conc[4] < 64 <= conc[8]                    # 62.70x at TP 4, 132.87x at TP 8
    p = _plan("llama-3.1-8b", target_concurrency=64, **kw)
    tp = [f for f in p.fixes if f["flag"] == "--tensor-parallel-size" and "--kv-cache-dtype" not in _options(p)[f["option"]]]
    assert [f["value"] for f in tp] == [smallest]
    why = tp[0]["why"]
    assert f"at TP 8: 136,060 blocks / 1,024 blocks per request = {conc[8]:.2f}x >= 64" in why
    assert f"TP 4: {conc[4]:.2f}x" in why and "gpu_memory_utilization 3.62 (144.80 GiB of the 40.00 GiB GPU)" in why
    # every option, applied, holds the target by the plan's own arithmetic
    for option in _options(p).values():
        assert _conc(_apply("llama-3.1-8b", option, **kw)) >= 64, option
    # from TP 2 the answer is still TP 8, never the current TP doubled; at TP 4 a utilization within the cap does
    q = _plan("llama-3.1-8b", target_concurrency=64, tensor_parallel_size=2, **kw)
    assert _options(q)[1]["--tensor-parallel-size"] == 8
    q = _plan("llama-3.1-8b", target_concurrency=64, tensor_parallel_size=4, **kw)
    u = _options(q)[1]["--gpu-memory-utilization"]
    assert u <= 0.95 and _conc(_plan("llama-3.1-8b", tensor_parallel_size=4, gpu_memory_utilization=u, **kw)) >= 64


def test_no_tp_reaching_the_target_is_said_with_the_computed_alternatives():
    kw = dict(gpu_memory_bytes=80 * cap.GiB)
    top = _conc(_plan("qwen3-32b", tensor_parallel_size=16, **kw))
    assert top < 64                                                      # 50.98x: no TP of 64 heads up to 16 gets there
    for now in (1, 2, 4, 8):
        p = _plan("qwen3-32b", target_concurrency=64, tensor_parallel_size=now, **kw)
        info = [f for f in p.fixes if f.get("informational")]
        assert info and info[0]["summary"] == "no --tensor-parallel-size up to 16 reaches 64 requests of 40,960 tokens"
        assert f"TP 16: {top:.2f}x" in info[0]["why"]
        opts = _options(p)
        assert all("--kv-cache-dtype" in o or "--max-model-len" in o for o in opts.values())   # TP alone is none of them
        for option in opts.values():
            assert _conc(_apply("qwen3-32b", option, tensor_parallel_size=now, **kw)) >= 64, (now, option)
        lines = to_text(p).splitlines()
        flags = next(i for i, line in enumerate(lines) if line.startswith("Flags"))
        assert lines[flags + 1].startswith("  no --tensor-parallel-size up to 16 reaches 64")
    # the GPUs there are cap the search: 4 GPUs, no TP 8 + fp8 option
    p = _plan("qwen3-32b", target_concurrency=64, gpu_count=4, **kw)
    assert p.fixes[0]["summary"].startswith("no --tensor-parallel-size up to 4 reaches")
    assert all(v <= 4 for o in _options(p).values() for k, v in o.items() if k == "--tensor-parallel-size")


def test_tp_candidates_are_values_vllm_accepts():
    from vllm_doctor.plan.planner import _tp_candidates

    def cands(model, **kw):
        cfg, _ = load_config(str(MODELS / model))
        return _tp_candidates(PlanInputs(config=cfg, **kw), cap.model_shape(cfg))
    # Qwen2.5-7B: 28 heads, 4 KV heads; 7 and 14 divide the heads but not the KV heads, nor they them
    # (vLLM's QKVParallelLinear divides one by the other); 28 is above the 16 tried without --gpus
    assert cands("qwen2.5-7b") == [2, 4]
    assert cands("qwen2.5-7b", gpu_count=32) == [2, 4, 28]
    assert cands("llama-3.1-8b", tensor_parallel_size=2, gpu_count=8) == [4, 8]
    assert cands("llama-3.1-8b", pipeline_parallel_size=2, gpu_count=8) == [2, 4]


def test_fixes_are_numbered_options_and_stay_within_the_utilization_cap():
    from vllm_doctor.diagnosis.loader import load_rules
    from vllm_doctor.plan.planner import utilization_max

    assert utilization_max() == load_rules().thresholds["gpu_memory_utilization_max"] == 0.95
    # Qwen3-32B on one 80 GiB GPU for 64 requests: it also fails to start; one plan, one answer per option
    p = _plan("qwen3-32b", gpu_memory_bytes=80 * cap.GiB, target_concurrency=64)
    assert p.startup["fails"]
    opts = _options(p)
    assert len(opts) == 2 and all(f["relation"] == "set" for f in p.fixes if not f.get("informational"))
    text = to_text(p)
    assert "Flags (2 options: pick one)" in text
    assert "  --max-model-len 432 (option 1 of 2, applied together): " in text
    assert "  --kv-cache-dtype fp8 (option 2 of 2, applied together): " in text
    assert "alternative to" not in text and "0.97" not in text
    for plan_ in (p, _plan("qwen3-32b", gpu_memory_bytes=80 * cap.GiB),
                  _plan("qwen2.5-7b", gpu_memory_bytes=24 * cap.GiB, target_concurrency=8)):
        assert all(f["value"] <= utilization_max() for f in plan_.fixes if f["flag"] == "--gpu-memory-utilization")
    # Qwen2.5-7B on 24 GiB: fp8 is marked as one of the options, and it starts
    p = _plan("qwen2.5-7b", gpu_memory_bytes=24 * cap.GiB)
    fp8 = next(f for f in p.fixes if f["flag"] == "--kv-cache-dtype")
    assert fp8["relation"] == "alternative" and f"--kv-cache-dtype fp8 (option {fp8['option']} of 2: pick one)" in to_text(p)
    assert not _plan("qwen2.5-7b", gpu_memory_bytes=24 * cap.GiB, kv_cache_dtype="fp8").startup["fails"]
