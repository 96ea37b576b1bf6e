"""Parsers: the format of each vLLM version becomes the same typed event, units normalised."""

from __future__ import annotations

import pytest

from vllm_doctor import events as ev
from test_envelope import one, parse_lines
from vllm_doctor.parsers.records import CUT_TRACEBACK

GIB = 1 << 30


def test_kv_capacity_v0_blocks_and_cuda_blocks():
    a = one("INFO 01-11 15:51:18 llm_engine.py:275] # GPU blocks: 229, # CPU blocks: 512", "KvCacheCapacity")
    b = one("INFO 02-11 10:17:54 [executor_base.py:113] # cuda blocks: 36184, # CPU blocks: 2340", "KvCacheCapacity")
    assert (a.num_gpu_blocks, a.num_cpu_blocks, a.device) == (229, 512, "GPU")
    assert (b.num_gpu_blocks, b.num_cpu_blocks, b.device) == (36184, 2340, "GPU")


def test_kv_capacity_v1_two_lines_and_one_line_forms():
    a = one("INFO 07-28 23:02:27 [kv_cache_utils.py:833] GPU KV cache size: 176,240 tokens", "KvCacheCapacity")
    c = one("INFO 07-28 23:02:27 [kv_cache_utils.py:837] Maximum concurrency for 8,192 tokens per request: 21.51x", "KvCacheCapacity")
    one_line = one("(EngineCore pid=1) INFO 11-30 09:07:54 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, "
                   "Maximum concurrency for 2,048 tokens per request: 512.00x", "KvCacheCapacity")
    host = one("INFO 11-30 09:07:54 [kv_cache_utils.py:1147] GPU + host KV cache size: 9,000 tokens, "
               "Maximum concurrency for 1,000 tokens per request: 9.00x", "KvCacheCapacity")
    assert a.kv_cache_tokens == 176240 and c.max_concurrency == 21.51 and c.concurrency_tokens == 8192
    assert (one_line.kv_cache_tokens, one_line.device, one_line.max_concurrency) == (1048576, "CPU", 512.0)
    assert host.device == "GPU + host" and host.kv_cache_tokens == 9000


def test_memory_lines_units():
    a = one("(EngineCore_0 pid=1) INFO 08-19 14:58:40 [gpu_worker.py:277] Available KV cache memory: 112.61 GiB", "MemoryProfile")
    b = one("INFO 10-23 19:55:16 model_runner.py:1067] Loading model weights took 19.8557 GB", "MemoryProfile")
    c = one("INFO 02-11 10:17:54 [worker.py:294] the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.80) = 63.35GiB", "MemoryProfile")
    assert a.available_kv_cache_bytes == round(112.61 * GIB)
    assert b.model_weights_bytes == round(19.8557 * GIB)
    assert c.total_memory_bytes == round(79.19 * GIB) and c.gpu_memory_utilization == 0.80


def test_v1_stats_preemptions_field_is_per_interval():
    line = ("(APIServer pid=1) INFO 12-11 20:30:06 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 10.0 tokens/s, Running: 1 reqs, Waiting: 5 reqs, Preemptions: 7, "
            "GPU KV cache usage: 99.3%, Prefix cache hit rate: 68.2%")
    s = one(line, "SchedulerStats")
    assert s.preemptions == 7 and s.prefix_cache_hit_ratio == pytest.approx(0.682)


def test_v0_preemption_warning_cumulative():
    p = one("WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is preempted by PreemptionMode.SWAP mode because "
            "there is not enough KV cache space. total_num_cumulative_preemption=151", "Preemption")
    assert (p.mode, p.cumulative, p.seq_id) == ("SWAP", 151, "165")


