"""``vllm-doctor check FILE|-``: lint a vLLM launch config or the monitoring that queries vLLM.

``check_text(text, name, ...) -> CheckResult``: detects what the file is (shell / docker run,
docker-compose, Kubernetes, CI YAML, ``.env``, Dockerfile, vLLM ``--config`` YAML, Prometheus
rules, Grafana dashboard JSON, raw PromQL), resolves the target vLLM version (``--vllm-version``,
else the ``vllm/vllm-openai:vX.Y.Z`` image tag, else the newest examined release, said so), and
returns findings. Formats: text, json, sarif (2.1.0), github (workflow commands).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from packaging.version import Version

from vllm_doctor import versions
from vllm_doctor.check.findings import CheckFinding, check_rule, sarif_level
from vllm_doctor.findings import SARIF_LEVELS
from vllm_doctor.check.launch import (Launch, flags_in, line_of, image_version, lint_launch, lint_shm, parsed_flags, read_ci, read_compose,
                     read_dockerfile, read_dotenv, read_k8s, read_shell, read_vllm_config, scan_modules)
from vllm_doctor.check.launch import lint_visible_devices
from vllm_doctor.check.monitoring import lint_grafana, lint_promql_text, lint_rules_file

NEWEST = "0.33.0"
#: libyaml's safe loader when PyYAML was built with it (25x faster on a multi-megabyte manifest bundle)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LEVEL_ORDER = {level: severity.rank for severity, level in SARIF_LEVELS.items()}  # note 0, warning 1, error 2
MONITORING_KINDS = ("prometheus-rules", "grafana", "promql", "markdown")


@dataclass
class CheckResult:
    file: str
    kind: str
    vllm_version: str
    version_source: str
    findings: list[CheckFinding] = field(default_factory=list)
    launches: int = 0

    def to_dict(self) -> dict:
        return {"file": self.file, "kind": self.kind, "vllm_version": self.vllm_version,
                "version_source": self.version_source, "launches": self.launches,
                "findings": [f.to_dict() for f in self.findings]}


def _yaml_docs(text: str) -> list[dict] | None:
    from vllm_doctor.bounded import check_yaml

    check_yaml(text)  # (TooComplex: check_files says so in one line)
    try:
        docs = [d for d in yaml.load_all(text, Loader=_YAML_LOADER) if d is not None]
    except yaml.YAMLError as e:
        if "maximum nesting depth" in str(e):      # libyaml's limit; the pure-Python loader recurses instead
            raise RecursionError(str(e)) from None
        if not re.search(r"(?m)^\s*(\.\.\.|…)\s*$", text):
            return None
        # a pasted file with `...` lines for what its author left out (vllm#32755): YAML reads `...` as
        # the end of a document, so the rest did not parse; read it again without them (same line count)
        return _yaml_docs(re.sub(r"(?m)^\s*(\.\.\.|…)\s*$", "", text))
    return docs if docs and all(isinstance(d, (dict, list)) for d in docs) else None


def _k8s_items(docs: list, depth: int = 0) -> list:
    """Kubernetes objects, with the items of a ``List`` (``kubectl get -o yaml``, ``DeploymentList``)
    taken out of it."""
    out: list = []
    for d in docs:
        if isinstance(d, dict) and str(d.get("kind", "")).endswith("List") and isinstance(d.get("items"), list) \
                and depth < 4:
            out += _k8s_items(d["items"], depth + 1)
        else:
            out.append(d)
    return out


def _mostly_promql(text: str) -> bool:
    """Whether most paragraphs of a plain file look like PromQL (not shell): a selector with a
    range, braces or a function call, and no command-line options."""
    paras = [p.strip()[:4096] for p in re.split(r"\n\s*\n", re.sub(r"(?m)^\s*#.*$", "", text[:1 << 20])) if p.strip()][:500]
    # (?<![\w:]) starts a name only at its first character: linear, not quadratic, on long words
    looks = [p for p in paras if re.search(r"(?<![\w:])[\w:]+\s*(\[\d+[smhdw]\]|\{|\()", p) and " --" not in p
             and not re.match(r"^(docker|vllm|python|curl|sudo|export|echo|set|for|if|kubectl)\b", p)]
    return bool(paras) and len(looks) * 2 >= len(paras)


#: Keys only a compose service has next to its `image:` (a CI job has `script:`, caught before)
_SERVICE_KEYS = ("command", "entrypoint", "deploy", "ipc", "shm_size", "runtime", "environment", "ports")


def detect(text: str, name: str) -> tuple[str, object]:
    """(kind, parsed document) of a file."""
    low = name.lower()
    base = Path(low).name
    s = text.lstrip()
    if s.startswith("{"):
        try:
            doc = json.loads(text)
            if isinstance(doc, dict) and ("panels" in doc or "dashboard" in doc):
                return "grafana", doc
        except ValueError:
            pass
    first = next((l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")), "")
    if base == "dockerfile" or base.endswith((".dockerfile", "-dockerfile")) or first.upper().startswith("FROM "):
        return "dockerfile", None
    if low.endswith((".promql", ".pql")):
        return "promql", None
    if low.endswith((".md", ".markdown")):
        return "markdown", None
    if base.endswith(".env") or base == ".env" or base.startswith(".env"):
        return "dotenv", None
    yamlish = re.search(r"(?m)^(---\s*$|[A-Za-z_][\w.-]*:(\s|$))", text[:65536]) is not None
    if low.endswith((".yml", ".yaml", ".json")) or (yamlish and not low.endswith((".sh", ".bash"))):
        docs = _yaml_docs(text)
        if docs:
            d0 = docs[0]
            if isinstance(d0, dict):
                if "groups" in d0 and isinstance(d0["groups"], list):
                    return "prometheus-rules", d0
                if d0.get("kind") == "PrometheusRule":
                    return "prometheus-rules", d0.get("spec") or {}
                if "services" in d0:
                    return "compose", d0
                if any(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") for d in docs):
                    return "kubernetes", _k8s_items(docs)
                if any(isinstance(v, dict) and ("script" in v or "steps" in v or "runs-on" in v) for v in d0.values()) \
                        or "jobs" in d0:
                    return "ci", d0.get("jobs", d0) if "jobs" in d0 else d0
                services = {k: v for k, v in d0.items() if isinstance(v, dict) and isinstance(v.get("image"), str)
                            and any(x in v for x in _SERVICE_KEYS)}
                if services:        # compose services pasted without their `services:` key (vllm#16841)
                    return "compose", {"services": services}
                known = [k for k in d0 if isinstance(k, str) and (versions.known_flag("--" + k.replace("_", "-"))
                                                                   or k in ("model",))]
                if d0 and len(known) * 2 >= len(d0):      # mostly vLLM flag names: a --config file
                    return "vllm-config", d0
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    if low.endswith((".sh", ".bash")) or s.startswith("#!") or any(l.startswith("--") for l in lines):
        return "shell", None
    if lines and all(re.match(r"^(export\s+)?[A-Za-z_]\w*=", l) for l in lines):
        return "dotenv", None
    if lines and _mostly_promql(text):
        return "promql", None
    return "shell", None


_FENCE_RE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w.+-]*)[^\n]*$")
_FENCE_NAMES = {"sh": "block.sh", "bash": "block.sh", "shell": "block.sh", "console": "block.sh", "zsh": "block.sh",
                "yaml": "block.yaml", "yml": "block.yaml", "json": "block.json", "promql": "block.promql",
                "dockerfile": "Dockerfile", "docker": "Dockerfile", "env": "block.env", "dotenv": "block.env"}


def markdown_blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line, pseudo file name from the info string, text) of each fenced code block of a Markdown
    file tagged with a language (sh, bash, console, yaml, json, promql, dockerfile, env): the prose
    around them, and untagged blocks, are no launch config. A ``console`` block keeps its ``$ `` commands (and
    their backslash continuations) and blanks the output, so line numbers stay those of the file."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).lower(), i + 2
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if info == "console":
            kept, cont = [], False
            for ln in body:
                if ln.startswith("$ ") or cont:
                    kept.append(ln[2:] if ln.startswith("$ ") and not cont else ln)
                    cont = ln.rstrip().endswith("\\")
                else:
                    kept.append("")
            body = kept
        if info in _FENCE_NAMES:          # an untagged block may be prose, a diagram or a template: not checked
            out.append((start, _FENCE_NAMES[info], "\n".join(body) + "\n"))
    return out


def _pin(explicit: str | None) -> str:
    """The release an unpinned image should name: the target version, unless it is newer than any
    known release (then no such image is known to exist: the newest known)."""
    from vllm_doctor.versions import newer_than_known

    return NEWEST if not explicit or newer_than_known(explicit) else explicit


def _resolve_version(explicit: str | None, launches: list[Launch]) -> tuple[str, str, list[CheckFinding]]:
    found: list[CheckFinding] = []
    tagged = None
    for la in launches:
        v, unpinned = image_version(la.image)
        if unpinned:
            found.append(CheckFinding("VC008", f"image {la.image}: :latest (or no tag) is whatever vLLM was newest "
                                      "when the node pulled it; flags, defaults and metric names change between "
                                      "releases. Pin the version", la.file, la.image_line or la.line,
                                      fix={"setting": "image", "value": f"vllm/vllm-openai:v{_pin(explicit)}"},
                                      snippet=la.image or ""))
        tagged = tagged or v
    if explicit:
        return explicit, "--vllm-version", found
    if tagged:
        return tagged, "image tag", found
    return NEWEST, "unknown: judged as the newest examined release", found


def _flag_line(la: Launch, text: str, *flags: str) -> int:
    """The line of the first of ``flags`` the launch sets (a .env variable's own line, a YAML key's, the
    continuation line of a long command), else the launch's line."""
    for fl in flags:
        extra = getattr(la, "extra_lines", None) or {}
        if fl in extra:
            return extra[fl]
        if any(a == fl or a.startswith(fl + "=") for a in la.argv):
            return line_of(la, text, fl)
    return la.line


