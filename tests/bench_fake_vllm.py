"""A stand-in for vLLM's OpenAI-compatible server, for the unit tests of ``bench`` (the real
vLLM on CPU is exercised by tests/e2e/test_e2e_bench.py).

It behaves like a server whose KV cache holds ``slots`` sequences: at most ``slots`` requests
decode at once, the rest wait in a queue (so TTFT grows past ``slots``), and every request admitted
while more than ``preempt_above`` are in flight counts one preemption on
``vllm:num_preemptions_total``; the seconds finished requests spent running and waiting are the sums
of ``vllm:request_inference_time_seconds`` and ``vllm:request_queue_time_seconds``. Each token takes
``token_seconds``, and ``overload_factor`` times that while more requests are in flight than there are slots (what recomputing preempted sequences
costs a real server); streaming uses vLLM's chunk
shapes (a role-only first chunk for chat, ``choices[0].text`` for completions, a final usage chunk,
``data: [DONE]``). Served by uvicorn (FastAPI) on 127.0.0.1 in a child process of its own, so that
the client's timings are not distorted by sharing the interpreter lock with the server; its counters
are read over HTTP (``/metrics``), as the ladder reads them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from vllm_doctor.loadtest.simulated import openai_routes, start_in_child


class FakeVllm:
    def __init__(self, slots: int = 4, preempt_above: int | None = None, token_seconds: float = 0.01,
                 fail_every: int = 0, overload_factor: float = 1.5, model: str = "fake-model", num_gpu_blocks: int = 32, block_size: int = 16,
                 version: str = "0.0.0+fake"):
        self.slots, self.preempt_above, self.token_seconds = slots, preempt_above, token_seconds
        self.fail_every, self.model, self.overload_factor = fail_every, model, overload_factor
        self.num_gpu_blocks, self.block_size, self.version = num_gpu_blocks, block_size, version
        self.running = 0
        self.waiting = 0
        self.preemptions = 0
        self.requests = 0
        self.arrivals = 0
        self.max_in_flight = 0
        self.running_seconds = 0.0   # vllm:request_inference_time_seconds_sum (time RUNNING, finished requests)
        self.waiting_seconds = 0.0   # vllm:request_queue_time_seconds_sum (time WAITING)
        self.finished = 0
        self.app = self._app()
        self.proc = None
        self.port = 0

    def _app(self) -> FastAPI:
        app = FastAPI()
        sem_holder: dict = {}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

        @app.get("/version")   # vLLM's api_server: {"version": VLLM_VERSION}
        async def version():
            return {"version": self.version}

        @app.get("/metrics")
        async def metrics():
            kv = min(1.0, self.running / self.slots)
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {float(self.running)}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{engine="0",model_name="{self.model}"}} {float(self.waiting)}\n'
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {kv}\n'
                "# TYPE vllm:num_preemptions counter\n"
                f'vllm:num_preemptions_total{{engine="0",model_name="{self.model}"}} {float(self.preemptions)}\n'
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="{self.block_size}",engine="0",'
                f'num_gpu_blocks="{self.num_gpu_blocks}"}} 1.0\n'
                "# TYPE vllm:request_inference_time_seconds histogram\n"
                f'vllm:request_inference_time_seconds_sum{{engine="0",model_name="{self.model}"}} {self.running_seconds}\n'
                f'vllm:request_inference_time_seconds_count{{engine="0",model_name="{self.model}"}} {float(self.finished)}\n'
                "# TYPE vllm:request_queue_time_seconds histogram\n"
                f'vllm:request_queue_time_seconds_sum{{engine="0",model_name="{self.model}"}} {self.waiting_seconds}\n'
                f'vllm:request_queue_time_seconds_count{{engine="0",model_name="{self.model}"}} {float(self.finished)}\n')
            return PlainTextResponse(text)

        async def generate(body: dict, chat: bool):
            if "sem" not in sem_holder:
                sem_holder["sem"] = asyncio.Semaphore(self.slots)
            sem = sem_holder["sem"]
            self.requests += 1
            n = int(body.get("max_tokens") or 16)
            prompt = body.get("prompt") or " ".join(m.get("content", "") for m in body.get("messages", []))
            prompt_tokens = len(str(prompt).split())
            self.waiting += 1
            in_flight = self.running + self.waiting
            self.max_in_flight = max(self.max_in_flight, in_flight)
            if self.preempt_above is not None and in_flight > self.preempt_above:
                self.preemptions += 1
            arrived = time.monotonic()
            async with sem:
                self.waiting -= 1
                self.running += 1
                admitted = time.monotonic()
                try:
                    cid = f"cmpl-{self.requests}"
                    if chat:
                        yield "data: " + json.dumps({"id": cid, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) + "\n\n"
                    for i in range(n):
                        busy = self.running + self.waiting > self.slots
                        await asyncio.sleep(self.token_seconds * (self.overload_factor if busy else 1.0))
                        piece = f" t{i}"
                        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                        yield "data: " + json.dumps({"id": cid, "choices": [choice]}) + "\n\n"
                finally:
                    self.running -= 1  # the sequence is finished before the client hears so
                    self.running_seconds += time.monotonic() - admitted
                    self.waiting_seconds += admitted - arrived
                    self.finished += 1
            yield "data: " + json.dumps({"id": cid, "choices": [], "usage": {
                "prompt_tokens": prompt_tokens, "completion_tokens": n,
                "total_tokens": prompt_tokens + n}}) + "\n\n"
            yield "data: [DONE]\n\n"

        async def handle(request: Request, chat: bool):
            body = await request.json()
            self.arrivals += 1  # every fail_every-th arrival fails, whatever is in flight
            if self.fail_every and self.arrivals % self.fail_every == 0:
                return JSONResponse({"object": "error", "message": "simulated failure", "code": 500}, status_code=500)
            if not body.get("stream"):
                return JSONResponse({"error": "this stand-in only streams"}, status_code=400)
            return StreamingResponse(generate(body, chat), media_type="text/event-stream")

        openai_routes(app, handle)
        return app

    def _serve(self, sock: socket.socket) -> None:
        uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off")).run(sockets=[sock])

    def __enter__(self) -> FakeVllm:
        self.proc, self.port = start_in_child(self._serve, ())
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def preemptions_total(self) -> float:
        """vllm:num_preemptions_total as the server exports it."""
        import httpx

        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:num_preemptions_total"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError("no vllm:num_preemptions_total")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.join(10)
