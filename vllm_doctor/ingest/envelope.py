"""Stage 2 of the pipeline: turn raw bytes of a log into records (one vLLM log message each).

What wraps a vLLM record, outermost first, and what this module strips:

* JSON log records (a JSON formatter through VLLM_LOGGING_CONFIG_PATH, vLLM 0.33's JSON_FORMAT):
  message, level, time and file from their usual keys.
* container runtimes: Kubernetes CRI lines (``2026-11-30T09:00:00.123456789Z stdout F msg``;
  ``P`` partial lines are joined with the following ``F`` line), docker's json-file driver
  (``{"log": "msg\\n", "stream": "stdout", "time": "..."}``), ``kubectl logs --timestamps``
  (an RFC 3339 time then a space) and bracketed times (``[2024-07-08 15:17:34] ``). Their
  timestamps carry the year, which vLLM's own timestamp lacks.
* ANSI colour codes (vLLM colours the process prefix cyan, and from 0.11 the level and file).
* process prefixes, possibly nested: ``(APIServer pid=N)``, ``(EngineCore_DP0 pid=N)``,
  ``(VllmWorker rank=0 pid=N)``, ``(VllmWorkerProcess pid=N)``, ``(RayWorkerWrapper pid=N,
  ip=...)``, ``(Worker_TP0 pid=N)`` (vllm/executor/multiproc_worker_utils.py 0.4–0.10,
  v1/executor/multiproc_executor.py, utils ``decorate_logs`` 0.10.2+, in the formatter 0.31+).
* vLLM's logger prefix (vllm/logger.py): ``INFO 07-10 10:23:45 file.py:123] msg`` (0.3.3–0.7.3),
  ``INFO 07-10 10:23:45 [file.py:123] msg`` (0.8+; a relative path such as
  ``v1/core/sched/scheduler.py`` when VLLM_LOGGING_LEVEL=DEBUG, 0.11+). The date has no year.

Damage from copy and paste is tolerated: several records glued on one line (tqdm progress text
before ``INFO``; newlines collapsed to spaces) are split at each embedded logger prefix, except
inside request-logging lines (``Received request ...: prompt: '...'``) whose text is user input.

Everything works on bytes until a line is known to matter: the :class:`KeywordScanner` (keywords derived from the matcher table) drops, at
C speed, lines that no parser could match (the bulk of a request-heavy log), which keeps
``diagnose`` near ``grep`` speed. Invalid UTF-8 is replaced, never raised; lines longer than
``max_line_bytes`` are cut (the rest of the line is counted but not kept).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from array import array
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

# Client-controlled text, known by its fixed head (vLLM's request logging of every version, the
# request-id lines, uvicorn's access log). Only the head is vLLM's: the rest (a prompt, a
# sampling-params echo, a JSON body, a request id taken verbatim from X-Request-Id, a URL path) is
# never parsed and never split at an embedded logger prefix. Heads read from vLLM's released source:
# entrypoints/logger.py RequestLogger (``Received request %s: prompt: %r, params: ...``; 0.4+),
# engine/async_llm_engine.py (``Received request``/``Added request``/``Aborted request``/``Finished
# request``, 0.1-0.10), v1/engine/async_llm.py and output_processor.py (``Added request %s.``,
# ``Request %s aborted.``, ``Request %s failed (engine dead).``, ``Aborted request(s) %s.``),
# entrypoints/logger.py 0.9+ (``Generated response %s: output: ...``), serving_engine.py 0.2x-0.33
# at DEBUG (``Request %s JSON body: ...``, ``Request %s details: prompt: ...``).
CLIENT_HEADS: tuple[tuple[str, str], ...] = (
    ("request-log", r"Received request\b"),
    ("request-log", r"Added request\b"),
    ("request-log", r"Aborted request"),
    ("request-log", r"Finished request\b"),
    ("request-log", r"Generated response\b"),
    ("request-log", r"Abort(?:ing|ed)? requests?\b"),
    ("request-id", r"Request\s"),
    # V1's fatal-step dump (logging_utils/dump_input.py 0.9+): the scheduler output holds requests'
    # prompts and sampling params.
    ("engine-dump", r"Dumping (?:input data for V1 LLM engine|scheduler output for model execution|scheduler stats)"),
)
# vLLM's own messages that go on, after a fixed head, with a client's text or the model's output
# (which a prompt steers), read from the released source (0.6.6, 0.10.2, 0.32): the head is kept, the
# rest is never parsed nor split at an embedded logger prefix, and so is every following line that
# carries the same vLLM prefix (process, level, time to the second, file and line: the same logger
# call), which is how vLLM's NewLineFormatter writes the other lines of one message (a newline in the
# client's text, the traceback of ``logger.exception``). A head that quotes only a request id, with a
# traceback that is vLLM's own, is a "request-id" head: only its line is cut.
ECHO_HEADS: tuple[tuple[str, str], ...] = (
    # entrypoints/openai/protocol.py OpenAIBaseModel.__log_extra_fields__ (WARNING 0.6.6, 0.10.2;
    # entrypoints/serve/engine/protocol.py DEBUG 0.32): the request's unknown JSON keys.
    ("client-echo", "The following fields were present in the request but ignored: "),
    # serving_chat.py / serving_responses.py 0.6.6-0.10.2, chat_completion/serving.py 0.32: the
    # ErrorResponse quotes the request's model ("The model `%s` does not exist.").
    ("client-echo", "Error with model "),
    # serving_*.py 0.6.6-0.10.2 (logger.exception): the traceback of the request's own error (a chat
    # template's raise_exception(), the request's model in a ValueError).
    ("client-echo", "Error in preprocessing prompt inputs"),
    # entrypoints/chat_utils.py 0.10.2, renderers/mistral.py 0.32 (logger.exception), renderers/hf.py
    # 0.32: the chat template's exception (the template and what it quotes are the request's).
    ("client-echo", "An error occurred in `transformers` while applying chat template"),
    ("client-echo", "An error occurred in `mistral_common` while applying chat template"),
    ("client-echo", "Chat template rejected the request: "),
    # tool parsers 0.6.6+ (entrypoints/openai/tool_parsers/*, tool_parsers/*, parser/mistral.py 0.32):
    # the model's output or the exception parsing it (pydantic quotes the input value).
    ("client-echo", "Error in extracting tool call from response"),
    ("client-echo", "Error trying to handle streaming tool call"),
    # tool_parsers/utils.py 0.32: ast.dump() of the model's tool call.
    ("client-echo", "Non-JSON-representable constant in tool call arguments: "),
    ("client-echo", "Unsupported unary operand in tool call arguments: "),
    ("client-echo", "Unsupported AST node type in tool call arguments: "),
    ("client-echo", "Dict argument keys are not all literals: "),
    ("client-echo", "Tool call has non-simple function name: "),
    # entrypoints/openai/serving_models.py 0.10.2, openai/models/serving.py 0.32: a LoRA name (the
    # request's model) and path (load_lora_adapter), and the loader's exception.
    ("client-echo", "Failed to load LoRA '"),
    ("client-echo", "Loaded new LoRA adapter: name '"),
    ("client-echo", "Removed LoRA adapter: name '"),
    ("client-echo", "Resolved and loaded LoRA adapter '"),
    # structured outputs: v1/structured_output/__init__.py 0.32 (logger.exception: a request id, then
    # the grammar compiler's error on the request's schema), backend_guidance.py 0.10.2-0.32,
    # backend_xgrammar.py 0.10.2-0.32 (a request id and the model's token).
    ("client-echo", "Failed to compile grammar for request "),
    ("client-echo", "LLMatcher error: "),
    ("client-echo", "Failed to advance FSM for request "),
    # entrypoints/openai/api_server.py 0.10.2, serve/middleware/log_response.py 0.32 (the model's output).
    ("client-echo", "response_body={"),
    # entrypoints/chat_utils.py 0.6.6-0.10.2, renderers/chat_utils.py 0.32: a content part of the request.
    ("client-echo", "Skipping multimodal part '"),
    # serve/exception_handling/handlers/*.py 0.32 (with --log-error-stack): a request id; the
    # validation error's traceback quotes the request's values, the others' are vLLM's own.
    ("client-echo", "RequestValidationError caught. Request id: "),
    ("request-id", "Exception caught. Request id: "),
    ("request-id", "HTTPException caught. Request id: "),
    ("request-id", "Engine Exception caught. Request id: "),
)
CLIENT_HEADS += tuple((kind, re.escape(head)) for kind, head in ECHO_HEADS)
# Source files whose every message is the model's output or about it: vLLM's tool and reasoning
# parsers (``*_tool_parser.py``, ``*_reasoning_parser.py`` in entrypoints/openai/tool_parsers 0.6.6-0.10.2,
# tool_parsers/ and reasoning/ 0.10.2-0.32).
ECHO_FILES = ("_tool_parser.py", "_reasoning_parser.py")
CLIENT_KEYWORDS = ("Dumping input data for V1 LLM engine", "Dumping scheduler output", "Dumping scheduler stats", "dump_input.py",
                   *(head for kind, head in ECHO_HEADS if kind == "client-echo"))  # (their next lines are read by it)
def _value_heads() -> re.Pattern:
    """vLLM's messages that embed a client's or the model's value after a fixed head (a request
    id, a LoRA name, a tool call's arguments, a harmony message; data/vllm_client_echo.json,
    generated from vLLM's source by tools/gen_client_echo.py): the lines that vLLM's
    NewLineFormatter writes after such a head for a newline in the value are the value's."""
    from importlib.resources import files

    heads = set()
    try:
        data = json.loads(files("vllm_doctor").joinpath("data/vllm_client_echo.json").read_text())
    except (OSError, ValueError):
        data = {}
    for e in data.get("entries", []):
        head = " ".join(str(e.get("head", "")).split())
        if len(head) >= 6:
            pieces = re.split(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfig]|\{\}", head)  # an earlier value: any text
            heads.add(".{0,200}?".join(r"\s+".join(re.escape(w) for w in p.split(" ")) for p in pieces))
    return re.compile("(?:" + "|".join(sorted(heads, key=len, reverse=True) or ["(?!)"]) + ")")