def _launch_plan(flags: dict, version: str, model_config: dict, gpu_memory: int | None,
                 kv_cache_memory_bytes: int | None = None, mean_request_tokens: int | None = None,
                 vllm_use_v1: str | None = None):
    """``plan`` on the launch's flags (``kv_cache_memory_bytes``: a KV cache size to assume when the launch
    gives none; ``vllm_use_v1``: the launch's VLLM_USE_V1, which chooses the engine plan sizes), or None when a
    flag has a value plan cannot use (0, -5, abc, 32k, $VAR: reported by the flag checks, never sized with a
    default in its place) or the plan fails."""
    from vllm_doctor.plan.planner import PlanInputs, make_plan, parse_size

    def num(k, cast):
        v = flags.get(k)
        try:
            return cast(v) if v is not None else None
        except ValueError:
            return None
    for k, cast in (("--tensor-parallel-size", int), ("--pipeline-parallel-size", int), ("--block-size", int),
                    ("--max-model-len", int), ("--gpu-memory-utilization", float), ("--max-num-seqs", int),
                    ("--max-num-batched-tokens", int)):
        if flags.get(k) is not None and not (num(k, cast) or 0) > 0:
            return None
    kvb = flags.get("--kv-cache-memory-bytes")
    try:
        return make_plan(PlanInputs(
            config=model_config, gpu_memory_bytes=gpu_memory, vllm_version=version,
            tensor_parallel_size=num("--tensor-parallel-size", int) or 1,
            pipeline_parallel_size=num("--pipeline-parallel-size", int) or 1,
            dtype=flags.get("--dtype") or "auto", kv_cache_dtype=flags.get("--kv-cache-dtype") or "auto",
            block_size=num("--block-size", int), max_model_len=num("--max-model-len", int),
            gpu_memory_utilization=num("--gpu-memory-utilization", float), max_num_seqs=num("--max-num-seqs", int),
            max_num_batched_tokens=num("--max-num-batched-tokens", int),
            kv_cache_memory_bytes=parse_size(kvb) if kvb else kv_cache_memory_bytes,
            mean_request_tokens=mean_request_tokens, vllm_use_v1=vllm_use_v1))
    except Exception:  # noqa: BLE001 - a value plan cannot use is reported by the flag checks
        return None


