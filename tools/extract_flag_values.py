"""Write vllm_doctor/data/vllm_flag_values.json: the value each ``vllm serve`` flag accepts, read from
vLLM's OWN argparse parser (``make_arg_parser``), not from its source text.

Run with the Python of an environment where vLLM is installed (the e2e harness's CPU build of vLLM 0.32.0:
``~/.cache/vllm-doctor-e2e/venv/bin/python tools/extract_flag_values.py``). For every option it records
the ``choices`` and classifies the ``type`` callable by feeding it probe strings (the callables are
closures such as ``optional_type(int)`` or ``human_readable_int``; probing says what they accept):
``int``, ``float``, ``human_int`` (``32k``, ``1M``), each with ``none`` (``None``/empty accepted) and
``auto`` (``auto`` accepted). Options whose type accepts any string are left out.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

PROBES = ["12", "-3", "1.5", "abc", "32k", "None", "", "auto"]


def _parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args",
                "vllm.entrypoints.common.cli_args"):
        try:
            return importlib.import_module(mod).make_arg_parser(FlexibleArgumentParser())
        except (ImportError, AttributeError):
            continue
    raise SystemExit("no make_arg_parser in this vLLM")


def _accepts(fn, s: str) -> bool:
    try:
        fn(s)
        return True
    except Exception:  # noqa: BLE001 - argparse turns any of these into "invalid ... value"
        return False


def classify(fn) -> dict | None:
    ok = {p for p in PROBES if _accepts(fn, p)}
    if "abc" in ok:
        return None
    if "32k" in ok:
        kind = "human_int"
    elif "1.5" in ok:
        kind = "float"
    elif "12" in ok:
        kind = "int"
    else:
        return None
    return {"type": kind, "none": "None" in ok, "auto": "auto" in ok}


def main() -> None:
    p = _parser()
    flags: dict[str, dict] = {}
    for a in p._actions:
        for o in a.option_strings:
            if not o.startswith("--"):
                continue
            d: dict = {}
            if a.type is not None and callable(a.type):
                d.update(classify(a.type) or {})
            if a.choices is not None and a.nargs in (None, "?"):
                d["choices"] = sorted(str(c) for c in a.choices)
            if d:
                flags[o] = d
    out = {"source": "argparse actions of vLLM's own make_arg_parser (tools/extract_flag_values.py)",
           "examined": importlib.metadata.version("vllm").split("+")[0], "flags": dict(sorted(flags.items()))}
    dest = Path(__file__).resolve().parents[1] / "vllm_doctor" / "data" / "vllm_flag_values.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{dest}: {len(flags)} flags from vLLM {out['examined']}", file=sys.stderr)


if __name__ == "__main__":
    main()
