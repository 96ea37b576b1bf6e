"""Findings: the results of rules (never exceptions).

A :class:`Finding` is one rule that fired for this deployment, deduplicated by rule id, with the
first and last time it was seen (log time in ``diagnose``, wall time in ``serve``), its evidence
(source lines) and its fixes (real vLLM flags of the detected version, values computed from
what was observed, the arithmetic shown).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Severity(StrEnum):
    """How bad a finding (or a rule, an alert) is, least first: the one order of severities.

    A member is its string (``Severity.warning == "warning"``, JSON and labels write ``warning``);
    members are named as their values, so a member and its string are the same dictionary key."""

    info = "info"
    warning = "warning"
    critical = "critical"

    @property
    def rank(self) -> int:
        """0 for info, 1 for warning, 2 for critical."""
        return SEVERITY_ORDER[self.value]


#: Severity name -> rank (higher is worse), in :class:`Severity`'s order.
SEVERITY_ORDER = {s.value: i for i, s in enumerate(Severity)}


#: SARIF's level of each severity (`vllm-doctor check`'s findings: error, warning, note): the one mapping
SARIF_LEVELS: dict[Severity, str] = {Severity.info: "note", Severity.warning: "warning", Severity.critical: "error"}


def severity_rank(severity: str) -> int:
    """The rank of a severity given as a member or its string (``"critical"`` -> 2)."""
    return SEVERITY_ORDER[severity]


def by_severity(f: Finding) -> tuple[int, str]:
    """Sort key: the most severe first, then by rule id."""
    return -SEVERITY_ORDER[f.severity], f.rule_id
#: How the harm a fix removes is known, strongest first: ``counted`` (vLLM's own counter or error
#: line shows it), ``inferred`` (read from a pattern of samples), ``assumed`` (rests on what the
#: inputs do not show: a version default, a worst case).
GRADES = ("counted", "inferred", "assumed")


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

    why: the reason; arithmetic: how the value was computed from observed facts.
    option / relation (vllm_doctor.diagnosis.advice.relate_fixes): fixes of one finding with the same
    ``option`` number go together; different options are alternatives. ``relation`` says it in a
    word: ``only`` | ``alternative`` (pick one option) | ``set`` (apply with the rest of its option).
    also_for: names of other findings that give the same fix (it is listed once, here).
    kind ``upgrade``: install vLLM ``value`` (``>=0.11.0``) first; the fixes of its option need it.
    grade: the evidence behind it, one of :data:`GRADES`."""

    flag: str
    value: str
    why: str
    arithmetic: str | None = None
    kind: str = "flag"  # "flag" (vllm serve --flag value), "env" (NAME=value) or "upgrade" (vllm>=X)
    option: int = 1
    relation: str = "only"
    also_for: list[str] = field(default_factory=list)
    grade: str = "inferred"

    def command(self) -> str:
        """As typed: ``--max-num-seqs 31``, ``--enable-chunked-prefill``, ``NCCL_P2P_DISABLE=1``,
        ``pip install -U 'vllm>=0.11.0'``."""
        if self.kind == "env":
            return f"{self.flag}={self.value}"
        if self.kind == "upgrade":
            return f"pip install -U '{self.flag}{self.value}'"
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
    occurrences: int = 1  # occurrences of this rule so far (this one is number ``occurrence``)
    occurrence: int = 1  # 1-based: the rule stopped firing, or the engine restarted, between two
    run: int = 0  # engine run (0 = the first in the log; a version banner / engine start begins the next)
    notes: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # diagnostic steps to confirm the cause (not fixes)
    checks_first: bool = False  # the first check comes before any fix (stop what holds the GPU)
    # not enough evidence to act on: the one thing to collect that would decide (None: enough)
    collect: str | None = None

    def to_dict(self) -> dict:
        """JSON form (see docs/json-schema.md)."""
        d = asdict(self)
        return d