def test_kv_too_small_wordings():
    v0 = one("ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (79392). Try", "KvCacheTooSmall")
    v083 = one("ERROR 04-05 01:12:55 [core.py:390] ValueError: To serve at least one request with the models's max seq len (1048576), "
               "(24.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.97 GiB). Try increasing", "KvCacheTooSmall")
    v085 = one("ValueError: To serve at least one request with the models's max seq len (4096), (2.00 GiB KV cache is needed, which is "
               "larger than the available KV cache memory (1.00 GiB). Based on the available memory,  Try increasing", "KvCacheTooSmall")
    v09 = one("ValueError: To serve at least one request with the model's max seq len (262144), (0.25 GiB KV cache is needed, which "
              "is larger than the available KV cache memory (0.12 GiB). Based on the available memory, the estimated maximum model length is 130944. Try", "KvCacheTooSmall")
    old_gb = one("ValueError: To serve at least one request with the models's max seq len (8192), (1.00 GB KV cache is needed, which is larger than the available KV cache memory (0.50 GB). Try", "KvCacheTooSmall")
    assert (v0.max_model_len, v0.kv_cache_tokens) == (131072, 79392)
    assert v083.needed_bytes == 24 * GIB and v083.estimated_max_model_len is None
    assert v085.estimated_max_model_len is None and v085.max_model_len == 4096
    assert v09.estimated_max_model_len == 130944
    assert old_gb.available_bytes == GIB // 2


def test_cuda_oom_bytes():
    o = one("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a total capacity of 14.62 GiB "
            "of which 3.31 MiB is free. Including non-PyTorch memory, this process has 14.61 GiB memory in use.", "OutOfMemory")
    old = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty of 23.65 GiB "
              "of which 1.00 GiB is free.", "OutOfMemory")
    assert (o.tried_bytes, o.gpu_index, o.total_bytes) == (20 * (1 << 20), 2, round(14.62 * GIB))
    assert o.free_bytes == round(3.31 * (1 << 20)) and o.in_use_bytes == round(14.61 * GIB)
    assert old.tried_bytes == 2 * GIB and old.total_bytes == round(23.65 * GIB)


@pytest.mark.parametrize("text,kind", [
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine-dead"),
    ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.", "engine-dead"),
    ("ERROR 09-05 17:22:27 async_llm_engine.py:63] Engine background task failed", "background-task-failed"),
    ("ERROR 09-05 17:22:27 async_llm_engine.py:660] Engine iteration timed out. This should never happen!", "iteration-timeout"),
    ("ERROR 08-19 14:58:40 [core.py:718] EngineCore failed to start.", "core-failed"),
    ("ERROR 08-19 14:58:40 [core_client.py:564] Engine core proc EngineCore_0 died unexpectedly, shutting down client.", "proc-died"),
])
def test_engine_failures(text, kind):
    assert one(text, "EngineFailure").kind == kind


def test_nccl_watchdog():
    n = one("(RayWorkerVllm pid=1) [E ProcessGroupNCCL.cpp:474] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800762 milliseconds before timing out.", "NcclError")
    assert (n.kind, n.op_type, n.timeout_seconds) == ("watchdog-timeout", "ALLREDUCE", 1800.0)


@pytest.mark.parametrize("line", [
    # shm_broadcast.py 0.11+ (INFO; held-back round 3 r03, r04) and 0.6.3 (WARNING, "No available block found")
    "(EngineCore pid=109) INFO 05-04 01:03:58 [shm_broadcast.py:681] No available shared memory broadcast block found in "
    "60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, "
    "weight/kv cache quantization).",
    "(VllmWorkerProcess pid=236) WARNING 10-01 10:00:00 shm_broadcast.py:396] No available block found in 60 second. ",
])
def test_shared_memory_broadcast_wait_is_not_an_nccl_error(line):
    w = one(line, "BroadcastWait")
    assert w.seconds == 60.0
    assert not any(isinstance(e, ev.NcclError) for e in parse_lines([line]))


def test_offline_progress_bar_tells_the_engine_served_once():
    bar = "Processed prompts:   0%|          | 0/4 [00:00<?, ?it/s, est. speed input: 0.00 toks/s, output: 0.00 toks/s]"
    evs = parse_lines([bar, bar.replace(" 0/4", " 1/4").replace("  0%", " 25%")])
    assert [(type(e).__name__, e.inferred, e.meta.lineno) for e in evs] == [("ServerReady", True, 1)]
    assert one("Adding requests: 100%|██████████| 4/4 [00:00<00:00, 1520.78it/s]", "ServerReady").inferred


