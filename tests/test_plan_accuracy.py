"""The plan-accuracy suite (issue 23 item 4): real vLLM start-ups from public issues and pages, each with
the model's config.json, its launch settings and the figures the log printed, against what `plan` gives.

tests/fixtures/plan_accuracy/cases.json lists the runs (its README.md says where each log and config
comes from). Per run, three errors where the log allows them:

- weights: plan's weights per GPU against "Model loading took" / "Loading model weights took";
- KV bytes per token: plan's against available KV cache memory / KV cache tokens as the log printed them
  (hybrid models with Mamba / linear-attention state: bytes per printed token);
- KV cache tokens, end to end: what a user gets from `plan` given only the GPU (its total memory as CUDA
  reports it), the version and the launch flags (and the sampler the log says it uses: "Using
  FlashInfer for top-p & top-k sampling" is --sampler flashinfer), with the overhead ESTIMATED, against the tokens the log
  printed ("GPU KV cache size", or "# GPU blocks" x block size); where the log printed only the available
  memory (the llm-d table), against the tokens vLLM's own arithmetic gives for that memory.

and the start-up verdict (starts / fails at which stage) against the run's outcome.

``python tests/test_plan_accuracy.py`` prints the table docs/plan.md holds; test_docs_table_is_current
keeps the two in step.
"""
from __future__ import annotations

import ast
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from vllm_doctor.plan import capacity as cap
from vllm_doctor.plan.planner import Plan, PlanInputs, load_config, make_plan

HERE = Path(__file__).parent
FIX = HERE / "fixtures"
SUITE = FIX / "plan_accuracy"
CASES: list[dict] = json.loads((SUITE / "cases.json").read_text())
DOC = HERE.parent / "docs" / "plan.md"
BEGIN, END = "<!-- plan-accuracy suite: python tests/test_plan_accuracy.py -->\n", "<!-- end of plan-accuracy suite -->"


def _num(s: str) -> int:
    return int(s.replace(",", ""))


def _args(text: str) -> dict:
    """vLLM's 'non-default args: {...}' line, where the log has one (values that are not literals dropped)."""
    m = re.search(r"non-default args: (\{.*\})", text)
    if not m:
        return {}
    try:
        return ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return {}


def logged(case: dict) -> dict:
    """What the run's log printed: weights GiB, available KV GiB, KV cache tokens, concurrency, outcome
    (the llm-d page's transcription sets its labels in bold: "Available KV cache memory:** 28.20 GiB")."""
    text = (FIX / case["log"]).read_text()
    own = text if "rank" not in case else "\n".join(  # the worker whose pipeline stage binds the pool
        line for line in text.splitlines() if f"rank={case['rank']} " in line)
    row = text.strip().splitlines()[-1].split("|") if "weights_column" in case else None
    out: dict = {"args": _args(text), "text": text}
    if m := re.search(r"(?:Model loading took|Loading model weights took)(?::\*\*)? ([\d.]+) G", text):
        out["weights_gib"] = float(m.group(1))
    elif row and row[case["weights_column"]].strip() != "N/A":
        out["weights_gib"] = float(row[case["weights_column"]])
    if m := re.search(r"Available KV cache memory:(?:\*\*)? (-?[\d.]+) GiB|kv_cache_size=(-?[\d.]+)GiB"
                      r"|reserved for KV Cache is (-?[\d.]+) ?GiB", own):
        out["avail_gib"] = float(m.group(1) or m.group(2) or m.group(3))
    elif row and "kv_gib_column" in case and row[case["kv_gib_column"]].strip() != "N/A":
        out["avail_gib"] = float(row[case["kv_gib_column"]])
    if m := re.search(r"KV cache size:(?:\*\*)? ([\d,]+) tokens", text):
        out["tokens"] = _num(m.group(1))
    elif m := re.search(r"# (?:GPU|cuda) blocks: (\d+)|GPU blocks: (\d+)", text):
        out["tokens"] = int(m.group(1) or m.group(2)) * case.get("block_size", 16)
    if m := re.search(r"Maximum concurrency for ([\d,]+) tokens per request:(?:\*\*)? ([\d.]+)x", text):
        out["max_model_len"], out["concurrency"] = _num(m.group(1)), float(m.group(2))
    out["fails"] = case.get("fails")
    return out


