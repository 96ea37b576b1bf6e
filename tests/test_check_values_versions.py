"""check (VC006) before 0.26: each release's flag types and choices, read with ast from its wheel
(tools/extract_flag_values_ast.py), judge the values that release's argparse rejects. The expected
choices below are those of the releases' own ``vllm/engine/arg_utils.py``."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from vllm_doctor.check import check_text
from vllm_doctor.check.knowledge import _values

ROOT = Path(__file__).resolve().parents[1]


def vc006(line: str, version: str) -> list[tuple[str, object]]:
    r = check_text(f"vllm serve m {line}\n", "run.sh", vllm_version=version)
    return [(f.message, (f.fix or {}).get("value")) for f in r.findings if f.rule_id == "VC006"]


def test_every_minor_release_from_0_2_to_0_25_has_a_table_read_with_ast():
    d = _values()
    minors = {".".join(v.split(".")[:2]) for v, how in d["how"].items() if how == "ast"}
    assert minors == {f"0.{m}" for m in range(2, 26)}
    assert [v for v in d["how"] if v.startswith("0.4.")] == ["0.4.0", "0.4.1", "0.4.2", "0.4.3"]
    assert {v for v, how in d["how"].items() if how == "argparse"} == {"0.26.0", "0.28.0", "0.30.0", "0.31.0",
                                                                       "0.32.0", "0.33.0"}
    assert set(d["how"]) == set(d["versions"]) == set(d["wheel"])
    assert d["wheel"]["0.6.6"] == "0.6.6.post1"
    v = d["versions"]
    assert v["0.3.3"]["--kv-cache-dtype"] == {"choices": ["auto", "fp8_e5m2"]}
    assert v["0.4.1"]["--kv-cache-dtype"] == {"choices": ["auto", "fp8"]}
    assert v["0.4.3"]["--kv-cache-dtype"] == {"choices": ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]}
    assert v["0.4.3"]["--block-size"]["choices"] == ["8", "16", "32"]
    assert v["0.6.6"]["--block-size"]["choices"] == ["8", "16", "32", "64", "128"]
    assert "choices" not in v["0.18.1"]["--block-size"]
    assert v["0.4.3"]["--max-model-len"] == {"type": "int", "none": False, "auto": False}
    assert v["0.8.5"]["--max-model-len"] == {"type": "human_int", "none": False, "auto": False}
    assert v["0.14.1"]["--max-model-len"] == {"type": "human_int", "none": False, "auto": True}
    assert v["0.10.2"]["--preemption-mode"] == {"choices": ["None", "recompute", "swap"]}
    assert "--preemption-mode" not in v["0.11.2"]


@pytest.mark.parametrize("version,line,words,fix", [
    # --kv-cache-dtype: 0.3.3/0.4.0 take auto|fp8_e5m2, 0.4.1 renamed it auto|fp8, 0.4.3 has all three fp8 names
    ("0.3.3", "--kv-cache-dtype fp8_e4m3", "invalid choice: 'fp8_e4m3' (choose from 'auto', 'fp8_e5m2')", "fp8_e5m2"),
    ("0.4.0", "--kv-cache-dtype fp8", "invalid choice: 'fp8' (choose from 'auto', 'fp8_e5m2')", "fp8_e5m2"),
    ("0.4.1", "--kv-cache-dtype fp8_e5m2", "invalid choice: 'fp8_e5m2' (choose from 'auto', 'fp8')", "fp8"),
    ("0.19.1", "--kv-cache-dtype int8_per_token_head", "invalid choice: 'int8_per_token_head'", "auto"),
    # --block-size: [8, 16, 32] up to 0.6.3 (0.3.3/0.4.0 also 128), 64 from 0.6.6, any int from 0.18
    ("0.2.7", "--block-size 64", "invalid choice: '64' (choose from '8', '16', '32')", None),
    ("0.4.3", "--block-size 64", "invalid choice: '64' (choose from '8', '16', '32')", None),
    ("0.6.3", "--block-size 64", "invalid choice: '64' (choose from '8', '16', '32')", None),
    ("0.17.1", "--block-size 48", "invalid choice: '48' (choose from '1', '8', '16', '32', '64', '128', '256')", None),
    # int flags: plain int() in 0.4, human-readable from 0.8.5 (max_model_len), auto from 0.14
    ("0.4.3", "--max-model-len abc", "argument --max-model-len: invalid int value: 'abc'", None),
    ("0.4.3", "--max-model-len 32k", "argument --max-model-len: invalid int value: '32k'", None),
    ("0.2.7", "--swap-space abc", "argument --swap-space: invalid int value: 'abc'", None),
    ("0.8.5", "--max-model-len auto", "invalid human_readable_int value: 'auto'", None),
    # choices that grew: fp8 quantization from 0.4.1, runai_streamer loading from 0.6.x
    ("0.4.0", "--quantization fp8", "invalid choice: 'fp8' (choose from 'None', 'awq', 'gptq', 'squeezellm')", None),
    ("0.5.5", "--load-format runai_streamer", "invalid choice: 'runai_streamer'", None),
])
def test_a_value_the_release_rejects_is_vc006_with_its_own_choices(version, line, words, fix):
    got = vc006(line, version)
    assert len(got) == 1, got
    assert got[0][0].startswith(line) and words in got[0][0]
    assert "judged by" not in got[0][0]                      # the release's own table
    assert got[0][1] == fix


@pytest.mark.parametrize("version,line", [
    ("0.4.3", "--kv-cache-dtype fp8_e4m3"), ("0.5.4", "--kv-cache-dtype fp8_e5m2"),
    ("0.4.1", "--kv-cache-dtype fp8"), ("0.20.0", "--kv-cache-dtype int8_per_token_head"),
    ("0.6.6", "--block-size 64"), ("0.8.5", "--block-size 64"), ("0.18.1", "--block-size 48"),
    ("0.8.5", "--max-model-len 32k"), ("0.14.1", "--max-model-len auto"), ("0.9.2", "--max-num-batched-tokens 8k"),
    ("0.4.1", "--quantization fp8"), ("0.6.6", "--load-format runai_streamer"), ("0.10.2", "--preemption-mode swap"),
])
def test_a_value_the_release_accepts_is_no_finding(version, line):
    assert vc006(line, version) == []


def test_a_release_judged_by_another_releases_table_names_it():
    got = vc006("--block-size 64", "0.5.1")                    # no 0.5.1 table: 0.4.3's; 0.5.4 has the same choices
    assert len(got) == 1 and "choose from '8', '16', '32'; judged by vLLM 0.4.3's parser (its add_argument calls, " \
        "read from its source with ast)" in got[0][0]
    # a patch release can add a choice (0.4.2 added gptq_marlin): choices that differ in the next table
    # are not judged between the two
    assert vc006("--quantization gptq_marlin", "0.4.2") == []
    assert len(vc006("--quantization gptq_marlin", "0.4.1")) == 1
    assert vc006("--block-size 128", "0.4.0") == [] and len(vc006("--block-size 128", "0.4.1")) == 1
    got = vc006("--max-model-len abc", "0.6.7")
    assert len(got) == 1 and "judged by vLLM 0.6.6.post1's parser" in got[0][0]
    got = vc006("--max-model-len abc", "0.27.0")
    assert len(got) == 1 and "judged by vLLM 0.26.0's parser (its own argparse)" in got[0][0]
    # 0.4.0..0.4.2 choices are not judged from 0.3.3 across lines where 0.4.1 changed them
    assert vc006("--load-format pt", "0.1.4") == []


def _tool():
    spec = importlib.util.spec_from_file_location("extract_flag_values_ast", ROOT / "tools" / "extract_flag_values_ast.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["extract_flag_values_ast"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_ast_reader_agrees_with_vllms_own_argparse_on_the_installed_release():
    """The e2e harness's vLLM 0.32 install: its sources read with ast against the argparse table of 0.32.0."""
    cache = Path(os.environ.get("VLLM_DOCTOR_E2E_CACHE", str(Path.home() / ".cache" / "vllm-doctor-e2e")))
    site = next(iter(sorted((cache / "venv" / "lib").glob("python3*/site-packages"))), None)
    if site is None or not (site / "vllm" / "engine" / "arg_utils.py").is_file():
        pytest.skip("no e2e vLLM install (tests/e2e/setup_vllm.sh)")
    flags, stats = _tool().extract(site)
    table = _values()["versions"]["0.32.0"]
    both = [f for f in flags if f in table]
    assert len(flags) >= 90 and set(flags) <= set(table)
    differ = [f for f in both if {**flags[f], "choices": set(flags[f].get("choices") or [])}
              != {**table[f], "choices": set(table[f].get("choices") or [])}]
    # the only disagreement: choices computed at runtime (the platform's device type), recorded as unknown
    assert differ == ["--mm-processor-device"] and flags["--mm-processor-device"] == {"choices": None}
    assert flags["--max-model-len"] == {"type": "human_int", "none": False, "auto": True}
    assert stats["choices_unknown"] == 1


