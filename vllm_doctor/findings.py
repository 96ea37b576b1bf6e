"""Findings: the results of rules (never exceptions).

A :class:`Finding` is one rule that fired for this deployment, deduplicated by rule id, with the
first and last time it was seen (log time in ``diagnose``, wall time in ``serve``), its evidence
(source lines) and its fixes (real vLLM flags of the detected version, values computed from
what was observed, the arithmetic shown).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


@dataclass
class Evidence:
    """A cited log line (1-based ``lineno``..``end_lineno`` in ``source``) or sample."""

    source: str
    lineno: int
    text: str
    end_lineno: int | None = None
    ts: float | None = None  # epoch seconds of the line (log time), when it has one


@dataclass
class FlagFix:
    """A concrete change: ``flag`` set to ``value`` (a string as typed on the command line).

    why: the reason; arithmetic: how the value was computed from observed facts."""

    flag: str
    value: str
    why: str
    arithmetic: str | None = None
    kind: str = "flag"  # "flag" (vllm serve --flag value) or "env" (NAME=value)

    def command(self) -> str:
        """As typed: ``--max-num-seqs 31``, ``--enable-chunked-prefill``, ``NCCL_P2P_DISABLE=1``."""
        if self.kind == "env":
            return f"{self.flag}={self.value}"
        return f"{self.flag} {self.value}".rstrip()


@dataclass
class Finding:
    """One rule that fired. ``values`` are the rule's computed evidence values (JSON scalars)."""

    rule_id: str
    name: str
    severity: str
    title: str
    message: str
    evidence: list[Evidence] = field(default_factory=list)
    fixes: list[FlagFix] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    first_seen: float | None = None
    last_seen: float | None = None
    active: bool = True
    occurrences: int = 1
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON form (see docs/json-schema.md)."""
        d = asdict(self)
        return d
