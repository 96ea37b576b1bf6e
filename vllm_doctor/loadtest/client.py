"""One streamed request to vLLM's OpenAI-compatible API, timed the way vLLM's own
``vllm bench serve`` times it.

- TTFT: from sending the request to the first chunk that carries generated text (a role-only or
  empty chunk is not a token). TTFT needs streaming: a non-streamed response carries no timing.
- ITL: per token, from the times the content chunks were received. Chunks that one network read
  carried together share the gap since the previous read equally (5 chunks read together 10 ms after
  the last ones: 5 gaps of 2 ms). Timed one by one they would show gaps of a few microseconds, the
  parser's time, not the server's: on a loaded server whose chunks reach the client in bursts, the
  p99 of such gaps was 0 ms while TPOT was 2.7 ms (the e2e ladder against vLLM 0.32 on CPU;
  ``vllm bench serve``'s own median ITL there was 0.004 ms). vLLM's own
  ``vllm:inter_token_latency_seconds`` is per token too. Chunks that came in the read of the first
  token have no gap of their own and are not timed.
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


#: One response's bound (``LadderConfig.max_response_bytes``, ``bench ladder --max-response-bytes``):
#: a streamed completion of a few thousand tokens is a few hundred KB.
MAX_RESPONSE_BYTES = 16 << 20


class MalformedChunk(ValueError):
    """A stream chunk that is not what OpenAI's stream format says (the request is an error)."""


def _count(v: object, what: str) -> int | None:
    """A token count of ``usage``: an integer >= 0 (a string, a float or a bool is malformed)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MalformedChunk(f"usage.{what} is {v!r}, not a count of tokens")
    return v


def _chunk_text(obj: dict, chat: bool) -> str:
    choices = obj.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise MalformedChunk(f"choices is {type(choices).__name__}, not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise MalformedChunk(f"a choice is {type(choice).__name__}, not an object")
        if chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedChunk(f"delta is {type(delta).__name__}, not an object")
            text = delta.get("content") or delta.get("reasoning_content") or ""
        else:
            text = choice.get("text") or ""
        if not isinstance(text, str):
            raise MalformedChunk(f"the text is {type(text).__name__}, not a string")
        if text:
            return text
    return ""


async def _reads(r: httpx.Response, max_bytes: int):
    """The response's lines, as (time received, the lines one network read completed); its size
    bounded by ``max_bytes`` (a line is never held whole past it)."""
    buf = b""
    total = 0
    async for chunk in r.aiter_bytes():
        now = time.perf_counter()
        total += len(chunk)
        if total > max_bytes:
            raise MalformedChunk(f"response over {max_bytes} bytes (--max-response-bytes)")
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield now, [line.decode("utf-8", "replace").rstrip("\r") for line in lines]
    if buf:
        yield time.perf_counter(), [buf.decode("utf-8", "replace")]


async def stream_one(client: httpx.AsyncClient, url: str, body: dict, chat: bool,
                     timeout_seconds: float, max_bytes: int = MAX_RESPONSE_BYTES) -> RequestResult:
    """Send one streamed request; never raises (a failure is a RequestResult with ``error``).
    ``timeout_seconds`` bounds the whole request (httpx's own timeouts are per read, so a server
    that trickles bytes without a token would never trip them); ``max_bytes`` its response. A
    chunk that is not what OpenAI's stream format says (unreadable JSON, ``choices`` that is no
    list, a ``completion_tokens`` that is a string) makes the request an error, with the reason."""
    res = RequestResult(ok=False, started=time.time())
    t0 = time.perf_counter()
    last = None
    chunks = 0
    usage_tokens = None
    try:
        async with asyncio.timeout(timeout_seconds):
            async with client.stream("POST", url, json=body, timeout=timeout_seconds) as r:
                if r.status_code != 200:
                    text = b""
                    async for part in r.aiter_bytes():
                        text += part
                        if len(text) >= 4096:
                            break
                    text = text.decode("utf-8", "replace")
                    res.error = f"HTTP {r.status_code}: {' '.join(text.split())[:200]}"
                    return res
                done = False
                async for now, lines in _reads(r, max_bytes):
                    new = 0   # content chunks this read carried
                    for data in (ln[5:].strip() for ln in lines if ln.startswith("data:")):   # SSE data lines
                        if data == "[DONE]":
                            done = True
                            break
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            raise MalformedChunk(f"unreadable JSON {data[:80]!r}") from None
                        if not isinstance(obj, dict):
                            raise MalformedChunk(f"a {type(obj).__name__}, not an object: {data[:80]!r}")
                        if obj.get("error"):
                            res.error = f"server error in stream: {str(obj['error'])[:200]}"
                            return res
                        usage = obj.get("usage")
                        if usage:
                            if not isinstance(usage, dict):
                                raise MalformedChunk(f"usage is {type(usage).__name__}, not an object")
                            c = _count(usage.get("completion_tokens"), "completion_tokens")
                            usage_tokens = usage_tokens if c is None else c
                            p = _count(usage.get("prompt_tokens"), "prompt_tokens")
                            res.prompt_tokens = res.prompt_tokens if p is None else p
                        if _chunk_text(obj, chat):
                            new += 1
                    if new:
                        if last is None:
                            res.ttft_seconds = now - t0
                        else:   # the chunks read together share the gap since the last read (per token)
                            res.itl_seconds.extend([(now - last) / new] * new)
                        last = now
                        chunks += new
                    if done:
                        break
    except MalformedChunk as e:
        res.error = f"malformed stream chunk: {e}"
        return res
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
