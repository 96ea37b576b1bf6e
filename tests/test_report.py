"""The report opens with a verdict (issue 11): one line saying what happened, then what to do
first, then the findings, then the facts; facts that are only version defaults are set apart."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import LOGS, ROOT

EXE = [sys.executable, "-m", "vllm_doctor"]


def run(*args) -> tuple[int, str]:
    p = subprocess.run(EXE + [str(a) for a in args], capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode()


def demo_args() -> list[str]:
    """The inputs of `make demo`, read from the Makefile."""
    mk = (ROOT / "Makefile").read_text()
    log = re.search(r"^DEMO_LOG \?= (\S+)", mk, re.M).group(1)
    metrics = re.search(r"^DEMO_METRICS \?= (\S+)", mk, re.M).group(1)
    return ["--metrics", str(ROOT / metrics), str(ROOT / log)]


def test_demo_opens_with_what_happened_and_what_to_do_first():
    rc, text = run("diagnose", *demo_args())
    _, js = run("diagnose", "--format", "json", *demo_args())
    rep = json.loads(js)
    top = rep["findings"][0]  # most severe first
    assert rc == 1 and top["severity"] in ("warning", "critical")
    lines = text.splitlines()
    assert lines[0].startswith(f"{top['severity'].upper()} {top['name']}: {top['title']} (")
    others = [f["name"] for f in rep["findings"][1:]]
    if others:
        assert lines[0].endswith(", ".join(others))
    fx = top["fixes"][0]
    assert lines[1].startswith(f"Do this first: restart vLLM with {fx['flag']} {fx['value']}")
    assert fx["why"] in lines[1]
    assert lines[2].startswith("Read cpu-preemption-tiny-kv-cache.log (235 lines); vLLM 0.32.0, V1")
    assert text.index("Findings (") < text.index("Facts (from the inputs)")


def test_healthy_and_empty_verdicts(tmp_path):
    rc, text = run("diagnose", LOGS / "025-v0.5.4-idle-healthy-zero-load.log")
    lines = text.splitlines()
    assert rc == 0 and lines[0] == "No incident found in 6 lines of vLLM 0.5.4."
    assert not lines[1].startswith("Do this first")
    # facts that are only the version's defaults stay out of the facts table
    facts = text[text.index("Facts (from the inputs)"):text.index("Version defaults")]
    assert "max_num_seqs" not in facts and "peak_num_running" in facts
    assert "Version defaults (not in the inputs): " in text and "max_num_seqs 256" in text
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    rc, text = run("diagnose", empty)
    assert rc == 0 and text.splitlines()[0].startswith("Nothing to diagnose")


def test_finding_without_fix_says_where_to_look():
    rc, text = run("diagnose", LOGS / "043-v0.20.2-v1-enginedeaderror-apiserver.log")
    _, js = run("diagnose", "--format", "json", LOGS / "043-v0.20.2-v1-enginedeaderror-apiserver.log")
    top = json.loads(js)["findings"][0]
    second = text.splitlines()[1]
    if top["fixes"]:
        assert second.startswith("Do this first: ") and top["fixes"][0]["flag"] in second
    elif top.get("checks"):  # a diagnostic step comes first when there is nothing to change yet
        assert second == f"Do this first: {top['checks'][0]}"
    else:
        assert second.startswith(f"Do this first: read the evidence of {top['name']} below")


def test_markdown_opens_with_the_verdict():
    _, md = run("diagnose", "--format", "markdown", *demo_args())
    lines = [ln for ln in md.splitlines() if ln]
    assert lines[0] == "# vllm-doctor report"
    assert lines[1].startswith("**WARNING ") or lines[1].startswith("**CRITICAL ")
    assert lines[2].startswith("**Do this first:** restart vLLM with `--")
    assert md.index("## Findings") < md.index("## Facts")


def test_first_step_takes_the_first_option_whole():
    """Fixes grouped into options (issue 11's advice: same ``option`` = a set, different options =
    alternatives): "do this first" is the whole first option, an upgrade before the flags."""
    from types import SimpleNamespace as NS

    from vllm_doctor.report.render import first_step

    def fx(cmd, kind="flag", option=1):
        return NS(kind=kind, option=option, command=lambda: cmd)

    assert first_step([fx("pip install -U 'vllm>=0.11.0'", "upgrade"), fx("--enable-chunked-prefill"),
                       fx("--max-num-batched-tokens 2048"), fx("--max-num-seqs 8", option=2)]) == (
        "upgrade vLLM: pip install -U 'vllm>=0.11.0', then restart vLLM with --enable-chunked-prefill "
        "--max-num-batched-tokens 2048")
    assert first_step([fx("NCCL_P2P_DISABLE=1", "env"), fx("--disable-custom-all-reduce", option=2)]) == (
        "set NCCL_P2P_DISABLE=1")


def test_html_report_of_a_log_without_stats_says_so_not_yet():
    # a report reads its inputs to the end: "yet" is the sidecar page's word (data may still come)
    rc, page = run("diagnose", "--format", "html", LOGS / "043-v0.20.2-v1-enginedeaderror-apiserver.log")
    assert rc == 1 and page.count("no stats line or /metrics sample in these inputs") == 4
    assert "sample yet" not in page
    from vllm_doctor.report.timeline import charts
    assert {c.empty for c in charts(None, live=True)} == {"no stats line or /metrics sample yet"}


def test_the_memory_a_refused_start_names_is_a_fact_of_the_report():
    """V1's refusal to start ("... larger than the available KV cache memory (9.97 GiB)") names
    the memory it had for the KV cache: the JSON facts and the text report carry it."""
    log = LOGS / "011-v0.8.3-v1-1M-context-kv-needed-gt-available.log"
    rc, out = run("diagnose", "--format", "json", "--fail-on", "never", log)
    facts = json.loads(out)["facts"]
    assert facts["available_kv_cache_bytes"] == round(9.97 * (1 << 30))
    assert facts["max_model_len"] == 1048576
    rc, text = run("diagnose", "--fail-on", "never", log)
    assert re.search(r"^  available_kv_cache_bytes +9\.97 GiB$", text, re.M), text
    # the fix's arithmetic writes token counts as the facts do, with thousands separators
    assert "how: 1,048,576 x 9.97 GiB available / 24.00 GiB needed, rounded down to a multiple of block_size 16 = 435,584" in text


def test_sizes_below_a_gib_print_in_their_unit_and_a_printed_zero_is_no_size():
    """The demo's KV cache is 4,194,304 B (--kv-cache-memory-bytes): 4.00 MiB in every format, never
    "0.00 GiB"; vLLM's "Explicitly set (0.0/11.71) GiB for KV cache" is 4 MiB rounded to 0.0 GiB, so
    no fact says the available KV cache memory was 0; the fix's arithmetic uses the exact bytes."""
    _, js = run("diagnose", "--format", "json", *demo_args())
    rep = json.loads(js)
    assert rep["facts"]["kv_cache_memory_bytes"] == 4194304 and rep["facts"]["available_kv_cache_bytes"] is None
    fixes = [fx for f in rep["findings"] for fx in f["fixes"] if fx["flag"] == "--kv-cache-memory-bytes"]
    assert fixes and fixes[0]["arithmetic"].startswith("4,194,304 bytes x 16 sequences / 4 held")
    _, text = run("diagnose", *demo_args())
    assert re.search(r"^  kv_cache_memory_bytes +4\.00 MiB$", text, re.M), text
    assert re.search(r"^  device_total_memory_bytes +11\.71 GiB$", text, re.M)
    _, md = run("diagnose", "--format", "markdown", *demo_args())
    _, page = run("diagnose", "--format", "html", *demo_args())
    assert "| `kv_cache_memory_bytes` | 4.00 MiB |" in md
    assert "4.00 MiB" in page
    for out in (text, md, page):
        assert "0.00 GiB" not in out and "available_kv_cache_bytes" not in out