def _kv_cache_tokens(found: list[CheckFinding], flags: dict, version: str, model_config: dict | None,
                     gpu_memory: int | None) -> None:
    """``--kv-cache N`` (a token count) with the model known: the --kv-cache-memory-bytes that holds N tokens,
    and whether that fits in the GPU's memory (``gpu_memory``), rewritten into the finding in place."""
    from vllm_doctor.check.knowledge import kv_cache_size_advice

    for f in found:
        tokens = f.extra.get("kv_cache_tokens")
        if tokens is None or model_config is None:
            continue
        if str(flags.get("--kv-cache-dtype")).isdigit():      # --kv-cache N read as --kv-cache-dtype N (<= 0.10.1)
            flags = {k: v for k, v in flags.items() if k != "--kv-cache-dtype"}
        p = _launch_plan(flags, version, model_config, gpu_memory, None if gpu_memory else 1 << 30)
        if p is None:
            continue
        sized = {"bytes_per_block": p.pool["bytes_per_block"], "block_size": p.settings["block_size"],
                 "available": p.pool["available_kv_cache_bytes"] if gpu_memory else None,
                 "available_arithmetic": p.pool["available_arithmetic"] if gpu_memory else None,
                 "fp8": str(flags.get("--kv-cache-dtype") or "auto").startswith("fp8")}
        said, fix, level = kv_cache_size_advice(tokens, version, set(flags_in(version)), sized=sized)
        f.message, f.fix = f.extra["read_as"] + ". " + said, fix
        f.level = level or f.level