VALUE_HEAD_RE = _value_heads()

# uvicorn's access log: ``INFO:     127.0.0.1:5000 - "GET /path HTTP/1.1" 200 OK`` (the level prefix
# may be missing or replaced by vLLM's own logger prefix; the client address is no quote).
ACCESS_RE = re.compile(r'(?:[A-Z]+:\s+)?[^"\s]{1,80}(?: \d{1,6})? - "(?:[A-Z]{3,9} |-")')
# The same head after a prefix no wrapper here knows (``kubectl logs --prefix``'s ``[pod/x/c] ``,
# stern's ``pod container ``, exported labels ``{app="vllm"} ``): the first `` - "`` of the line is
# uvicorn's (the client's path comes after it), preceded by the client address.
ACCESS_TAIL_RE = re.compile(r' - "(?:[A-Z]{3,9} |-")')
ACCESS_ADDR_RE = re.compile(r'(?:^|(?<=\s))[^"\s]{1,80}(?: \d{1,6})?$')


def _is_access(text: str) -> bool:
    """Whether ``text`` is a uvicorn access line, whatever prefix precedes its head."""
    i = text.find(' - "')
    return (i > 0 and ACCESS_TAIL_RE.match(text, i) is not None
            and ACCESS_ADDR_RE.search(text, max(0, i - 90), i) is not None)
CLIENT_RE = re.compile(
    r"\s*(?:" + "|".join(f"(?P<k{i}>{p})" for i, (_, p) in enumerate(CLIENT_HEADS)) + ")"
)
# The head of a client-text line right after vLLM's logger prefix, at byte level: such lines
# are skipped before decoding (they are most of a request-heavy log).
REQUEST_HEAD_RE = re.compile(rb"\] (?:Received request|Added request|Finished request|Aborted request|Generated response|Request \S)")
# A client's request id inside a vLLM message (``[shutdown] EngineCore: rejecting new request
# request_id=%s``, the KV-transfer connectors' ``kv_request_id=%s ...``): the message is read only
# up to it, since the id (X-Request-Id, verbatim) may hold anything, the rest of a line included.
CLIENT_FIELD_RE = re.compile(r"\b(?:kv_)?request_id=")
CRI_PARTIAL_RE = re.compile(rb"^\S{10,40} std(?:out|err) P ")
_CRI_P_MARK_RE = re.compile(rb" std(?:out|err) P ")  # what every CRI_PARTIAL_RE match holds


def client_head(text: str) -> str | None:
    """The kind of client-controlled line ``text`` is ("request-log", "request-id",
    "access-log"), or None. ``text`` starts after the process and logger prefixes."""
    m = CLIENT_RE.match(text)
    if m:
        return CLIENT_HEADS[int(m.lastgroup[1:])][0]
    if ' - "' in text and _is_access(text):  # (the substring test: what every access line holds)
        return "access-log"
    return None


def _cut_client_field(text: str) -> str:
    """``text`` up to a client's request id inside it (see :data:`CLIENT_FIELD_RE`)."""
    if "request_id=" in text:
        m = CLIENT_FIELD_RE.search(text)
        if m:
            return text[: m.end()]
    return text


def _head(text: str, kind: str | None = None) -> str:
    """The fixed head of a client-text line of ``kind``, without the client's part."""
    m = CLIENT_RE.match(text)
    if m:
        return m.group(0).strip()
    if kind == "client-echo":
        return "echo body"  # a line of a client-echo message after its head (see ECHO_HEADS)
    return "access log" if _is_access(text) else "dump body"


_ECHO_NAMES = tuple(f[:-3] for f in ECHO_FILES)  # the same files as logger names (JSON records)


def _file_kind(file: str) -> str | None:
    """The kind of every message written from vLLM's source ``file`` (as its logger prefix names
    it): "engine-dump" (the fatal-step dump), "client-echo" (a tool or reasoning parser:
    :data:`ECHO_FILES`) or None."""
    if file.endswith(ECHO_FILES):
        return "client-echo"
    return "engine-dump" if file.startswith("dump_input.py") else None


def prefilter_patterns(keywords) -> list[bytes]:
    """Regexes (bytes) for the keyword scan: each keyword as written and as it appears inside a
    JSON string (docker json-file, JSON log records: ``"`` -> ``\\"``, non-ASCII -> ``\\uXXXX``),
    and the pieces of a record split over lines (a CRI ``P`` line, a docker entry without its
    newline): they must reach the envelope to be joined, whatever the keyword they were cut in."""
    out: list[bytes] = []
    for kw in keywords:
        for form in {kw.encode(), json.dumps(kw)[1:-1].encode()}:
            out.append(re.escape(form))
    out.append(rb" std(?:out|err) P ")
    out.append(rb'(?:[^n]|[^\\]n)", ?"stream"')  # a docker entry whose log does not end with a newline
    return sorted(set(out))


@lru_cache(maxsize=8)
def _compiled_scan(keywords: tuple[str, ...], anchors: tuple[bytes, ...] = ()) -> tuple[list[bytes], re.Pattern, re.Pattern, object]:
    """What a :class:`KeywordScanner` of ``keywords`` scans with, built once per process (the
    Hyperscan compile takes about 0.4 s): the patterns, the keyword regex, the per-line regex, and
    the Hyperscan database (None: ``re`` is used); it reports each of ``anchors`` too (id 2 + its
    index, at its end), so that the rare anchor costs no pass of its own over a block."""
    patterns = prefilter_patterns(keywords)
    any_kw = b"(?:" + b"|".join(patterns) + b")"
    line_re = re.compile(any_kw + rb"[^\n]*")  # finditer: one match per line, to its end
    db = None
    try:
        import hyperscan  # type: ignore[import-not-found]

        cri_p = CRI_PARTIAL_RE.pattern + rb"[^\n]*$"  # (^: a line start, multi-line)
        exprs = [any_kw + rb"[^\n]*$", cri_p, *(re.escape(a) for a in anchors)]
        db = _hyperscan_db(exprs, [hyperscan.HS_FLAG_MULTILINE] * len(exprs))
    except Exception:  # noqa: BLE001 - any failure (missing, no CPU support) falls back to re
        db = None
    return patterns, re.compile(b"|".join(patterns)), line_re, db


def _hyperscan_db(exprs: list[bytes], flags: list[int]):
    """The Hyperscan block-mode database of ``exprs`` (ids 0..n-1). Its compiled form is kept in
    the user's cache ($XDG_CACHE_HOME or ~/.cache, then vllm-doctor/), so that the next process
    loads it in microseconds instead of compiling it again (about 0.25 s of CPU at each start of
    diagnose, of the sidecar and of each scan worker). A missing, unreadable, damaged or foreign
    (another Hyperscan, another CPU) file is compiled again; a cache that cannot be written is
    done without."""
    import hashlib

    import hyperscan  # type: ignore[import-not-found]

    version = hyperscan.__version__  # type: ignore[attr-defined]  # (the package has no stubs)
    key = hashlib.sha256(repr((version, exprs, flags)).encode()).hexdigest()[:32]
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-doctor" / f"scan-{key}.hsdb"
    try:
        blob = path.read_bytes()
        if hashlib.sha256(blob[32:]).digest() == blob[:32]:
            db = hyperscan.loadb(blob[32:], hyperscan.HS_MODE_BLOCK)
            hyperscan.Scratch(db)  # raises for a database built for another platform
            return db
    except Exception:  # noqa: BLE001 - no cache, or one that cannot serve: compile
        pass
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=flags)
    try:
        data = hyperscan.dumpb(db)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(hashlib.sha256(data).digest() + data)
        os.replace(tmp, path)  # whole or not at all, whoever else writes it at the same time
    except Exception:  # noqa: BLE001 - a read-only or full home: no cache
        pass
    return db


