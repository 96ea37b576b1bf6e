"""Add the releases that cannot be imported (0.2 ... 0.25) to vllm_doctor/data/vllm_flag_values.json,
read STATICALLY with Python's ``ast`` from each wheel's ``vllm/`` sources (nothing of vLLM is executed).

Usage: ``python tools/extract_flag_values_ast.py DIR VERSION`` where DIR holds the ``vllm/`` package of
that release (``unzip vllm-X-*.whl 'vllm/*.py' -d DIR``); ``--dry-run`` prints instead of writing.

Read per ``add_argument`` call of ``vllm/engine/arg_utils.py`` and ``vllm/entrypoints/openai/cli_args.py``
(``api_server.py`` for 0.2.x/0.3.x):
- the option strings; ``action`` (store_true/store_false/BooleanOptionalAction flags take no value:
  left out); ``nargs`` other than ``?`` left out;
- ``type=``: ``int``, ``float``, and vLLM's helpers by name: ``nullable_str`` (str or None),
  ``optional_int`` / ``optional_type(int)`` / ``optional_float`` (None accepted), ``human_readable_int``
  (``32k``), ``human_readable_int_or_auto``; any other callable (``json.loads``, lambdas, ...) is not judged;
- ``choices=``: a literal list, or a name resolved statically (a module-level constant, the keys of a
  module-level dict, ``get_args`` of a ``Literal`` alias, ``[m.value for m in SomeEnum]``); choices
  computed at runtime (a registry, a function call) are recorded as unknown (``"choices": null``) and
  never judged;
- ``**xxx_kwargs["field"]`` (0.8+, built from config dataclasses by ``get_kwargs``): the field's
  annotation in the config class, with ``get_kwargs``'s rules: ``bool`` -> no value; a pure
  ``Literal[...]`` -> choices (a ``Literal`` together with ``str`` gives no choices, as vLLM uses
  ``metavar`` then); ``int`` -> int, or human_int for the field names ``get_kwargs`` itself names next to
  ``human_readable_int``; ``float``; ``None`` in the union -> None accepted; a dataclass, dict,
  list or unknown class -> not judged.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

DEST = Path(__file__).resolve().parents[1] / "vllm_doctor" / "data" / "vllm_flag_values.json"


class Unknown(Exception):
    pass


class Src:
    """The ``vllm/`` modules of one release, parsed on demand."""

    def __init__(self, root: Path):
        self.root = root
        self._mods: dict[str, ast.Module | None] = {}

    def module(self, dotted: str) -> ast.Module | None:
        if dotted not in self._mods:
            p = self.root.joinpath(*dotted.split("."))
            f = p.with_suffix(".py") if p.with_suffix(".py").is_file() else p / "__init__.py"
            self._mods[dotted] = ast.parse(f.read_text()) if f.is_file() else None
        return self._mods[dotted]

    def lookup(self, mod: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, the node defining ``name`` there): an assignment's value, a class, following imports."""
        tree = self.module(mod)
        if tree is None or depth > 6:
            return None
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return mod, node.value
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                    and node.value is not None:
                return mod, node.value
            if isinstance(node, ast.ClassDef) and node.name == name:
                return mod, node
            if getattr(ast, "TypeAlias", None) and isinstance(node, getattr(ast, "TypeAlias")) and node.name.id == name:
                return mod, node.value
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    if (a.asname or a.name) == name:
                        return self.lookup(node.module, a.name, depth + 1)
        return None


def _enum_values(src: Src, mod: str, cls: ast.ClassDef) -> list:
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases}
    if not any("Enum" in b for b in bases):
        raise Unknown(cls.name)
    out = []
    for n in cls.body:
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
            out.append(evaluate(src, mod, n.value))
    return out