def _capacity(la: Launch, flags: dict, version: str, model_config: dict | None, gpu_memory: int | None,
              text: str = "", mean_request_tokens: int | None = None) -> list[CheckFinding]:
    """What plan predicts for this launch: start-up failure, or max_num_seqs above what fits: at the
    mean request length where it is given (a warning with the value), else only as the worst case
    (every request at max_model_len), said to be an assumption, with no value prescribed (a note)."""
    kvb = flags.get("--kv-cache-memory-bytes")
    if model_config is None or (gpu_memory is None and not kvb):
        return []
    p = _launch_plan(flags, version, model_config, gpu_memory, mean_request_tokens=mean_request_tokens,
                     vllm_use_v1=_use_v1(la, version))
    if p is None:
        return []
    # the engine, where the launch's own VLLM_USE_V1 chose it (docker -e, compose environment, a pod's env)
    engine = f" [{p.engine.upper()} engine: {p.engine_reason}]" if p.engine_reason.startswith("VLLM_USE_V1") else ""
    out = []
    if p.startup["fails"]:
        fixes = [f for f in p.fixes if not f.get("informational")]
        by_option: dict[int, list[str]] = {}    # plan's options: alternatives; the fixes of one go together
        for f in fixes:
            by_option.setdefault(f["option"], []).append(f"{f['flag']} {f['value']}" if f.get("flag") else f.get("hardware", ""))
        alts = [" ".join(c) for o, c in by_option.items() if fixes and o != fixes[0]["option"]]
        line = _flag_line(la, text, "--max-model-len", "--gpu-memory-utilization", "--kv-cache-memory-bytes",
                          "--tensor-parallel-size", "--max-num-seqs")
        out.append(CheckFinding("VC010", "vLLM will refuse to start: " + p.startup["messages"][0] + engine, la.file, line,
                                fix={"setting": fixes[0]["flag"], "value": fixes[0]["value"], "alternatives": alts}
                                if fixes and fixes[0].get("flag") else None))
        return out
    conc = p.concurrency["at_max_model_len"]
    seqs = p.settings["max_num_seqs"]
    at_mean = p.concurrency.get("at_mean_request_length")
    line = _flag_line(la, text, "--max-num-seqs")
    if mean_request_tokens and at_mean is not None:
        if seqs > at_mean and "--max-num-seqs" in flags:
            out.append(CheckFinding("VC010", f"--max-num-seqs {seqs} but at the mean request of {mean_request_tokens:,} tokens "
                                    f"the KV cache holds {at_mean:,} requests at once ({p.concurrency['mean_arithmetic']}); "
                                    f"once they fill it, vLLM preempts (RECOMPUTE) instead of admitting more{engine}", la.file,
                                    line, level="warning", fix={"setting": "--max-num-seqs", "value": max(1, int(at_mean)),
                                                                "alternatives": []}))
    elif seqs > conc and "--max-num-seqs" in flags:
        mml = p.settings["max_model_len"]
        out.append(CheckFinding("VC010", f"--max-num-seqs {seqs} but the KV cache holds {p.pool['kv_cache_tokens']:,} "
                                f"tokens = {conc:.2f} requests of {mml:,} tokens ({p.kv_per_token['bytes_per_token']:,} "
                                f"B/token, {p.pool['num_gpu_blocks']:,} blocks): assumed the worst case, every request "
                                f"growing to max_model_len. vLLM preempts only when requests really fill the cache, so "
                                f"how many fit at your mean request length decides; give it (--mean-request-tokens N) "
                                f"for a value{engine}", la.file, line, level="note"))
    return out


