"""The package's import graph (issue 26 item 2): no import cycle inside vllm_doctor, and no private
name (``_x``) imported from another module. Every import counts, at module level or inside a
function or ``if TYPE_CHECKING:``: a cycle hidden in a function is still a cycle of the design
(a sink that needs serve.py to be typed depends on serve.py). Read from the source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vllm_doctor"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """module -> the modules of vllm_doctor it imports; and the private names imported across modules."""

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.split(".")[0] == "vllm_doctor"]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = up + ("." + node.module if node.module else "")
                if base.split(".")[0] != "vllm_doctor":
                    continue
                targets = []
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else owner(base))
                    if full not in mods and a.name.startswith("_") and not a.name.startswith("__"):
                        private.append(f"{mod} imports {a.name} from {base}")
            else:
                continue
            graph[mod].update(t for t in targets if t and t != mod)
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_inside_the_package():
    graph, _ = _imports(_modules())
    assert len(graph) > 50 and "vllm_doctor.ingest.envelope" in graph["vllm_doctor.parsers.records"]
    assert _cycles(graph) == []


def test_no_private_name_is_imported_across_modules():
    assert _imports(_modules())[1] == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_diagnose_on_a_log_imports_only_what_it_uses():
    """The CLI's start is paid by every ``vllm-doctor diagnose`` (and by every test that runs the
    command): a log's diagnosis, in text or JSON, imports neither the fleet package (with the
    Prometheus client), nor asyncio (bench ladder), nor jinja2 (the HTML report)."""
    import subprocess
    import sys

    from conftest import log

    code = ("import sys\nfrom vllm_doctor import cli\nsys.argv = ['vllm-doctor', 'diagnose', '--format', 'json', "
            f"'--fail-on', 'never', {str(log('014-'))!r}]\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('MODULES', sorted(m for m in sys.modules if m.split('.')[0] in ('jinja2', 'asyncio', "
            "'prometheus_client') or m.startswith('vllm_doctor.fleet')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert '"findings"' in out.stdout  # the report was written
    assert out.stdout.rsplit("MODULES ", 1)[1].strip() == "[]"