def inputs(case: dict, **over) -> PlanInputs:
    """The launch as a user gives it to `plan`: the log's own arguments, then the case's settings."""
    lg = logged(case)
    a = lg["args"]
    cfg, _ = load_config(str(FIX / case["config"]))
    kw = dict(config=cfg, model=case["model"],
              tensor_parallel_size=a.get("tensor_parallel_size", case.get("tp", 1)),
              pipeline_parallel_size=a.get("pipeline_parallel_size", case.get("pp", 1)),
              max_model_len=lg.get("max_model_len") or a.get("max_model_len") or case.get("max_model_len"),
              gpu_memory_utilization=a.get("gpu_memory_utilization", case.get("gpu_memory_utilization")),
              max_num_seqs=a.get("max_num_seqs", case.get("max_num_seqs")),
              max_num_batched_tokens=a.get("max_num_batched_tokens", case.get("max_num_batched_tokens")),
              kv_cache_dtype=a.get("kv_cache_dtype", case.get("kv_cache_dtype", "auto")),
              enable_prefix_caching=a.get("enable_prefix_caching", case.get("enable_prefix_caching")),
              quantization=case.get("quantization"), engine=case.get("engine"), dtype=case.get("dtype", "auto"),
              sampler="flashinfer" if "Using FlashInfer for top-p & top-k sampling" in lg["text"]
              else case.get("sampler", "native"), block_size=case.get("block_size"),
              disable_custom_all_reduce="Custom allreduce is disabled" in lg["text"])
    if case.get("vllm"):                 # the version is not printed in every log: weights do not depend on it
        kw["vllm_version"] = case["vllm"]
    kw.update(over)
    return PlanInputs(**kw)


def plan_given_memory(case: dict) -> Plan:
    """The plan given the available KV cache memory the log printed: vLLM's block arithmetic alone."""
    return make_plan(inputs(case, kv_cache_memory_bytes=int(logged(case)["avail_gib"] * cap.GiB)))


def plan_end_to_end(case: dict) -> Plan:
    """The plan a user gets: the GPU's total memory, the overhead estimated."""
    return make_plan(inputs(case, gpu_memory_bytes=int(case["gpu_gib"] * cap.GiB), gpu_name=case.get("gpu")))


def _pct(pred: float, log: float) -> float:
    return (pred / log - 1) * 100


def row(case: dict) -> dict:
    """One run: plan's figures, the log's, and the errors in %."""
    lg = logged(case)
    r: dict = {"id": case["id"], "model": case["model"], "kind": case.get("kind", ""), "vllm": case.get("vllm") or "-",
               "gpu": case.get("gpu", "-"), "source": case["source"],
               "tp": f"{inputs(case).tensor_parallel_size}" + (f" x PP {case['pp']}" if case.get("pp", 1) > 1 else "")}
    p = make_plan(inputs(case, kv_cache_memory_bytes=cap.GiB))
    w = p.weights["bytes_per_gpu"] / cap.GiB
    if "weights_gib" in lg:
        r["weights"] = (w, lg["weights_gib"], _pct(w, lg["weights_gib"]), case.get("weights_known_miss"))
    if lg.get("avail_gib", 0) > 0 and "tokens" in lg:
        given = plan_given_memory(case)
        per_tok = given.pool["bytes_per_printed_token"] if case.get("hybrid") else given.kv_per_token["bytes_per_token"]
        log_per_tok = lg["avail_gib"] * cap.GiB / lg["tokens"]
        r["bytes_per_token"] = (per_tok, log_per_tok, _pct(per_tok, log_per_tok))
        if case.get("vllm"):        # the printed tokens' formula is the version's
            got = given.pool["kv_cache_tokens"]
            r["tokens_given_memory"] = (got, lg["tokens"], _pct(got, lg["tokens"]))
    if case.get("gpu_gib") and case.get("vllm"):
        e2e = plan_end_to_end(case)
        lean = any("--sampler flashinfer" in m for m in e2e.startup["messages"])
        r["verdict"] = ((f"fails ({e2e.startup['stage']}{'; starts with --sampler flashinfer' if lean else ''})"
                         if e2e.startup["fails"] else "starts"),
                        f"fails ({case['fails']})" if case.get("fails") else "starts")
        r["overhead_gib"] = e2e.pool["overhead_bytes"] / cap.GiB
        want, how = None, ""
        if "tokens" in lg and not case.get("fails"):
            want, how = lg["tokens"], "logged"
        elif lg.get("avail_gib", 0) > 0 and not case.get("fails"):
            want, how = plan_given_memory(case).pool["kv_cache_tokens"], "from the logged memory"
        if want:
            got = e2e.pool["kv_cache_tokens"]
            r["tokens_e2e"] = (got, want, _pct(got, want), how)
            if "avail_gib" in lg:
                r["avail_e2e"] = (e2e.pool["available_kv_cache_bytes"] / cap.GiB, lg["avail_gib"])
    return r


ROWS_CACHE: list[dict] = []


def rows() -> list[dict]:
    if not ROWS_CACHE:
        ROWS_CACHE.extend(row(c) for c in CASES)
    return ROWS_CACHE


def summary(rs: list[dict]) -> dict:
    def stat(key: str, skip_known: bool = False) -> tuple[int, float, float, str]:
        errs = [(abs(r[key][2]), r["id"]) for r in rs if key in r and not (skip_known and r[key][3])]
        if not errs:
            return 0, 0.0, 0.0, "-"
        worst = max(errs)
        return len(errs), statistics.median(e for e, _ in errs), worst[0], worst[1]
    verdicts = [r["verdict"] for r in rs if "verdict" in r]
    return {"logs": len(rs), "models": len({r["model"] for r in rs}),
            "weights": stat("weights", skip_known=True), "bytes_per_token": stat("bytes_per_token"),
            "tokens_given_memory": stat("tokens_given_memory"), "tokens_e2e": stat("tokens_e2e"),
            "verdicts": len(verdicts), "verdicts_right": sum((a == "starts") == (b == "starts") for a, b in verdicts),
            "false_failures": [r["id"] for r in rs if "verdict" in r and r["verdict"][0] != "starts"
                               and r["verdict"][1] == "starts"]}


