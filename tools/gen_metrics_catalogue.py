#!/usr/bin/env python3
"""Generate vllm_doctor/data/vllm_metrics.json: every ``vllm:`` series vLLM defines, per release.

For the newest patch release of every minor version 0.2 .. latest (the versions of
vllm_doctor/data/vllm_wordings.json unless ``--versions``), the wheel is fetched with pip
(``pip download vllm==X --no-deps --only-binary :all:``, as tools/gen_wordings.py does) and only
``vllm/**/*.py`` is read from it: nothing is installed or imported. Every metric definition is
found in the syntax tree:

* a call of a Prometheus metric class (``Counter``, ``Gauge``, ``Histogram``, ``Summary``,
  ``Info``; prometheus_client's, aioprometheus' before 0.4, or vLLM's ``self._counter_cls`` /
  ``_gauge_cls`` / ``_histogram_cls`` indirections and metadata classes such as
  ``OffloadingHistogramMetadata``) whose name (``name=`` or the first argument) is a ``vllm:``
  string: a literal, an f-string of literals, a constant of the module or function, or a call of a
  helper that returns ``f"vllm:{x}"``;
* a dict entry ``{"vllm:x": SomethingHistogramMetadata(...)}`` (the KV offloading metrics).

The type comes from the class name; the documentation, label names (``labelnames`` literals,
variables of the function or module, ``labels + ["reason"]``) and unit (``unit=``, else the name's
suffix) from the call. A series is exposed as prometheus_client exposes it (a counter with
``_total``, a histogram's ``_bucket`` / ``_sum`` / ``_count``, an info with ``_info``); the family
is keyed by the name a query uses (a counter's ``_total`` name, a histogram's base name).

Each family gets the releases it is defined in (runs of consecutive examined releases), whether
it sits behind ``--show-hidden-metrics-for-version`` (vLLM's deprecation period), the engine(s)
(V0 ``vllm/engine``, V1 ``vllm/v1``) and files. Renames are vLLM's own (their deprecation notes),
listed in RENAMES below and checked against the catalogue. The ``sidecar`` part (vllm-doctor's own
series, from which vllm_doctor/export/collectors.py builds its families) is kept by hand in the
same file and carried over by each run.

Usage: python tools/gen_metrics_catalogue.py [--cache DIR] [--versions 0.2.7,0.3.3,...]
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_wordings import fetch, newest_per_minor, pypi_versions, template  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_doctor" / "data" / "vllm_metrics.json"
NAME_RE = re.compile(r"vllm:[a-zA-Z_][a-zA-Z0-9_]*")
KIND_RE = re.compile(r"(?i)(counter|gauge|histogram|summary)")
UNITS = (("_seconds", "seconds"), ("_milliseconds", "milliseconds"), ("_ms", "milliseconds"), ("_bytes", "bytes"),
         ("_perc", "ratio"), ("_ratio", "ratio"), ("_rate", "ratio"), ("_toks_per_s", "tokens_per_second"),
         ("_tokens", "tokens"), ("_blocks", "blocks"))

#: vLLM's renames (old -> new), from its deprecation notes (the ``documentation`` of the old name,
#: docs/usage/metrics.md and the release notes): the new name reports the same quantity.
#: "related" are successors that report a different aggregation of it.
RENAMES = [
    {"old": "vllm:gpu_cache_usage_perc", "new": "vllm:kv_cache_usage_perc",
     "note": "KV cache usage is not GPU-specific (0.9.2); the old name hidden from 0.10, removed in 0.12"},
    {"old": "vllm:gpu_prefix_cache_queries_total", "new": "vllm:prefix_cache_queries_total",
     "note": "prefix cache counters lose the GPU prefix (0.9.2)"},
    {"old": "vllm:gpu_prefix_cache_hits_total", "new": "vllm:prefix_cache_hits_total",
     "note": "prefix cache counters lose the GPU prefix (0.9.2)"},
    {"old": "vllm:time_per_output_token_seconds", "new": "vllm:inter_token_latency_seconds",
     "related": ["vllm:request_time_per_output_token_seconds"],
     "note": "the per-token interval is inter-token latency (0.10.2); the per-request mean is "
             "request_time_per_output_token_seconds (0.11.0)"},
]


def exposed(name: str, kind: str) -> tuple[str, list[str]]:
    """(family key a query uses, the sample names) of a metric named ``name`` of ``kind``."""
    if kind == "counter":
        base = name[:-6] if name.endswith("_total") else name
        return base + "_total", [base + "_total"]
    if kind == "histogram":
        return name, [name + "_bucket", name + "_sum", name + "_count"]
    if kind == "summary":
        return name, [name, name + "_sum", name + "_count"]
    if kind == "info":
        base = name[:-5] if name.endswith("_info") else name
        return base + "_info", [base + "_info"]
    return name, [name]


def unit_of(name: str) -> str:
    base = re.sub(r"_(total|info)$", "", name)
    for suf, unit in UNITS:
        if base.endswith(suf):
            return unit
    return ""


def _fname(f: ast.AST) -> str:
    return f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "")


def kind_of(func_name: str) -> str | None:
    if func_name == "Info" or func_name.endswith("InfoMetadata"):
        return "info"
    m = KIND_RE.search(func_name)
    return m.group(1).lower() if m else None


class FileScan:
    """The metric definitions of one source file."""

    def __init__(self, path: str, text: str, shared: dict[str, str] | None = None) -> None:
        self.path = path
        self.shared = shared if shared is not None else {}  # "Class.ATTR" -> string, over the wheel
        self.tree = ast.parse(text)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.module_env = self._assignments(self.tree.body)
        self.prefix_funcs: dict[str, str] = {}  # helper name -> the literal prefix it puts before its argument
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef) and node.args.args and len(node.body) >= 1:
                ret = node.body[-1]
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.JoinedStr):
                    vals = ret.value.values
                    if (len(vals) == 2 and isinstance(vals[0], ast.Constant) and isinstance(vals[1], ast.FormattedValue)
                            and isinstance(vals[0].value, str) and vals[0].value.startswith("vllm:")):
                        self.prefix_funcs[node.name] = vals[0].value
        self.unresolved: list[str] = []
        self._envs: dict[ast.AST, dict[str, list[ast.AST]]] = {}

    @staticmethod
    def _assignments(body) -> dict[str, list[ast.AST]]:
        env: dict[str, list[ast.AST]] = {}
        for st in body:
            for node in ast.walk(st) if not isinstance(st, (ast.FunctionDef, ast.ClassDef)) else [st]:
                if isinstance(node, ast.Assign):
                    for tgt in node.targets:
                        if isinstance(tgt, ast.Name):
                            env.setdefault(tgt.id, []).append(node.value)
                        elif isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and tgt.value.id == "self":
                            env.setdefault("self." + tgt.attr, []).append(node.value)
                elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
                    env.setdefault(node.target.id, []).append(node.value)
            if isinstance(st, ast.ClassDef):
                for k, v in FileScan._assignments(st.body).items():
                    env.setdefault(k, []).extend(v)
        return env

    def _env_of(self, node: ast.AST) -> list[dict[str, list[ast.AST]]]:
        """Assignments of the enclosing functions and classes, innermost first, then the module's."""
        envs = []
        cur = self.parent.get(node)
        while cur is not None:
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if cur not in self._envs:
                    self._envs[cur] = self._assignments(cur.body)
                envs.append(self._envs[cur])
            cur = self.parent.get(cur)
        return envs + [self.module_env]

    def _lookup(self, key: str, envs) -> ast.AST | None:
        for env in envs:
            if key in env:
                return env[key][-1]
        return None

    def string(self, node: ast.AST | None, envs, depth: int = 0) -> str | None:
        if node is None or depth > 5:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                else:
                    s = self.string(v.value, envs, depth + 1)
                    if s is None:
                        return None
                    parts.append(s)
            return "".join(parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.string(node.left, envs, depth + 1), self.string(node.right, envs, depth + 1)
            return a + b if a is not None and b is not None else None
        if isinstance(node, ast.Name):
            return self.string(self._lookup(node.id, envs), envs, depth + 1)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id != "self" and f"{node.value.id}.{node.attr}" in self.shared:
                return self.shared[f"{node.value.id}.{node.attr}"]
            key = f"{node.value.id}.{node.attr}" if node.value.id == "self" else node.attr
            return self.string(self._lookup(key, envs), envs, depth + 1)
        if isinstance(node, ast.Call) and _fname(node.func) in self.prefix_funcs and node.args:
            s = self.string(node.args[0], envs, depth + 1)
            return self.prefix_funcs[_fname(node.func)] + s if s is not None else None
        return None

    def labels(self, node: ast.AST | None, envs, depth: int = 0) -> list[str] | None:
        if node is None or depth > 5:
            return None
        if isinstance(node, (ast.List, ast.Tuple)):
            out = []
            for e in node.elts:
                s = self.string(e, envs, depth + 1)
                if s is None:
                    return None
                out.append(s)
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.labels(node.left, envs, depth + 1), self.labels(node.right, envs, depth + 1)
            return a + b if a is not None and b is not None else None
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = node.id if isinstance(node, ast.Name) else (
                f"self.{node.attr}" if isinstance(node.value, ast.Name) and node.value.id == "self" else node.attr)
            return self.labels(self._lookup(key, envs), envs, depth + 1)
        if isinstance(node, ast.Call) and _fname(node.func) in ("list", "tuple") and node.args:
            return self.labels(node.args[0], envs, depth + 1)
        return None

    def _hidden(self, node: ast.AST) -> bool:
        cur = self.parent.get(node)
        while cur is not None:
            if isinstance(cur, ast.If) and "hidden" in ast.unparse(cur.test):
                return True
            cur = self.parent.get(cur)
        return False

    def _loop_values(self, call: ast.Call, var: str, envs) -> list[tuple[str, str | None]]:
        """(name, documentation) pairs a loop variable takes: ``for name, doc in specs`` (a
        comprehension or a ``for``) over literal lists, or variables assigned such lists."""
        cur = self.parent.get(call)
        while cur is not None:
            gens = cur.generators if isinstance(cur, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)) else (
                [cur] if isinstance(cur, ast.For) else [])
            for g in gens:
                tgt = g.target
                names = [tgt.id] if isinstance(tgt, ast.Name) else (
                    [e.id if isinstance(e, ast.Name) else "" for e in tgt.elts] if isinstance(tgt, ast.Tuple) else [])
                if var not in names:
                    continue
                i = names.index(var)
                it = g.iter
                sources = [it] if not isinstance(it, ast.Name) else [
                    v for env in envs for v in env.get(it.id, [])][:4]
                out = []
                for src in sources:
                    for el in src.elts if isinstance(src, (ast.List, ast.Tuple)) else []:
                        parts = el.elts if isinstance(el, ast.Tuple) else [el]
                        if len(parts) == len(names) or len(names) == 1:
                            n = self.string(parts[i] if len(names) > 1 else el, envs)
                            doc = self.string(parts[i + 1], envs) if len(names) > 1 and i + 1 < len(parts) else None
                            if n is not None:
                                out.append((n, doc))
                return out
            cur = self.parent.get(cur)
        return []

    def _definition(self, call: ast.Call, name_node: ast.AST | None, kind: str) -> dict | None:
        envs = self._env_of(call)
        name = self.string(name_node, envs)
        if name is None:
            return None
        if not NAME_RE.fullmatch(name):
            return None
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        doc_node = kw.get("documentation") or kw.get("description")
        if doc_node is None and len(call.args) > 1:
            doc_node = call.args[1]
        doc = self.string(doc_node, envs) if doc_node is not None else None
        if doc is None and doc_node is not None:
            doc = template(doc_node)
        labels = self.labels(kw.get("labelnames") or kw.get("labels") or (call.args[2] if len(call.args) > 2 else None), envs)
        unit = self.string(kw.get("unit"), envs) if "unit" in kw else None
        return {"name": name, "kind": kind, "documentation": " ".join((doc or "").split()), "labels": labels,
                "unit": unit, "hidden": self._hidden(call), "file": self.path, "line": call.lineno}

    def definitions(self):
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                kind = kind_of(_fname(node.func))
                if kind is None:
                    continue
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                name_node = kw.get("name") or (node.args[0] if node.args else None)
                d = self._definition(node, name_node, kind)
                if d is not None:
                    yield d
                elif name_node is not None and self.string(name_node, self._env_of(node)) is None:
                    looped = self._loop_values(node, name_node.id, self._env_of(node)) if isinstance(name_node, ast.Name) else []
                    for n, doc in looped:
                        d = self._definition(node, ast.Constant(n), kind)
                        if d is not None:
                            d["documentation"] = d["documentation"] or " ".join((doc or "").split())
                            yield d
                    if not looped and (_fname(node.func)[:1].isupper() or _fname(node.func).endswith("_cls")):
                        self.unresolved.append(f"{self.path}:{node.lineno}: {ast.unparse(name_node)[:80]}")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    isinstance(node.targets[0], ast.Subscript) and kind_of(_fname(node.value.func)):
                d = self._definition(node.value, node.targets[0].slice, kind_of(_fname(node.value.func)))
                if d is not None:
                    yield d
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if k is None or not isinstance(v, ast.Call):
                        continue
                    kind = kind_of(_fname(v.func))
                    if kind is None:
                        continue
                    d = self._definition(v, k, kind)
                    if d is not None:
                        yield d