def test_do_this_first_sets_only_what_is_typed_as_code():
    """Markdown and HTML: "restart vLLM with" is words, only the flags are code; a check (a sentence
    to read, not to type) is no code at all."""
    _, md = run("diagnose", "--format", "markdown", *demo_args())
    assert "**Do this first:** restart vLLM with `--max-num-seqs 2`: " in md
    assert "`restart vLLM" not in md
    _, page = run("diagnose", "--format", "html", *demo_args())
    assert "<b>Do this first:</b> restart vLLM with <code>--max-num-seqs 2</code> &mdash; " in page
    assert "<code>restart vLLM" not in page
    nccl = LOGS / "048-v0.5.4-nccl-init-error-newlines-collapsed.log"
    _, md = run("diagnose", "--format", "markdown", nccl)
    assert "**Do this first:** set `NCCL_P2P_DISABLE=1`: " in md
    dead = LOGS / "043-v0.20.2-v1-enginedeaderror-apiserver.log"
    _, md = run("diagnose", "--format", "markdown", dead)
    step = next(ln for ln in md.splitlines() if ln.startswith("**Do this first:**"))
    assert step.startswith("**Do this first:** Collect the complete output") and "`Collect" not in step


def test_counts_in_messages_are_written_as_the_facts_are_and_a_shared_fix_note_is_a_sentence():
    # 014: 9,832 requests pending (V0 "Pending: 9832 reqs"): the messages write it as Facts does
    rc, text = run("diagnose", LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log")
    assert "(34 running, 9,832 waiting)" in text and "with up to 9,832 requests waiting while only 34 ran" in text
    assert re.search(r"^  peak_num_waiting +9,832$", text, re.M)
    assert "9832 waiting" not in text and "9832 requests" not in text
    # the demo: kv-capacity-bound's fix is listed under preemption-storm, said in a whole sentence
    _, text = run("diagnose", *demo_args())
    assert "  note: --max-num-seqs 2 also fixes this; it is listed under preemption-storm (VD001)" in text
    assert "gives\n" not in text


def test_an_oom_message_writes_sizes_as_the_log_did(tmp_path):
    # "Tried to allocate 2.00 GiB ... 23.57 GiB of which 1.00 GiB is free": not "2048 MiB", "1024.0 MiB"
    p = tmp_path / "vllm.log"
    p.write_text("(EngineCore pid=9) ERROR 11-30 09:00:07 [core.py:710] torch.OutOfMemoryError: CUDA out of "
                 "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.57 GiB of which 1.00 GiB is free.\n")
    _, text = run("diagnose", p)
    assert "(tried to allocate 2.00 GiB; 23.57 GiB device, 1.00 GiB free)" in text
    assert "MiB" not in text
    # 006: "Tried to allocate 20.00 MiB ... 14.62 GiB of which 3.31 MiB is free"
    _, text = run("diagnose", LOGS / "006-v0.7dev-mp-worker-cuda-oom-14GiB-gpu.log")
    assert "(tried to allocate 20.00 MiB; 14.62 GiB device, 3.31 MiB free)" in text