def _use_v1(la: Launch, version: str) -> str | None:
    """The VLLM_USE_V1 the launch sets ("0" / "1"), where that version reads it (0.7.0-0.10.2: from 0.11.0
    V1 is the only engine and the variable is ignored); other values are the env checks' to report."""
    v = (la.env.get("VLLM_USE_V1") or ("", 0))[0].strip("'\"")
    pv = versions.parse_version(version)
    return v if v in ("0", "1") and pv is not None and Version("0.7.0") <= pv < Version("0.11.0") else None


def check_text(text: str, name: str = "-", vllm_version: str | None = None, model_config: dict | None = None,
               gpu_memory: int | None = None, kind: str | None = None, mean_request_tokens: int | None = None,
               recorded: frozenset[str] = frozenset(), detected: tuple[str, object] | None = None) -> CheckResult:
    """Findings for one file. ``recorded``: series that Prometheus rule files checked in the same run
    record (a dashboard that queries them queries no vLLM series)."""
    if model_config is not None:
        from vllm_doctor.plan.planner import validate_config

        validate_config(model_config)       # a bad config.json is one line (exit 2), never silently no finding
    kind_, doc = (detected or detect(text, name)) if kind is None else (kind, None)
    if kind is not None and kind not in ("shell", "promql", "dotenv", "dockerfile"):
        _, doc = detected or detect(text, name)
    findings: list[CheckFinding] = []
    launches: list[Launch] = []
    if kind_ == "markdown":
        return _check_markdown(text, name, vllm_version, model_config, gpu_memory, recorded, mean_request_tokens)
    if kind_ == "shell":
        launches = read_shell(text, name, findings)
        scan_modules(text, name, 1, findings)
    elif kind_ == "compose":
        launches = read_compose(doc, text, name)
    elif kind_ == "kubernetes":
        start = 1
        for d in doc:
            if isinstance(d, dict) and d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet",
                                                        "Job", "CronJob", "Pod"):
                launches += read_k8s(d, text, name, start)
    elif kind_ == "ci":
        launches = read_ci(doc, text, name, findings)
    elif kind_ == "dotenv":
        launches = read_dotenv(text, name)
    elif kind_ == "dockerfile":
        launches = read_dockerfile(text, name)
    elif kind_ == "vllm-config":
        launches = read_vllm_config(doc, text, name)
    version, source, vf = _resolve_version(vllm_version, launches)
    findings += vf
    known = source != "unknown: judged as the newest examined release"
    if kind_ == "prometheus-rules":
        findings += lint_rules_file(doc, text, name, version, known, recorded)
    elif kind_ == "grafana":
        findings += lint_grafana(doc, text, name, version, known, recorded)
    elif kind_ == "promql":
        findings += lint_promql_text(text, name, version, known, recorded)
    for la in launches:
        found = lint_launch(la, version, text)
        flags = parsed_flags(la, version)
        _kv_cache_tokens(found, flags, version, model_config, gpu_memory)
        findings += found
        findings += lint_shm(la, flags)
        findings += lint_visible_devices(la)
        findings += _capacity(la, flags, version, model_config, gpu_memory, text, mean_request_tokens)
    seen, uniq = set(), []
    for f in sorted(findings, key=lambda f: (f.line, f.rule_id)):
        key = (f.rule_id, f.line, f.message)
        if key not in seen:
            seen.add(key)
            uniq.append(f)
    return CheckResult(name, kind_, version, source, uniq, len([la for la in launches if la.argv or la.env]))