class KeywordScanner:
    """Finds the lines of a block of bytes that hold one of ``keywords``
    (:func:`vllm_doctor.parsers.records.keyword_scanner` gives the matcher table's): the offset where each such
    line ends (its ``\n``, or the end of the block), once per line; and the ends of the CRI
    ``P`` lines among them (:data:`CRI_PARTIAL_RE`).

    Uses Hyperscan (the ``hyperscan`` package, Intel's multi-pattern matcher: grep speed) when it
    imports, else Python's ``re`` (about 30 MB/s on a 2-core machine: correct, slower).
    ``backend`` says which. The keywords are one expression that runs on to the end of the line
    (``(?:kw1|kw2|...)[^\n]*$``, multi-line): Hyperscan reports an expression once per end
    offset, so a dense block costs one Python callback per candidate line, not one per keyword.
    ``regex`` finds the keywords themselves. ``near``: literals that count only within some lines
    after an anchor (``parsers.records.NEAR_KEYWORDS``), looked for there only.
    """

    def __init__(self, keywords, near=()) -> None:
        # literals that count only in the lines right after an anchor (see records.NEAR_KEYWORDS)
        self._near = tuple((anchor.encode(), lines, tuple({f for kw in kws for f in (kw.encode(), json.dumps(kw)[1:-1].encode())}))
                           for anchor, lines, kws in near)
        self.patterns, self.regex, self._line_re, self._db = _compiled_scan(tuple(keywords), tuple(a for a, _n, _k in self._near))
        self.backend = "re" if self._db is None else "hyperscan"
        self._scratch = None
        if self._db is not None:  # the database is shared; a scan's scratch space is not (the GIL is
            import hyperscan  # type: ignore[import-not-found]  # released while it scans)

            self._scratch = hyperscan.Scratch(self._db)

    def line_ends(self, block: bytes) -> tuple[list[int], set[int]]:
        """Sorted offsets where the lines of ``block`` that hold a keyword end (the offset of
        their ``\n``, or ``len(block)``), each once; and the set of those that end a CRI ``P``
        line (a piece of a record continued on the next line)."""
        cri_p: set[int] = set()
        if self._db is None:
            hits = [m.end() for m in self._line_re.finditer(block)]
            for m in _CRI_P_MARK_RE.finditer(block):  # then the whole line, as CRI_PARTIAL_RE does
                ls = block.rfind(b"\n", 0, m.start()) + 1
                le = block.find(b"\n", m.end())
                le = len(block) if le < 0 else le
                if CRI_PARTIAL_RE.match(block[ls:le]):
                    cri_p.add(le)
            anchored: list[tuple[int, int]] | None = None  # (the re backend: a search for each anchor)
        else:
            hits = []
            anchored = []  # (index of the anchor, where it ends), from the same scan
            append, add, seen = hits.append, cri_p.add, anchored.append

            def hit(i: int, _f: int, to: int, _fl: int, _c: object) -> None:
                if i == 0:
                    append(to)
                elif i == 1:
                    add(to)
                else:
                    seen((i - 2, to))

            self._db.scan(block, match_event_handler=hit, scratch=self._scratch)
            hits.sort()
        near = self._near_ends(block, anchored) if self._near and anchored != [] else None
        return (sorted(near.union(hits)) if near else hits), cri_p

    def _near_ends(self, block: bytes, anchored: list[tuple[int, int]] | None) -> set[int]:
        """The ends of the lines that hold one of an anchor's literals within its number of lines
        after it; ``anchored``: where the anchors end, as the scan reported them (None: search)."""
        out: set[int] = set()
        find = block.find
        for k, (anchor, n, kws) in enumerate(self._near):
            starts = (sorted(to - len(anchor) for j, to in anchored if j == k) if anchored is not None else None)
            i = (starts.pop(0) if starts else -1) if starts is not None else find(anchor)
            while i >= 0:
                le = find(b"\n", i)
                for _ in range(n):
                    if le < 0:
                        break
                    ls, le = le + 1, find(b"\n", le + 1)
                    e = len(block) if le < 0 else le
                    if any(find(kw, ls, e) >= 0 for kw in kws):
                        out.add(e)
                i = (starts.pop(0) if starts else -1) if starts is not None else find(anchor, i + len(anchor))
        return out


# Terminal escapes: OSC (``ESC ] ... BEL`` or ``ESC \\``: titles, hyperlinks), CSI (colours,
# cursor moves), other two-byte escapes; an OSC cut off by the end of the line is dropped too.
ANSI_RE = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\x1b")
# The left and right borders of a terminal UI's box (k9s ``│ line … │``) with the padding before the right one.
BOX_RE = re.compile(r"^[│┃] ?|\s*[│┃]\s*$")
# Markdown blockquote of a paste (``> ``, possibly nested).
QUOTE_RE = re.compile(r"^(?:> ?)+")
# journald: ``journalctl`` short (``Nov 30 10:00:00 host unit[pid]: msg``), short-precise and
# short-iso (``2026-11-30T10:00:00+0000 host unit[pid]: msg``) output.
JOURNAL_RE = re.compile(
    r"^(?:(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?))"
    r" [\w.-]+ [\w@./-]+\[\d+\]: "
)
# docker compose: ``service-1  | msg``.
COMPOSE_RE = re.compile(r"^[\w.-]+(?:-\d+)? *\| ")
# A supervisor's own tags between its timestamp and the vLLM line it relays: a level in brackets
# and/or a source name in parentheses (``[Info] (Process) (EngineCore pid=3043) ...``). Stripped
# only when a vLLM process prefix (``(Name pid=N)``) or logger prefix follows them, so that no
# text of vLLM's own is taken for a tag.
SUPERVISOR_RE = re.compile(
    r"^(?:\[[A-Za-z]{1,12}\] ?|\([A-Za-z][\w.-]{0,40}\) ?){1,4}"
    r"(?=\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:)"
)
CRI_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) (?P<stream>stdout|stderr) (?P<tag>[FP]) ?(?P<msg>.*)$",
    re.S,
)
ISO_PREFIX_RE = re.compile(
    r"^\[?(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?\s+"
)
# One process prefix; several may nest.
PROC_RE = re.compile(r"\(([A-Za-z][\w.-]*(?: [\w.=-]+)*?) pid=(\d+)(?:, ip=[^)]*)?\)\s?")
LEADING_PROCS_RE = re.compile(r"^\s*((?:\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+(?:, ip=[^)]*)?\)\s?)+)")
# vLLM's logger prefix. The level may be lost in a paste, the brackets exist from 0.8.
LOGGER_RE = re.compile(
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) )?"
    r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? "
    r"(?:\[?(?P<file>[\w.-]+(?:/[\w.-]+)*\.py|[\w.-]+(?:/[\w.-]+)*(?:/\.\.\.)?[\w.-]*):(?P<line>\d+)\] ?)?"
)
# The usual head of a vLLM line, in one match: at most one process prefix (PROC_RE), then the
# logger prefix with its level (LOGGER_RE). What _one does for such a line with its separate
# searches gives the same record (see Envelope._one).
VLLM_HEAD_RE = re.compile(
    r"(?:\((?P<proc>[A-Za-z][\w.-]*(?: [\w.=-]+)*?) pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s?)?"
    r"(?=(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) )" + LOGGER_RE.pattern
)
# A host program's level in brackets, padded or not (``[ WARNING]: ``, ``[INFO] ``), and Python
# logging's ``(%(filename)s:%(lineno)d)`` at the end of its format (see Envelope._one).
# or Python's default ``%(asctime)s - %(name)s - %(levelname)s - %(message)s`` (the time taken off before).
# or a pipe-separated ``| LEVEL | stream |`` (FastChat's workers: ``2023-12-27 11:25:36 | ERROR | stderr | ``).
HOST_LEVEL_RE = re.compile(r"(?:\[\s*(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*\]:?|- (?:[\w.]+ - )?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) -"
                           r"|\| (DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \|(?: [\w.-]+ \|)?)\s", re.I)
