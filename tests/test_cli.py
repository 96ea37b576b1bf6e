"""The ``vllm-doctor`` command as a user runs it: formats, exit codes, bad input, rules."""

from __future__ import annotations

import gzip
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOGS, METRICS, ROOT, log

EXE = [sys.executable, "-m", "vllm_doctor"]


def run(*args, stdin: bytes | None = None, cwd: Path | None = None):
    p = subprocess.run(EXE + [str(a) for a in args], input=stdin, capture_output=True, timeout=120, cwd=cwd)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_json_schema_fields():
    rc, out, err = run("diagnose", "--format", "json", log("037"))
    d = json.loads(out)
    assert rc == 0, err
    for key in ("vllm_version", "engine", "facts", "findings", "facts_defaulted", "schema_version", "sources"):
        assert key in d
    assert d["vllm_version"] == "0.24.0" and d["engine"] == "v1"
    for k in ("kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency", "max_model_len",
              "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "tensor_parallel_size",
              "kv_cache_dtype", "enable_chunked_prefill", "enable_prefix_caching", "preemptions_total",
              "peak_num_running", "peak_num_waiting", "peak_kv_cache_usage_ratio"):
        assert k in d["facts"], k
    f = d["facts"]
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["max_model_len"], f["max_num_seqs"]) == (567978, 4.33, 131072, 1)
    assert f["kv_cache_dtype"] == "fp8" and f["max_num_batched_tokens"] == 8192
    # defaults of 0.24 filled in and marked
    assert f["gpu_memory_utilization"] == 0.92 and "gpu_memory_utilization" in d["facts_defaulted"]
    assert "max_num_seqs" not in d["facts_defaulted"]


def test_finding_json_shape_and_exit_code():
    rc, out, _ = run("diagnose", "-f", "json", log("014"))
    assert rc == 1
    f = json.loads(out)["findings"][0]
    assert set(f) >= {"rule_id", "name", "severity", "title", "message", "evidence", "fixes"}
    assert f["evidence"][0]["lineno"] >= 1 and f["evidence"][0]["text"]
    assert {"flag", "value", "why"} <= set(f["fixes"][0])


@pytest.mark.parametrize("fail_on,code", [("info", 1), ("warning", 1), ("critical", 0), ("never", 0)])
def test_fail_on(fail_on, code):
    assert run("diagnose", "--fail-on", fail_on, log("014"))[0] == code  # warnings only


def test_fail_on_critical_with_critical():
    assert run("diagnose", "--fail-on", "critical", log("004"))[0] == 1


def test_healthy_exit_zero_and_text_report():
    rc, out, _ = run("diagnose", log("039"))
    assert rc == 0
    assert out.splitlines()[0] == "No incident found in 9 lines."  # the verdict opens the report
    assert "KV cache size" in out and "922,496 tokens" in out


@pytest.mark.parametrize("fmt,needle", [("markdown", "## Findings"), ("html", "<h2>Findings")])
def test_other_formats(fmt, needle):
    rc, out, _ = run("diagnose", "-f", fmt, log("014"))
    assert rc == 1 and needle in out


def test_html_escapes_log_text(tmp_path):
    p = tmp_path / "x.log"
    line = log("043").read_text().splitlines()[-3].replace("EngineDeadError: EngineCore", "EngineDeadError: <script>alert(1)</script> EngineCore")
    p.write_text(line + "\n")
    rc, out, _ = run("diagnose", "-f", "html", p)
    assert "<script>alert(1)</script>" not in out and "&lt;script&gt;" in out


def test_missing_file_exit_2():
    rc, out, err = run("diagnose", "/nonexistent/vllm.log")
    assert rc == 2 and out == "" and err.strip() == "vllm-doctor: /nonexistent/vllm.log: no such file"


def test_directory_exit_2(tmp_path):
    rc, _, err = run("diagnose", tmp_path)
    assert rc == 2 and "is a directory" in err and "Traceback" not in err