def test_config_echoes_of_every_version():
    ns = one("INFO 07-10 10:00:00 api_server.py:178] args: Namespace(host=None, port=8000, max_model_len=4096, "
             "gpu_memory_utilization=0.85, max_num_seqs=128, block_size=16, enable_chunked_prefill=None, "
             "served_model_name=['a, b'], kv_cache_dtype='auto')", "EngineConfigObserved")
    nd = one("(APIServer pid=1) INFO 07-06 22:50:34 [api_utils.py:273] non-default args: {'model_tag': 'm', "
             "'max_model_len': 131072, 'kv_cache_dtype': 'fp8', 'max_num_seqs': 1, 'enable_chunked_prefill': True}", "EngineConfigObserved")
    evs = parse_lines(["(EngineCore pid=107) INFO 07-06 22:50:46 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with "
                       "config: model='m', speculative_config=None, max_seq_len=131072, tensor_parallel_size=2, "
                       "kv_cache_dtype=fp8, enable_prefix_caching=True, compilation_config={\"level\": 3, \"x\": [1, 2]}"])
    d = dict(ns.values)
    assert (d["max_model_len"], d["gpu_memory_utilization"], d["max_num_seqs"], d["served_model_name"]) == (4096, 0.85, 128, ["a, b"])
    assert dict(nd.values)["kv_cache_dtype"] == "fp8" and dict(nd.values)["max_num_seqs"] == 1
    cfg = [e for e in evs if isinstance(e, ev.EngineConfigObserved)][0]
    ver = [e for e in evs if isinstance(e, ev.VersionSeen)][0]
    assert dict(cfg.values)["max_model_len"] == 131072 and dict(cfg.values)["tensor_parallel_size"] == 2
    assert (ver.version, ver.engine) == ("0.24.0", "v1")


def test_truncated_non_default_args_still_give_known_keys():
    cfg = one("INFO 07-06 22:50:34 [api_utils.py:273] non-default args: {'model': 'm', 'max_model_len': 8192, 'max_num_seqs': 64, 'enable_pre",
              "EngineConfigObserved")
    assert dict(cfg.values)["max_model_len"] == 8192 and dict(cfg.values)["max_num_seqs"] == 64


def test_version_banner_and_api_server_version():
    assert one("(APIServer pid=1) INFO 11-30 09:10:22 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0", "VersionSeen").version == "0.32.0"
    assert one("INFO 10-01 10:00:00 api_server.py:148] vLLM API server version 0.6.3.post1", "VersionSeen").version == "0.6.3.post1"


def test_kv_check_value_error_cut_by_a_hard_wrap_still_gives_its_max_model_len():
    # held-out corpus 149 (Intel Arc, 120-column terminal): the ValueError stops mid-word
    cut = one("(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach",
              "KvCacheTooSmall")
    assert (cut.max_model_len, cut.needed_bytes, cut.available_bytes, cut.estimated_max_model_len) == (100000, round(4.26 * GIB), None, None)
    bare = one("ValueError: To serve at least one request with the models's max seq len (131072), (", "KvCacheTooSmall")
    assert (bare.max_model_len, bare.needed_bytes) == (131072, None)


@pytest.mark.parametrize("line", [
    "        self._initialize_kv_caches()",  # V0 engine/llm_engine.py 0.4-0.10 (held-out corpus 137)
    "(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708]     num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(",
    "(EngineCore pid=316)     kv_cache_config = self._initialize_kv_caches(vllm_config)",  # V1 0.2x
])
def test_traceback_through_start_up_kv_cache_set_up_is_an_engine_start_failure(line):
    e = one(line, "EngineFailure")
    assert e.kind == "core-failed" and "_initialize_kv_caches(" in e.message


def test_kv_init_frame_is_not_read_from_prose_or_a_def_line():
    assert not [e for e in parse_lines(["    def _initialize_kv_caches(self) -> None:",
                                        "we call self._initialize_kv_caches() here"]) if isinstance(e, ev.EngineFailure)]