def evaluate(src: Src, mod: str, node: ast.AST):
    """A value built of literals and module-level names; Unknown when it needs running code."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                out.extend(evaluate(src, mod, e.value))
            else:
                out.append(evaluate(src, mod, e))
        return out
    if isinstance(node, ast.Dict):
        return {evaluate(src, mod, k): None for k in node.keys if k is not None}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return list(evaluate(src, mod, node.left)) + list(evaluate(src, mod, node.right))
    if isinstance(node, ast.Name):
        hit = src.lookup(mod, node.id)
        if hit is None:
            raise Unknown(node.id)
        m, val = hit
        if isinstance(val, ast.ClassDef):
            return _enum_values(src, m, val)
        return evaluate(src, m, val)
    if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
        sl = node.slice
        elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        return _flat([evaluate(src, mod, e) for e in elts])
    if isinstance(node, ast.Call):
        fn = _name(node.func)
        if fn in ("list", "tuple", "sorted", "set", "get_args") and len(node.args) == 1:
            v = evaluate(src, mod, node.args[0])
            return list(v)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "keys" and not node.args:
            return list(evaluate(src, mod, node.func.value))
        raise Unknown(ast.unparse(node))
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        g = node.generators[0]
        if isinstance(g.target, ast.Name) and not g.ifs:
            items = evaluate(src, mod, g.iter)
            e = node.elt
            if isinstance(e, ast.Name) and e.id == g.target.id:
                return list(items)
            if isinstance(e, ast.Attribute) and e.attr == "value" and _name(e.value) == g.target.id:
                return list(items)          # an Enum iterated: its members' values
    raise Unknown(ast.unparse(node))


def _flat(vals: list) -> list:
    """Literal[Literal["a", "b"], "c"] -> ["a", "b", "c"]."""
    out = []
    for v in vals:
        out.extend(_flat(v) if isinstance(v, list) else [v])
    return out


def _sorted_choices(vals) -> list[str]:
    """Choices as strings (what a command line holds), integers in numeric order first."""
    vals = set(vals)
    return [str(v) for v in sorted((v for v in vals if isinstance(v, int)))] + \
        sorted(str(v) for v in vals if not isinstance(v, int))


def _name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


# type= callables by name -> (kind, None accepted, auto accepted); anything else is not judged
TYPES = {
    "int": ("int", False, False), "float": ("float", False, False),
    "optional_int": ("int", True, False), "optional_float": ("float", True, False),
    "human_readable_int": ("human_int", False, False), "human_readable_int_or_auto": ("human_int", False, True),
}


def type_kind(node: ast.AST) -> tuple[str, bool, bool] | None:
    n = _name(node)
    if n in TYPES:
        return TYPES[n]
    if isinstance(node, ast.Call) and _name(node.func) == "optional_type" and node.args:
        inner = type_kind(node.args[0])
        return (inner[0], True, inner[2]) if inner else None
    return None


# ---- get_kwargs: a config dataclass field's annotation -> argparse kwargs ------------------------

def _atoms(src: Src, mod: str, node: ast.AST, depth: int = 0) -> list:
    """The union members of an annotation: 'int', 'float', 'str', 'bool', None, ('lit', values),
    ('coll',), ('other', name)."""
    if depth > 8:
        return [("other", "?")]
    if isinstance(node, ast.Constant) and node.value is None:
        return [None]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):     # a string annotation
        return _atoms(src, mod, ast.parse(node.value, mode="eval").body, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _atoms(src, mod, node.left, depth + 1) + _atoms(src, mod, node.right, depth + 1)
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        sl = node.slice
        elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        if head == "Literal":
            return [("lit", _flat([evaluate(src, mod, e) for e in elts]))]
        if head == "Optional":
            return _atoms(src, mod, elts[0], depth + 1) + [None]
        if head == "Union":
            return [a for e in elts for a in _atoms(src, mod, e, depth + 1)]
        if head in ("Annotated", "SkipValidation"):
            return _atoms(src, mod, elts[0], depth + 1)
        if head in ("list", "List", "tuple", "Tuple", "set", "Set", "dict", "Dict", "type", "Type", "Callable"):
            return [("coll",)]
        return [("other", head)]
    n = _name(node)
    if n in ("int", "float", "str", "bool"):
        return [n]
    if n in ("dict", "list", "tuple", "set", "Any"):
        return [("coll",)]
    if isinstance(node, ast.Name):
        hit = src.lookup(mod, n)
        if hit and not isinstance(hit[1], ast.ClassDef):
            return _atoms(src, hit[0], hit[1], depth + 1)
    return [("other", n)]


def _config_class(src: Src, mod: str, cls_name: str) -> tuple[str, ast.ClassDef] | None:
    hit = src.lookup(mod, cls_name)
    if hit and isinstance(hit[1], ast.ClassDef):
        return hit[0], hit[1]
    return None


def _field_annotation(src: Src, mod: str, cls: ast.ClassDef, field: str):
    for n in cls.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == field:
            return n.annotation
    for b in cls.bases:                      # a field inherited from a base config class
        hit = _config_class(src, mod, _name(b) or "")
        if hit:
            ann = _field_annotation(src, hit[0], hit[1], field)
            if ann is not None:
                return mod, ann
    return None


def human_fields(src: Src, mod: str) -> dict[str, tuple[str, bool, bool]]:
    """Field names that get_kwargs / _compute_kwargs of this release gives ``human_readable_int*``."""
    out: dict[str, tuple[str, bool, bool]] = {}
    tree = src.module(mod)
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name in ("get_kwargs", "_compute_kwargs")):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and _name(node.test.left) == "name"):
                continue
            names = []
            for c in node.test.comparators:
                if isinstance(c, ast.Name):          # a set assigned in the function itself
                    c = next((a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                              and any(_name(t) == c.id for t in a.targets)), c)
                try:
                    v = evaluate(src, mod, c)
                except Unknown:
                    continue
                names += v if isinstance(v, list) else [v]
            for st in node.body:
                if isinstance(st, ast.Assign):
                    k = type_kind(st.value)
                    if k and k[0] == "human_int":
                        for nm in names:
                            out[nm] = k
    return out


def _maybe_dataclass(src: Src, mod: str, name: str | None) -> bool:
    """Whether a class named in an annotation may be a dataclass (unresolvable names count as may;
    attributes such as ``torch.dtype`` are not vLLM's config classes)."""
    if name is None:
        return True
    hit = src.lookup(mod, name)
    if hit is None:
        return name[:1].isupper() and name not in ("Any",)
    if not isinstance(hit[1], ast.ClassDef):
        return True
    return bool(hit[1].decorator_list) or any("Config" in (_name(b) or "") for b in hit[1].bases)


def from_dataclass(src: Src, mod: str, cls_name: str, field: str, humans: dict) -> dict | None:
    hit = _config_class(src, mod, cls_name)
    if hit is None:
        raise Unknown(cls_name)
    res = _field_annotation(src, hit[0], hit[1], field)
    if res is None:
        raise Unknown(f"{cls_name}.{field}")
    fmod, ann = (res if isinstance(res, tuple) else (hit[0], res))
    atoms = _atoms(src, fmod, ann)
    none = None in atoms
    kinds = [a for a in atoms if a is not None]
    others = [a[1] for a in kinds if isinstance(a, tuple) and a[0] == "other"]
    if any(_maybe_dataclass(src, fmod, o) for o in others):
        return None                           # parsed as JSON of a config dataclass
    if "bool" in kinds:
        return {"action": True}
    lits = [v for a in kinds if isinstance(a, tuple) and a[0] == "lit" for v in a[1]]
    if lits:
        if "str" in kinds:
            return None                       # metavar, any string accepted
        d = {"choices": _sorted_choices(set(lits) | ({"None"} if none else set()))}
        if all(isinstance(v, int) for v in lits):
            d.update(type="int", none=none, auto=False)
        return d
    if any(isinstance(a, tuple) and a[0] == "coll" for a in kinds):
        return None
    if "int" in kinds:
        k = humans.get(field, ("int", False, False))
        return {"type": k[0], "none": none, "auto": k[2]}
    if "float" in kinds:
        return {"type": "float", "none": none, "auto": False}
    return None


# ---- add_argument calls --------------------------------------------------------------------------

def _kwargs_sources(func: ast.FunctionDef) -> dict[str, str]:
    """``model_kwargs = get_kwargs(ModelConfig)`` in a function -> {'model_kwargs': 'ModelConfig'}."""
    out = {}
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _name(n.value.func) == "get_kwargs" \
                and n.value.args and isinstance(n.targets[0], ast.Name):
            out[n.targets[0].id] = _name(n.value.args[0])
    return out


def _kw_ref(node) -> tuple[str, str] | None:
    """``model_kwargs["dtype"]`` -> ("model_kwargs", "dtype")."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant):
        return node.value.id, node.slice.value
    return None


def _mutations(func) -> dict[tuple[str, str], list]:
    """Edits a function makes to get_kwargs' result before add_argument: ``kw["f"]["choices"].remove("x")``,
    ``kw["f"]["type"] = ...``: (var, field) -> [(key, op, node)]."""
    out: dict[tuple[str, str], list] = {}
    for n in ast.walk(func):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Subscript):
            tgt = n.func.value                                   # kw["f"]["choices"].remove(...)
            ref = _kw_ref(tgt.value)
            if ref and isinstance(tgt.slice, ast.Constant):
                out.setdefault(ref, []).append((tgt.slice.value, n.func.attr, n.args))
        if isinstance(n, ast.Assign):
            for t in n.targets:                                  # kw["f"]["type"] = ...
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and _kw_ref(t.value):
                    out.setdefault(_kw_ref(t.value), []).append((t.slice.value, "=", [n.value]))
    return out


def _apply(spec: dict, edits: list, src: Src, mod: str) -> dict:
    for key, op, args in edits:
        if key not in ("choices", "type", "action", "nargs"):
            continue
        try:
            vals = [evaluate(src, mod, a) for a in args]
        except Unknown:
            vals = None
        if key == "choices" and op in ("remove", "append", "extend") and vals is not None and spec.get("choices"):
            ch = list(spec["choices"])
            for v in (vals[0] if op == "extend" else vals):
                if op == "remove":
                    ch = [c for c in ch if c != str(v)]
                else:
                    ch.append(str(v))
            spec["choices"] = ch
        elif key == "choices" and op == "=" and vals is not None:
            spec["choices"] = _sorted_choices(vals[0])
        elif key == "choices":
            spec["choices"] = None                               # changed at runtime: unknown
        elif key == "type" and op == "=":
            k = type_kind(args[0])
            spec.pop("type", None), spec.pop("none", None), spec.pop("auto", None)
            if k:
                spec.update(type=k[0], none=k[1], auto=k[2])
            elif _name(args[0]) not in ("str", "nullable_str"):
                spec.pop("choices", None)                        # a converter: not judged at all
                spec["not_judged"] = True
        else:
            spec["not_judged"] = True
    return spec


def read_calls(src: Src, mod: str, flags: dict, stats: dict) -> None:
    tree = src.module(mod)
    if tree is None:
        return
    humans = human_fields(src, "vllm.engine.arg_utils") if src.module("vllm.engine.arg_utils") else {}
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        kw_src = _kwargs_sources(func)
        edits = _mutations(func)
        for call in ast.walk(func):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "add_argument"):
                continue
            opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            opts = [o for o in opts if o.startswith("--")]
            if not opts:
                continue
            kws = {k.arg: k.value for k in call.keywords if k.arg}
            spec: dict | None = {}
            for k in call.keywords:
                if k.arg is None:                     # **model_kwargs["dtype"]
                    v = k.value
                    if isinstance(v, ast.Dict) and None in v.keys:     # **{**x_kwargs["f"], "default": ...}
                        for kk, vv in zip(v.keys, v.values):
                            if kk is None:
                                v = vv
                            elif isinstance(kk, ast.Constant) and kk.value in ("type", "choices", "action", "nargs"):
                                kws[kk.value] = vv
                    if isinstance(v, ast.Subscript) and _name(v.value) in kw_src \
                            and isinstance(v.slice, ast.Constant):
                        try:
                            spec = from_dataclass(src, mod, kw_src[_name(v.value)], v.slice.value, humans)
                        except Unknown:
                            spec = None
                        if spec is not None and _kw_ref(v) in edits:
                            spec = _apply(spec, edits[_kw_ref(v)], src, mod)
                            if spec.pop("not_judged", False):
                                spec = None
                    else:
                        spec = None
            stats["calls"] += 1
            if spec is None:
                stats["not_judged"] += 1
                continue
            if spec.get("action") or "action" in kws and _name(kws["action"]) != "store" \
                    and not (isinstance(kws["action"], ast.Constant) and kws["action"].value == "store"):
                continue
            nargs = kws.get("nargs")
            if nargs is not None and not (isinstance(nargs, ast.Constant) and nargs.value == "?"):
                continue
            if "type" in kws:
                k = type_kind(kws["type"])
                spec.pop("type", None)
                if k:
                    spec.update(type=k[0], none=k[1], auto=k[2])
                elif _name(kws["type"]) in ("str", "nullable_str"):
                    spec.pop("none", None), spec.pop("auto", None)
                else:
                    spec = {}                         # json.loads, bool, a lambda: not judged
            if "choices" in kws:
                try:
                    ch = evaluate(src, mod, kws["choices"])
                    spec["choices"] = _sorted_choices(ch)
                except (Unknown, TypeError):
                    spec["choices"] = None            # computed at runtime: unknown, never judged
                    stats["choices_unknown"] += 1
            if "type" not in spec:
                spec.pop("none", None), spec.pop("auto", None)
            if spec:
                for o in opts:
                    flags[o] = spec


def extract(root: Path) -> tuple[dict, dict]:
    src = Src(root)
    flags: dict = {}
    stats = {"calls": 0, "not_judged": 0, "choices_unknown": 0}
    for mod in ("vllm.engine.arg_utils", "vllm.entrypoints.openai.cli_args", "vllm.entrypoints.openai.api_server"):
        read_calls(src, mod, flags, stats)
    return dict(sorted(flags.items())), stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", help="a folder holding the release's vllm/ package")
    ap.add_argument("version")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    flags, stats = extract(Path(a.dir))
    print(f"vLLM {a.version}: {len(flags)} flags judged; {stats}", file=sys.stderr)
    if a.dry_run:
        print(json.dumps(flags, indent=1))
        return
    out = json.loads(DEST.read_text())
    key = ".".join(a.version.split(".")[:3])            # 0.6.6.post1 -> 0.6.6
    if out.get("how", {}).get(key) == "argparse":
        raise SystemExit(f"{key} is already read from vLLM's own argparse")
    out["versions"][key] = flags
    out.setdefault("how", {})[key] = "ast"
    out.setdefault("wheel", {})[key] = a.version
    out["versions"] = dict(sorted(out["versions"].items(), key=lambda kv: [int(x) for x in kv[0].split(".")[:3]]))
    out["how"] = dict(sorted(out["how"].items(), key=lambda kv: [int(x) for x in kv[0].split(".")[:3]]))
    out["wheel"] = dict(sorted(out["wheel"].items(), key=lambda kv: [int(x) for x in kv[0].split(".")[:3]]))
    DEST.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