def test_the_ast_reader_resolves_names_and_leaves_runtime_choices_unknown(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "config.py").write_text(
        "import enum\nfrom typing import Literal, Optional\nCacheDType = Literal['auto', 'fp8']\n"
        "class LoadFormat(str, enum.Enum):\n    AUTO = 'auto'\n    PT = 'pt'\n"
        "@dataclass\nclass CacheConfig:\n    cache_dtype: CacheDType = 'auto'\n    block_size: Optional[int] = None\n"
        "    mode: Literal['a', 'b'] | str = 'a'\n    on: bool = False\n")
    (pkg / "engine" / "arg_utils.py").write_text(
        "import json\nfrom vllm.config import CacheConfig, LoadFormat\nMETHODS = {'awq': 1, 'gptq': 2}\n"
        "def get_kwargs(cls):\n    pass\n"
        "class EngineArgs:\n    @staticmethod\n    def add_cli_args(parser):\n"
        "        cache_kwargs = get_kwargs(CacheConfig)\n"
        "        cache_kwargs['cache_dtype']['choices'].remove('fp8')\n"
        "        parser.add_argument('--quantization', '-q', type=str, choices=[*METHODS, None])\n"
        "        parser.add_argument('--load-format', type=str, choices=[f.value for f in LoadFormat])\n"
        "        parser.add_argument('--device', type=str, choices=registry.names())\n"
        "        parser.add_argument('--rope', type=json.loads)\n"
        "        parser.add_argument('--seed', type=int)\n"
        "        parser.add_argument('--eager', action='store_true')\n"
        "        parser.add_argument('--kv-cache-dtype', **cache_kwargs['cache_dtype'])\n"
        "        parser.add_argument('--block-size', **cache_kwargs['block_size'])\n"
        "        parser.add_argument('--mode', **cache_kwargs['mode'])\n"
        "        parser.add_argument('--on', **cache_kwargs['on'])\n")
    flags, stats = _tool().extract(tmp_path)
    assert flags == {
        "--block-size": {"type": "int", "none": True, "auto": False},
        "--device": {"choices": None},
        "--kv-cache-dtype": {"choices": ["auto"]},
        "--load-format": {"choices": ["auto", "pt"]},
        "--quantization": {"choices": ["None", "awq", "gptq"]},
        "--seed": {"type": "int", "none": False, "auto": False},
    }
    assert stats == {"calls": 10, "not_judged": 1, "choices_unknown": 1}


@pytest.mark.parametrize("line", ["--limit-mm-per-prompt '{\"image\": 2}'", "--allowed-origins '[\"*\"]'",
                                  "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'"])
def test_json_valued_flags_are_not_judged_as_numbers(line):
    """json.loads accepts '12' and '1.5' too: the argparse probe no longer calls such a flag a float."""
    for version in ("0.26.0", "0.32.0", "0.33.0"):
        assert vc006(line, version) == []
    assert all("--limit-mm-per-prompt" not in t for t in _values()["versions"].values())