def scan_wheel(path: Path):
    """(definitions, unresolved name expressions) of one wheel."""
    defs, unresolved = [], []
    texts: dict[str, str] = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            n = info.filename
            if not (n.startswith("vllm/") and n.endswith(".py")) or "/tests/" in n or n.startswith("vllm/benchmarks/"):
                continue
            text = z.read(info).decode("utf-8", "replace")
            if "vllm:" in text or re.search(r"(?:Counter|Gauge|Histogram)Metadata\(", text):
                texts[n] = text
    trees = {}
    shared: dict[str, str] = {}  # class constants (``CPUOffloadingMetrics.STORES_SKIPPED``), used across files
    for n, text in texts.items():
        try:
            trees[n] = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(trees[n]):
            if isinstance(node, ast.ClassDef):
                for st in node.body:
                    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                        for tgt in st.targets:
                            if isinstance(tgt, ast.Name):
                                shared[f"{node.name}.{tgt.id}"] = st.value.value
    for n in trees:
        fs = FileScan(n, texts[n], shared)
        defs.extend(fs.definitions())
        if "vllm:" in texts[n] and not n.endswith("/reader.py"):  # reader.py reads metrics, defines none
            unresolved.extend(fs.unresolved)
    return defs, unresolved


def engine_of(path: str) -> str:
    if path.startswith("vllm/v1/"):
        return "v1"
    if path.startswith(("vllm/engine/", "vllm/spec_decode/")):
        return "v0"
    return "any"


