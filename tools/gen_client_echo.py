#!/usr/bin/env python3
"""Generate vllm_doctor/data/vllm_client_echo.json: every vLLM logger call whose message embeds a
client- or model-controlled value (a request id, a prompt, a request's body or model name, a
LoRA name, a tool call's arguments, the model's output, a harmony message), per version, with
the position of the value in the message.

The wheels are read as gen_wordings.py reads them (``pip download vllm==X --no-deps``; a wheel is
a zip: nothing is installed). A call is listed when an argument of its ``%s`` (or a value of its
f-string) names a client- or model-controlled value (CLIENT_ARG below, on the argument's source
text). ``head`` is the message's literal text before the first such value (``""``: the value
starts the message), ``value_at`` the index of that value among the message's placeholders.
``covered`` tells how vllm-doctor knows the message as client text: ``head`` (a CLIENT_HEADS
pattern matches its start), ``file`` (a tool or reasoning parser: ECHO_FILES), or null.

Usage: python tools/gen_client_echo.py [--cache DIR] [--versions 0.6.6,0.8.0,0.10.2,0.32.0]
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gen_wordings import fetch, is_logger_call, template  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_doctor" / "data" / "vllm_client_echo.json"
VERSIONS = "0.6.6,0.8.0,0.10.2,0.32.0"
# The source text of an argument that holds a client's or the model's value.
CLIENT_ARG = re.compile(
    r"(?<![\w.])(?:request_id|req_id|rid|request_ids|req_ids|external_req_id|prompt|prompts|raw_request|body|"
    r"arguments|tool_calls?|function_call|model_output|output_text|delta_text|current_text|lora_name|lora_path|"
    r"model_name|served_model_name|chat_template|json_schema|browser_call|recipient)\b"
    r"|\.(?:request_id|req_id|prompt|text|content|arguments|lora_name|lora_path)\b"
    r"|\[['\"](?:prompt|id|name|arguments|content)['\"]\]")
PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfig]|\{\}")


def calls(text: str):
    """(level, template, [argument source], lineno) of each logger call in ``text``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in filter(is_logger_call, ast.walk(tree)):
        first = node.args[0]
        t = template(first)
        if not t:
            continue
        if isinstance(first, ast.JoinedStr):
            args = [ast.unparse(v.value) for v in first.values if isinstance(v, ast.FormattedValue)]
        elif isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "format":
            args = [ast.unparse(a) for a in first.args]
        elif isinstance(first, ast.BinOp) and isinstance(first.op, ast.Mod):
            r = first.right
            args = [ast.unparse(a) for a in r.elts] if isinstance(r, ast.Tuple) else [ast.unparse(r)]
        else:
            args = [ast.unparse(a) for a in node.args[1:]]
        yield node.func.attr.replace("_once", ""), t, args, node.lineno


def covered(head: str, fname: str) -> str | None:
    from vllm_doctor.ingest.envelope import ECHO_FILES, client_head

    if fname.endswith(ECHO_FILES):
        return "file"
    return "head" if head.strip() and client_head(head) else None


def scan(whl: Path):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            n = info.filename
            if not (n.startswith("vllm/") and n.endswith(".py")) or "/tests/" in n:
                continue
            for level, t, args, line in calls(z.read(info).decode("utf-8", "replace")):
                for i, a in enumerate(args):
                    if CLIENT_ARG.search(a):
                        holes = list(PLACEHOLDER.finditer(t))
                        at = holes[i].start() if i < len(holes) else len(t)
                        yield level, n, " ".join(t.split()), " ".join(t[:at].split()) + (" " if t[:at].endswith(" ") else ""), i, a, line
                        break


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="/tmp/vllm-wheels")
    ap.add_argument("--versions", default=VERSIONS)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    entries: dict[tuple[str, str], dict] = {}
    done = []
    for v in a.versions.split(","):
        whl = fetch(v, Path(a.cache))
        if whl is None:
            print(f"{v}: no wheel", file=sys.stderr)
            continue
        for level, fname, t, head, i, arg, line in scan(whl):
            e = entries.setdefault((fname, t), {"file": fname, "level": level, "text": t, "head": head, "value_at": i,
                                                "value": arg, "versions": [], "line": line})
            e["versions"].append(v)
        done.append(v)
    for e in entries.values():
        e["covered"] = covered(e["head"], e["file"])
    out = {"generated_by": "tools/gen_client_echo.py (pip download vllm==X --no-deps)", "versions": done,
           "entries": sorted(entries.values(), key=lambda e: (e["file"], e["text"]))}
    Path(a.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    n = len(out["entries"])
    print(f"{n} messages with a client value from {len(done)} versions -> {a.out}; "
          f"{sum(1 for e in out['entries'] if e['covered'])} covered", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