HOST_SRC_RE = re.compile(r"\s\(([\w.-]+\.py):(\d+)\)\s*$")
# A wrapper's label before vLLM's logger prefix: one word (a container, a pod, ``[pod/x/c]``) and a space.
LABEL_RE = re.compile(r"[A-Za-z\[][\w.\-/\[\]]{0,79} ")
# A logging config's own format for vLLM's records, its time taken off before: level, process id,
# then vLLM's ``[file.py:line]`` (``%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]``).
LEVEL_PID_SRC_RE = re.compile(r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (\d{1,10}) \[([\w.-]+\.py):(\d+)\] ?")
# uvicorn's own level prefix (``INFO:     Application startup complete.``).
UVICORN_LEVEL_RE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")
# A record boundary inside a line: optional process prefixes then a logger prefix with a level.
EMBEDDED_RE = re.compile(
    r"(?:\([A-Za-z][\w.-]*(?: [\w.=-]+)*? pid=\d+(?:, ip=[^)]*)?\)\s?)*"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\] ?"
)
# What every EMBEDDED_RE match (and every logger prefix not at a message start) holds: a level then
# a date. A search for it is fast (its first character is one of five letters), so the costly
# searches run only on the rare message that holds one.
LEVEL_DATE_RE = re.compile(r"(?:DEBUG|INFO|WARN|ERROR|CRITICAL)(?:ING)? \d\d-\d\d \d\d:\d\d:\d\d")
# What every LOGGER_RE match holds (its only mandatory part): where the first match can start.
LOGGER_DATE_RE = re.compile(r"\d\d-\d\d \d\d:\d\d:\d\d")
LOGGER_LEVEL_MAX = len("CRITICAL ")


class Record(NamedTuple):
    """One vLLM log message.

    lineno: 1-based line in the source; level: "INFO", ... or None; ts: epoch seconds (year
    inferred) or None; process: innermost process prefix name ("EngineCore_DP0") or None;
    pid: its pid or None; src: vLLM's ``file.py:123`` or None; msg: the message text.
    client: set for a line whose text a client controls (see :data:`CLIENT_HEADS`); its ``msg``
    is then only the fixed head (``Received request``), the payload is dropped here.

    Immutable (a named tuple: built in a tenth of the time of a frozen dataclass, one is built
    per candidate line).
    """

    lineno: int
    msg: str
    level: str | None = None
    ts: float | None = None
    process: str | None = None
    pid: int | None = None
    src: str | None = None
    client: str | None = None  # a client-text line ("request-log", ...): msg is its fixed head only


_new = tuple.__new__  # _new(Record, (8 fields)): a Record without the keyword-argument handling


class LogClock:
    """Turns vLLM's year-less ``MM-DD HH:MM:SS`` into epoch seconds and keeps order across a
    new year: when the month goes back by six or more (December -> January) the year advances.
    Small backward steps (lines of several processes, pastes regrouped by hand) do not.
    Times are taken as UTC (vLLM prints local time without a zone; only differences matter).

    base_year: the year of the reference time (a container timestamp when there is one, else the
    file's modification time, else today); ref_month: that time's month (a first line in a later
    month belongs to the year before).
    """

    def __init__(self, base_year: int | None = None, ref_month: int | None = None) -> None:
        now = time.gmtime()
        self.year = base_year or now.tm_year
        # The month of the reference time (file modification, or now): a first line in a later
        # month than that was written the year before (a December log read in January).
        self.ref_month = ref_month if ref_month is not None else (None if base_year else now.tm_mon)
        self._year_fixed = False
        self._last_month: int | None = None
        self._last_key: tuple | None = None  # (year, month, day, hms) of the last conversion
        self._last_epoch: float | None = None
        # The (month, day, hms) tuple of the last conversion when the envelope's head cache asked
        # for it (see Envelope._fast): the same object again gives the same epoch, since a repeat
        # of the last month moves no year. Any other call forgets it.
        self._last_mdh: tuple | None = None

    def set_year(self, year: int) -> None:
        """Adopt the year of a container timestamp (authoritative)."""
        self.year = year
        self._year_fixed = True
        self._last_mdh = None

    def to_epoch(self, month: int, day: int, hms: str) -> float | None:
        """Epoch seconds of ``month-day hms`` in the inferred year, or None if invalid."""
        self._last_mdh = None
        if self._last_month is None and not self._year_fixed and self.ref_month is not None and month > self.ref_month:
            self.year -= 1
        if self._last_month is not None and not self._year_fixed and month + 6 <= self._last_month:
            self.year += 1
        self._last_month = month
        key = (self.year, month, day, hms)
        if key == self._last_key:  # lines come many to a second
            return self._last_epoch
        try:
            h, m, s = (int(x) for x in hms.split(":"))
            t = float(calendar.timegm((self.year, month, day, h, m, s, 0, 0, 0)))
        except (ValueError, OverflowError):
            t = None
        self._last_key, self._last_epoch = key, t
        return t


# The epoch seconds a datetime can hold (years 1-9999): a JSON record's numeric time outside
# them (Infinity, NaN, 1e400) is no time (it made the windows' arithmetic raise).
_MIN_EPOCH, _MAX_EPOCH = -62135596800, 253402300800


def _parse_iso(ts: str) -> datetime | None:
    ts = ts.replace(",", ".").replace(" ", "T")
    if ts.endswith("Z"):
        ts = ts[:-1] + "+00:00"
    m = re.match(r"^(.*?\.\d{1,6})\d*(.*)$", ts)  # Python takes at most 6 fraction digits
    if m:
        ts = m.group(1) + m.group(2)
    try:
        dt = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


