"""A SIMULATED vLLM-like server for ``vllm-doctor bench demo``: try the ladder anywhere, without a GPU.

It is a simulation, never a measurement of vLLM: its latencies come from a cost model, not from a
model running on an accelerator. Every result made against it says so (the server answers
``GET /version`` with :data:`SIMULATED_VERSION`, and the ladder marks such a result ``simulated``).

What it imitates is how vLLM's V1 scheduler behaves when the KV cache is the limit:

- continuous batching: one engine step at a time; each step decodes one token for every running
  sequence and prefills waiting prompts within a token budget (``max_num_batched_tokens``);
- a paged KV cache of ``num_gpu_blocks`` blocks of ``block_size`` tokens; a sequence holds
  ceil(tokens / block_size) blocks, and a new request is admitted only while its prompt fits
  (and fewer than ``max_num_seqs`` run); the others wait in the queue;
- when a running sequence needs a new block and none is free, the newest running sequence is
  preempted (recompute: its blocks are freed, it goes back to the front of the queue, and its
  prompt and generated tokens are computed again when it is readmitted): preemption begins when the
  KV cache is full;
- the prefix cache: full blocks of prompts already seen are not computed again (hits counted);
- a step costs ``step_seconds`` + ``decode_seq_seconds`` per sequence decoded +
  ``prefill_token_seconds`` per token prefilled, so a larger batch is slower per step (compute).

It serves OpenAI's streamed ``/v1/completions`` and ``/v1/chat/completions`` (vLLM's chunk shapes:
a role-only first chunk for chat, a final usage chunk with ``stream_options.include_usage``,
``data: [DONE]``), ``/v1/models``, ``/version``, ``/health`` and ``/metrics`` with vLLM's series
(running, waiting, KV cache usage, preemptions, prefix cache queries and hits, recomputed prompt
tokens, TTFT / inter-token / end-to-end histograms, ``vllm:cache_config_info``), written by
prometheus-client. A token is a whitespace-separated word of the prompt.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import socket
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request   # at module level: FastAPI resolves the handlers' annotations here
from vllm_doctor.catalogue import V, family

SIMULATED_VERSION = "simulated (vllm-doctor bench demo, not vLLM)"
SIMULATION_NOTE = ("SIMULATED: a cost model of vLLM's scheduler and KV cache (vllm-doctor bench demo), "
                   "not a measurement of vLLM")

# vLLM's own histogram buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


@dataclass
class SimConfig:
    """The simulated server's capacity and cost model."""

    model: str = "simulated-kv-limited"
    num_gpu_blocks: int = 96            # KV cache: 96 x 16 = 1,536 tokens
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    step_seconds: float = 0.008         # fixed cost of one engine step
    decode_seq_seconds: float = 0.0008  # per sequence decoded in the step
    prefill_token_seconds: float = 0.00002  # per prompt token computed in the step
    max_prompt_tokens: int = 65_536     # a longer prompt is refused (HTTP 400), as max_model_len does
    max_waiting: int = 10_000           # a longer queue is refused (HTTP 503): the simulation stays bounded


@dataclass
class _Seq:
    prompt: list[str]
    max_tokens: int
    arrival: float
    out: asyncio.Queue
    generated: int = 0
    computed: int = 0                  # tokens whose KV is in the cache
    blocks: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    cached_blocks: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def length(self) -> int:           # tokens the KV cache must hold once the next token is computed
        return len(self.prompt) + self.generated