def _cell(t: tuple | None, fmt: str = "{:,.0f}") -> str:
    if not t:
        return "- | -"
    return f"{fmt.format(t[0])} / {fmt.format(t[1])} | {t[2]:+.2f} %"


def markdown() -> str:
    rs = rows()
    s = summary(rs)
    out = [f"{s['logs']} real start-ups of {s['models']} models. Absolute errors, median / worst (run):", ""]
    for key, name in (("weights", "weights per GPU"), ("bytes_per_token", "KV bytes per token"),
                      ("tokens_given_memory", "KV cache tokens given the logged available memory"),
                      ("tokens_e2e", "KV cache tokens end to end (GPU total, overhead estimated)")):
        n, med, worst, who = s[key]
        out.append(f"- {name}: {n} runs, median {med:.2f} %, worst {worst:.2f} % ({who})")
    out.append(f"- start-up verdict: {s['verdicts_right']} of {s['verdicts']} runs right; false \"start-up fails\": "
               f"{', '.join(s['false_failures']) or 'none'}")
    out += ["", "| run | kind | vLLM | GPU | TP | weights GiB plan / log | error | KV B/token plan / log | error | "
            "KV tokens given logged memory: plan / log | error | KV tokens end to end: plan / log | error | "
            "verdict plan / log | source |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        w = r.get("weights")
        wc = (f"{w[0]:.2f} / {w[1]:g} | {w[2]:+.2f} %" + (" (known miss)" if w[3] else "")) if w else "- | -"
        e2e = r.get("tokens_e2e")
        ec = (_cell(e2e) + ("" if e2e[3] == "logged" else " (log: memory only)")) if e2e else "- | -"
        v = " / ".join(r["verdict"]) if "verdict" in r else "-"
        out.append(f"| {r['id']} | {r['kind']} | {r['vllm']} | {r['gpu']} | {r['tp']} | {wc} | "
                   f"{_cell(r.get('bytes_per_token'))} | {_cell(r.get('tokens_given_memory'))} | {ec} | {v} | {r['source']} |")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_no_real_config_is_refused(case):
    """Every real config.json is planned (no InputError, no exit 2), with and without the GPU given."""
    assert make_plan(inputs(case, kv_cache_memory_bytes=cap.GiB)).weights["bytes_per_gpu"] > 0
    if case.get("gpu_gib"):
        plan_end_to_end(case)


def test_no_false_startup_failure():
    """A run that started is never planned as 'start-up fails' (but the known misses cases.json explains,
    which must still be misses); every run that failed is."""
    s = summary(rows())
    assert s["false_failures"] == [c["id"] for c in CASES if c.get("verdict_known_miss")]
    assert s["verdicts_right"] == s["verdicts"] - len(s["false_failures"]), [r["verdict"] for r in rows() if "verdict" in r]


def test_given_the_logged_memory_the_block_arithmetic_is_exact():
    """vLLM's own accounting: given the available memory it printed, the tokens within 0.5 % (its GiB
    is rounded to 2 decimals) and the bytes per token within 1 %."""
    for r in rows():
        if "tokens_given_memory" in r:
            assert abs(r["tokens_given_memory"][2]) < 0.5, r["id"]
            assert abs(r["bytes_per_token"][2]) < 1, r["id"]


def test_weights_within_5_percent():
    """Each weights figure within 5 %; a miss the case explains (weights_known_miss) must still be one."""
    for r in rows():
        if "weights" in r:
            assert (abs(r["weights"][2]) < 5) is not bool(r["weights"][3]), r["id"]


def test_suite_size_and_end_to_end_figures():
    """What the suite holds now, and the end-to-end KV-token error it reaches: a bound that may only
    tighten (49 runs of 25 models, median 0.69 %, worst 3.89 %; the issue's bar is test_issue_bar below)."""
    s = summary(rows())
    assert s["logs"] >= 49 and s["models"] >= 25
    n, med, worst, _ = s["tokens_e2e"]
    assert n >= 19
    assert med <= 0.75 and worst <= 4.0


def test_issue_bar():
    """Issue 23's bar: >= 40 real start-ups of >= 25 models, end-to-end KV-token error median <= 1 %
    and worst <= 5 %, no false "start-up fails"."""
    s = summary(rows())
    assert s["false_failures"] == []
    assert s["logs"] >= 40 and s["models"] >= 25
    _, med, worst, _ = s["tokens_e2e"]
    assert med <= 1.0 and worst <= 5.0


def test_docs_table_is_current():
    doc = DOC.read_text()
    assert doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)] == markdown()


if __name__ == "__main__":
    sys.stdout.write(markdown())