def test_binary_exit_2(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(os.urandom(65536))
    rc, _, err = run("diagnose", p)
    assert rc == 2 and "binary" in err and len(err.strip().splitlines()) == 1


def test_empty_and_not_vllm(tmp_path):
    e = tmp_path / "empty.log"
    e.write_text("")
    n = tmp_path / "nginx.log"
    n.write_text('127.0.0.1 - - [30/Nov/2026:09:00:00 +0000] "GET / HTTP/1.1" 200 612\n' * 50)
    for p in (e, n):
        rc, out, err = run("diagnose", "-f", "json", p)
        assert rc == 0, err
        assert json.loads(out)["nothing_to_diagnose"] is True
    rc, out, _ = run("diagnose", n)
    assert "Nothing to diagnose" in out


def test_since_after_the_log_is_no_all_clear():
    # the demo log ended at 11-30 09:12:09 (of its file's year), long before the last 30 minutes: no
    # line fell in the span, so the report says so and when the log ran, and exits 3, not 0 (healthy)
    demo = LOGS / "cpu-preemption-tiny-kv-cache.log"
    rc, out, err = run("diagnose", "--since", "30m", demo)
    assert rc == 3, err
    head = out.splitlines()[0]
    assert head.startswith("Nothing to diagnose in the span since ") and "No incident found" not in out
    assert "no vLLM line read (23 events) falls in it; the log runs " in head
    assert re.search(r"the log runs \d{4}-11-30 09:10:22 \.\. \d{4}-11-30 09:12:09, ending [\d.]+ (h|days) before "
                     r"the span begins\. Nothing was judged\.$", head), head
    assert "Facts" not in out
    rc, out, _ = run("diagnose", "-f", "json", "--since", "30m", demo)
    tr = json.loads(out)["time_range"]
    assert rc == 3 and (tr["events_in_range"], tr["events_outside"], tr["nothing_in_range"]) == (0, 23, True)
    assert tr["log_last_ts"] - tr["log_first_ts"] == 107.0 and tr["until"] is None
    for fmt, needle in (("markdown", "**Nothing to diagnose in the span since "), ("html", "Nothing to diagnose in the span since ")):
        rc, out, _ = run("diagnose", "-f", fmt, "--fail-on", "never", "--since", "30m", demo)
        assert rc == 3 and needle in out and "No incident found" not in out
    rc, out, _ = run("diagnose", "--until", "2000-01-01", demo)
    assert rc == 3 and ", starting " in out.splitlines()[0] and "after the span ends. Nothing was judged." in out
    # a span holding the whole log judges it as without one
    rc, out, _ = run("diagnose", "-f", "json", "--since", "2000-01-01", demo)
    d = json.loads(out)
    assert rc == 1 and d["time_range"]["nothing_in_range"] is False and d["time_range"]["events_outside"] == 0
    assert {f["name"] for f in d["findings"]} == {"kv-capacity-bound"}


def test_a_report_under_since_until_says_which_span_it_judged():
    """Issue 27: the text report under --since did not say which span it judged (the JSON has
    time_range); text, markdown and html say it, with the events in and outside it."""
    demo = LOGS / "cpu-preemption-tiny-kv-cache.log"
    line = ("Judged only the span 2000-01-01 00:00:00 .. 2100-01-01 00:00:00 (UTC, the log's clock; --since/--until): "
            "23 events in it, 0 outside it")
    span = ["--since", "2000-01-01", "--until", "2100-01-01"]
    rc, out, _ = run("diagnose", *span, demo)
    assert rc == 1 and out.splitlines()[3] == line
    rc, out, _ = run("diagnose", "-f", "markdown", *span, demo)
    assert f"\n- {line}\n" in out
    rc, out, _ = run("diagnose", "-f", "html", *span, demo)
    assert '<p class="muted" id="span">' + line.replace("'", "&#39;") + "</p>" in out
    rc, out, _ = run("diagnose", "--since", "2000-01-01", demo)
    assert "Judged only the span since 2000-01-01 00:00:00 (UTC" in out
    assert "Judged only" not in run("diagnose", demo)[1]


def test_logs_of_two_servers_at_once_are_refused_rotations_and_restarts_are_merged(tmp_path):
    """Issue 27: the logs of two servers given together were reported as one (one log's version with
    the other's engine). Files that run at the same time and name another vLLM version, engine or model
    are refused with the reason (exit 2); one deployment's files one after the other are merged."""
    from vllm_doctor.ingest.replay import restamp

    t0 = 1_790_000_000.0
    v032 = (LOGS / "cpu-preemption-tiny-kv-cache.log").read_bytes()
    v050 = log("014").read_bytes()
    a, b = tmp_path / "replica-a.log", tmp_path / "replica-b.log"
    a.write_bytes(restamp(v032, now=t0))
    b.write_bytes(restamp(v050, now=t0))
    rc, out, err = run("diagnose", a, b)
    assert (rc, out) == (2, "")
    assert err == ("vllm-doctor: replica-a.log (version 0.32.0, engine v1, model /srv/vllm-test/tiny-llama) and "
                   "replica-b.log (engine v0) are logs of two vLLM servers running at the same time, not one "
                   "deployment's rotated files: diagnose each server's logs on its own\n")
    # the same two servers one after the other (an upgrade and a restart): one deployment, merged
    b.write_bytes(restamp(v050, now=t0 + 3600))
    rc, out, err = run("diagnose", "-f", "json", a, b)
    assert (rc, err) == (1, "") and json.loads(out)["facts"]["preemptions_total"] == 151
    # one log cut in two rotated files: merged, the same facts as the whole
    lines = v032.splitlines(keepends=True)
    (tmp_path / "vllm.log.1").write_bytes(b"".join(lines[:120]))
    (tmp_path / "vllm.log").write_bytes(b"".join(lines[120:]))
    rc, out, err = run("diagnose", "-f", "json", tmp_path / "vllm.log.1", tmp_path / "vllm.log")
    whole = json.loads(run("diagnose", "-f", "json", LOGS / "cpu-preemption-tiny-kv-cache.log")[1])
    assert rc == 1 and json.loads(out)["facts"] == whole["facts"], err


def test_truncated_lines_and_invalid_utf8(tmp_path):
    raw = log("014").read_bytes()
    p = tmp_path / "cut.log"
    p.write_bytes(b"\xff\xfe\xc3" + raw[: len(raw) - 200])  # last line cut in the middle
    rc, out, err = run("diagnose", "-f", "json", p)
    assert rc == 1, err
    assert json.loads(out)["facts"]["preemptions_total"] == 151


def test_gzip_and_stdin(tmp_path):
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(log("014").read_bytes()))
    rc, out, _ = run("diagnose", "-f", "json", gz)
    assert json.loads(out)["facts"]["preemptions_total"] == 151
    rc, out, _ = run("diagnose", "-f", "json", "-", stdin=log("014").read_bytes())
    assert json.loads(out)["facts"]["preemptions_total"] == 151


