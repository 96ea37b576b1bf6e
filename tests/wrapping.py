"""The wrappers a vLLM log arrives in, applied to plain lines (the test double of kubelet,
docker, journald, a JSON formatter and a markdown paste), and the one pipeline run over them."""

from __future__ import annotations

import dataclasses
import json
import re

from vllm_doctor.diagnosis import load_rules
from vllm_doctor.pipeline import Pipeline, WallTime

PREFIX_RE = re.compile(
    r"^(?P<proc>(?:\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+(?:, ip=[^)]*)?\) ?)*)"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mon>\d\d)-(?P<day>\d\d) (?P<hms>\d\d:\d\d:\d\d) "
    r"\[?(?P<file>[\w./-]+):(?P<line>\d+)\] ?(?P<msg>.*)$"
)
MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()


def _ts(line: str, i: int) -> tuple[str, str, str]:
    m = PREFIX_RE.match(line)
    mon, day, hms = (m["mon"], m["day"], m["hms"]) if m else ("11", "30", "10:00:00")
    return f"2026-{mon}-{day}T{hms}.{i:06d}000Z", f"{MONTHS[int(mon) - 1]} {day} {hms}", f"2026-{mon}-{day}T{hms}+0000"


def _json_record(line: str, i: int) -> str:
    m = PREFIX_RE.match(line)
    iso = _ts(line, i)[0]
    if not m:  # uvicorn's own records carry their level in the record, not in the message
        u = re.match(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+", line)
        return json.dumps({"timestamp": iso, "levelname": u.group(1) if u else "ERROR", "message": line[u.end():] if u else line})
    rec = {"timestamp": iso, "levelname": m["level"], "filename": m["file"].rsplit("/", 1)[-1],
           "lineno": int(m["line"]), "message": m["msg"]}
    proc = re.findall(r"\(([A-Za-z][\w.-]*(?: [\w.=-]+)*?) pid=(\d+)", m["proc"])
    if proc:
        rec["processName"], rec["process"] = proc[-1][0], int(proc[-1][1])
    return json.dumps(rec, ensure_ascii=False)


def wrap(kind: str, lines: list[str]) -> str:
    """``lines`` as the wrapper ``kind`` writes them (one string, newline-terminated)."""
    out = []
    for i, line in enumerate(lines):
        iso, short, short_iso = _ts(line, i)
        if kind == "plain":
            out.append(line)
        elif kind == "cri":
            out.append(f"{iso} stdout F {line}")
        elif kind == "cri-partial":  # kubelet cuts long lines into P pieces and a final F piece
            cut = max(1, len(line) // 2)
            out += [f"{iso} stdout P {line[:cut]}", f"{iso} stdout F {line[cut:]}"]
        elif kind == "docker":
            out.append(json.dumps({"log": line + "\n", "stream": "stdout", "time": iso}))
        elif kind == "docker-partial":  # docker cuts lines over 16 KiB the same way
            cut = max(1, len(line) // 2)
            out += [json.dumps({"log": line[:cut], "stream": "stdout", "time": iso}),
                    json.dumps({"log": line[cut:] + "\n", "stream": "stdout", "time": iso})]
        elif kind == "kubectl":  # kubectl logs --timestamps
            out.append(f"{iso} {line}")
        elif kind == "json":
            out.append(_json_record(line, i))
        elif kind == "process":
            out.append(f"(APIServer pid=7) {line}")
        elif kind == "journald":
            out.append(f"{short} host vllm[4242]: {line}")
        elif kind == "journald-iso":
            out.append(f"{short_iso} host vllm[4242]: {line}")
        elif kind == "blockquote":
            out.append(f"> {line}")
        elif kind == "compose":
            out.append(f"vllm-1  | {line}")
        else:
            raise ValueError(kind)
    return "".join(x + "\n" for x in out)


WRAPPERS = ("plain", "cri", "cri-partial", "docker", "docker-partial", "kubectl", "json", "process",
            "journald", "journald-iso", "blockquote", "compose")
_RULES = None


def pipeline(serve: bool = False) -> Pipeline:
    global _RULES
    if _RULES is None:
        _RULES = load_rules([])
    if serve:  # as serve wires it: the wall clock, bytes appended as they come
        return Pipeline(_RULES, clock=WallTime(lambda: 1.8e9), base_year=2026)
    return Pipeline(_RULES, base_year=2026)


def run(text: str, serve: bool = False, chunk: int = 0) -> tuple[Pipeline, list]:
    """Feed ``text`` through the one pipeline (``chunk`` bytes at a time, 0: at once) and
    return it with the events it gave."""
    pipe = pipeline(serve)
    got: list = []
    pipe.on_event = got.append
    data = text.encode()
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        pipe.feed("vllm.log", data[i : i + step])
    pipe.end("vllm.log")
    return pipe, got


def shape(e) -> tuple:
    """An event without where it came from (wrappers change line numbers, times, processes; a
    traceback's ``raised_in`` follows the process prefix a wrapper adds)."""
    return (type(e).__name__,) + tuple(
        (f.name, getattr(e, f.name)) for f in dataclasses.fields(e) if f.name not in ("meta", "message", "raised_in"))


def diagnose_json(path) -> dict:
    """``vllm-doctor diagnose -f json`` of ``path`` as the command runs it (exit code 0)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "json", "--fail-on", "never", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
