#!/usr/bin/env python3
"""Regenerate vllm_doctor/data/vllm_flags.json from the reference extraction of vLLM's CLI flags.

Source: ../shared/reference/vllm-flags.json (vllm serve flags and VLLM_* env vars read with ast
from the PyPI wheels of 48 vLLM releases, 0.3.3 ... 0.33.0). Kept: per version the set of flags
and env names (as ranges over the examined versions) and the defaults that capacity math needs.
"""
import json
import sys
from pathlib import Path

src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/reference/vllm-flags.json")
d = json.loads(src.read_text())
versions = d["versions_examined"]


def ranges(names_by_version):
    out = {}
    for i, v in enumerate(versions):
        for n in names_by_version[v]:
            out.setdefault(n, []).append(i)
    packed = {}
    for n, idx in out.items():
        rs, start, prev = [], idx[0], idx[0]
        for i in idx[1:]:
            if i != prev + 1:
                rs.append([versions[start], versions[prev]])
                start = i
            prev = i
        rs.append([versions[start], versions[prev]])
        packed[n] = rs
    return dict(sorted(packed.items()))


flags = ranges({v: d["versions"][v]["flags"] for v in versions})
env = ranges({v: d["versions"][v]["env"] for v in versions})
defaults = {}
for v in versions:
    df = d["defaults"].get(v, {})
    mns = df.get("max_num_seqs")
    defaults[v] = {
        "gpu_memory_utilization": df.get("gpu_memory_utilization"),
        "block_size": df.get("block_size"),
        "max_num_seqs": mns if isinstance(mns, int) else None,
        "max_num_seqs_by_gpu": mns if isinstance(mns, dict) else None,
        "swap_space_gib": df.get("swap_space_gib"),
        # CPU backend, OpenAI server: "128*world_size" -> 128 per rank
        "max_num_seqs_cpu_server": (int(str(df["max_num_seqs_cpu"]["OpenAI server"]).split("*")[0])
                                    if isinstance(df.get("max_num_seqs_cpu"), dict) else None),
    }
out = {
    "source": "shared/reference/vllm-flags.json (ast over vllm wheels 0.3.3-0.33.0)",
    "versions": versions,
    "flags": flags,
    "env": env,
    "defaults": defaults,
}
dst = Path(__file__).resolve().parents[1] / "vllm_doctor/data/vllm_flags.json"
dst.write_text(json.dumps(out, separators=(",", ":"), sort_keys=False) + "\n")
print(f"wrote {dst} ({dst.stat().st_size} bytes, {len(flags)} flags, {len(env)} env vars)")
