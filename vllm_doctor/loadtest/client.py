"""One streamed request to vLLM's OpenAI-compatible API, timed the way vLLM's own
``vllm bench serve`` times it.

- TTFT: from sending the request to the first chunk that carries generated text (a role-only or
  empty chunk is not a token). TTFT needs streaming: a non-streamed response carries no timing.
- ITL: the gaps between successive content chunks.
- TPOT: (end-to-end latency - TTFT) / (output tokens - 1), with the output token count from the
  server's own ``usage`` (``stream_options.include_usage``), else the number of content chunks.

httpx (async) is the HTTP client; the server's Server-Sent Events are split on blank lines here
because the stream format (``data: {json}`` lines ending with ``data: [DONE]``) is OpenAI's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    """What one request measured. Times in seconds; ``error`` is None on success."""

    ok: bool
    ttft_seconds: float | None = None
    e2e_seconds: float | None = None
    itl_seconds: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    error: str | None = None
    started: float = 0.0  # time.time() when sent

    @property
    def tpot_seconds(self) -> float | None:
        if not self.ok or self.ttft_seconds is None or self.e2e_seconds is None or self.output_tokens < 2:
            return None
        return (self.e2e_seconds - self.ttft_seconds) / (self.output_tokens - 1)


def request_body(model: str, prompt: str, max_tokens: int, chat: bool, ignore_eos: bool) -> dict:
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}, "temperature": 0.0}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: exactly max_tokens are generated
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_text(obj: dict, chat: bool) -> str:
    for choice in obj.get("choices") or ():
        if chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or ""
        else:
            text = choice.get("text") or ""
        if text:
            return text
    return ""


async def stream_one(client: httpx.AsyncClient, url: str, body: dict, chat: bool,
                     timeout_seconds: float) -> RequestResult:
    """Send one streamed request; never raises (a failure is a RequestResult with ``error``).
    ``timeout_seconds`` bounds the whole request (httpx's own timeouts are per read, so a server
    that trickles bytes without a token would never trip them)."""
    res = RequestResult(ok=False, started=time.time())
    t0 = time.perf_counter()
    last = None
    chunks = 0
    usage_tokens = None
    try:
        async with asyncio.timeout(timeout_seconds):
            async with client.stream("POST", url, json=body, timeout=timeout_seconds) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    res.error = f"HTTP {r.status_code}: {' '.join(text.split())[:200]}"
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        res.error = f"unreadable stream chunk: {data[:80]!r}"
                        return res
                    if not isinstance(obj, dict):
                        res.error = f"unreadable stream chunk: {data[:80]!r}"
                        return res
                    if obj.get("error"):
                        res.error = f"server error in stream: {str(obj['error'])[:200]}"
                        return res
                    usage = obj.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens", usage_tokens)
                        res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
                    if _chunk_text(obj, chat):
                        now = time.perf_counter()
                        if last is None:
                            res.ttft_seconds = now - t0
                        else:
                            res.itl_seconds.append(now - last)
                        last = now
                        chunks += 1
    except (httpx.TimeoutException, TimeoutError):
        res.error = f"timed out after {timeout_seconds:g} s"
        return res
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
        return res
    res.e2e_seconds = time.perf_counter() - t0
    res.output_tokens = usage_tokens if usage_tokens is not None else chunks
    if res.ttft_seconds is None:
        res.error = "the stream carried no generated text"
        return res
    res.ok = True
    return res