class Engine:
    """The scheduler loop and the KV cache (one asyncio task in the server's event loop)."""

    def __init__(self, cfg: SimConfig, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.cfg = cfg
        self.free_blocks = cfg.num_gpu_blocks
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.prefix: OrderedDict[int, None] = OrderedDict()   # block hash -> (LRU), at most num_gpu_blocks
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.registry = registry or CollectorRegistry()
        lab = ["model_name", "engine"]
        r = self.registry

        def made(kind, name, **kw):  # the series as vLLM defines it: its name and help text from the catalogue
            fam = family(name)
            assert fam is not None  # V.<name> is checked against the catalogue
            return kind(fam.defined_as, fam.documentation, lab, registry=r, **kw).labels(cfg.model, "0")

        self.m_running = made(Gauge, V.num_requests_running)
        self.m_waiting = made(Gauge, V.num_requests_waiting)
        self.m_kv = made(Gauge, V.kv_cache_usage_perc)
        self.m_preempt = made(Counter, V.num_preemptions_total)
        self.m_prompt = made(Counter, V.prompt_tokens_total)
        self.m_gen = made(Counter, V.generation_tokens_total)
        self.m_pq = made(Counter, V.prefix_cache_queries_total)
        self.m_ph = made(Counter, V.prefix_cache_hits_total)
        self.m_recomputed = made(Counter, V.prompt_tokens_recomputed_total)
        self.m_success = made(Counter, V.request_success_total)
        self.m_ttft = made(Histogram, V.time_to_first_token_seconds, buckets=TTFT_BUCKETS)
        self.m_itl = made(Histogram, V.inter_token_latency_seconds, buckets=ITL_BUCKETS)
        self.m_e2e = made(Histogram, V.e2e_request_latency_seconds, buckets=E2E_BUCKETS)
        info = family(V.cache_config_info)
        assert info is not None
        Gauge(info.defined_as, info.documentation, ["block_size", "num_gpu_blocks",
              "enable_prefix_caching", "engine"], registry=r).labels(
            str(cfg.block_size), str(cfg.num_gpu_blocks), "True", "0").set(1)

    # -- the KV cache -------------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.cfg.block_size)

    def _hashes(self, prompt: list[str]) -> list[int]:
        bs, out, prev = self.cfg.block_size, [], 0
        for i in range(len(prompt) // bs):
            prev = hash((prev, tuple(prompt[i * bs:(i + 1) * bs])))
            out.append(prev)
        return out

    def _cached_tokens(self, seq: _Seq) -> int:
        """Leading prompt tokens the prefix cache holds (the last prompt token is always computed)."""
        n = 0
        for hsh in seq.cached_blocks:
            if hsh not in self.prefix:
                break
            self.prefix.move_to_end(hsh)
            n += self.cfg.block_size
        return min(n, len(seq.prompt) - 1)

    def _remember(self, seq: _Seq) -> None:
        for hsh in seq.cached_blocks:
            self.prefix[hsh] = None
            self.prefix.move_to_end(hsh)
        while len(self.prefix) > self.cfg.num_gpu_blocks:
            self.prefix.popitem(last=False)

    def _free(self, seq: _Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _preempt(self, seq: _Seq) -> None:
        """vLLM's recompute preemption: blocks freed, back to the front of the queue."""
        self.running.remove(seq)
        self._free(seq)
        self.m_recomputed.inc(seq.computed)
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.m_preempt.inc()

    # -- requests -----------------------------------------------------------------------------------

    def submit(self, prompt: list[str], max_tokens: int) -> _Seq:
        seq = _Seq(prompt=prompt, max_tokens=max_tokens, arrival=time.monotonic(), out=asyncio.Queue())
        seq.cached_blocks = self._hashes(prompt)
        self.waiting.append(seq)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop())
        self.wake.set()
        return seq

    def abort(self, seq: _Seq) -> None:
        """The client went away: the sequence leaves the engine and frees its blocks."""
        if seq.done:
            return
        seq.done = True
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    # -- the scheduler ------------------------------------------------------------------------------

    def _schedule(self) -> tuple[list[tuple[_Seq, int]], int, int]:
        """One step's work: [(sequence, tokens computed)], decode count, prefill tokens."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        work: list[tuple[_Seq, int]] = []
        preempted = False
        for seq in list(self.running):
            if seq not in self.running:      # preempted by an older sequence in this very step
                continue
            todo = max(1, seq.length - seq.computed)
            chunk = min(todo, budget)
            if chunk <= 0:
                break
            need = self._blocks_for(seq.computed + chunk) - seq.blocks
            while need > self.free_blocks:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq not in self.running:
                continue
            self.free_blocks -= need
            seq.blocks += need
            budget -= chunk
            work.append((seq, chunk))
        while self.waiting and not preempted and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            hit = self._cached_tokens(seq) if seq.generated == 0 else 0
            if seq.generated == 0:
                self.m_pq.inc(len(seq.prompt))
            chunk = min(seq.length - hit, budget)
            need = self._blocks_for(hit + chunk)
            if need > self.free_blocks:
                break                         # it waits for blocks: the KV cache is the limit
            self.waiting.popleft()
            if seq.generated == 0:
                self.m_ph.inc(hit)
            seq.computed = hit
            self.free_blocks -= need
            seq.blocks = need
            budget -= chunk
            self.running.append(seq)
            work.append((seq, chunk))
        decode = sum(1 for s, n in work if s.computed >= s.length - 1 and n == 1)
        prefill = sum(n for s, n in work) - decode
        return work, decode, prefill

    def _gauges(self) -> None:
        self.m_running.set(len(self.running))
        self.m_waiting.set(len(self.waiting))
        self.m_kv.set(1.0 - self.free_blocks / self.cfg.num_gpu_blocks)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._gauges()
                self.wake.clear()
                await self.wake.wait()
                next_at = loop.time()
            work, decode, prefill = self._schedule()
            self._gauges()
            cost = self.cfg.step_seconds + decode * self.cfg.decode_seq_seconds + prefill * self.cfg.prefill_token_seconds
            next_at = max(next_at, loop.time() - cost) + cost   # a late step does not make the next ones short
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            now = time.monotonic()
            self.m_prompt.inc(prefill)
            for seq, n in work:
                if seq.done or seq not in self.running:
                    continue
                seq.computed += n
                if seq.computed < seq.length:
                    continue                  # a chunked prefill: no token yet
                if seq.generated == 0:
                    self._remember(seq)
                seq.generated += 1
                self.m_gen.inc()
                if seq.first_token_at is None:
                    seq.first_token_at = now
                    self.m_ttft.observe(now - seq.arrival)
                else:
                    self.m_itl.observe(now - (seq.last_token_at or now))
                seq.last_token_at = now
                seq.out.put_nowait(seq.generated)
                if seq.generated >= seq.max_tokens:
                    seq.done = True
                    self.running.remove(seq)
                    self._free(seq)
                    self.m_success.inc()
                    self.m_e2e.observe(now - seq.arrival)
                    seq.out.put_nowait(None)


def make_app(cfg: SimConfig):
    """The FastAPI app of the simulated server."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from prometheus_client import generate_latest

    app = FastAPI()
    holder: dict = {}

    def engine() -> Engine:
        if "engine" not in holder:
            holder["engine"] = Engine(cfg)
        return holder["engine"]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": cfg.model, "object": "model", "owned_by": "vllm-doctor-simulation",
                                            "max_model_len": cfg.max_prompt_tokens}]}

    @app.get("/version")
    async def version():
        return {"version": SIMULATED_VERSION}

    @app.get("/health")
    async def health():
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics():
        eng = engine()
        eng._gauges()
        return PlainTextResponse(generate_latest(eng.registry).decode(), media_type="text/plain; version=0.0.4")

    def error(msg: str, status: int):
        return JSONResponse({"object": "error", "message": msg, "type": "BadRequestError", "code": status},
                            status_code=status)

    async def stream(eng: Engine, seq: _Seq, chat: bool, usage: bool, rid: str):
        try:
            if chat:
                yield "data: " + json.dumps({"id": rid, "object": "chat.completion.chunk", "model": cfg.model,
                                             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) + "\n\n"
            while True:
                i = await seq.out.get()
                if i is None:
                    break
                piece = f" t{i}"
                choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                          else {"index": 0, "text": piece, "finish_reason": None})
                yield "data: " + json.dumps({"id": rid, "model": cfg.model, "choices": [choice]}) + "\n\n"
            if usage:
                yield "data: " + json.dumps({"id": rid, "model": cfg.model, "choices": [], "usage": {
                    "prompt_tokens": len(seq.prompt), "completion_tokens": seq.generated,
                    "total_tokens": len(seq.prompt) + seq.generated}}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            eng.abort(seq)

    counter = {"n": 0}

    async def handle(request: Request, chat: bool):
        try:
            body = await request.json()
        except ValueError:
            return error("the body is not JSON", 400)
        if not isinstance(body, dict):
            return error("the body is not a JSON object", 400)
        if not body.get("stream"):
            return error("the simulated server only streams (send \"stream\": true)", 400)
        text: object
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list):
                return error("messages: a list is expected", 400)
            text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            text = body.get("prompt")
            if not isinstance(text, str):
                return error("prompt: a string is expected", 400)
        words = text.split() or ["<empty>"]
        max_tokens = body.get("max_tokens") or 16
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return error("max_tokens: a positive integer is expected", 400)
        if len(words) + max_tokens > cfg.max_prompt_tokens:
            return error(f"This model's maximum context length is {cfg.max_prompt_tokens} tokens", 400)
        eng = engine()
        if eng._blocks_for(len(words) + max_tokens) > cfg.num_gpu_blocks:
            return error(f"{len(words)} prompt tokens + max_tokens {max_tokens} exceed the simulated KV cache "
                         f"({cfg.num_gpu_blocks * cfg.block_size} tokens)", 400)
        if len(eng.waiting) >= cfg.max_waiting:
            return error("the simulated queue is full", 503)
        seq = eng.submit(words, max_tokens)
        counter["n"] += 1
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim-{counter['n']}"
        return StreamingResponse(stream(eng, seq, chat, usage, rid), media_type="text/event-stream")

    openai_routes(app, handle)
    return app