class Envelope:
    """Stateful unwrapper for one log source: bytes lines in, :class:`Record` objects out.

    Usage: ``for rec in env.records(lineno, raw_line_bytes): ...``. It keeps the state that
    spans lines: CRI partial lines waiting for their ``F`` line, the log clock, and the last
    timestamp (carried to records that have none, so windows still work).
    """

    def __init__(self, clock: LogClock | None = None) -> None:
        self.clock = clock or LogClock()
        self._partial: list[str] = []
        self._partial_lineno = 0
        self._partial_last = 0
        self._partial_bytes = 0
        # CRI and docker keep stdout and stderr apart: the pieces of the other stream's line
        # held while a line of this one is read (stream -> pieces, first line, last line, bytes)
        self._partial_stream: str | None = None
        self._stash: dict[str, tuple[list[str], int, int, int]] = {}
        self.last_ts: float | None = None
        # The canonical vLLM head (``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] ``), parsed,
        # by its bytes: it repeats for every line of a process within a second (see _fast_head).
        self._heads: dict[str, tuple | bool] = {}
        self._last_head: str | None = None
        self._last_h: tuple | bool = False
        # The vLLM prefixes ``(level, src, process, pid, (month, day, hms))`` of the client-echo
        # messages seen (see ECHO_HEADS): a line with one of them is a line of that message.
        self._echo: dict[tuple, None] = {}
        # A label a wrapper writes before every line (``kubectl logs --prefix``, a container's name):
        # learnt from a line where vLLM's logger prefix follows it, taken off the lines without one
        # (a traceback vLLM's process wrote to stderr).
        self._label: str | None = None
        # The message a line ending in "\r" goes on with (vLLM's NewLineFormatter writes each
        # newline of a message as "\r\n" + the message's prefix): (its last line's number, the
        # vLLM prefix, whether the message's text is a client's), and the prefix of the line read.
        self._cont: tuple[int, str, bool] | None = None
        self._prefix: str | None = None

    def records(self, lineno: int, raw: bytes) -> list[Record]:
        """Records in one raw line (see :meth:`_records`). A line that follows a line ending in
        "\r" with the same vLLM prefix (process, level, time, file and line) is the next line of
        that message, as vLLM's NewLineFormatter writes a newline inside it: when the message is
        a client's text (a client head, or a vLLM message that embeds a client's or the model's
        value: :data:`VALUE_HEAD_RE`), the line is the client's text too, whatever it holds."""
        cont = self._cont
        cr = raw[-1:] == b"\r" or (raw[:1] == b"{" and b'\\r\\n"' in raw)
        if cont is None and not cr:
            return self._records(lineno, raw)
        self._prefix = None
        recs = self._records(lineno, raw)
        if not recs:
            if not self._partial:
                self._cont = None
            return recs
        prefix = self._prefix
        client = None
        if cont is not None:
            self._cont = None
            if prefix is not None and prefix == cont[1] and recs[0].lineno == cont[0] + 1:
                client = cont[2]
                if client:
                    recs = [r if r.client else r._replace(msg="echo body", client="client-echo") for r in recs]
        if cr and prefix is not None:
            if client is None:
                first = recs[0]
                client = first.client is not None or VALUE_HEAD_RE.match(first.msg) is not None
            self._cont = (lineno, prefix, client)
        return recs

    def _records(self, lineno: int, raw: bytes) -> list[Record]:
        """Records in one raw line (usually one; several when records were glued together).

        Two fast paths give the record of the commonest lines with fewer steps: a line that
        starts with vLLM's head and no wrapper (the head parsed once, then cached), and a line
        with neither a wrapper nor a prefix (a traceback line, an exception). Each takes a line
        only when every check of the general path (:meth:`_unwrap`) would end as it does, the
        client-text checks included; anything else goes the general way. (The text is tested
        as str: a one-character ``in`` is a memchr, where bytes pay a buffer look-up.)"""
        text = raw.decode("utf-8", "replace")
        if self._partial or "\x1b" in text or self._label is not None and text.startswith(self._label):
            return self._unwrap(lineno, text)
        line = text
        if "\r" in line:
            if line.find("\r") != len(line) - 1:
                return self._unwrap(lineno, text)
            line = line[:-1]  # a CRLF line end
        h = None
        lh = self._last_head  # the head of the last line that had one: most often this one's too
        if lh is not None and line.startswith(lh):
            h = self._last_h
            i = len(lh) - 2
            kind = 1
        else:
            kind = _FIRST.get(line[:1])
            if kind is None:
                return self._unwrap(lineno, text)
            if kind == 1:  # "(" or a level's initial: vLLM's head?
                i = line.find("]")
                if i > 0 and line[i + 1 : i + 2] == " ":
                    head = line[: i + 2]
                    h = self._heads.get(head)
                    if h is None:
                        h = self._fast_head(head)
                    if h:
                        self._last_head, self._last_h = head, h
        if h:
            if self._prefix is None:
                self._prefix = line[: i + 2]
            # _vllm and _split, for a line with a cached head h
            msg = line[i + 2 :]
            c = msg[:1]
            if c.isspace():
                body = msg.lstrip()
                c = body[:1]
            else:
                body = msg
            if c == "(":
                return self._unwrap(lineno, text)  # a process prefix after the logger prefix (0.31+)
            level, src, process, pid, mdh, hkind = h
            kind = (client_head(msg) if (((w := _CLIENT_BY_FIRST.get(c)) is not None and body.startswith(w))
                                         or ('"' in msg and ' - "' in msg)) else None)
            if kind is None:
                if hkind:
                    kind = hkind  # the dump's body, a parser's file, a line of a client-echo message
                else:
                    if "=" in msg and "request_id=" in msg:
                        msg = _cut_client_field(msg)
                    if "-" in msg and ":" in msg and _has_level(msg) and LEVEL_DATE_RE.search(msg):
                        return self._unwrap(lineno, text)  # glued records
            clock = self.clock
            if clock._last_mdh is mdh:
                ts = clock._last_epoch
            else:
                ts = clock.to_epoch(*mdh)
                clock._last_mdh = mdh
            if ts is None:
                ts = self.last_ts
            else:
                self.last_ts = ts
            if kind:
                if kind == "client-echo" and hkind is None:
                    self._echoed(h[:5])  # a client-echo head: the next lines with this prefix are its own
                return [_new(Record, (lineno, _head(msg, kind), level, ts, process, pid, src, kind))]
            return [_new(Record, (lineno, msg, level, ts, process, pid, src, None))]
        if kind == 1:
            if line[:1] == "(":
                return self._unwrap(lineno, text)
        # _one and _split, for a line with no wrapper and no prefix: its text, the last time
        body = line.lstrip() if kind == 3 else line
        if (body[:1] == "(" or body.startswith(_NOT_PLAIN_BY_FIRST.get(body[:1], ()))
                or ("|" in line and "| " in line) or ('"' in line and ' - "' in line)):
            return self._unwrap(lineno, text)  # a process prefix, a level, a client head, a journald date, compose, access log
        msg = _cut_client_field(line) if "=" in line else line
        if "-" in line and ":" in line and (_logger_prefix(line) is not None
                                            or (_has_level(msg) and LEVEL_DATE_RE.search(msg))):
            return self._unwrap(lineno, text)  # a logger prefix inside (after glued text, glued records)
        return [_new(Record, (lineno, msg, None, self.last_ts, None, None, None, None))]

    def _fast_head(self, head: str) -> tuple | bool:
        """Parse ``head`` (a line up to its first ``"] "``) if it is exactly what VLLM_HEAD_RE
        matches at the start of the line (a match ends at the first ``"]"`` that is not inside a
        process prefix, so it is then the same match on the whole line), else False; cached
        (bounded: cleared at 1024 heads)."""
        hm = VLLM_HEAD_RE.match(head)
        h: tuple | bool = False
        if hm is not None and hm.end() == len(head) and hm.group("file"):
            level = hm.group("level")
            src = f"{hm.group('file')}:{hm.group('line')}"
            process = hm.group("proc")
            h = ("WARNING" if level == "WARN" else level, src, process,
                 int(hm.group("pid")) if process is not None else None,
                 (int(hm.group("mon")), int(hm.group("day")), hm.group("hms")))
            h += (_file_kind(hm.group("file")) or ("client-echo" if h in self._echo else None),)
        if len(self._heads) >= 1024:
            self._heads.clear()
        self._heads[head] = h
        return h

    def _echoed(self, key: tuple) -> None:
        """Remember the vLLM prefix ``key`` of a client-echo message's head (see :data:`ECHO_HEADS`),
        in the cached heads too (:meth:`_fast_head`). Bounded: the oldest go first."""
        if key in self._echo:
            return
        if len(self._echo) >= MAX_ECHO_PREFIXES:
            old = next(iter(self._echo))
            del self._echo[old]
            self._mark_heads(old, None)
        self._echo[key] = None
        self._mark_heads(key, "client-echo")

    def _mark_heads(self, key: tuple, kind: str | None) -> None:
        """The cached heads with vLLM's prefix ``key``: of ``kind`` unless their file has one."""
        def marked(h):
            return key + (_file_kind(h[1].rpartition(":")[0]) or kind,) if h and h[:5] == key else h

        for head, h in self._heads.items():
            self._heads[head] = marked(h)
        self._last_h = marked(self._last_h)

    def _unwrap(self, lineno: int, text: str) -> list[Record]:
        """:meth:`records`, the general way (``text``: the line decoded): wrappers, prefixes,
        glued records."""
        if text.endswith("\r"):
            text = text[:-1]
        if self._label is not None and text.startswith(self._label):
            text = text[len(self._label):]  # the wrapper's label learnt from a line with vLLM's prefix
        if "\x1b" in text:
            text = ANSI_RE.sub("", text)
        out: list[Record] = []
        if self._partial and lineno != self._partial_last + 1:
            out = self.flush()  # a partial line whose continuation never came
        outer_ts: float | None = None
        for _ in range(4):  # wrappers nest: a quoted paste of journald around CRI around JSON, ...
            first = text[:1]
            if first in "│┃":  # a terminal UI's box around each line (k9s): its borders and right padding
                text = BOX_RE.sub("", text)
                continue
            if first == ">":  # a markdown blockquote (a paste)
                text = QUOTE_RE.sub("", text, 1)
                continue
            if first == "{":
                try:
                    obj = json.loads(text)
                except ValueError:
                    break
                if isinstance(obj, dict) and "log" in obj:  # docker json-file
                    dt = _parse_iso(str(obj.get("time", "")))
                    if dt:
                        outer_ts = dt.timestamp()
                        self.clock.set_year(dt.year)
                    log_text = str(obj.get("log", ""))
                    self._switch(str(obj.get("stream", "")), lineno)
                    if not log_text.endswith("\n"):  # docker splits lines over 16 KiB: join the parts
                        self._hold(lineno, log_text)
                        return out
                    text = self._joined(log_text.rstrip("\n").rstrip("\r"))
                    lineno = self._joined_lineno(lineno)
                    self._unstash(lineno)
                    if "\x1b" in text:
                        text = ANSI_RE.sub("", text)
                    continue
                if isinstance(obj, dict) and ("message" in obj or "msg" in obj):
                    return out + self._json_record(lineno, obj, outer_ts)
                break
            if first.isdigit() or first == "[":
                m = CRI_RE.match(text)
                if m:
                    dt = _parse_iso(m.group("ts"))
                    if dt:
                        outer_ts = dt.timestamp()
                        self.clock.set_year(dt.year)
                    self._switch(m.group("stream"), lineno)
                    if m.group("tag") == "P":
                        self._hold(lineno, m.group("msg"))
                        return out
                    text = self._joined(m.group("msg"))
                    lineno = self._joined_lineno(lineno)
                    self._unstash(lineno)
                    continue
            m = JOURNAL_RE.match(text) if first.isalnum() else None
            if m:
                if m.group("iso"):
                    dt = _parse_iso(m.group("iso"))
                    if dt:
                        outer_ts = dt.timestamp()
                        self.clock.set_year(dt.year)
                text = text[m.end():]
                continue
            if first.isdigit() or first == "[":
                m = ISO_PREFIX_RE.match(text)
                if m:
                    dt = _parse_iso(m.group("ts"))
                    if dt:
                        outer_ts = dt.timestamp()
                        self.clock.set_year(dt.year)
                    text = text[m.end():]
                    continue
            m = COMPOSE_RE.match(text) if first.isalnum() and "| " in text else None
            if m:
                text = text[m.end():]
                continue
            m = SUPERVISOR_RE.match(text) if first in "[(" else None
            if m:
                text = text[m.end():]
                continue
            break
        if "\r" in text:  # tqdm redraws: each segment is its own record
            for seg in text.split("\r"):
                if seg.strip():
                    recs = self._split(lineno, seg, outer_ts)
                    out.extend(recs)
                    if recs and recs[-1].client:
                        break  # the rest of the line is the client's text
            return out
        return out + self._split(lineno, text, outer_ts)

    def _switch(self, stream: str, lineno: int) -> None:
        """Make the held pieces of ``stream`` (stdout, stderr) the current ones: a line of the
        other stream inside a split line is its own line, never joined to the pieces."""
        if stream == self._partial_stream:
            return
        if self._partial and len(self._stash) < 4:
            self._stash[self._partial_stream or ""] = (self._partial, self._partial_lineno, lineno, self._partial_bytes)
        elif self._partial:
            self._stash.clear()
        self._partial, self._partial_lineno, self._partial_last, self._partial_bytes = self._stash.pop(stream, ([], 0, 0, 0))
        self._partial_stream = stream

    def _unstash(self, lineno: int) -> None:
        """After a whole line: the other stream's held pieces are current again (they go on
        after this line)."""
        if not self._partial and self._stash:
            stream, (parts, first, _, size) = self._stash.popitem()
            self._partial, self._partial_lineno, self._partial_last, self._partial_bytes = parts, first, lineno, size
            self._partial_stream = stream

    def _hold(self, lineno: int, part: str) -> None:
        """Keep a partial line (CRI ``P``, a docker entry without its newline) for the next line."""
        if not self._partial:
            self._partial_lineno = lineno
        self._partial_last = lineno
        if self._partial_bytes < 1 << 20:
            self._partial.append(part)
            self._partial_bytes += len(part)

    def _joined(self, text: str) -> str:
        if not self._partial:
            return text
        return "".join(self._partial) + text

    def _joined_lineno(self, lineno: int) -> int:
        if not self._partial:
            return lineno
        lineno = self._partial_lineno
        self._partial = []
        self._partial_bytes = 0
        return lineno

    def _json_record(self, lineno: int, obj: dict, outer_ts: float | None = None) -> list[Record]:
        """A JSON log record (VLLM_LOGGING_CONFIG_PATH with a JSON formatter, vLLM 0.33's
        JSON_FORMAT, python-json-logger): message, level, time and file taken by their usual keys."""
        msg = str(obj.get("message", obj.get("msg", ""))).rstrip("\n")
        level = obj.get("levelname") or obj.get("level")
        level = str(level).upper() if level else None
        ts = None
        for key in ("timestamp", "time", "asctime", "@timestamp"):
            if key in obj:
                v = obj[key]
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    # epoch seconds; a number no clock gives (Infinity, NaN, 1e400, true) is no time
                    ts = float(v) if _MIN_EPOCH < v < _MAX_EPOCH else None
                else:
                    dt = _parse_iso(str(v))
                    if dt:
                        ts = dt.timestamp()
                    else:
                        m = re.match(r"^(\d\d)-(\d\d) (\d\d:\d\d:\d\d)", str(v))
                        if m:
                            ts = self.clock.to_epoch(int(m.group(1)), int(m.group(2)), m.group(3))
                break
        src = f"{obj['filename']}:{obj.get('lineno', 0)}" if obj.get("filename") else "json"
        if ts is None:
            ts = outer_ts if outer_ts is not None else self.last_ts
        if ts is not None:
            self.last_ts = ts
        process = obj.get("processName") if isinstance(obj.get("processName"), str) else None
        pid = obj.get("process") if isinstance(obj.get("process"), int) else None
        pm = LEADING_PROCS_RE.match(msg) if msg[:1] == "(" else None
        bare = msg[pm.end():] if pm else msg
        name = obj.get("name")
        kind = (client_head(bare) or _file_kind(src.rpartition(":")[0])
                or ("client-echo" if isinstance(name, str) and name.endswith(_ECHO_NAMES) else None))
        if kind:  # the whole message, newlines included (and its exc_info), is the client's text
            return [Record(lineno, _head(bare, kind), level, ts, process, pid, src, kind)]
        if "\n" in msg and VALUE_HEAD_RE.match(bare):
            msg = msg.partition("\n")[0]  # the lines after a client's or the model's value are that value's
        if pm and "\n" not in msg:  # a relayed line of a vLLM process: "(EngineCore pid=N) text"
            procs = PROC_RE.findall(pm.group(1))
            if procs and process is None:
                process, pid = procs[-1][0], int(procs[-1][1])
            msg = bare
        out = []
        for part in _cut_client_field(msg).split("\n"):  # a traceback inside one JSON record
            out.append(Record(lineno, part, level, ts, process, pid, src))
        exc = obj.get("exc_info") or obj.get("exception")
        if isinstance(exc, str):
            out.extend(Record(lineno, part, level, ts, None, None, src) for part in exc.split("\n") if part)
        return out

    def _split(self, lineno: int, text: str, outer_ts: float | None) -> list[Record]:
        first = self._one(lineno, text, outer_ts)
        if first.client:
            return [first]
        # Glued records: a second logger prefix inside the message.
        msg = first.msg
        if not _has_level(msg) or LEVEL_DATE_RE.search(msg) is None:
            return [first]  # no embedded logger prefix (each holds a level and a date)
        cuts = [m.start() for m in EMBEDDED_RE.finditer(msg)]
        if not cuts:
            return [first]
        out = []
        head = msg[: cuts[0]].rstrip()
        if head:
            out.append(Record(lineno, head, first.level, first.ts, first.process, first.pid, first.src))
        for i, start in enumerate(cuts):
            end = cuts[i + 1] if i + 1 < len(cuts) else len(msg)
            rec = self._one(lineno, msg[start:end].rstrip(), outer_ts)
            if rec.client:  # the rest of the line is the client's text: no further cut
                out.append(self._one(lineno, msg[start:].rstrip(), outer_ts))
                break
            out.append(rec)
        return out

    def _one(self, lineno: int, text: str, outer_ts: float | None) -> Record:
        orig = text
        hm = VLLM_HEAD_RE.match(text)
        if hm is not None:
            rest = text[hm.end():]
            if rest.lstrip()[:1] != "(":  # not a second process prefix (0.31+ order): the usual line
                return self._vllm(lineno, hm, rest, outer_ts)
        process = None
        pid = None
        m = LEADING_PROCS_RE.match(text)
        if m:
            procs = PROC_RE.findall(m.group(1))
            if procs:
                process, pid_s = procs[-1]
                pid = int(pid_s)
            text = text[m.end():]
        level = src = None
        ts = outer_ts
        file = None
        kind = client_head(text)
        # The logger prefix must start the message, or follow non-vLLM text glued before it
        # (tqdm): accept it anywhere only when a level is present, and never inside client text.
        lm = None if kind else _logger_prefix(text)
        if lm and (lm.start() == 0 or (lm.group("level") and lm.start() > 0 and not client_head(text[: lm.start()]))):
            # Text glued before the prefix (tqdm progress) is never a vLLM message: dropped.
            if lm.start() > 0 and process is None and LABEL_RE.fullmatch(text, 0, lm.start()):
                self._label = text[: lm.start()]
            level = lm.group("level") or None
            if level == "WARN":
                level = "WARNING"
            if self._prefix is None:  # the line up to the logger prefix's end, the process prefix included
                self._prefix = orig[: len(orig) - len(text) + lm.end()]
            src = f"{lm.group('file')}:{lm.group('line')}" if lm.group("file") else "?"
            mdh = (int(lm.group("mon")), int(lm.group("day")), lm.group("hms"))
            t = self.clock.to_epoch(*mdh)
            if ts is None:
                ts = t
            text = text[lm.end():]
            # A process prefix may also follow the logger prefix in 0.31+ formatter order.
            m2 = LEADING_PROCS_RE.match(text)
            if m2 and process is None:
                procs = PROC_RE.findall(m2.group(1))
                if procs:
                    process, pid_s = procs[-1]
                    pid = int(pid_s)
                text = text[m2.end():]
            kind = client_head(text)
            file = lm.group("file")
        elif not kind and text[:1] in "DIWEC":
            um = UVICORN_LEVEL_RE.match(text)
            pm = None if um else LEVEL_PID_SRC_RE.match(text)
            if pm:
                level = "WARNING" if pm.group(1) == "WARN" else pm.group(1)
                if pid is None:
                    pid = int(pm.group(2))
                file = pm.group(3)
                src = f"{file}:{pm.group(4)}"
                mdh = None  # (its date is the time taken off before)
                text = text[pm.end():]
                kind = client_head(text)
            elif um:
                level = um.group(1)
                text = text[um.end():]
        elif not kind and text[:1] in "[-|":
            # a host program's logging format around vLLM's messages: its level in brackets (padded
            # to a width: ``[ WARNING]: ``) after its own time (taken off as a wrapper before), and
            # Python's ``(file.py:line)`` at the end (an evaluation harness re-logging vLLM's records)
            hm = HOST_LEVEL_RE.match(text)
            if hm:
                level = (hm.group(1) or hm.group(2) or hm.group(3)).upper()
                if level == "WARN":
                    level = "WARNING"
                text = text[hm.end():]
                fm = HOST_SRC_RE.search(text)
                if fm:
                    src = f"{fm.group(1)}:{fm.group(2)}"
                    text = text[: fm.start()]
                kind = client_head(text)
        # Lines with no logger prefix (print(), tracebacks from multiprocessing, pastes without a
        # prefix) keep their text as it is.
        if ts is None:
            ts = self.last_ts
        else:
            self.last_ts = ts
        if file and kind is None:
            kind = _file_kind(file)
        if file and (kind == "client-echo" or self._echo and kind is None):
            kind = self._prefix_kind(kind, file, (level, src, process, pid, mdh))
        if kind:
            return Record(lineno, _head(text, kind), level, ts, process, pid, src, kind)
        return Record(lineno, _cut_client_field(text), level, ts, process, pid, src)

    def _vllm(self, lineno: int, hm: re.Match, text: str, outer_ts: float | None) -> Record:
        """:meth:`_one` for a line that starts with VLLM_HEAD_RE (``hm``; ``text`` the message
        after it), in one match instead of its separate searches: the same record. (No client
        head can start where a logger prefix does, so the first look for one is skipped.)"""
        if self._prefix is None:
            self._prefix = hm.string[: hm.end()]
        level = hm.group("level")
        if level == "WARN":
            level = "WARNING"
        file = hm.group("file")
        src = f"{file}:{hm.group('line')}" if file else "?"
        t = self.clock.to_epoch(int(hm.group("mon")), int(hm.group("day")), hm.group("hms"))
        ts = t if outer_ts is None else outer_ts
        process = hm.group("proc")
        pid = int(hm.group("pid")) if process is not None else None
        kind = client_head(text)
        if ts is None:
            ts = self.last_ts
        else:
            self.last_ts = ts
        if file and kind is None:
            kind = _file_kind(file)
        if file and (kind == "client-echo" or self._echo and kind is None):
            kind = self._prefix_kind(kind, file, (level, src, process, pid, (int(hm.group("mon")), int(hm.group("day")), hm.group("hms"))))
        if kind:
            return Record(lineno, _head(text, kind), level, ts, process, pid, src, kind)
        return Record(lineno, _cut_client_field(text), level, ts, process, pid, src)

    def _prefix_kind(self, kind: str | None, file: str, key: tuple) -> str | None:
        """The kind of a message written from ``file`` with vLLM's prefix ``key`` (``(level, src,
        process, pid, (month, day, hms))``), of ``kind`` by its text and its file (None or
        "client-echo"): "client-echo" when it repeats a client-echo message's prefix; a client-echo
        head's prefix is remembered (not a parser file's: every line of those is known by its file)."""
        if kind is None:
            return "client-echo" if key in self._echo else None
        if _file_kind(file) is None:
            self._echoed(key)
        return kind

    def flush(self) -> list[Record]:
        """Records still held (a CRI partial line with no final ``F`` line), of each stream."""
        out: list[Record] = []
        while True:
            if self._partial:
                text = "".join(self._partial)
                self._partial = []
                self._partial_bytes = 0
                out += self._split(self._partial_lineno, text, self.last_ts)
            if not self._stash:
                return out
            self._unstash(0)


