"""One small scanner shared by the parsers (``args: Namespace(a=1, b='x, y')``) and the rule
templates (``{expr:spec}``): where a character stands outside quotes and brackets."""

from __future__ import annotations

from collections.abc import Iterator


def top_level(text: str, char: str) -> Iterator[int]:
    """Indexes of ``char`` in ``text`` that are outside quotes ('...', "...", backslash escapes
    honoured) and outside (), [] and {}."""
    depth = 0
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == char and depth == 0:
            yield i