def _check_markdown(text: str, name: str, vllm_version, model_config, gpu_memory, recorded,
                    mean_request_tokens: int | None = None) -> CheckResult:
    """Each fenced code block checked as what it holds, its findings on the Markdown file's lines."""
    res = CheckResult(name, "markdown", vllm_version or NEWEST,
                      "--vllm-version" if vllm_version else "unknown: judged as the newest examined release")
    versions_seen = []
    for start, pseudo, body in markdown_blocks(text):
        det = detect(body, pseudo)
        r = check_text(body, pseudo, vllm_version, model_config, gpu_memory, recorded=recorded, detected=det,
                       mean_request_tokens=mean_request_tokens)
        if r.version_source == "image tag":
            versions_seen.append(r.vllm_version)
        res.launches += r.launches
        for f in r.findings:
            f.file, f.line = name, f.line + start - 1
            res.findings.append(f)
    if versions_seen and not vllm_version:
        res.vllm_version, res.version_source = versions_seen[0], "image tag (a code block)"
    return res


MAX_BYTES = 16 << 20   # a launch config, rule file or dashboard is far smaller; memory stays bounded


def read_input(path: str) -> str:
    """A file's text (``-``: stdin). InputError (exit 2, one line) for what is no config: unreadable, a
    directory, binary data, over MAX_BYTES."""
    import sys

    from vllm_doctor.errors import InputError

    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(f"{path}: larger than {MAX_BYTES >> 20} MiB: not a launch config or monitoring file")
    if b"\0" in raw[:65536]:
        raise InputError(f"{path}: binary data, not a launch config or monitoring file")
    return raw.decode("utf-8", "replace")


def check_file(path: str, **kw) -> CheckResult:
    """``check_text`` on a file (``-``: stdin); see ``read_input`` for what is refused."""
    return check_files([path], **kw)[0]


def check_files(paths: list[str], **kw) -> list[CheckResult]:
    """``check_text`` on each file, after reading them all: the series that any Prometheus rule file among
    them records are known to the dashboards and rule files among them."""
    from vllm_doctor.bounded import TooComplex
    from vllm_doctor.errors import InputError
    from vllm_doctor.check.monitoring import recorded_names

    texts = [(p, read_input(p)) for p in paths]
    recorded: set[str] = set(kw.pop("recorded", ()))
    detected = []
    for p, text in texts:
        try:
            detected.append(detect(text, p))
        except RecursionError:
            raise InputError(f"{p}: nested too deeply to read") from None
        except TooComplex as e:
            raise InputError(f"{p}: {e}") from None
        if detected[-1][0] == "prometheus-rules":
            recorded |= recorded_names(detected[-1][1])
    out = []
    for (p, text), det in zip(texts, detected):
        try:
            out.append(check_text(text, p, recorded=frozenset(recorded), detected=det, **kw))
        except RecursionError:
            raise InputError(f"{p}: nested too deeply to read") from None
        except TooComplex as e:
            raise InputError(f"{p}: {e}") from None
    return out