def test_several_files_merged_in_time_order(tmp_path):
    # one run's log split in two files, given in the wrong order
    lines = log("cpu-preemption").read_bytes().split(b"\n")
    a, b = tmp_path / "part1.log", tmp_path / "part2.log"
    a.write_bytes(b"\n".join(lines[:130]) + b"\n")
    b.write_bytes(b"\n".join(lines[130:]))
    rc, out, _ = run("diagnose", "-f", "json", b, a)
    d = json.loads(out)
    whole = json.loads(run("diagnose", "-f", "json", log("cpu-preemption"))[1])
    assert d["facts"] == whole["facts"]
    assert [f["name"] for f in d["findings"]] == [f["name"] for f in whole["findings"]]
    assert {s["name"]: s["lines_total"] for s in d["sources"]} == {"part1.log": 130, "part2.log": len(lines) - 131}


def test_metrics_capture_option():
    rc, out, _ = run("diagnose", "-f", "json", "--metrics", METRICS / "vllm-0.32-cpu-preemption.txt", log("cpu-preemption"))
    assert json.loads(out)["facts"]["preemptions_total"] == 105
    rc, _, err = run("diagnose", "--metrics", log("014"), log("cpu-preemption"))
    assert rc == 2 and "not a vLLM /metrics capture" in err