def runs(present: list[bool], versions: list[str]) -> list[list[str]]:
    out, start = [], None
    for i, p in enumerate(present + [False]):
        if p and start is None:
            start = i
        elif not p and start is not None:
            out.append([versions[start], versions[i - 1]])
            start = None
    return out


def build(per_version: dict[str, list[dict]], versions: list[str]) -> dict[str, dict]:
    fams: dict[str, dict] = {}
    seen: dict[str, dict[str, dict]] = {}
    for v in versions:
        for d in per_version.get(v, []):
            key, samples = exposed(d["name"], d["kind"])
            f = fams.setdefault(key, {"type": d["kind"], "samples": samples, "labels": [], "unit": "",
                                      "documentation": "", "engines": [], "files": [], "defined_as": d["name"]})
            # the newest release's definition wins for type, documentation, labels and unit
            f.update(type=d["kind"], samples=samples, defined_as=d["name"])
            if d["documentation"]:
                f["documentation"] = d["documentation"]
            if d["labels"] is not None:
                f["labels"] = sorted(set(d["labels"]))
            f["unit"] = d["unit"] or unit_of(key)
            for lst, val in ((f["engines"], engine_of(d["file"])), (f["files"], d["file"])):
                if val not in lst:
                    lst.append(val)
            s = seen.setdefault(key, {}).setdefault(v, {"hidden": True})
            s["hidden"] = s["hidden"] and d["hidden"]
    for key, f in fams.items():
        f["versions"] = runs([v in seen[key] for v in versions], versions)
        hidden = runs([v in seen[key] and seen[key][v]["hidden"] for v in versions], versions)
        if hidden:
            f["hidden_versions"] = hidden
        f["engines"].sort()
        f["files"].sort()
    return dict(sorted(fams.items()))


