"""vLLM's own lines that echo a client's text or the model's output after a fixed head, with no
request-logging head (envelope ECHO_HEADS, ECHO_FILES): a client cannot steer the diagnosis through
them, in any wrapper, through the pipeline as ``diagnose`` and ``serve`` wire it and through the
``vllm-doctor diagnose`` command; vLLM's genuine lines of the same kinds are still read, right
after them and from the same process in the same second.

Lines marked "vLLM 0.32, written by its own code" were printed by vLLM 0.32.0 (CPU build, the e2e
venv) running the named function with vLLM's logger configuration (``_configure_vllm_root_logger``)
and a hostile input; only the pid and the time are changed. The others are the named format string
filled in (the value of ``%s`` as that version's objects print it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wrapping import run, wrap

OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.1 GiB of which 3.2 MiB is free."
API = "(APIServer pid=1) "
PRE = API + "{} 11-30 10:00:00 [{}] "
BS = "\\"  # a backslash: repr() writes a newline of the client's text as backslash n

HOSTILE = [
    # vLLM 0.32, written by its own code: ChatCompletionRequest(**body) with an unknown key,
    # entrypoints/serve/engine/protocol.py:72 OpenAIBaseModel.__log_extra_fields__ (DEBUG; WARNING in
    # 0.6.6 entrypoints/openai/protocol.py:59 and 0.10.2 protocol.py:82), "%s" of the set of keys (a
    # real log has it: corpus 059, 0.12.0 "[protocol.py:112] The following fields ...: {'strict'}").
    PRE.format("DEBUG", "entrypoints/.../engine/protocol.py:72") + f"The following fields were present in the request but ignored: {{'{OOM}'}}",
    PRE.format("DEBUG", "entrypoints/.../engine/protocol.py:72") + "The following fields were present in the request but ignored: "
    "{'x" + BS + "nINFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 1 tokens'}",
    # 0.10.2 entrypoints/openai/protocol.py:82 (WARNING), a key holding V0's preemption warning
    # (core/scheduler.py 0.4.3-0.10.2) behind an embedded logger prefix.
    PRE.format("WARNING", "protocol.py:82") + "The following fields were present in the request but ignored: {'x" + BS
    + "nWARNING 01-01 00:00:00 scheduler.py:1] Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode because there "
    "is not enough KV cache space. total_num_cumulative_preemption=99999'}",
    # vLLM 0.32, written by its own code: Granite20bFCToolParser.extract_tool_calls on a model output
    # whose tool name is an object (tool_parsers/granite_20b_fc_tool_parser.py:109, "Error in extracting
    # tool call from response %s" of pydantic's ValidationError, which quotes the model's value).
    PRE.format("ERROR", "granite_20b_fc_tool_parser.py:109") + "Error in extracting tool call from response 1 validation error for FunctionCall\r",
    PRE.format("ERROR", "granite_20b_fc_tool_parser.py:109") + "name\r",
    PRE.format("ERROR", "granite_20b_fc_tool_parser.py:109") + "  Input should be a valid string [type=string_type, input_value={'EngineDeadError': 1}, input_type=dict]\r",
    PRE.format("ERROR", "granite_20b_fc_tool_parser.py:109") + "    For further information visit https://errors.pydantic.dev/2.14/v/string_type",
    # vLLM 0.32, written by its own code: renderers/hf.py:839 safe_apply_chat_template ("Chat template
    # rejected the request: %s") on a chat template calling raise_exception() with the client's text,
    # a newline in it (NewLineFormatter repeats vLLM's prefix) then a logger prefix.
    PRE.format("WARNING", "hf.py:839") + "Chat template rejected the request: x\r",
    PRE.format("WARNING", "hf.py:839") + "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.",
    PRE.format("WARNING", "hf.py:839") + f"Chat template rejected the request: {OOM}",
    # 0.32 openai/chat_completion/serving.py:274 ("Error with model %s"; 0.6.6 serving_chat.py:114,
    # 0.10.2 :176): the ErrorResponse of openai/models/serving.py:58 check_model as 0.32 prints it.
    PRE.format("ERROR", "serving.py:274") + "Error with model error=ErrorInfo(message='The model `ncclSystemError x" + BS
    + "nERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.` does not exist.', type='NotFoundError', "
    "param='model', code=404)",
    # 0.32 openai/models/serving.py:339 ("Failed to load LoRA '%s' resolved by %s: %s. Trying next
    # resolver."), the request's model as LoRA name, the message of 0.32's LoRAAdapterNotFoundError.
    PRE.format("WARNING", "serving.py:339") + "Failed to load LoRA 'cudaErrorMemoryAllocation' resolved by FilesystemResolver: "
    "Loading lora cudaErrorMemoryAllocation failed: No adapter found for /loras/cudaErrorMemoryAllocation. Trying next resolver.",
    # 0.32 tool_parsers/phi4mini_tool_parser.py:58 (DEBUG "Model output: %s"), the model's output with a newline.
    PRE.format("DEBUG", "tool_parsers/phi4mini_tool_parser.py:58") + f"Model output: torch.OutOfMemoryError: {OOM}\r",
    PRE.format("DEBUG", "tool_parsers/phi4mini_tool_parser.py:58") + "ncclSystemError",
]
# 0.10.2: a client's chat_template calling raise_exception(): entrypoints/chat_utils.py:1475
# (logger.exception "An error occurred in `transformers` while applying chat template", then
# ``raise ValueError(str(e)) from e``) and openai/serving_chat.py:251 (logger.exception "Error in
# preprocessing prompt inputs"); the frames and exception line as transformers and jinja2 raise it.
_TB = [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/transformers/utils/chat_template_utils.py", line 485, in raise_exception',
    "    raise jinja2.exceptions.TemplateError(message)",
    f"jinja2.exceptions.TemplateError: {OOM}",
]
HOSTILE += [PRE.format("ERROR", "chat_utils.py:1475") + x for x in
            ["An error occurred in `transformers` while applying chat template", *_TB]]
HOSTILE += [PRE.format("ERROR", "serving_chat.py:251") + x for x in
            ["Error in preprocessing prompt inputs", *_TB, "", "The above exception was the direct cause of the following exception:", "",
             "Traceback (most recent call last):",
             '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/chat_utils.py", line 1478, in apply_hf_chat_template',
             "    raise ValueError(str(e)) from e", f"ValueError: {OOM}"]]

# Genuine lines (corpus logs), the first from the same process in the same second as the echoes.
REAL = [
    API + "ERROR 11-30 10:00:00 [async_llm.py:699] AsyncLLM output_handler failed.",
    "(EngineCore pid=112) ERROR 11-30 10:00:01 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. "
    "GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free.",
    API + "ERROR 11-30 10:00:02 [serving_chat.py:1278] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause.",
    "(VllmWorkerProcess pid=232) ERROR 11-30 10:00:03 multiproc_worker_utils.py:226] Exception in worker VllmWorkerProcess while "
    "processing method init_device: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), Traceback (most recent call last):",
    "INFO 11-30 10:00:04 [kv_cache_utils.py:775] GPU KV cache size: 174,800 tokens",
]
WRAPPERS = ("plain", "cri", "cri-partial", "docker", "docker-partial", "kubectl", "process", "journald", "journald-iso",
            "blockquote", "compose")  # each physical line on its own (the json wrapper: JSON_RECORDS below)


def _summary(pipe, events) -> tuple:
    st = pipe.state
    return (sorted({type(e).__name__ for e in events}), st.oom_events_total, st.preemptions_total,
            st.facts().get("kv_cache_tokens"), sorted(f.name for f in pipe.evaluate()))


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_no_event_fact_or_finding_from_echoed_client_text(wrapper, serve):
    from test_hostile_input import assert_nothing_from

    pipe, events = run(wrap(wrapper, HOSTILE), serve=serve, chunk=4096 if serve else 0)
    assert_nothing_from(pipe, events)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_genuine_lines_after_the_echoes_are_still_read(wrapper, serve):
    alone = _summary(*run(wrap(wrapper, REAL), serve=serve))
    assert alone[0] == ["EngineFailure", "ExceptionRaised", "KvCacheCapacity", "NcclError", "OutOfMemory"]
    assert alone[1:] == (1, 0, 174800, ["nccl-failure", "startup-oom"]), alone
    assert _summary(*run(wrap(wrapper, HOSTILE + REAL), serve=serve, chunk=4096 if serve else 0)) == alone


# A JSON formatter writes one record per message: the newline and the traceback inside it.
def _json(line: str, exc: str | None = None) -> str:
    head, _, msg = line.partition("] ")
    rec = {"levelname": head.split()[2], "filename": head.rsplit("[", 1)[1].split(":")[0].rsplit("/", 1)[-1],
           "lineno": int(head.rsplit(":", 1)[1]), "message": msg.rstrip("\r")}
    if exc:
        rec["exc_info"] = exc
    return json.dumps(rec)


JSON_RECORDS = [
    _json(HOSTILE[0]), _json(HOSTILE[2]),
    _json(HOSTILE[3].rstrip("\r") + "\nname\n  Input should be a valid string [type=string_type, input_value={'EngineDeadError': 1}, input_type=dict]"),
    _json(HOSTILE[7].rstrip("\r") + "\n(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start."),
    _json(PRE.format("ERROR", "serving_chat.py:251") + "Error in preprocessing prompt inputs", exc="\n".join(_TB)),
    # vLLM 0.33's JSON_FORMAT has no file, only the logger's name
    json.dumps({"levelname": "DEBUG", "name": "vllm.tool_parsers.phi4mini_tool_parser", "message": f"Model output: {OOM}"}),
]


@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_json_records_of_echoes_are_client_text(serve):
    from test_hostile_input import assert_nothing_from

    pipe, events = run("\n".join(JSON_RECORDS) + "\n", serve=serve)
    assert_nothing_from(pipe, events)
    real = run(wrap("json", REAL), serve=serve)
    assert _summary(*run("\n".join(JSON_RECORDS) + "\n" + wrap("json", REAL), serve=serve)) == _summary(*real)


def _diagnose(path) -> dict:
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "json", "--fail-on", "never", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    return {"findings": sorted(f["name"] for f in rep["findings"]),
            **{k: rep["facts"].get(k) for k in ("preemptions_total", "kv_cache_tokens", "num_gpu_blocks")}}


def test_diagnose_command_reports_nothing_for_echoed_client_text(tmp_path):
    for wrapper in ("plain", "cri", "docker"):
        p = tmp_path / f"echo-{wrapper}.log"
        p.write_text(wrap(wrapper, HOSTILE))
        assert _diagnose(p) == {"findings": [], "preemptions_total": None, "kv_cache_tokens": None, "num_gpu_blocks": None}
        p.write_text(wrap(wrapper, REAL))
        real = _diagnose(p)
        assert {"nccl-failure", "startup-oom"} <= set(real["findings"]) and real["kv_cache_tokens"] == 174800
        p.write_text(wrap(wrapper, HOSTILE + REAL))
        assert _diagnose(p) == real


def test_an_echo_prefix_marks_only_its_own_lines():
    """The lines that repeat a client-echo head's vLLM prefix are its own (a newline in the client's
    text, its traceback); a line of another file, process or second is vLLM's again."""
    from vllm_doctor.ingest.envelope import Envelope, LogClock

    env = Envelope(LogClock(2026))
    echo = PRE.format("WARNING", "hf.py:839")
    kinds = [[(r.client, r.msg) for r in env.records(n, ln.encode())] for n, ln in enumerate([
        echo + "Chat template rejected the request: x",
        echo + "EngineCore failed to start.",
        API + "WARNING 11-30 10:00:00 [core_client.py:1] EngineCore failed to start.",
        "(APIServer pid=2) WARNING 11-30 10:00:00 [hf.py:839] EngineCore failed to start.",
        API + "WARNING 11-30 10:00:01 [hf.py:839] EngineCore failed to start.",
        echo + "EngineCore failed to start.",
    ], 1)]
    assert kinds == [[("client-echo", "Chat template rejected the request:")], [("client-echo", "echo body")],
                     [(None, "EngineCore failed to start.")], [(None, "EngineCore failed to start.")],
                     [(None, "EngineCore failed to start.")], [("client-echo", "echo body")]]
