"""A traceback's exception line (``SomeType: message``) whose type carries someone else's text — a
request's, a chat template's, the model's output — gives no out-of-memory, NCCL or engine-death
event, fact or finding, whatever its message says; the same traceback ending in a type such a
failure is really raised as still gives its event and finding. Through the pipeline as
``diagnose`` and ``serve`` wire it, under every wrapper.

The tracebacks are those of vLLM 0.32's streaming error paths, which log whatever the stream raised
(``logger.exception``, so every line of the traceback carries the handler's own vLLM prefix):
entrypoints/openai/chat_completion/serving.py:929 ``logger.exception("Error in chat completion
stream generator.")`` and entrypoints/openai/completion/serving.py:500 ``logger.exception("Error in
completion stream generator.")``. A raise from the streaming parser (serving.py:667
``parser.parse_delta(...)``, parser/abstract_parser.py:849, on the model's output) is the hostile
one; a raise through the engine (serving.py:527 ``async for res in result_generator``,
v1/engine/async_llm.py:766 ``q.get_nowait() or await q.get()``, output_processor.py:92 ``raise
output``) is the genuine one. The frames' lines are those of 0.32; the exception lines are
written as Python's traceback module writes ``module.QualName: str(exc)``."""

from __future__ import annotations

import json

import pytest

from wrapping import WRAPPERS, run, wrap

OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 3.19 MiB is "
       "free. Including non-PyTorch memory, this process has 79.09 GiB memory in use.")
SITE = "/usr/local/lib/python3.12/dist-packages/vllm"
CHAT = ("(APIServer pid=1) ERROR 11-30 10:00:{:02d} [serving.py:929] ", "Error in chat completion stream generator.",
        f'  File "{SITE}/entrypoints/openai/chat_completion/serving.py", line {{}}, in chat_completion_stream_generator')
COMPLETION = ("(APIServer pid=1) ERROR 11-30 10:00:{:02d} [serving.py:500] ", "Error in completion stream generator.",
              f'  File "{SITE}/entrypoints/openai/completion/serving.py", line {{}}, in completion_stream_generator')

# The model's output or the request's text inside the exception's message, raised as the types
# that carry it: the streaming parser's ValueError/KeyError/TypeError/JSON error on the model's
# output, a template's TemplateError, pydantic's ValidationError quoting the input, vLLM's own
# request validation error, an OpenAI client's BadRequestError (a tool calling out), FastAPI's
# RequestValidationError.
HOSTILE_EXC = [
    f"ValueError: {OOM}",
    f"ValueError: Model output is not valid: torch.OutOfMemoryError: {OOM}",
    "jinja2.exceptions.TemplateError: ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
    f"jinja2.exceptions.TemplateSyntaxError: {OOM}",
    "jinja2.exceptions.UndefinedError: 'cudaErrorMemoryAllocation' is undefined",
    "KeyError: 'EngineDeadError'",
    "KeyError: 'vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.'",
    "TypeError: tool 'EngineCore failed to start.' got an unexpected keyword argument 'x'",
    "json.decoder.JSONDecodeError: Extra data: 'Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)': line 1 column 5 (char 4)",
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for FunctionCall name Input should be a valid "
    "string [type=string_type, input_value='RuntimeError: CUDA error: out of memory', input_type=str]",
    "pydantic.ValidationError: 1 validation error for ChatCompletionRequest: 'NCCL error: unhandled system error'",
    "vllm.exceptions.VLLMValidationError: Engine core initialization failed (parameter=model, value=x)",
    "openai.BadRequestError: Error code: 400 - {'error': 'NCCL error: unhandled cuda error; Some NCCL operations have "
    "failed or timed out'}",
    "fastapi.exceptions.RequestValidationError: [{'msg': 'RuntimeError: CUDA driver error: out of memory'}]",
    "UnicodeDecodeError: 'utf-8' codec can't decode: Engine background task failed",
    "AssertionError: AsyncLLM output_handler failed.",
]


def _traceback(head: tuple, sec: int, genuine: bool, exc: str) -> list[str]:
    pre, first, frame = head
    p = pre.format(sec)
    if genuine:  # raised through the engine: the request's output queue
        body = [frame.format(527 if head is CHAT else 306), "    async for res in result_generator:"
                if head is CHAT else "    async for prompt_idx, res in result_generator:",
                f'  File "{SITE}/v1/engine/async_llm.py", line 766, in generate',
                "    out = q.get_nowait() or await q.get()",
                f'  File "{SITE}/v1/engine/output_processor.py", line 92, in get', "    raise output"]
    else:  # raised by the streaming parser on the model's output
        body = [frame.format(667), "    delta_message = parser.parse_delta(",
                f'  File "{SITE}/parser/abstract_parser.py", line 881, in parse_delta',
                "    delta_message = self.extract_reasoning_streaming("]
    return [p + x for x in [first, "Traceback (most recent call last):", *body, exc]]


def hostile_lines() -> list[str]:
    out: list[str] = []
    for i, exc in enumerate(HOSTILE_EXC):
        out += _traceback(CHAT if i % 2 == 0 else COMPLETION, i, False, exc)
    return out


INCIDENTS = {"OutOfMemory", "NcclError", "EngineFailure"}