def test_engine_config_echo_cut_inside_its_last_pair_does_not_give_that_value():
    # held-out corpus 156 (0.9.2): the echo is hard-wrapped right after "enable_prefix_caching="
    cfg = one("INFO 07-17 00:07:07 [core.py:69] Initializing a V1 LLM engine (v0.9.2) with config: model='meta-llama/Llama-3.1-8B', "
              "dtype=torch.bfloat16, max_seq_len=131072, tensor_parallel_size=1, enforce_eager=False, enable_prefix_caching=",
              "EngineConfigObserved")
    vals = dict(cfg.values)
    assert vals["max_model_len"] == 131072 and vals["enforce_eager"] is False and "enable_prefix_caching" not in vals
    cut_value = dict(one("INFO 07-17 00:07:07 [core.py:69] Initializing a V1 LLM engine (v0.9.2) with config: max_seq_len=4096, enable_prefix_caching=Fa",
                         "EngineConfigObserved").values)
    assert cut_value == {"max_model_len": 4096}


# ---- argparse's own rejection of the command line (corpus 046, 047)
def test_argparse_unrecognized_arguments_read_from_argparse_text():
    evs = [e for e in parse_lines(["usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...",
                                   "vllm serve: error: unrecognized arguments: --kv-cache fp8 --max_model_len=4096 --omni -q x"])
           if isinstance(e, ev.UnknownFlag)]
    assert [(e.flag, e.value) for e in evs] == [("--kv-cache", "fp8"), ("--max_model_len", "4096"), ("--omni", None), ("-q", "x")]
    real = {e.flag: e.real_flag for e in evs}
    assert real["--kv-cache"].startswith("--kv-cache-dtype") and real["--max_model_len"] == "--max-model-len"
    assert real["--omni"] is None and real["-q"] is None
    # markdown inline code around the whole line (a paste), and at most 16 flags from one line
    assert one("`vllm: error: unrecognized arguments: --config`", "UnknownFlag").flag == "--config"
    many = [e for e in parse_lines(["vllm: error: unrecognized arguments: " + " ".join(f"--f{i}" for i in range(40))])
            if isinstance(e, ev.UnknownFlag)]
    assert len(many) == 16
    # the words "unrecognized arguments" elsewhere in a message are not argparse's error line
    assert not [e for e in parse_lines(["INFO 01-01 00:00:00 x.py:1] note: error: unrecognized arguments are ignored here"])
                if isinstance(e, ev.UnknownFlag)]


# ---- the phase of an OOM from what follows it (corpus 086, 123)
def _ooms(lines):
    return [e for e in parse_lines(lines) if isinstance(e, ev.OutOfMemory)]


OOM_REPR = ("ERROR 10-11 12:27:29 engine.py:157] OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB. "
            "GPU 0 has a total capacity of 79.15 GiB of which 2.19 MiB is free.')")


def test_oom_logged_before_its_traceback_takes_the_phase_of_the_traceback():
    tb = ["ERROR 10-11 12:27:29 engine.py:157] Traceback (most recent call last):",
          'ERROR 10-11 12:27:29 engine.py:157]   File "/v/vllm/engine/multiprocessing/engine.py", line 155, in start',
          "ERROR 10-11 12:27:29 engine.py:157]     self.run_engine_loop()",
          'ERROR 10-11 12:27:29 engine.py:157]   File "/v/vllm/engine/multiprocessing/engine.py", line 218, in run_engine_loop']
    assert [e.phase for e in _ooms([OOM_REPR] + tb)] == ["runtime"]
    start = tb[:2] + ['ERROR 10-11 12:27:29 engine.py:157]   File "/v/vllm/worker/worker.py", line 9, in determine_num_available_blocks']
    assert [e.phase for e in _ooms([OOM_REPR] + start)] == ["startup"]
    # nothing after it tells: undecided (the state decides from what came before)
    assert [e.phase for e in _ooms([OOM_REPR])] == [None]
    # V1: the API server's output handler, which exists only once the engine core started, fails next
    v1 = ["(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.",
          "(APIServer pid=1) ERROR 05-01 14:39:06 [async_llm.py:699] AsyncLLM output_handler failed."]
    assert [e.phase for e in _ooms(v1)] == ["runtime"]
    v1_start = [v1[0], "(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1108] EngineCore failed to start."]
    assert [e.phase for e in _ooms(v1_start)] == ["startup"]