def test_rules_and_explain():
    rc, out, _ = run("rules")
    assert rc == 0
    rows = [ln.split() for ln in out.splitlines() if re.match(r"VD\d{3} ", ln)]
    names = [r[1] for r in rows]
    assert {"startup-oom", "preemption-storm", "prefill-blocking", "kv-capacity-bound", "gpu-memory-leak",
            "nccl-failure", "runtime-oom", "engine-dead"} <= set(names)
    # the fleet rules (rules/fleet/) are listed too, after their heading, each with what it needs
    fleet = out[out.index("Fleet rules (run by `vllm-doctor diagnose --prometheus URL`"):]
    assert [ln.split()[0] for ln in fleet.splitlines() if re.match(r"VD\d{3} ", ln)] == [
        "VD020", "VD021", "VD022", "VD023", "VD024", "VD025"]
    assert fleet.count("needs: ") == 6 and "vllm:num_preemptions_total" in fleet
    rc, out, _ = run("rules", "--format", "json")
    scopes = {r["id"]: r["scope"] for r in json.loads(out)}
    assert scopes["VD001"] == "deployment" and scopes["VD024"] == "fleet"
    rc, out, _ = run("explain", "replica-imbalance")
    assert rc == 0 and "[fleet rule]" in out and "diagnose --prometheus URL" in out and "Needs:" in out
    rc, out, _ = run("explain", "preemption-storm")
    assert rc == 0 and "Why it matters" in out and "Example log line" in out and "total_num_cumulative_preemption" in out
    assert run("explain", "VD002")[0] == 0
    rc, _, err = run("explain", "no-such-rule")
    assert rc == 2 and "no rule" in err


def test_user_rules_dir(tmp_path):
    (tmp_path / "my.yaml").write_text("""\
id: XX001
name: many-waiting
title: Many requests wait
severity: info
category: scheduling
when:
  all: ["coalesce(max([x.num_waiting for x in stats]), 0) >= 100"]
values:
  w: max([x.num_waiting for x in stats])
evidence: [SchedulerStats]
message: "{w} waiting"
docs: {why: queues, example_log: "Pending: 115 reqs"}
""")
    rc, out, _ = run("diagnose", "-f", "json", "--rules", tmp_path, log("034"))
    f = {x["name"]: x for x in json.loads(out)["findings"]}
    assert f["many-waiting"]["message"] == "115 waiting"


@pytest.mark.parametrize("body,msg", [
    ("id: VD001\nname: dup\n", "duplicate rule id VD001"),
    ("id: XX002\nname: preemption-storm\n", "duplicate rule name preemption-storm"),
    ("id: XX003\nname: bad\nwhen: {all: ['nosuch > 1']}\n", "unknown name 'nosuch'"),
    ("id: XX004\nname: bad\nwhen: {all: ['t.nosuch > 1']}\n", "unknown threshold t.nosuch"),
    ("id: XX005\nname: bad\nwhen: {all: ['1']}\nfixes: [{flag: --chunked-prefill-size, value: '1', why: x}]\n", "not a flag of any vLLM version"),
    ("id: XX006\nname: bad\nwhen: {all: ['1']}\nbogus: 1\n", "bogus"),
    ("id: XX007\nname: Bad_Name\nwhen: {all: ['1']}\n", "kebab-case"),
    ("id: XX008\nname: bad\nwhen: {all: ['count(\"NoSuchEvent\") > 0']}\n", "unknown event kind"),
    ("id: [\n", "not valid YAML"),
])
def test_rule_load_errors_are_one_line_exit_2(tmp_path, body, msg):
    common = "title: t\nseverity: info\ncategory: c\nmessage: m\ndocs: {why: w, example_log: e}\n"
    text = body if body.startswith("id: [") else body + ("" if "when" in body else "when: {all: ['1']}\n") + common
    (tmp_path / "r.yaml").write_text(text)
    rc, out, err = run("diagnose", "--rules", tmp_path, log("026"))
    assert rc == 2, (out, err)
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_python_m_and_version():
    rc, out, _ = run("version")
    assert rc == 0 and out.startswith("vllm-doctor ")


