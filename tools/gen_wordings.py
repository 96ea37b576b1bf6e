#!/usr/bin/env python3
"""Generate vllm_doctor/data/vllm_wordings.json: every logger call and raise in vLLM's released
source that bears on memory, KV cache, scheduling, preemption, engine death or NCCL.

For the newest patch release of every minor version 0.2 .. latest, the wheel is fetched with
pip (``pip download vllm==X --no-deps --only-binary :all:``), only ``vllm/**/*.py`` is read from
it (a wheel is a zip: nothing is installed or imported), and each ``logger.<level>(...)`` /
``raise X(...)`` whose first argument is a string literal, an f-string, a ``%`` / ``+`` /
``.format`` of literals is reduced to its template (``%s`` / ``{}`` placeholders kept). Entries
are grouped by (kind, file, template) with the first and last version that has them.

Usage: python tools/gen_wordings.py [--cache DIR] [--versions 0.2.7,0.3.3,...]
Re-run when a new vLLM minor is released; the test tests/test_wordings.py then shows which new
wordings need a matcher or a reason.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_doctor" / "data" / "vllm_wordings.json"
TOPIC = re.compile(
    r"out of memory|OOM|[Ff]ree memory|[Aa]vailable memory|KV cache (?:memory|size|usage|space)|"
    r"memory for (?:the )?cache blocks|cache blocks|# \w+ blocks|num_gpu_blocks|gpu_memory_utilization|"
    r"max seq len|max_model_len|max model len|[Pp]reempt|swap space|max_num_seqs|max_num_batched_tokens|"
    r"[Aa]vg prompt throughput|[Mm]aximum concurrency|[Ee]ngine ?[Dd]ead|died|[Ee]ngine core|EngineCore|"
    r"background (?:task|loop)|[Tt]ask finished|iteration timed out|output_handler|fatal|"
    r"NCCL (?:error|[Ee]rror)|nccl\w*(?:Error|failed)|[Ww]atchdog|shared memory broadcast|block found in|"
    r"[Ff]ailed to start|unexpectedly"
)
# Outside what vllm-doctor diagnoses (the engine's own memory, KV cache, scheduling, death, NCCL):
# model- and kernel-specific code and the KV/weight-transfer plug-ins of disaggregated serving.
EXCLUDE = re.compile(
    r"^vllm/(?:distributed/(?:kv_transfer|weight_transfer|ec_transfer|eplb|elastic_ep)|v1/kv_offload|"
    r"v1/simple_kv_offload|v1/hisparse|third_party|models?/|model_executor/|attention/|v1/attention/|"
    r"lora/|multimodal/|benchmarks/|transformers_utils/|tokenizers?/|reasoning/|tool_parsers?/|"
    r"entrypoints/openai/tool_parsers|spec_decode/|v1/spec_decode/)"
)
LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "info_once", "warning_once"}


def newest_per_minor(all_versions: list[str]) -> list[str]:
    best: dict[tuple[int, int], str] = {}
    for v in all_versions:
        m = re.fullmatch(r"0\.(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?", v)
        if not m or int(m[1]) < 2:
            continue
        key = (0, int(m[1]))
        rank = (int(m[2]), int(m[3] or 0), int(m[4] or 0))
        if key not in best or rank > best[key][0]:
            best[key] = (rank, v)
    return [best[k][1] for k in sorted(best)]


def pypi_versions() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"], capture_output=True, text=True).stdout
    m = re.search(r"Available versions: (.*)", out)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def template(node: ast.AST) -> str | None:
    """The literal text of a message argument, placeholders as written (``%s``) or ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            parts.append(v.value if isinstance(v, ast.Constant) else "{}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = template(node.left), template(node.right)
        if a is None and b is None:
            return None
        return (a if a is not None else "{}") + (b if b is not None else "{}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return template(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return template(node.func.value)
    return None


def is_logger_call(node: ast.AST) -> bool:
    """``logger.<level>(message, ...)``: a call of a level method on an owner named ``*log*``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS and node.args):
        return False
    owner = node.func.value
    name = owner.id if isinstance(owner, ast.Name) else (owner.attr if isinstance(owner, ast.Attribute) else "")
    return "log" in name.lower()


def scan_source(text: str):
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if is_logger_call(node):
            t = template(node.args[0])
            if t:
                yield node.func.attr.replace("_once", "").replace("warn", "warning").replace("warninging", "warning"), t, node.lineno
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            f = node.exc.func
            exc = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "?")
            t = template(node.exc.args[0])
            if t:
                yield "raise " + exc, t, node.lineno


def scan_wheel(path: Path):
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            n = info.filename
            if n.startswith("vllm/") and n.endswith(".py") and "/tests/" not in n and not EXCLUDE.match(n):
                text = z.read(info).decode("utf-8", "replace")
                for kind, t, line in scan_source(text):
                    t = " ".join(t.split())
                    if TOPIC.search(t):
                        yield kind, n, t, line


def fetch(version: str, cache: Path) -> Path | None:
    found = list(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
                        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_31_x86_64",
                        "--platform", "manylinux_2_34_x86_64", "--abi", "abi3", "--abi", "cp312", "--abi", "none",
                        f"vllm=={version}", "-d", str(cache)], capture_output=True)
        found = list(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--python-version", "3.10", "--platform", "manylinux1_x86_64", f"vllm=={version}", "-d", str(cache)],
                       capture_output=True)
        found = list(cache.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="/tmp/vllm-wheels")
    ap.add_argument("--versions", default="")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    versions = a.versions.split(",") if a.versions else newest_per_minor(pypi_versions())
    entries: dict[tuple[str, str, str], dict] = {}
    done = []
    for v in versions:
        whl = fetch(v, cache)
        if whl is None:
            print(f"{v}: no wheel", file=sys.stderr)
            continue
        n = 0
        for kind, fname, t, line in scan_wheel(whl):
            e = entries.setdefault((kind, fname, t), {"kind": kind, "file": fname, "text": t, "first": v, "last": v, "line": line})
            e["last"] = v
            n += 1
        done.append(v)
        print(f"{v}: {n} calls", file=sys.stderr)
    out = {"generated_by": "tools/gen_wordings.py (pip download vllm==X --no-deps --only-binary :all:, newest patch of each minor)",
           "scope": "logger calls and raises in vllm/**/*.py bearing on memory, KV cache, scheduling, preemption, engine death, NCCL; "
                    "model-, kernel- and KV-transfer-plug-in code excluded (tools/gen_wordings.py EXCLUDE)",
           "versions": done,
           "entries": sorted(entries.values(), key=lambda e: (e["file"], e["text"]))}
    Path(a.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(out['entries'])} wordings from {len(done)} versions -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
