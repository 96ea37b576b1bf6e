"""The report opens with a verdict (issue 11): one line saying what happened, then what to do
first, then the findings, then the facts; facts that are only version defaults are set apart."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys

from conftest import LOGS, ROOT


def run(*args) -> tuple[int, str]:
    """``vllm-doctor ARGS`` in this process (the command's own entry point, its exit code and what
    it writes to stdout): these tests read the report, not the process, and a new Python for each
    of their 30 runs cost some 0.75 s of CPU each (tests/test_cli.py runs the command as a process)."""
    from vllm_doctor import cli

    out, argv = io.StringIO(), sys.argv
    sys.argv = ["vllm-doctor", *(str(a) for a in args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli.main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
    return (code if isinstance(code, int) else 0 if code is None else 1), out.getvalue()


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
    assert "max_num_seqs" not in facts and "Most requests running  " in facts
    # facts in words with their unit, vLLM's own name where it is a setting
    assert "Version defaults (not in the inputs): " in text and "(max_num_seqs) 256 requests" in text
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
    assert re.search(r"^  Memory available for the KV cache +9\.97 GiB$", text, re.M), text
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
    assert re.search(r"^  KV cache memory +4\.00 MiB$", text, re.M), text
    assert re.search(r"^  GPU memory +11\.71 GiB$", text, re.M)
    _, md = run("diagnose", "--format", "markdown", *demo_args())
    _, page = run("diagnose", "--format", "html", *demo_args())
    assert "| KV cache memory | 4.00 MiB |" in md
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
    assert "<b>Do this first:</b> restart vLLM with <code class=\"fix\">--max-num-seqs 2</code> &mdash; " in page
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
    assert re.search(r"^  Most requests waiting +9,832 requests$", text, re.M)
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


# ---- now versus history (issue 20 item 5) -----------------------------------------------------------
def test_the_verdict_names_the_current_occurrence_of_an_incident(tmp_path):
    # the demo's stretch of stats lines (115-170) again an hour later, no restart: two occurrences of
    # kv-capacity-bound; the verdict speaks of the later one, the earlier one is listed as history
    lines = (LOGS / "cpu-preemption-tiny-kv-cache.log").read_bytes().split(b"\n")[:-1]
    again = [ln.replace(b"11-30 09:1", b"11-30 10:1") for ln in lines[114:170]]
    p = tmp_path / "vllm.log"
    p.write_bytes(b"\n".join(lines + again) + b"\n")
    rc, text = run("diagnose", p)
    head = text.splitlines()[0]
    assert head.startswith("WARNING kv-capacity-bound: ") and "(11-30 10:11:29)" in head, head
    assert "09:11" not in head
    # the log alone counts no preemption (V1 logs none): the capacity fix, not a --max-num-seqs cut (issue 20)
    assert text.splitlines()[1].startswith("Do this first: restart vLLM with --kv-cache-memory-bytes 16777216 (16 MiB)")
    assert "  history: earlier occurrence 1 of 2: the incident was seen again later" in text


def test_a_crash_vllm_recovered_from_opens_as_recovered_not_critical(tmp_path):
    # real vLLM 0.32 lines: EngineDeadError at 09:13:49, then vLLM started again and served a load
    # from 10:17:05 to 10:18:54 with no incident
    dead = (LOGS / "cpu-request-errors-then-enginecore-killed.log").read_bytes()
    served = (LOGS / "cpu-basic-serve-and-load.log").read_bytes().replace(b"11-30 09:0", b"11-30 10:1")
    p = tmp_path / "recovered.log"
    p.write_bytes(dead + served)
    rc, text = run("diagnose", p)
    head = text.splitlines()[0]
    assert head == ("Recovered: vLLM restarted at 11-30 10:17:05 after CRITICAL engine-dead (11-30 09:13:49) and has "
                    "served with no finding; healthy for 2 min since, to the newest log line (11-30 10:18:54).")
    assert "  history: earlier engine run: vLLM restarted after it (at 11-30 10:17:05)" in text
    # the exit code is the current state's: recovered, nothing live at or above --fail-on warning
    assert rc == 0, text.splitlines()[0]
    assert run("diagnose", "--fail-on", "info", p)[0] == 0
    _, page = run("diagnose", "--format", "html", p)
    assert '<div class="verdict ok" id="verdict">' in page and "History: earlier engine run" in page
    # restarted and not serving yet (the new run's start-up lines, before its first request): the
    # crash stands, and the verdict says vLLM restarted
    starting = tmp_path / "starting.log"
    starting.write_bytes(dead + b"\n".join(served.split(b"\n")[:102]) + b"\n")
    rc, text = run("diagnose", starting)
    assert text.splitlines()[0].startswith("CRITICAL engine-dead: ") and (
        "; vLLM restarted at 11-30 10:17:05 and has not served yet" in text.splitlines()[0])
    assert rc == 1  # not served since: the crash is still the state
    # a crash loop is no recovery: the run that failed last is the verdict
    one = (LOGS / "cpu-startup-error-kv-cache-bigger-than-ram.log").read_text()
    loop = tmp_path / "crashloop.log"
    loop.write_text(one + one)
    _, text = run("diagnose", "--format", "json", loop)
    occ = [(f["occurrence"], f["run"]) for f in json.loads(text)["findings"] if f["name"] == "startup-oom"]
    assert occ == [(1, 0), (2, 1)]
    rc, text = run("diagnose", loop)
    assert text.startswith("CRITICAL startup-oom: ") and "history: earlier engine run" in text
    assert rc == 1  # the run that failed last is the state


def test_a_metrics_sample_as_evidence_says_what_it_read(tmp_path):
    """A /metrics capture cited as evidence shows the scheduler values it held, as vLLM names them, and no
    line number (a scrape has none): was ``m.txt:0: `` with nothing after it."""
    import yaml

    sc = yaml.safe_load((ROOT / "tests" / "scenarios" / "busy-chat-at-capacity-counter-zero.yaml").read_text())
    (tmp_path / "l.log").write_text(sc["text"])
    (tmp_path / "m.txt").write_text(sc["metrics_text"])
    said = ("m.txt: vllm:num_requests_running 181, vllm:num_requests_waiting 24, vllm:kv_cache_usage_perc 0.981, "
            "vllm:num_preemptions_total 0")
    for fmt in ("text", "markdown", "html"):
        rc, out = run("diagnose", str(tmp_path / "l.log"), "--metrics", str(tmp_path / "m.txt"), "--format", fmt)
        assert said in out, fmt
        assert "m.txt:0" not in out, fmt