def test_demo_log_in_readme_exists():
    mk = (ROOT / "Makefile").read_text()
    demo = [ln.split("?=")[1].strip() for ln in mk.splitlines() if ln.startswith("DEMO_LOG")][0]
    assert (ROOT / demo).is_file()


def test_docs_check_md_findings_table_is_generated_from_the_check_rules():
    """docs/check.md's table of findings is made from rules/check/ (make docs), not written by hand:
    every check rule has its row with its SARIF level, and nothing else is in the table."""
    from vllm_doctor.report.docs import CHECK_TABLE_BEGIN, CHECK_TABLE_END, check_ruleset, with_check_table

    text = (ROOT / "docs" / "check.md").read_text()
    assert with_check_table(text, check_ruleset()) == text, "run: make docs"
    table = text.split(CHECK_TABLE_BEGIN)[1].split(CHECK_TABLE_END)[0]
    ids = [ln.split("|")[1].strip() for ln in table.strip().splitlines()[2:]]
    assert ids == [r.id for r in check_ruleset().rules] and len(ids) == 21
    assert "| VM006 | [`not-a-vllm-series`](rules.md#vm006-not-a-vllm-series) | info | note |" in table
    with pytest.raises(ValueError, match="lost the markers"):
        with_check_table(text.replace(CHECK_TABLE_END, ""), check_ruleset())


def test_docs_rules_md_is_generated_from_the_rules():
    rc, out, _ = run("rules", "--format", "markdown")
    assert rc == 0 and out == (ROOT / "docs" / "rules.md").read_text(), "run: vllm-doctor rules --format markdown > docs/rules.md"


