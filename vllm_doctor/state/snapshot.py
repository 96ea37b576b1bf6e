"""The typed part of :class:`~vllm_doctor.state.core.State` that a checkpoint saves.

A sidecar checkpoints it together with the log offsets it corresponds to (``--state-file``,
:mod:`vllm_doctor.ingest.statefile`), so a restart (a ``kill -9`` included) neither loses nor
double-counts an event. Two parts:

* **sticky facts**: what vLLM prints only at start-up (configuration, KV cache capacity, memory
  budget, version, engine, unknown flags) and whether the engine run served: a restarted sidecar
  resumes after those lines and must still know them;
* **counters**: the monotonic counters the sidecar exports (preemptions, OOMs, lines) and what
  they are computed from, plus the peaks.

Everything else a State holds is volatile (series, windows, kept events: refilled by the data
that follows), declared in :data:`vllm_doctor.state.core.VOLATILE`; a test checks that every
State attribute is one or the other.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, StrictBool, StrictFloat, StrictInt, model_validator

#: A configuration, capacity or memory value as vLLM logged it (a Python scalar).
Scalar = StrictBool | StrictInt | StrictFloat | str | None
_Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class StateSnapshot(BaseModel):
    """What :meth:`State.snapshot` saves and :meth:`State.restore` puts back."""

    model_config = ConfigDict(extra="forbid")
    # sticky facts
    config: dict[str, tuple[int, Scalar]] = Field(default_factory=dict)  # name -> (priority, value)
    capacity: dict[str, Scalar] = Field(default_factory=dict)
    memory: dict[str, Scalar] = Field(default_factory=dict)
    vllm_version: str | None = None
    version_source: Annotated[str, Field(pattern="^(banner|fingerprint)$")] | None = None
    engine: Annotated[str, Field(pattern="^v[01]$")] | None = None
    unknown_flags: dict[str, str | None] = Field(default_factory=dict)
    served: bool = False
    # counters (and what the unified preemption counter is computed from)
    oom_events_total: NonNegativeInt = 0
    last_oom: tuple[float | None, int] | None = None  # (ts, lineno) of the last OOM line
    log_preempt_base: NonNegativeInt = 0
    log_preempt_cum: NonNegativeInt = 0
    v1_interval_sum: NonNegativeInt = 0
    metrics_base: _Amount = 0.0
    metrics_last: _Amount | None = None
    preemptions_total: NonNegativeInt = 0
    preemptions_reported: bool = False
    peak_running: NonNegativeInt | None = None
    peak_waiting: NonNegativeInt | None = None
    peak_kv: _Amount | None = None
    lines_total: dict[str, NonNegativeInt] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _drop_unparsed_total(cls, data: object) -> object:
        """Version-2 files written before State lost ``unparsed_total`` (never written: always
        ``{}``; the unparsed lines are the pipeline's, from ``sources``) are read without it."""
        if isinstance(data, dict) and "unparsed_total" in data:
            data = {k: v for k, v in data.items() if k != "unparsed_total"}
        return data


class SourceCounters(BaseModel):
    """One log source's line number and count of lines that gave an event (the pipeline's)."""

    model_config = ConfigDict(extra="forbid")
    lineno: NonNegativeInt = 0
    parsed: NonNegativeInt = 0


class PipelineSnapshot(BaseModel):
    """:meth:`Pipeline.snapshot`: the state's snapshot and each log source's counters."""

    model_config = ConfigDict(extra="forbid")
    state: StateSnapshot = Field(default_factory=StateSnapshot)
    sources: dict[str, SourceCounters] = Field(default_factory=dict)
