"""Bounds on structured text that comes from outside: YAML (aliases, nesting depth) and PromQL
(size, nesting depth). A 502-byte YAML alias bomb expands to millions of nodes when walked; a
20 KB PromQL expression nested 10,000 deep crashes the parser. Each bound is a setting (an
environment variable) with a documented default; crossing it is :class:`TooComplex`, whose
message is one line naming the bound."""

from __future__ import annotations

import os

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: setting (environment variable) -> default
DEFAULTS = {
    "VLLM_DOCTOR_MAX_YAML_NODES": 1_000_000,  # nodes once every alias is expanded (a 5 MB manifest bundle: ~300k)
    "VLLM_DOCTOR_MAX_YAML_DEPTH": 100,  # nested mappings/sequences
    "VLLM_DOCTOR_MAX_PROMQL_BYTES": 65536,  # one expression
    "VLLM_DOCTOR_MAX_PROMQL_DEPTH": 64,  # nested (), [], {}
}


class TooComplex(ValueError):
    """Input over one of the bounds of this module."""


def limit(name: str) -> int:
    """The bound ``name`` (a key of :data:`DEFAULTS`): the environment's positive integer, else
    the default."""
    raw = os.environ.get(name, "")
    try:
        v = int(raw)
    except ValueError:
        return DEFAULTS[name]
    return v if v > 0 else DEFAULTS[name]


def check_yaml(text: str) -> None:
    """Raise TooComplex when ``text`` holds more nodes, every alias expanded (a 502-byte alias
    bomb: 9^9), or nests deeper than the bounds. Text without an anchor (``&``) holds no alias
    and is only bounded by the loader's own depth limit; a YAML syntax error is left to the
    loader."""
    if "&" not in text:
        return
    max_nodes, max_depth = limit("VLLM_DOCTOR_MAX_YAML_NODES"), limit("VLLM_DOCTOR_MAX_YAML_DEPTH")
    sizes: dict[str, int] = {}  # anchor -> nodes of its node, aliases expanded
    stack: list[list] = []  # open collections: [nodes so far, anchor]
    total = 0

    def grow(n: int) -> None:  # n more nodes in the expanded document
        nonlocal total
        total += n
        if total > max_nodes:
            raise TooComplex(f"YAML of more than {max_nodes} nodes once its aliases are expanded "
                             "(VLLM_DOCTOR_MAX_YAML_NODES): refused, an alias bomb")

    def done(n: int, anchor: str | None) -> None:  # a node of n nodes ends inside the open one
        if anchor:
            sizes[anchor] = n
        if stack:
            stack[-1][0] += n

    try:
        for ev in yaml.parse(text, Loader=_LOADER):
            if isinstance(ev, yaml.ScalarEvent):
                grow(1)
                done(1, ev.anchor)
            elif isinstance(ev, yaml.AliasEvent):
                n = sizes.get(ev.anchor, 1)
                grow(n)
                done(n, None)
            elif isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                grow(1)
                stack.append([1, ev.anchor])
                if len(stack) > max_depth:
                    raise TooComplex(f"YAML nested more than {max_depth} deep (VLLM_DOCTOR_MAX_YAML_DEPTH): refused")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)) and stack:
                done(*stack.pop())
    except yaml.YAMLError:
        return


def check_promql(expr: str) -> None:
    """Raise TooComplex when the PromQL ``expr`` is longer or nests deeper (parentheses, brackets,
    braces outside quoted strings) than the bounds: the parser's time and memory grow with both."""
    max_bytes, max_depth = limit("VLLM_DOCTOR_MAX_PROMQL_BYTES"), limit("VLLM_DOCTOR_MAX_PROMQL_DEPTH")
    n = len(expr.encode("utf-8", "replace"))
    if n > max_bytes:
        raise TooComplex(f"PromQL expression of {n} bytes, over {max_bytes} (VLLM_DOCTOR_MAX_PROMQL_BYTES): refused")
    depth = 0
    quote = ""
    escaped = False
    for c in expr:
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
            if depth > max_depth:
                raise TooComplex(f"PromQL expression nested more than {max_depth} deep "
                                 "(VLLM_DOCTOR_MAX_PROMQL_DEPTH): refused")
        elif c in ")]}":
            depth -= 1
