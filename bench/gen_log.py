#!/usr/bin/env python3
"""Generate a large, request-heavy vLLM log for benchmarks (stdout or --out FILE).

The shape is that of a real vLLM 0.32 server (the line formats of tests/fixtures/logs/
cpu-*.log) run with --enable-log-requests under steady load: for each request a
"Received request ... prompt: '...'" line with the prompt echoed (1-4 KB, some prompts hold words
such as "error" or "memory" that the prefilter must not be fooled by), an "Added request" line
and a uvicorn access line; every 10 s of log time the periodic stats line; a start-up header.
Deterministic for a given --seed.

    python bench/gen_log.py --size 1GiB --out /tmp/big.log
"""

from __future__ import annotations

import argparse
import random
import sys

HEADER = """\
(APIServer pid=16315) INFO 11-30 09:10:22 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=16315) INFO 11-30 09:10:22 [api_utils.py:286] non-default args: {'host': '0.0.0.0', 'port': 8000, 'model': '/models/llama', 'max_model_len': 8192, 'max_num_seqs': 256, 'enable_log_requests': True}
(EngineCore pid=16486) INFO 11-30 09:10:29 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/models/llama', max_seq_len=8192, tensor_parallel_size=1, kv_cache_dtype=auto, enable_prefix_caching=True, enable_chunked_prefill=True
(EngineCore pid=16486) INFO 11-30 09:10:38 [gpu_worker.py:440] Available KV cache memory: 61.84 GiB
(EngineCore pid=16486) INFO 11-30 09:10:38 [kv_cache_utils.py:2327] GPU KV cache size: 506,400 tokens, Maximum concurrency for 8,192 tokens per request: 61.82x
INFO:     Application startup complete.
"""
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no what can out other were into "
         "more some could time these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down should because each "
         "just those people how too little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old year off come since "
         "against go came right used take three summarize translate explain code python function write story").split()
RARE = "error memory version config failed timeout blocks concurrency".split()