def test_an_undecided_oom_is_released_after_a_bounded_number_of_records():
    from vllm_doctor.parsers.records import HOLD_RECORDS

    filler = [f"INFO 10-11 12:27:{i % 60:02d} x.py:1] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
              "Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%." for i in range(3)]
    # stats lines after the OOM: the engine serves, so the OOM was raised while serving
    assert [e.phase for e in _ooms([OOM_REPR] + filler)] == ["runtime"]
    noise = ["ERROR 10-11 12:27:29 engine.py:157] SomeError: nothing that tells the phase"] * (HOLD_RECORDS + 5)
    late = ['ERROR 10-11 12:27:29 engine.py:157]   File "/v/e.py", line 218, in run_engine_loop']
    evs = [e for e in parse_lines([OOM_REPR] + noise + late)]
    ooms = [e for e in evs if isinstance(e, ev.OutOfMemory)]
    assert [e.phase for e in ooms] == [None]  # released undecided before the late frame
    assert evs.index(ooms[0]) < len(evs) - 1


def test_a_held_oom_reaches_the_state_in_serve_before_any_evaluation():
    from wrapping import pipeline

    pipe = pipeline(serve=True)
    pipe.feed("vllm.log", (OOM_REPR + "\n").encode())
    assert pipe.state.oom_events_total == 0  # held: the next lines may tell its phase
    pipe.evaluate()
    assert pipe.state.oom_events_total == 1 and pipe.state.run_total("OutOfMemory:startup") == 1
    # the phase is the event's own field from the state on (the parser left it undecided: None),
    # in the kind's ring, the phase selector's ring and the timeline alike (issue 26 item 3)
    kept = pipe.state.run_events("OutOfMemory")
    assert [e.phase for e in kept] == ["startup"]
    assert pipe.state.run_events("OutOfMemory:startup") == kept


# ---- start-up tracebacks cut before their error (corpus 012, 026)
def test_kv_cache_check_and_kv_allocation_seen_only_through_their_tracebacks():
    nc = one("ERROR 04-28 15:55:45 worker_base.py:157]     raise_if_cache_size_invalid(num_gpu_blocks,", "NoCacheMemory")
    assert nc.from_traceback is True
    assert one("(EngineCore_0 pid=62) ERROR 03-19 11:14:31 [core.py:700]     check_enough_kv_cache_memory(vllm_config, "
               "kv_cache_spec, available_memory)", "NoCacheMemory").from_traceback
    assert one("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
               "NoCacheMemory").from_traceback is False
    f = one("2026-05-08 11:50:14.753 [Info] (Process) (EngineCore pid=3043)     kv_caches = self.initialize_kv_cache_tensors(",
            "EngineFailure")
    assert (f.kind, f.meta.process) == ("core-failed", "EngineCore")
    # the definition, or a mention in a message, is no traceback line
    assert not parse_lines(["def raise_if_cache_size_invalid(num_gpu_blocks, block_size,",
                            "INFO 01-01 00:00:00 x.py:1] calling initialize_kv_cache_tensors( now"])


# ---- a worker's traceback cut at both ends, logged with no process prefix (held-back round 3, class 2)
def _with_cut(lines: list[str]) -> list:
    from vllm_doctor.ingest.envelope import Envelope, LogClock
    from vllm_doctor.parsers.records import RecordParser

    env, p, out = Envelope(LogClock(2026)), RecordParser("t.log"), []
    for i, ln in enumerate(lines, 1):
        for rec in env.records(i, ln.encode()):
            out.extend(e for e in p.parse(rec) if e is not None)
    return out + p.cut_tracebacks()


W = "ERROR 11-14 08:06:22 [multiproc_executor.py:597] "  # V1's WorkerProc handler, in the worker process
NIXL_FRAMES = [
    W + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 4010, in initialize_kv_cache',
    W + "    kv_transfer_group.register_kv_caches(kv_caches)",
    W + '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py", line 816, in register_kv_caches',
    W + "    self.nixl_wrapper.register_memory(descs, backends=self.nixl_backends)",
]