def check_renames(fams: dict[str, dict]) -> None:
    for r in RENAMES:
        for n in [r["old"], r["new"], *r.get("related", [])]:
            if n not in fams:
                raise SystemExit(f"RENAMES: {n} is not in the catalogue")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default="/tmp/vllm-wheels", type=Path, help="where the wheels are kept")
    ap.add_argument("--versions", default="", help="comma-separated; default: the newest patch of each minor")
    ap.add_argument("--out", default=OUT, type=Path)
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    versions = [v for v in args.versions.split(",") if v] or newest_per_minor(pypi_versions()) or \
        json.loads((ROOT / "vllm_doctor" / "data" / "vllm_wordings.json").read_text())["versions"]
    wheels = {v: fetch(v, args.cache) for v in versions}
    per_version = {v: scan_wheel(whl) for v, whl in wheels.items() if whl is not None}
    done = list(per_version)
    for v in versions:
        if v not in per_version:
            print(f"{v}: no wheel", file=sys.stderr)
            continue
        defs, unresolved = per_version[v]
        print(f"{v}: {len({exposed(d['name'], d['kind'])[0] for d in defs})} vllm: families"
              + (f"; names not resolved: {'; '.join(unresolved)}" if unresolved else ""), file=sys.stderr)
    per_version = {v: defs for v, (defs, _) in per_version.items()}
    fams = build(per_version, done)
    check_renames(fams)
    out_path = args.out
    old = json.loads(out_path.read_text()) if out_path.exists() else {}
    out = {"generated_by": "tools/gen_metrics_catalogue.py (pip download vllm==X --no-deps --only-binary :all:, "
                           "newest patch of each minor; metric definitions read from vllm/**/*.py)",
           "versions": done,
           "vllm": fams,
           "renames": RENAMES,
           "sidecar": old.get("sidecar", {})}
    out_path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(fams)} vllm: families from {len(done)} versions -> {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