def size_arg(s: str) -> int:
    s = s.strip().upper()
    for suf, mul in (("GIB", 1 << 30), ("MIB", 1 << 20), ("KIB", 1 << 10), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s.endswith(suf):
            return int(float(s[: -len(suf)]) * mul)
    return int(s)


def ts(t: float) -> str:
    d, r = divmod(int(t), 86400)
    h, r = divmod(r, 3600)
    m, s = divmod(r, 60)
    return f"11-{30 + d if 30 + d <= 30 else 30:02d} {h:02d}:{m:02d}:{s:02d}" if d == 0 else f"12-{d:02d} {h:02d}:{m:02d}:{s:02d}"


def _begin(out, header: str, seed: int) -> tuple[random.Random, int]:
    """Write the start-up header; the generator's random source and the bytes written."""
    out.write(header)
    return random.Random(seed), len(header.encode())


def _flush(buf: list[str], out) -> int:
    """Write the lines held in ``buf`` and empty it; the bytes written."""
    chunk = "".join(buf)
    out.write(chunk)
    buf.clear()
    return len(chunk.encode())


V1_PARAMS = ("SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, "
             "top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], max_tokens={mt}, min_tokens=0, "
             "logprobs=None, skip_special_tokens=True)")


def _v1_stats(rnd: random.Random, prefix: str) -> str:
    """V1's periodic stats line of engine 0 under steady load, after ``prefix`` (process, level, time, file)."""
    running = rnd.randint(20, 120)
    return (f"{prefix} Engine 000: Avg prompt throughput: {rnd.uniform(2000, 9000):.1f} tokens/s, Avg generation "
            f"throughput: {rnd.uniform(2500, 4000):.1f} tokens/s, Running: {running} reqs, Waiting: {rnd.randint(0, 3)} "
            f"reqs, GPU KV cache usage: {rnd.uniform(20, 80):.1f}%, Prefix cache hit rate: {rnd.uniform(10, 60):.1f}%\n")


def _prompt_words(rnd: random.Random) -> list[str]:
    """The words of one prompt: 150-700, now and then one that names a symptom (the prefilter must not be fooled)."""
    return [rnd.choice(WORDS) if rnd.random() > 0.002 else rnd.choice(RARE) for _ in range(rnd.randint(150, 700))]


def _added(rnd: random.Random, prefix: str, access_prefix: str, rid: str) -> list[str]:
    """V1's ``Added request`` line of ``rid`` (after ``prefix``) and the request's uvicorn access line."""
    return [f"{prefix} Added request {rid}-{rnd.getrandbits(32):08x}.\n",
            f'{access_prefix}INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "POST /v1/completions HTTP/1.1" 200 OK\n']


def generate(size: int, out, seed: int = 1, rps: float = 40.0) -> int:
    rnd, written = _begin(out, HEADER, seed)
    t = 9 * 3600 + 11 * 60.0
    next_stats = t + 10
    n = 0
    buf = []
    while written < size:
        t += rnd.expovariate(rps)
        while t >= next_stats:
            buf.append(_v1_stats(rnd, f"(APIServer pid=16315) INFO {ts(next_stats)} [loggers.py:335]"))
            next_stats += 10
        rid = f"cmpl-{rnd.getrandbits(64):016x}-0"
        words = _prompt_words(rnd)
        prompt = " ".join(words)
        stamp = ts(t)
        buf.append(f"(APIServer pid=16315) INFO {stamp} [request_logger.py:65] Received request {rid}: prompt: '{prompt}', "
                   f"params: {V1_PARAMS.format(mt=rnd.randint(64, 1024))}, lora_request: None.\n")
        buf += _added(rnd, f"(APIServer pid=16315) INFO {stamp} [async_llm.py:578]", "", rid)
        n += 1
        if len(buf) > 3000:
            written += _flush(buf, out)
    _flush(buf, out)
    return n


HEADER_V0 = """\
INFO 02-01 06:30:02 api_server.py:495] vLLM API server version 0.6.3.post1
INFO 02-01 06:30:02 api_server.py:496] args: Namespace(host=None, port=8000, model='/models/llama', max_model_len=8192, max_num_seqs=256, disable_log_requests=False)
INFO 02-01 06:30:12 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: model='/models/llama', max_seq_len=8192, tensor_parallel_size=1, enable_prefix_caching=False
INFO 02-01 06:30:40 gpu_executor.py:122] # GPU blocks: 31470, # CPU blocks: 2048
INFO 02-01 06:30:40 gpu_executor.py:126] Maximum concurrency for 8192 tokens per request: 61.46x
INFO:     Application startup complete.
"""
V0_PARAMS = ("SamplingParams(n=1, best_of=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
             "temperature=0.7, top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
             "include_stop_str_in_output=False, ignore_eos=False, max_tokens={mt}, min_tokens=0, logprobs=None, "
             "prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, "
             "truncate_prompt_tokens=None)")


def generate_v0(size: int, out, seed: int = 1, rps: float = 40.0) -> int:
    """What vLLM <= 0.9's V0 engine writes by default under load (request logging on, the
    default): per request entrypoints/logger.py's ``Received request %s: prompt: %r, params: %s,
    prompt_token_ids: %s, lora_request: %s, prompt_adapter_request: %s.``, async_llm_engine.py's
    ``Added request %s.`` and ``Finished request %s.``, uvicorn's access line; metrics.py's stats
    line every 5 s (the line formats of the real V0 logs in tests/fixtures)."""
    rnd, written = _begin(out, HEADER_V0, seed)
    t = 6 * 3600 + 31 * 60.0
    next_stats = t + 5
    n = 0
    buf: list[str] = []
    finishing: list[tuple[float, str]] = []
    while written < size:
        t += rnd.expovariate(rps)
        while t >= next_stats:
            buf.append(f"INFO {ts(next_stats)} metrics.py:349] Avg prompt throughput: {rnd.uniform(2000, 9000):.1f} tokens/s, "
                       f"Avg generation throughput: {rnd.uniform(2500, 4000):.1f} tokens/s, Running: {rnd.randint(20, 120)} reqs, "
                       f"Swapped: 0 reqs, Pending: {rnd.randint(0, 3)} reqs, GPU KV cache usage: {rnd.uniform(20, 80):.1f}%, "
                       "CPU KV cache usage: 0.0%.\n")
            next_stats += 5
        while finishing and finishing[0][0] <= t:
            done, frid = finishing.pop(0)
            buf.append(f"INFO {ts(done)} async_llm_engine.py:140] Finished request {frid}.\n")
            buf.append(f'INFO:     127.0.0.1:{rnd.randint(30000, 60000)} - "POST /v1/completions HTTP/1.1" 200 OK\n')
        rid = f"cmpl-{rnd.getrandbits(128):032x}-0"
        words = _prompt_words(rnd)
        stamp = ts(t)
        buf.append(f"INFO {stamp} logger.py:37] Received request {rid}: prompt: '{' '.join(words)}', "
                   f"params: {V0_PARAMS.format(mt=rnd.randint(64, 1024))}, prompt_token_ids: None, lora_request: None, "
                   "prompt_adapter_request: None.\n")
        buf.append(f"INFO {stamp} async_llm_engine.py:207] Added request {rid}.\n")
        finishing.append((t + rnd.uniform(1, 20), rid))
        finishing.sort()
        n += 1
        if len(buf) > 3000:
            written += _flush(buf, out)
    _flush(buf, out)
    return n


HEADER_DEBUG = "".join((
    "(APIServer pid=2231) INFO 11-30 09:10:22 [entrypoints/utils.py:253] non-default args: {'model': '/models/llama', "
    "'max_model_len': 8192, 'max_num_seqs': 256, 'enable_log_requests': True}\n",
    "(APIServer pid=2231) DEBUG 11-30 09:10:22 [entrypoints/openai/api_server.py:163] Setup forkserver with pre-imports\n",
    "(EngineCore pid=2402) INFO 11-30 09:10:29 [v1/engine/core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/models/llama', max_seq_len=8192, tensor_parallel_size=1, kv_cache_dtype=auto, enable_prefix_caching=True, "
    "enable_chunked_prefill=True\n",
    "(EngineCore pid=2402) INFO 11-30 09:10:38 [v1/worker/gpu_worker.py:440] Available KV cache memory: 61.84 GiB\n",
    "(EngineCore pid=2402) INFO 11-30 09:10:38 [v1/core/kv_cache_utils.py:2327] GPU KV cache size: 506,400 tokens, "
    "Maximum concurrency for 8,192 tokens per request: 61.82x\n",
    "INFO:     Application startup complete.\n",
))


def generate_debug(size: int, out, seed: int = 1, rps: float = 40.0) -> int:
    """vLLM 0.32 (V1) run with VLLM_LOGGING_LEVEL=DEBUG and --enable-log-requests under steady
    load: the logger's file is a relative path at DEBUG (logging_utils/formatter.py); per request
    request_logger.py's ``Received request %s: params: ...`` (INFO), ``Request %s details: prompt:
    %r, prompt_token_ids: %s, prompt_embeds shape: %s.`` and ``Request %s JSON body: %s`` (DEBUG:
    the prompt twice, its token ids once), ``Added request %s.`` and the access line; a /health
    probe every 5 s (async_llm.py's DEBUG ``Called check_health.`` and its access line); the
    engine's DEBUG ``EngineCore waiting for work.`` / ``EngineCore loop active.`` at each pause
    of the load; the stats line every 10 s."""
    rnd, written = _begin(out, HEADER_DEBUG, seed)
    t = 9 * 3600 + 11 * 60.0
    next_stats = next_probe = t + 5
    n = 0
    buf: list[str] = []
    api = "(APIServer pid=2231)"
    while written < size:
        gap = rnd.expovariate(rps) if rnd.random() > 0.001 else rnd.uniform(5, 30)  # now and then a pause
        if gap > 2:
            buf.append(f"(EngineCore pid=2402) DEBUG {ts(t + 0.5)} [v1/engine/core.py:737] EngineCore waiting for work.\n")
        t += gap
        if gap > 2:
            buf.append(f"(EngineCore pid=2402) DEBUG {ts(t)} [v1/engine/core.py:743] EngineCore loop active.\n")
        while t >= next_probe:
            buf.append(f"{api} DEBUG {ts(next_probe)} [v1/engine/async_llm.py:609] Called check_health.\n")
            buf.append(f'{api} INFO:     10.0.0.1:{rnd.randint(30000, 60000)} - "GET /health HTTP/1.1" 200 OK\n')
            next_probe += 5
        while t >= next_stats:
            buf.append(_v1_stats(rnd, f"{api} INFO {ts(next_stats)} [v1/metrics/loggers.py:271]"))
            next_stats += 10
        rid, words = f"cmpl-{rnd.getrandbits(64):016x}-0", _prompt_words(rnd)
        prompt = " ".join(words)
        ids = ", ".join(str(rnd.randint(100, 32000)) for _ in words)
        mt = rnd.randint(64, 1024)
        stamp = ts(t)
        rl = f"{api} %s {stamp} [entrypoints/serve/utils/request_logger.py:%d] "
        buf.append(rl % ("INFO", 65) + f"Received request {rid}: params: {V1_PARAMS.format(mt=mt)}, lora_request: None.\n")
        buf.append(rl % ("DEBUG", 55) + f"Request {rid} details: prompt: '{prompt}', prompt_token_ids: [{ids}], "
                   "prompt_embeds shape: None.\n")
        buf.append(rl % ("DEBUG", 74) + f'Request {rid} JSON body: {{"model": "/models/llama", "prompt": "{prompt}", '
                   f'"max_tokens": {mt}, "temperature": 0.7}}\n')
        buf += _added(rnd, f"{api} INFO {stamp} [v1/engine/async_llm.py:578]", f"{api} ", rid)
        n += 1
        if len(buf) > 3000:
            written += _flush(buf, out)
    _flush(buf, out)
    return n


def generate_stats8(size: int, out, seed: int = 1, storm_at: float = 0.5, span: float | None = None) -> int:
    """vLLM V1 with --data-parallel-size 8 (the stats line of each of its 8 engines every 10 s,
    written by the API server: v1/metrics/loggers.py, as in tests/fixtures/logs/071-*), for as
    long as ``size`` bytes last (a week is about 130 MB), or ``span`` seconds of log time when
    given; at ``storm_at`` of the way an hour-long
    storm on two engines: their KV cache full, requests waiting by the hundred, generation
    throughput down (the fixture's shape). Returns the number of stats lines."""
    rnd, written = _begin(out, "", seed)
    t0 = t = 6 * 3600 + 16 * 60.0
    storm = None
    n = 0
    buf: list[str] = []
    while (written < size) if span is None else (t - t0 < span):
        if storm is None and (written >= storm_at * size if span is None else t - t0 >= storm_at * span):
            storm = t + 3600
        hot = storm is not None and t < storm
        for e in range(8):
            full = hot and e < 2
            d, r = divmod(int(t), 86400)
            stamp = f"{3 + (d // 28) % 9:02d}-{1 + d % 28:02d} {r // 3600:02d}:{r // 60 % 60:02d}:{r % 60:02d}"
            buf.append(f"(APIServer pid=387731) INFO {stamp} [loggers.py:257] Engine {e:03d}: Avg prompt throughput: "
                       f"{rnd.uniform(0, 40) if full else rnd.uniform(500, 3000):.1f} tokens/s, Avg generation throughput: "
                       f"{rnd.uniform(600, 1200) if full else rnd.uniform(1500, 2500):.1f} tokens/s, Running: "
                       f"{rnd.randint(30, 64) if full else rnd.randint(10, 40)} reqs, Waiting: "
                       f"{rnd.randint(100, 400) if full else rnd.randint(0, 2)} reqs, GPU KV cache usage: "
                       f"{rnd.uniform(98, 100) if full else rnd.uniform(20, 70):.1f}%, Prefix cache hit rate: "
                       f"{rnd.uniform(60, 70):.1f}%, MM cache hit rate: 0.0%\n")
            n += 1
        t += 10
        if len(buf) > 3000:
            written += _flush(buf, out)
    _flush(buf, out)
    return n


SHAPES = {"v1": generate, "v0": generate_v0, "debug": generate_debug, "stats8": generate_stats8}
SHAPE_HELP = ("v1: vLLM 0.32 with --enable-log-requests; v0: vLLM <= 0.9's V0 engine, request logging by default; "
              "debug: vLLM 0.32 at VLLM_LOGGING_LEVEL=DEBUG with --enable-log-requests; stats8: the stats lines of 8 "
              "data-parallel engines (a week: about 130 MB) with an hour's storm on two of them")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100MiB", help="approximate size (e.g. 1GiB, 200MiB)")
    ap.add_argument("--out", default="-")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="v1", help=SHAPE_HELP)
    a = ap.parse_args()
    size = size_arg(a.size)
    gen = SHAPES[a.shape]
    if a.out == "-":
        gen(size, sys.stdout, a.seed)
    else:
        with open(a.out, "w") as fh:
            n = gen(size, fh, a.seed)
        print(f"wrote {a.out}: {size_arg(a.size) / (1 << 20):.0f} MiB, {n:,} {'stats lines' if a.shape == 'stats8' else 'requests'}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