def test_cut_worker_traceback_known_by_its_logger_file_and_kv_connector_frames():
    evs = _with_cut(NIXL_FRAMES)
    exc = [e for e in evs if isinstance(e, ev.ExceptionRaised)]
    kv = [e for e in evs if isinstance(e, ev.KvTransferFailure)]
    assert [(e.exc_type, e.raised_in, e.meta.lineno) for e in exc] == [(CUT_TRACEBACK, "worker", 1)]
    assert [(e.connector, e.kind, e.meta.lineno) for e in kv] == [("nixl", "connector-error", 1)]
    # the connector library's own frames (as installed), with only a third-party frame around them
    lib = _with_cut([W + '  File "/opt/venv/lib/python3.12/site-packages/mooncake/engine.py", line 88, in register_memory',
                     W + "    ret = self.engine.register_memory(addr, size)"])
    assert [(e.connector, e.kind) for e in lib if isinstance(e, ev.KvTransferFailure)] == [("mooncake", "connector-error")]
    # with its exception line: one event each, a wording the matchers know keeps its own kind
    done = _with_cut(NIXL_FRAMES + [W + "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND"])
    assert [(e.connector, e.kind) for e in done if isinstance(e, ev.KvTransferFailure)] == [("nixl", "transfer-failed")]


def test_a_venv_named_after_a_connector_is_no_connector_frame():
    evs = _with_cut(["ERROR 05-18 12:25:44 [core.py:489]   File \"/data1/user/venvs/nixl/lib/python3.12/site-packages/vllm/v1/engine/"
                     "core.py\", line 480, in run_engine_core"])
    assert [type(e).__name__ for e in evs] == ["ExceptionRaised"]


# ---- a hard-wrapped args echo (corpus 048)
NS1 = ("INFO 08-08 14:47:21 api_server.py:220] args: Namespace(host='0.0.0.0', port=8000, max_model_len=16384, "
       "block_size=16, enable_prefix_caching=False, disable_sliding_wind")
NS2 = "ow=False, use_v2_block_manager=False, swap_space=4, gpu_memory_utilization=0.9, max_num_seqs=256, max_logprobs=20, quanti"
NS3 = "zation=None, max_num_batched_tokens=4096)"


def _cfg(lines):
    out = {}
    for e in parse_lines(lines):
        if isinstance(e, ev.EngineConfigObserved):
            out.update(e.values)
    return out


def test_hard_wrapped_args_echo_is_read_across_its_lines():
    d = _cfg([NS1, NS2, NS3])
    assert (d["max_model_len"], d["max_num_seqs"], d["disable_sliding_window"], d["quantization"],
            d["max_num_batched_tokens"]) == (16384, 256, False, None, 4096)
    assert "disable_sliding_wind" not in d and "ow" not in d
    # a line with vLLM's logger prefix ends the echo; so does a line that is not next to it
    d = _cfg([NS1, "INFO 08-08 14:47:22 x.py:1] max_num_seqs=999, block_size=1, max_logprobs=20, quant", NS2])
    assert "max_num_seqs" not in d
    d = _cfg([NS1, "unrelated", "unrelated", NS2])
    assert "max_num_seqs" not in d


def test_hard_wrapped_args_echo_is_read_under_every_wrapper():
    from wrapping import WRAPPERS, run, wrap

    for kind in WRAPPERS:
        pipe, _ = run(wrap(kind, [NS1, NS2, NS3]))
        facts = pipe.state.facts()
        assert (facts["max_model_len"], facts["max_num_seqs"], facts["max_num_batched_tokens"]) == (16384, 256, 4096), kind


def test_args_echo_continuations_are_bounded():
    from vllm_doctor.parsers.records import MAX_NS_PIECES

    pieces = [f"x{i}=None, max_num_seqs={i}, pad" for i in range(MAX_NS_PIECES + 4)]
    d = _cfg([NS1] + pieces)
    assert d["max_num_seqs"] == MAX_NS_PIECES - 1  # the pieces after the bound are not read
