"""Text a client controls is data, never a log line (issue 9 item 3, issue 10 item 1).

Request logging of every version, request-id lines (the id is the client's X-Request-Id,
verbatim) and uvicorn access lines are written with hostile prompts, ids and paths, under every
wrapper, through the pipeline as ``diagnose`` and as ``serve`` wire it, and through the
``vllm-doctor diagnose`` command: no event, no fact and no finding may come from them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wrapping import WRAPPERS, run, wrap

FAKE_STATS = ("INFO 01-01 00:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
              "throughput: 1.0 tokens/s, Running: 999 reqs, Waiting: 999 reqs, GPU KV cache usage: 100.0%, "
              "Prefix cache hit rate: 0.0%, Preemptions: 99999")
PAYLOADS = [
    "total_num_cumulative_preemption=99999",
    "Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. total_num_cumulative_preemption=99999",
    FAKE_STATS,
    "(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 1 tokens",
    "INFO 01-01 00:00:00 llm_engine.py:1] # GPU blocks: 1, # CPU blocks: 1",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 1 GiB of which 0 MiB is free.",
    "RuntimeError: CUDA error: out of memory cudaErrorMemoryAllocation CUDA driver error: out of memory",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. EngineCore failed to start.",
    "RuntimeError: NCCL error: unhandled system error ncclSystemError Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=1)",
    "ValueError: No available memory for the cache blocks. Free memory on device cuda:0 (1.0/80.0 GiB) on startup is less than desired GPU memory utilization (0.9, 72.0 GiB).",
    "<script>alert(1)</script><img src=x onerror=alert(1)>",
    "{{ 7*7 }} {% for x in y %} {rej.limitt} ${jndi:ldap://x} __import__('os')",
    "\x1b[31mERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\x1b[0m \x1b]0;pwned\x07 \x1b]8;;http://x\x1b\\",
    "a\nERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\nTraceback (most recent call last):\nValueError: No available memory for the cache blocks.",
    "\\nERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.\\n",
    "args: Namespace(max_model_len=1, max_num_seqs=1) non-default args: {'max_model_len': 1} --kv-cache fp8 VLLM_USE_PREFILL=1",
    "Application startup complete. [shutdown] API server: shutdown triggered Received SIGTERM",
    "Traceback (most recent call last):",
    "vllm: error: unrecognized arguments: --omni --kv-cache fp8",
    "    raise_if_cache_size_invalid(num_gpu_blocks,\n    kv_caches = self.initialize_kv_cache_tensors(",
    "args: Namespace(max_model_len=1, disable_sliding_wind\now=False, max_num_seqs=1, max_num_batched_tokens=1, x",
    "torch.OutOfMemoryError: CUDA out of memory.\n  File \"x.py\", line 1, in run_engine_loop\nAsyncLLM output_handler failed.",
]
IDS = [
    "chatcmpl-EngineDeadError",
    "x INFO 01-01 00:00:00 [scheduler.py:1] Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode total_num_cumulative_preemption=99999",
    "x (EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.",
    "x " + FAKE_STATS,
    "cudaErrorMemoryAllocation-ncclSystemError-<script>alert(1)</script>",
]


def hostile_lines() -> list[str]:
    """Client-text lines as vLLM writes them (the formats of its released source)."""
    out = []
    pre = "(APIServer pid=1) INFO 11-30 09:13:44 "
    for p in PAYLOADS:
        r = repr(p)
        out += [
            # entrypoints/logger.py RequestLogger.log_inputs 0.4-0.10 (prompt %r, params echo)
            f"INFO 05-19 10:13:11 [logger.py:43] Received request chatcmpl-1: prompt: {r}, params: SamplingParams(n=1, temperature=0.7, stop=[{r}]), prompt_token_ids: [1, 2], lora_request: None, prompt_adapter_request: None.",
            # async_llm_engine.py 0.2-0.3
            f"INFO 01-11 15:51:18 async_llm_engine.py:433] Received request cmpl-1: prompt: {r}, sampling params: SamplingParams(n=1, stop=[{r}]), prompt token ids: None.",
            # entrypoints/serve/utils/request_logger.py 0.31+ (params only at INFO, details and JSON body at DEBUG)
            f"{pre}[request_logger.py:40] Received request cmpl-1: params: SamplingParams(n=1, stop=[{r}]), lora_request: None.",
            f"(APIServer pid=1) DEBUG 11-30 09:13:44 [request_logger.py:50] Request cmpl-1 details: prompt: {r}, prompt_token_ids: [1], prompt_embeds shape: None.",
            f"(APIServer pid=1) DEBUG 11-30 09:13:44 [request_logger.py:60] Request cmpl-1 JSON body: {json.dumps({'prompt': p, 'stop': [p]})}",
            f"{pre}[request_logger.py:72] Generated response chatcmpl-1: output: {r}, finish_reason: stop",
            # uvicorn access log (on by default), the path as the client sent it
            f'INFO:     127.0.0.1:5000 - "GET /v1/models?{p.replace(chr(10), " ")} HTTP/1.1" 200 OK',
            f'(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /{p.replace(chr(10), " ")} HTTP/1.1" 404 Not Found',
        ]
    for rid in IDS:
        out += [
            f"INFO 07-10 10:23:45 async_llm_engine.py:111] Added request {rid}.",
            f"INFO 07-10 10:23:45 async_llm_engine.py:120] Finished request {rid}.",
            f"INFO 07-10 10:23:45 async_llm_engine.py:130] Aborted request {rid}.",
            f"{pre}[async_llm.py:400] Request {rid} aborted.",
            f"{pre}[async_llm.py:410] Request {rid} failed (engine dead).",
            f"{pre}[async_llm.py:420] Aborted request(s) {rid}.",
            f"(EngineCore_DP0 pid=2) INFO 11-30 09:13:44 [core.py:900] [shutdown] EngineCore: rejecting new request request_id={rid}",
        ]
    return out


def assert_nothing_from(pipe, events):
    assert events == [], [type(e).__name__ + ": " + e.meta.text[:80] for e in events]
    st = pipe.state
    assert st.preemptions_total == 0 and st.oom_events_total == 0
    facts = st.facts()
    for k in ("kv_cache_tokens", "num_gpu_blocks", "max_model_len", "max_num_seqs"):
        assert facts.get(k) in (None, 0) or k == "max_model_len" and facts.get(k) is None, (k, facts.get(k))
    assert not st.unknown_flags
    assert pipe.evaluate() == [] and not pipe.engine.findings


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("serve", [False, True], ids=["diagnose", "serve"])
def test_no_event_fact_or_finding_from_client_text(wrapper, serve):
    pipe, events = run(wrap(wrapper, hostile_lines()), serve=serve, chunk=4096 if serve else 0)
    assert pipe.state.lines_total["vllm.log"] >= len(hostile_lines())
    assert_nothing_from(pipe, events)


def test_json_record_with_real_newlines_in_a_prompt_is_one_record():
    lines = [json.dumps({"levelname": "INFO", "filename": "logger.py", "lineno": 43,
                         "message": f"Received request x: prompt: {p}, params: SamplingParams(n=1)"}) for p in PAYLOADS]
    for serve in (False, True):
        pipe, events = run("\n".join(lines) + "\n", serve=serve)
        assert_nothing_from(pipe, events)


def test_real_incident_after_hostile_text_is_still_seen():
    # The cut at an embedded logger prefix still works for vLLM's own glued records, and a real
    # line after client text is read as usual.
    real = ("(EngineCore_0 pid=1810465) ERROR 09-03 11:03:37 [core.py:712] ValueError: Free memory on device "
            "(7.34/139.72 GiB) on startup is less than desired GPU memory utilization (0.9, 125.75 GiB).")
    pipe, events = run("\n".join(hostile_lines() + [real]) + "\n")
    assert [type(e).__name__ for e in events] == ["ExceptionRaised", "InsufficientFreeMemory"]
    glued = ("Processed prompts: 100%|##| 1/1 [00:01<00:00]INFO 06-16 21:24:15 metrics.py:341] Avg prompt throughput: 1.0 tokens/s, "
             "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 4 reqs, GPU KV cache usage: 5.0%, "
             "CPU KV cache usage: 0.0%.INFO 06-16 21:24:16 metrics.py:341] Received request x: prompt: " + repr(FAKE_STATS))
    pipe, events = run(glued + "\n")
    stats = [e for e in events if type(e).__name__ == "SchedulerStats"]
    assert [(s.num_running, s.num_waiting) for s in stats] == [(3, 4)]


def test_fatal_step_dump_payload_is_not_parsed():
    dump = [
        f"(EngineCore_DP0 pid=1) ERROR 01-27 01:24:41 [dump_input.py:79] Dumping scheduler output for model execution: "
        f"SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=x, prompt={FAKE_STATS!r})])",
        "(EngineCore_DP0 pid=1) ERROR 01-27 01:24:41 [dump_input.py:81] Dumping scheduler stats: SchedulerStats(num_running_reqs=8, "
        "num_waiting_reqs=4, kv_cache_usage=0.078) torch.OutOfMemoryError: CUDA out of memory. NCCL error: x",
        "(EngineCore_DP0 pid=1) ERROR 01-27 01:24:41 [dump_input.py:76]          True,  True, CUDA out of memory. total_num_cumulative_preemption=99999",
    ]
    for wrapper in WRAPPERS:
        pipe, events = run(wrap(wrapper, dump))
        assert [(type(e).__name__, e.kind) for e in events] == [("EngineFailure", "step-failed")], wrapper
        assert pipe.state.preemptions_total == 0 and pipe.state.oom_events_total == 0 and pipe.state.last_stats is None


def test_diagnose_command_reports_nothing_for_client_text(tmp_path):
    for wrapper in ("plain", "cri", "docker"):
        p = tmp_path / f"hostile-{wrapper}.log"
        p.write_text(wrap(wrapper, hostile_lines()))
        r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "json", "--fail-on", "never", str(p)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["findings"] == [] and rep["facts"].get("preemptions_total") in (0, None)
        assert rep["facts"].get("kv_cache_tokens") is None and rep["unknown_flags"] == []
        r = subprocess.run([sys.executable, "-m", "vllm_doctor", "events", str(p)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == "", r.stdout[:500]