# ---------------------------------------------------------------- output

def _setting(d: dict) -> str:
    return f"{d['setting']}" + (f" {d['value']}" if d.get("value") not in (None, "") else "")


def fix_text(fix: dict | None) -> str:
    """A finding's fix in words, for every format: the setting and its value ("delete X" for a variable
    that does nothing), and the alternatives numbered as the diagnose report numbers them ("option 1 of
    2: pick one"). "" when there is no fix."""
    if not fix or not fix.get("setting"):
        return ""
    first = f"delete {fix['setting']}" if fix.get("action") == "delete" else _setting(fix)
    if fix.get("and"):
        first += f" (and, only if that is meant: {_setting(fix['and'])})"
    alts = [a for a in fix.get("alternatives") or () if a]
    if not alts:
        return first
    n = len(alts) + 1
    return "; ".join(f"{s} (option {i} of {n}: pick one)" for i, s in enumerate([first, *alts], 1))


def to_text(results: list[CheckResult]) -> str:
    out = []
    for r in results:
        empty = "" if r.launches or r.kind in MONITORING_KINDS else "; no vLLM launch found in it"
        out.append(f"{r.file}: {r.kind}, vLLM {r.vllm_version} ({r.version_source}), {len(r.findings)} finding(s){empty}")
        for f in r.findings:
            fix = fix_text(f.fix)
            out.append(f"  {f.file}:{f.line}: {f.level} {f.rule_id} {f.name}: {f.message}" + (f" -> {fix}" if fix else ""))
    return "\n".join(out) + "\n"


def to_json(results: list[CheckResult]) -> str:
    return json.dumps([r.to_dict() for r in results], indent=2) + "\n"


def to_sarif(results: list[CheckResult]) -> str:
    from vllm_doctor.about import __version__

    used = sorted({f.rule_id for r in results for f in r.findings})
    rules = [{"id": rid, "name": check_rule(rid).name, "shortDescription": {"text": check_rule(rid).title},
              "defaultConfiguration": {"level": sarif_level(rid)}} for rid in used]
    res = []
    for r in results:
        for f in r.findings:
            msg = f.message + (f" Fix: {fix_text(f.fix)}" if fix_text(f.fix) else "")
            res.append({"ruleId": f.rule_id, "ruleIndex": used.index(f.rule_id), "level": f.level,
                        "message": {"text": msg},
                        "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.file},
                                                            "region": {"startLine": max(1, f.line)}}}]})
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                       "runs": [{"tool": {"driver": {"name": "vllm-doctor", "version": __version__,
                                                     "informationUri": "https://github.com/vllm-project/vllm",
                                                     "rules": rules}},
                                 "results": res}]}, indent=2) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return s.replace(":", "%3A").replace(",", "%2C") if prop else s


def to_github(results: list[CheckResult]) -> str:
    out = []
    for r in results:
        for f in r.findings:
            cmd = {"error": "error", "warning": "warning", "note": "notice"}[f.level]
            fix = f" Fix: {fix_text(f.fix)}" if fix_text(f.fix) else ""
            out.append(f"::{cmd} file={_gh_escape(f.file, True)},line={max(1, f.line)},"
                       f"title={_gh_escape(f.rule_id + ' ' + f.name, True)}::{_gh_escape(f.message + fix)}")
    return "\n".join(out) + ("\n" if out else "")


FORMATS = {"text": to_text, "json": to_json, "sarif": to_sarif, "github": to_github}


def worst(results: list[CheckResult]) -> int:
    """Highest level present: 2 error, 1 warning, 0 note, -1 none."""
    return max((LEVEL_ORDER[f.level] for r in results for f in r.findings), default=-1)