def _assert_no_incident(pipe, events):
    got = [type(e).__name__ + ": " + e.meta.text[:100] for e in events if type(e).__name__ in INCIDENTS]
    assert got == []
    st = pipe.state
    assert st.oom_events_total == 0
    assert pipe.evaluate() == [] and not pipe.engine.findings
    # the exception lines are still exceptions (the type is data vLLM wrote)
    assert sum(type(e).__name__ == "ExceptionRaised" for e in events) == len(HOSTILE_EXC)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_client_text_exception_types_give_no_incident(wrapper, serve):
    pipe, events = run(wrap(wrapper, hostile_lines()), serve=serve, chunk=4096 if serve else 0)
    _assert_no_incident(pipe, events)


# The types such failures are really raised as, at the end of the same tracebacks (the corpus's
# exception lines: torch's OutOfMemoryError, vLLM's EngineDeadError, pynccl_wrapper.py's RuntimeError).
GENUINE = [
    (f"torch.OutOfMemoryError: {OOM}", "OutOfMemory", "runtime-oom"),
    (f"torch.cuda.OutOfMemoryError: {OOM}", "OutOfMemory", "runtime-oom"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
     "EngineFailure", "engine-dead"),
    ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", "NcclError", "nccl-failure"),
]
SERVED = "(APIServer pid=1) INFO 11-30 09:59:50 [loggers.py:271] Engine 000: Avg prompt throughput: 12.5 tokens/s, " \
         "Avg generation throughput: 300.0 tokens/s, Running: 18 reqs, Waiting: 0 reqs, GPU KV cache usage: 95.9%, Prefix cache hit rate: 0.0%"


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
@pytest.mark.parametrize("head", [CHAT, COMPLETION], ids=["chat", "completion"])
@pytest.mark.parametrize("exc,event,finding", GENUINE, ids=[g[2] + str(i) for i, g in enumerate(GENUINE)])
def test_genuine_exception_types_still_give_their_incident(wrapper, serve, head, exc, event, finding):
    lines = [SERVED, *_traceback(head, 1, True, exc)]
    pipe, events = run(wrap(wrapper, lines), serve=serve)
    assert event in {type(e).__name__ for e in events}
    assert finding in {f.name for f in pipe.evaluate()}
    # and after the hostile tracebacks, from the same process and handler
    pipe2, events2 = run(wrap(wrapper, [SERVED, *hostile_lines(), *_traceback(head, 59, True, exc)]), serve=serve,
                         chunk=4096 if serve else 0)
    assert sorted(f.name for f in pipe2.evaluate()) == sorted(f.name for f in pipe.evaluate())
    assert [type(e).__name__ for e in events2 if type(e).__name__ in INCIDENTS] == \
        [type(e).__name__ for e in events if type(e).__name__ in INCIDENTS]


@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_json_record_with_the_traceback_in_exc_info(serve):
    """A JSON formatter's record: the message and the traceback in one record (exc_info)."""
    recs = []
    for i, exc in enumerate(HOSTILE_EXC):
        tb = _traceback(CHAT, i, False, exc)
        recs.append(json.dumps({"levelname": "ERROR", "filename": "serving.py", "lineno": 929, "message": CHAT[1],
                                "exc_info": "\n".join(x.split("] ", 1)[1] for x in tb[1:])}))
    pipe, events = run("\n".join(recs) + "\n", serve=serve)
    _assert_no_incident(pipe, events)


# vLLM's logged facts inside an exception's message (the model's output or a client's schema under
# the same streaming error path): an anchored matcher reads vLLM's own message from its start, never
# after a ``SomeError: `` head, so none of these moves a fact. Each is vLLM's wording of the fact
# (v1/core/kv_cache_utils.py, v1/metrics/loggers.py, V0 core/scheduler.py, v1/engine/core.py).
FACT_EXC = [
    "ValueError: GPU KV cache size: 1 tokens",
    "ValueError: Maximum concurrency for 2,048 tokens per request: 0.01x",
    "KeyError: 'Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 9999 reqs, "
    "Waiting: 9999 reqs, GPU KV cache usage: 100.0%, Prefix cache hit rate: 0.0%'",
    "TypeError: Sequence group 1 is preempted by PreemptionMode.SWAP mode because there is not enough KV cache space. "
    "total_num_cumulative_preemption=99999",
    "jinja2.exceptions.TemplateError: # GPU blocks: 1, # CPU blocks: 1",
]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_facts_inside_an_exception_message_move_nothing(wrapper, serve):
    lines = [SERVED]
    for i, exc in enumerate(FACT_EXC):
        lines += _traceback(CHAT if i % 2 == 0 else COMPLETION, i, False, exc)
    pipe, events = run(wrap(wrapper, lines), serve=serve, chunk=4096 if serve else 0)
    kinds = [type(e).__name__ for e in events if e is not None]
    assert kinds.count("SchedulerStats") == 1  # SERVED's own line only
    assert not {"KvCacheCapacity", "Preemption"} & set(kinds)
    facts = pipe.state.facts()
    assert facts.get("kv_cache_tokens") is None and facts.get("num_gpu_blocks") is None
    assert facts.get("peak_num_running") == 18 and not facts.get("preemptions_total")
    assert kinds.count("ExceptionRaised") == len(FACT_EXC)