# For Envelope.records: the kind of a line by its first character. 1: it may start vLLM's head (a
# process prefix, a level); 2: no wrapper can start with it (not a digit, "[", "{", ">", "(");
# 3: a space or a tab. Absent (the general path): the rest (digits, brackets, control bytes,
# non-ASCII).
_FIRST = {chr(c): 2 for c in range(0x21, 0x7F) if chr(c) not in "0123456789[{>("}
_FIRST.update({"(": 1, "D": 1, "I": 1, "W": 1, "E": 1, "C": 1, " ": 3, "\t": 3})
# What every CLIENT_HEADS pattern starts with (the echo heads by a shorter prefix: fewer words to
# test on each line; :func:`client_head` then tells).
_CLIENT_WORDS = ("Received request", "Added request", "Aborted request", "Finished request",
                 "Generated response", "Abort", "Request", "Dumping",
                 "The following fields", "Error ", "An error occurred in", "Chat template rejected", "Non-JSON-representable",
                 "Unsupported ", "Dict argument", "Tool call has", "Failed to ", "Loaded new LoRA", "Removed LoRA",
                 "Resolved and loaded LoRA", "LLMatcher error", "response_body=", "Skipping multimodal", "Exception caught",
                 "HTTPException caught", "Engine Exception")
assert all(head.startswith(_CLIENT_WORDS) for _, head in ECHO_HEADS)
# What no fast-path plain line starts with: a level (vLLM's prefix, uvicorn's), a client head,
# a month (journald).
_NOT_PLAIN = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL", *_CLIENT_WORDS,
              "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _by_first(words: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``words`` by their first character: ``text.startswith(d.get(text[:1], ()))`` is
    ``text.startswith(words)`` at the cost of the few words of that character."""
    out: dict[str, tuple[str, ...]] = {}
    for w in words:
        out[w[0]] = out.get(w[0], ()) + (w,)
    return out


_CLIENT_BY_FIRST = _by_first(_CLIENT_WORDS)
_NOT_PLAIN_BY_FIRST = _by_first(_NOT_PLAIN)
MAX_ECHO_PREFIXES = 64  # client-echo prefixes remembered (their lines come right after the head)


def _has_level(text: str) -> bool:
    """Whether ``text`` holds a level name as LEVEL_DATE_RE needs it (substring tests: fast)."""
    return "INFO " in text or "WARN" in text or "ERROR " in text or "DEBUG " in text or "CRITICAL " in text


def _logger_prefix(text: str) -> re.Match | None:
    """``LOGGER_RE.search(text, 0, 4096)``, fast: a match holds a date (LOGGER_DATE_RE) and
    starts at most a level's length before it, so the search starts there; most messages hold
    no date at all and cost one fast scan."""
    dm = LOGGER_DATE_RE.search(text, 0, 4096)
    if dm is None:
        return None
    return LOGGER_RE.search(text, max(0, dm.start() - LOGGER_LEVEL_MAX), 4096)


def _is_partial(line: bytes) -> bool:
    """A line whose record continues on the next line: a CRI ``P`` line, or a docker json-file
    entry whose ``log`` does not end with a newline (docker cuts lines over 16 KiB)."""
    if CRI_PARTIAL_RE.match(line):
        return True
    if line.startswith(b'{"log":'):
        i = line.rfind(b'"stream"')
        if i < 0:
            return False
        head = line[:i].rstrip(b", ")  # ... the log value's closing quote
        return head.endswith(b'"') and not head[:-1].endswith(b"\\n")
    return False


MAX_CR_LINES = 64  # lines of one message read back from a candidate line (candidate_spans)


def _ends_in_cr(buf: bytes, start: int, nl: int) -> bool:
    """Whether the line of ``buf`` that ends at ``nl`` (a newline's offset) ends in "\r", as
    vLLM's NewLineFormatter ends every line of a message but its last (in a docker json-file
    entry: ``\r\n"`` at the end of its ``log``)."""
    if nl <= start:
        return False
    last = buf[nl - 1]
    if last == 13:
        return True
    if last != 125:  # "}"
        return False
    ls = buf.rfind(b"\n", start, nl) + 1 or start
    return buf[ls] == 123 and buf.find(b'\\r\\n"', ls, nl) >= 0


def _stream_of(buf: bytes, ls: int, le: int) -> int:
    """The stream of a CRI or docker json-file line (1: stdout, 2: stderr, 0: neither)."""
    if buf[ls:ls + 1] == b"{":
        i = buf.rfind(b'"stream":', ls, le)
        if i < 0:
            return 0
        v = buf[i + 9:i + 18].lstrip()
        return 2 if v.startswith(b'"stderr"') else 1 if v.startswith(b'"stdout"') else 0
    i = buf.find(b" std", ls, min(le, ls + 48))
    return 0 if i < 0 else (2 if buf[i + 4:i + 8] == b"err " else 1 if buf[i + 4:i + 8] == b"out " else 0)


def candidate_spans(scanner: KeywordScanner, buf: bytes, start: int, end: int,
                    max_line: int = 65536, carry: bool = False) -> tuple[array, array, array, int, bool]:
    """The lines of ``buf[start:end]`` (complete lines, ``\n``-separated: ``end`` is the offset
    of a ``\n`` or ``len(buf)``) that a parser could match, as offsets, not copies:
    ``(starts, ends, indexes, number of lines, carry)`` where
    ``buf[starts[k]:ends[k]]`` is the k-th candidate line (cut to ``max_line`` bytes) and
    ``indexes[k]`` its index from 0 among the lines of the span. Three arrays of integers
    whatever the number of lines: no object per line is kept.

    A record split over several lines (CRI ``P`` lines, docker's 16 KiB pieces) is kept whole:
    every line of it is returned when one is (``carry``: the last line returned was such a
    piece, so the first line of the next block continues it). Request-logging lines (user
    prompts) are skipped by their head. Pure: the parallel reader of ``diagnose`` runs it in
    worker processes on byte ranges of one file.

    Per line, only what may be true is tested: where the next request head in the block is
    (REQUEST_HEAD_RE, searched again only once passed) tells which lines can be request lines;
    the scanner tells the CRI ``P`` lines; a docker piece starts with ``{``."""
    starts, ends, idxs = array("q"), array("q"), array("q")
    s_append, e_append, i_append = starts.append, ends.append, idxs.append
    find, rfind, count = buf.find, buf.rfind, buf.count
    request_head = REQUEST_HEAD_RE.search
    hits, cri_p = scanner.line_ends(buf)

    def partial(ls: int, le: int) -> bool:  # _is_partial(buf[ls:le])
        return le in cri_p or (ls < le and buf[ls] == 123 and _is_partial(buf[ls:le]))  # 123: "{"

    pos = start  # the start of line ``idx`` (lines before it are counted)
    held = 0  # the stream of the split line being returned (_stream_of), 0: none
    idx = 0
    end_of_last = start - 1
    rq = rq_end = start - 1  # where the next request head starts and ends (searched again once passed)
    if carry and start < end:  # the continuation of a piece held from the previous block
        le = find(b"\n", start + 1, end)
        hits = [end if le < 0 else le] + hits
    for le in hits:  # the end of a line that holds a keyword
        if le <= end_of_last or le <= start:
            continue
        if le > end:
            break
        ls = rfind(b"\n", start, le) + 1 or start
        if not carry:
            if rq < ls:
                m = request_head(buf, ls, end)
                rq, rq_end = m.span() if m else (end, end)
            if rq < le:  # a request head in this line: within its first 256 bytes?
                lim = ls + 256
                lim = le if le < lim else lim
                if (rq_end <= lim or request_head(buf, ls, lim)) and not partial(ls, le):
                    end_of_last = le
                    continue  # a request-logging line: user text
        # The lines before it of one message that vLLM's formatter wrote over several lines (each
        # but the last ends in "\r"): its head tells whose text the message is (Envelope.records).
        first = ls
        k = 0
        while first > start and first - 1 > end_of_last and k < MAX_CR_LINES and _ends_in_cr(buf, start, first - 1):
            first = rfind(b"\n", start, first - 1) + 1 or start
            k += 1
        if k:  # each of those lines on its own, before this one
            if first > pos:
                idx += count(b"\n", pos, first)
            while first < ls:
                pe = find(b"\n", first, ls)
                s_append(first)
                e_append(pe if pe - first <= max_line else first + max_line)
                i_append(idx)
                idx += 1
                first = pe + 1
            pos = ls
            end_of_last = ls - 1
        # The first pieces of a record split over lines (docker: the previous lines of this block).
        while ls > start and ls - 1 > end_of_last:
            ps = rfind(b"\n", start, ls - 1) + 1 or start
            if not partial(ps, ls - 1):
                break
            ls = ps
        if ls > pos:
            idx += count(b"\n", pos, ls)
        while True:  # this line, and the lines that continue it
            s_append(ls)
            e_append(le if le - ls <= max_line else ls + max_line)
            i_append(idx)
            piece = le in cri_p or (ls < le and buf[ls] == 123 and _is_partial(buf[ls:le]))  # partial(ls, le)
            if piece:
                held = _stream_of(buf, ls, le)
            elif held and _stream_of(buf, ls, le) != held:
                piece = True  # a line of the other stream inside a split line: the split line goes on after it
            else:
                held = 0
            carry = piece or _ends_in_cr(buf, ls, le)  # (or a message that vLLM's formatter goes on with)
            if le >= end:
                pos = ls
                break
            pos = le + 1  # the next line
            idx += 1
            if not carry:
                break
            ls = pos
            le = find(b"\n", ls, end)
            if le < 0:
                le = end
        end_of_last = le
    if end_of_last < end and _ends_in_cr(buf, start, end):
        # The block ends inside a message that vLLM's formatter goes on with in the next block:
        # its lines here are returned (its head tells whose text the next lines are).
        first = end
        k = 0
        while first > start and first - 1 > end_of_last and k < MAX_CR_LINES and _ends_in_cr(buf, start, first - 1):
            first = rfind(b"\n", start, first - 1) + 1 or start
            k += 1
        if k == 0 or first <= end_of_last:
            first = rfind(b"\n", start, end) + 1 or start
        if first > pos:
            idx += count(b"\n", pos, first)
        while True:
            pe = find(b"\n", first, end)
            pe = end if pe < 0 else pe
            s_append(first)
            e_append(pe if pe - first <= max_line else first + max_line)
            i_append(idx)
            if pe >= end:
                break
            idx += 1
            first = pe + 1
        pos = first
        end_of_last = end
        carry = True
    return starts, ends, idxs, idx + count(b"\n", pos, end) + 1, carry if starts and end_of_last >= end else False


class LineSplitter:
    """Splits a byte stream into spans of complete lines, without copying.

    ``feed(data)`` returns spans ``(buf, start, end)``: ``buf[start:end]`` holds complete lines
    separated by ``\n`` (the final newline at ``end`` excluded). A partial last line waits for
    the next feed or for :meth:`flush`; while it waits it is cut to ``max_line_bytes`` (the rest
    is read and discarded), so memory stays bounded whatever the input (a 10 MB prompt echoed by
    --enable-log-requests, a binary file without newlines). ``lineno`` (lines returned so far) is
    advanced by the reader of the spans, which counts them anyway.
    """

    def __init__(self, max_line_bytes: int = 64 * 1024) -> None:
        self.max_line = max_line_bytes
        self._buf = b""
        self._buf_len = 0  # bytes of the current partial line seen so far (may exceed the buffer)
        self.lineno = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of a partial last line seen but not yet returned."""
        return self._buf_len

    def feed(self, data: bytes) -> list[tuple[bytes, int, int]]:
        """Spans of complete lines in ``data`` (plus a buffered partial line completed by it)."""
        nl = data.rfind(b"\n")
        if nl < 0:
            self._append_partial(data)
            return []
        spans = []
        start = 0
        if self._buf_len:
            head_end = data.find(b"\n")
            room = max(0, self.max_line - len(self._buf))
            head = self._buf + data[: min(head_end, room)]
            spans.append((head, 0, len(head)))
            start = head_end + 1
        self._buf = b""
        self._buf_len = 0
        if start <= nl:
            spans.append((data, start, nl))
        self._append_partial(data[nl + 1 :])
        return spans

    def _append_partial(self, data: bytes) -> None:
        if not data:
            return
        room = self.max_line - len(self._buf)
        if room > 0:
            self._buf += data[:room]
        self._buf_len += len(data)

    def flush(self) -> list[tuple[bytes, int, int]]:
        """The partial last line, if any, as a complete line (end of file)."""
        if not self._buf_len:
            return []
        line = self._buf
        self._buf = b""
        self._buf_len = 0
        return [(line, 0, len(line))]