@pytest.mark.slow
def test_installed_wheel_has_rules_and_diagnoses(tmp_path):
    """The rules ship inside the wheel: a user without the repository lists and runs them."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    b = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr[-2000:]
    i = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        *map(str, wheels.glob("vllm_incident_doctor-*.whl"))], capture_output=True, text=True, timeout=300)
    assert i.returncode == 0, i.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "rules"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # every rule, the fleet rules (rules/fleet/) too: the same list as the checkout's
    here = subprocess.run([sys.executable, "-m", "vllm_doctor", "rules"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout == here.stdout and "VD025" in r.stdout
    d = subprocess.run([sys.executable, "-c", "import vllm_doctor.diagnosis.loader as l; print(l.builtin_rules_dir())"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert d.stdout.strip().startswith(str(target))  # not the checkout
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "json", str(log("014"))],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and json.loads(r.stdout)["facts"]["preemptions_total"] == 151
    # the package data of issue 11: the Alertmanager routing, the report's JSON Schema, the charts
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "export", "alertmanager"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == (ROOT / "alerts" / "alertmanager.yml").read_text()
    assert (target / "vllm_doctor" / "data" / "report.schema.json").read_text() == (ROOT / "docs" / "report.schema.json").read_text()
    r = subprocess.run([sys.executable, "-m", "vllm_doctor", "diagnose", "-f", "html", str(log("014"))],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout.count('<polyline class="series"') == 6  # with preemptions (V0)


def test_fifo_and_process_substitution(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    data = log("014").read_bytes()
    import threading

    def writer():
        with open(fifo, "wb") as w:
            w.write(data)

    t = threading.Thread(target=writer)
    t.start()
    rc, out, err = run("diagnose", "-f", "json", fifo)
    t.join(10)
    assert rc == 1, err
    assert json.loads(out)["facts"]["preemptions_total"] == 151


def test_two_files_across_new_year(tmp_path):
    stats = log("026").read_text().splitlines()[0]  # a real 0.6.4 stats line
    dec = tmp_path / "dec.log"
    jan = tmp_path / "jan.log"
    dec.write_text(stats.replace("01-22 18:27:20", "12-31 23:59:50") + "\n")
    jan.write_text(stats.replace("01-22 18:27:20", "01-01 00:00:10").replace("Running: 1 reqs", "Running: 7 reqs") + "\n")
    jan_time = 1_767_225_600 + 86400 * 3  # 2026-01-04: both files written in January
    for p in (dec, jan):
        os.utime(p, (jan_time, jan_time))
    from vllm_doctor import diagnose

    rep = diagnose([str(jan), str(dec)])
    assert rep.facts["peak_num_running"] == 7
    # the state's newest stats line is January's: December sorted first
    from vllm_doctor.ingest.oneshot import open_source  # noqa: F401  (same path the CLI takes)
    rc, out, _ = run("diagnose", "-f", "json", jan, dec)
    assert json.loads(out)["sources"][0]["name"] == "jan.log"


def test_markdown_escapes_log_text(tmp_path):
    p = tmp_path / "x.log"
    line = log("043").read_text().splitlines()[-3].replace("EngineDeadError: EngineCore", "EngineDeadError: <img src=x onerror=alert(1)> EngineCore")
    p.write_text(line + "\n")
    rc, out, _ = run("diagnose", "-f", "markdown", p)
    prose = out.split("```")[0::2]  # outside code fences, where Markdown renders HTML
    assert not any("<img" in part for part in prose) and "<img" in out  # only inside the evidence fence


def test_parallel_reader_gives_the_same_report(tmp_path, monkeypatch):
    """A large file is scanned by worker processes over byte ranges; the report must equal the
    one-process report: same line count, facts, findings and evidence line numbers."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gen_log import generate

    from vllm_doctor.ingest import oneshot
    p = tmp_path / "big.log"
    with open(p, "w") as fh:
        generate(6 << 20, fh, seed=7)
        fh.write(log("cpu-preemption").read_text())  # a real incident at the end
    monkeypatch.setattr(oneshot, "PARALLEL_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(oneshot, "RANGE_BYTES", 1 << 20)  # ranges cut lines everywhere
    assert oneshot._parallel_source(str(p)) and len(oneshot._ranges(str(p), p.stat().st_size)) >= 6
    par = oneshot.diagnose([str(p)]).to_dict()
    monkeypatch.setenv("VLLM_DOCTOR_WORKERS", "1")
    one = oneshot.diagnose([str(p)]).to_dict()
    assert par["sources"] == one["sources"] and par["sources"][0]["lines_total"] == p.read_bytes().count(b"\n")
    assert par["facts"] == one["facts"]
    assert [(f["name"], [e["lineno"] for e in f["evidence"]]) for f in par["findings"]] == \
           [(f["name"], [e["lineno"] for e in f["evidence"]]) for f in one["findings"]]
    assert "kv-capacity-bound" in {f["name"] for f in par["findings"]}


# ---- issue 11: CLI rough edges --------------------------------------------------------------------

def test_version_option():
    from vllm_doctor import __version__

    rc, out, err = run("--version")
    assert (rc, out, err) == (0, f"vllm-doctor {__version__}\n", "")


@pytest.mark.parametrize("args,line", [
    (["--fail-on", "bogus"], "vllm-doctor: --fail-on 'bogus': expected one of info, warning, critical, never"),
    (["--format", "xml"], "vllm-doctor: --format 'xml': expected one of text, json, markdown, html"),
])
def test_bad_choice_is_one_clean_line(args, line):
    rc, out, err = run("diagnose", *args, log("014"))
    assert (rc, out, err.splitlines()) == (2, "", [line])


def all_commands() -> list[list[str]]:
    """Every command and subcommand of the CLI (those added by any section of cli.py)."""
    import typer.main

    from vllm_doctor.cli import app

    out = [[]]

    def walk(cmd, path):
        for name, sub in getattr(cmd, "commands", {}).items():
            out.append(path + [name])
            walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return out


@pytest.mark.parametrize("cmd", all_commands(), ids=lambda c: " ".join(c) or "top")
def test_help_shows_no_python_types(cmd):
    rc, out, _ = run(*cmd, "--help")
    assert rc == 0 and "Usage: vllm-doctor" in out
    for leak in ("<list", "<bool>", "<str>", "<int>", "<float>", "<path>", "Path]", "Optional["):
        assert leak not in out, (cmd, leak)


@pytest.mark.parametrize("cmd", all_commands(), ids=lambda c: " ".join(c) or "top")
def test_dash_h_is_help_and_no_argument_is_named_twice(cmd):
    """Issue 27: `-h` was 'No such option: -h'; every help page listed its arguments as 'LOG LOG'."""
    rc, out, err = run(*cmd, "-h")
    assert (rc, err) == (0, "") and out == run(*cmd, "--help")[1]
    assert "-h, --help" in out
    args = out.split("\nArguments:\n", 1)[1].split("\n\n", 1)[0] if "\nArguments:\n" in out else ""
    for line in args.splitlines():
        words = line.split()
        if line.startswith("  ") and not line.startswith("   ") and len(words) > 1:
            assert words[0] != words[1], (cmd, line)
            assert words[0].upper() == words[0], (cmd, line)   # LOG, MODEL, FILE: what to type, upper case


def test_export_alertmanager_is_the_shipped_routing():
    rc, out, err = run("export", "alertmanager")
    assert rc == 0, err
    assert out == (ROOT / "alerts" / "alertmanager.yml").read_text()
    import yaml

    cfg = yaml.safe_load(out)
    assert cfg["route"]["receiver"] and cfg["receivers"]
    rc, _, err = run("export", "grafana")
    assert rc == 2 and err.count("\n") == 1 and "grafana" in err
    # the kinds it names are the kinds it takes, alertmanager (package data, not generated) included
    kinds = err.split(": one of ")[1].strip().split(", ")
    assert set(kinds) == {"alerts", "dashboards", "prometheus-rule", "alertmanager", "fleet-dashboard",
                          "replicas-dashboard"}
    assert all(run("export", k)[0] == 0 for k in kinds)


def test_explain_renders_expressions_for_people():
    rc, out, _ = run("explain", "preemption-storm")
    assert rc == 0
    import yaml

    th = yaml.safe_load((ROOT / "rules" / "thresholds.yaml").read_text())
    n = th["preemption_storm_min"]["value"]
    assert f"preempted is at least {n} (preemption_storm_min)" in out
    assert "t.preemption_storm_min" not in out and ">=" not in out and " is not None" not in out
    assert "      when " in out  # a fix's condition, in words
    for rid in ("VD002", "VD004", "VD006"):  # conditions and fix values: no raw comparison
        _, out = run("explain", rid)[:2]
        end = out.index("  where (the rule's values") if "  where (the rule's values" in out else out.index("Example log line:")
        cond = out[out.index("When it fires"):end]  # the values below may hold comprehensions: kept as written
        fixes = [ln for ln in out.splitlines() if ln.startswith(("  --", "      when "))]
        for text in [cond, *fixes]:
            assert not re.search(r"\bt\.[a-z_]+|>=|<=|!=|==| is not None| is None", text), (rid, text)


def test_explain_shows_check_steps_as_sentences_with_slots_and_their_conditions():
    """A check's template is printed for people: its placeholders as <name> (never the raw ``{u.prefix}``
    or ``{root.meta.lineno}`` of the YAML), and the condition it is given under, in words."""
    rc, out, _ = run("explain", "log-unread")
    assert rc == 0 and '("<prefix>")' in out and "{u.prefix}" not in out
    _, out = run("explain", "engine-dead")[:2]
    checks = out[out.index("Checks (diagnostic steps"):]
    assert "around line <lineno> holds the exception" in checks and "{" not in checks
    assert "      when cause is illegal-memory-access" in checks


def test_human_expressions():
    from vllm_doctor.report.docs import human

    th = {"x_min": 2.0, "big": 536870912}
    assert human("a >= t.x_min and b is not None", th) == "a is at least 2 (x_min) and b is known"
    assert human("coalesce(c, 0) > t.big", th) == "c (or 0 when unknown) is more than 536,870,912 (big)"
    assert human("kv_cache_dtype in (None, 'auto')") == "kv_cache_dtype is one of (unknown, auto)"
    assert human("exists('OutOfMemory:startup')") == "the log shows 'out of memory' (startup)"
    assert human("not (a or b)") == "not (a or b)"
    assert human("[x.n for x in stats]") == "[x.n for x in stats]"  # no wording: kept as is


def test_parallel_scan_workers_end_when_diagnose_is_killed(tmp_path):
    """kill -9 of diagnose while it scans on several cores leaves no worker behind (each worker
    asks Linux for SIGTERM when its parent dies)."""
    import signal
    import subprocess
    import time

    p = tmp_path / "big.log"
    p.write_bytes(b"INFO 11-30 09:10:00 [loggers.py:1] plain line\n" * 200_000)
    script = (
        "import sys, time\n"
        "from vllm_doctor.ingest import oneshot\n"
        "oneshot.RANGE_BYTES = 1 << 20\n"
        f"it = oneshot.scan_parallel({str(p)!r}, workers=2)\n"
        "next(it)\n"
        "print('scanning', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "scanning"
        kids = [int(k) for k in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(kids) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{k}").exists() and "zombie" not in
                                                  Path(f"/proc/{k}/status").read_text() for k in kids):
            time.sleep(0.1)
        alive = [k for k in kids if Path(f"/proc/{k}").exists() and "(zombie)" not in Path(f"/proc/{k}/status").read_text()]
        assert alive == []
    finally:
        proc.kill()
        proc.wait()


def test_explain_says_what_each_value_a_condition_or_fix_reads_is():
    """A condition reading ``n_full`` or a fix of ``c.value`` is explained: the rule's values it
    reads (directly or through other values) are listed, each in words, in the YAML's order."""
    _, out, _ = run("explain", "kv-capacity-bound")
    where = out[out.index("  where (the rule's values"):out.index("Example log line:")]
    assert "    n_full = the number of full lines\n" in where
    assert "    c = the sequences the KV cache holds at once" in where
    assert where.index("    c = ") < where.index("    kv_bytes = ")  # YAML order; kv_bytes reads c
    assert "    demand = the smallest of the largest requests of the all_stats lines and max_num_seqs" in where
    import yaml

    values = yaml.safe_load((ROOT / "rules" / "VD004-kv-capacity-bound.yaml").read_text())["values"]
    listed = re.findall(r"^    (\w+) = ", where, re.M)
    assert set(listed) <= set(values) and "n_full" in listed


def test_explain_and_rules_show_checks_rules():
    rc, out, _ = run("explain", "VC010")
    assert rc == 0 and out.startswith("VC010 kv-capacity (critical, launch) [check rule, SARIF level error]\n"
                                      "  The KV cache cannot hold what the launch asks for (plan's arithmetic).\n")
    assert "Example input:\n  vllm serve meta-llama/Llama-3.1-70B-Instruct" in out
    assert run("explain", "histogram-quantile-misuse")[1].startswith("VM003 histogram-quantile-misuse (critical,")
    assert run("explain", "VC001")[1].startswith("VD010 unknown-flag")  # the log rule answers to check's id
    rc, out, _ = run("rules", "--format", "json")
    check = [r for r in json.loads(out) if r["scope"] == "check"]
    assert [r["id"] for r in check][:2] == ["VC001", "VC002"] and len(check) == 21
    assert {"id": "VM006", "severity": "info", "category": "monitoring"}.items() <= check[-1].items()
    rc, out, _ = run("rules")
    assert "\nCheck rules (run by `vllm-doctor check`" in out and "\nVC015  gpu-index-outside-container  critical" in out