def openai_routes(app, handle) -> None:
    """POST /v1/completions and /v1/chat/completions on ``app``, each ``await handle(request, chat)``."""

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, True)


def _serve(cfg: SimConfig, sock: socket.socket) -> None:
    import uvicorn

    uvicorn.Server(uvicorn.Config(make_app(cfg), log_level="warning", lifespan="off",
                                  access_log=False)).run(sockets=[sock])


def start_in_child(target, args: tuple, host: str = "127.0.0.1", port: int = 0, wait_seconds: float = 30.0):
    """Serve ``target(*args, sock)`` in a child process on a socket bound here (port 0: a free one);
    returns (process, port) once ``GET /v1/models`` answers 200. RuntimeError when it does not."""
    import httpx

    sock = socket.socket()
    sock.bind((host, port))
    sock.listen(1024)
    port = sock.getsockname()[1]
    ctx: Any = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    proc = ctx.Process(target=target, args=(*args, sock), daemon=True)
    proc.start()
    sock.close()
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            if httpx.get(f"http://{host}:{port}/v1/models", timeout=2, trust_env=False).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.terminate()
            proc.join(10)
            raise RuntimeError("the server did not start")
        time.sleep(0.05)


class SimulatedServer:
    """The simulated server in a child process of its own on 127.0.0.1 (port 0: a free one), so
    that the client's timings do not share an interpreter lock with it. A context manager."""

    def __init__(self, cfg: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.cfg = cfg or SimConfig()
        self.host, self.port = host, port
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> SimulatedServer:
        self.proc, self.port = start_in_child(_serve, (self.cfg,), self.host, self.port)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join(10)
            self.proc = None
