"""Write vllm_doctor/data/vllm_flag_values.json: the value each ``vllm serve`` flag accepts, per vLLM
release, read from vLLM's OWN argparse parser (``make_arg_parser``), not from its source text.

Run with the Python of an environment where vLLM is installed (the e2e harness's CPU build of vLLM 0.32:
``~/.cache/vllm-doctor-e2e/venv/bin/python tools/extract_flag_values.py``). ``--source DIR --version X``
reads another release instead: DIR holds the ``vllm/`` package (the ``.py`` files of its wheel,
``unzip vllm-X-*.whl 'vllm/*.py' -d DIR``) imported over the installed one, whose dependencies and CPU
platform serve it; the result is merged into the file under X.

For every option it records the ``choices`` and classifies the ``type`` callable by feeding it probe
strings (the callables are closures such as ``optional_type(int)`` or ``human_readable_int``; probing
says what they accept): ``int``, ``float``, ``human_int`` (``32k``, ``1M``), each with ``none``
(``None``/empty accepted) and ``auto`` (``auto`` accepted). Options whose type accepts any string and
that have no choices are left out.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

PROBES = ["12", "-3", "1.5", "abc", "32k", "None", "", "auto", '["*"]', '{"image": 2}']
DEST = Path(__file__).resolve().parents[1] / "vllm_doctor" / "data" / "vllm_flag_values.json"


def _parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args",
                "vllm.entrypoints.common.cli_args"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        return m.make_arg_parser(FlexibleArgumentParser())
    raise SystemExit("no make_arg_parser in this vLLM")


def _accepts(fn, s: str) -> bool:
    try:
        fn(s)
        return True
    except Exception:  # noqa: BLE001 - argparse turns any of these into "invalid ... value"
        return False


def classify(fn) -> dict | None:
    ok = {p for p in PROBES if _accepts(fn, p)}
    if "abc" in ok or '["*"]' in ok or '{"image": 2}' in ok:     # any string, or JSON (json.loads accepts 12 too)
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
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", help="a folder holding another release's vllm/ package")
    ap.add_argument("--version", help="that release's version")
    a = ap.parse_args()
    if a.source:
        sys.path.insert(0, a.source)
    version = a.version or importlib.metadata.version("vllm").split("+")[0]
    p = _parser()
    flags: dict[str, dict] = {}
    for act in p._actions:
        for o in act.option_strings:
            if not o.startswith("--"):
                continue
            d: dict = {}
            if act.type is not None and callable(act.type):
                d.update(classify(act.type) or {})
            if act.choices is not None and act.nargs in (None, "?"):
                d["choices"] = sorted(str(c) for c in act.choices)
            if d:
                flags[o] = d
    out = json.loads(DEST.read_text()) if DEST.is_file() else {}
    out["source"] = ("per release: 'argparse' = the argparse actions of vLLM's own make_arg_parser "
                     "(tools/extract_flag_values.py); 'ast' = add_argument calls read statically with Python's ast "
                     "from the wheel's sources (tools/extract_flag_values_ast.py), for releases that cannot be "
                     "imported; see 'how' and 'wheel'")
    out.setdefault("how", {})[version] = "argparse"
    out.setdefault("wheel", {})[version] = version
    for k in ("how", "wheel"):
        out[k] = dict(sorted(out[k].items(), key=lambda kv: [int(x) for x in kv[0].split(".")[:3]]))
    out.setdefault("versions", {})[version] = dict(sorted(flags.items()))
    out["versions"] = dict(sorted(out["versions"].items(), key=lambda kv: [int(x) for x in kv[0].split(".")[:3]]))
    out.pop("flags", None), out.pop("examined", None)
    DEST.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{DEST}: {len(flags)} flags from vLLM {version}", file=sys.stderr)


if __name__ == "__main__":
    main()
