"""The sidecar's ``--state-file`` as a typed, versioned schema (pydantic): the followed files'
checkpoints and the counters and sticky facts written with them (follow.save_checkpoints).

A file that is valid JSON with a wrong type (a ``lineno`` that is a string, a counter that is
not a number, a negative offset) is not half-used: :func:`check_state_file` tells it at start,
the sidecar says so in one line, moves the file aside (``<path>.bad``) and starts fresh.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, model_validator

log = logging.getLogger(__name__)

STATE_VERSION = 1
_Count = Annotated[int | float, Field(ge=0, allow_inf_nan=False)]


class _Entry(BaseModel):
    """A rotated or finished file: where its reading stopped."""

    model_config = ConfigDict(extra="allow")
    dev: int
    ino: NonNegativeInt
    offset: NonNegativeInt
    tail: str = ""


class FileCheckpoint(BaseModel):
    """One followed path (follow.LogFollower.checkpoint)."""

    model_config = ConfigDict(extra="allow")
    path: str | None = None
    absent: bool = False
    dev: int | None = None
    ino: NonNegativeInt | None = None
    offset: NonNegativeInt | None = None
    tail: str = ""
    rotated: list[_Entry] = Field(default_factory=list)
    done: list[_Entry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _open_file_has_offset(self) -> FileCheckpoint:
        if not self.absent and (self.dev is None or self.ino is None or self.offset is None):
            raise ValueError("a file that is not absent needs dev, ino and offset")
        return self


class SourceCounters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lineno: NonNegativeInt = 0
    parsed: NonNegativeInt = 0


class StateCounters(BaseModel):
    """state.core.State.counters(): counts are numbers >= 0, finite."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    oom_events_total: _Count | None = None
    preemptions_total: _Count | None = None
    preemptions_reported: bool | _Count | None = None
    peak_running: _Count | None = None
    peak_waiting: _Count | None = None
    peak_kv: _Count | None = None
    log_preempt_base: _Count | None = Field(None, alias="_log_preempt_base")
    log_preempt_cum: _Count | None = Field(None, alias="_log_preempt_cum")
    v1_interval_sum: _Count | None = Field(None, alias="_v1_interval_sum")
    metrics_base: _Count | None = Field(None, alias="_metrics_base")
    metrics_last: _Count | None = Field(None, alias="_metrics_last")
    lines_total: dict[str, NonNegativeInt] = Field(default_factory=dict)
    unparsed_total: dict[str, NonNegativeInt] = Field(default_factory=dict)
    last_oom: list | None = Field(None, alias="_last_oom")


class Counters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: StateCounters = Field(default_factory=StateCounters)
    sources: dict[str, SourceCounters] = Field(default_factory=dict)


class StateFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: Literal[1] = STATE_VERSION
    files: dict[str, FileCheckpoint] = Field(default_factory=dict)
    counters: Counters = Field(default_factory=Counters)
    sticky_state: dict = Field(default_factory=dict)


def check_state_file(path: str | os.PathLike[str] | None) -> str | None:
    """None when ``path`` is absent or a valid state file; else the reason in one line, after
    moving the file aside to ``<path>.bad`` (the sidecar then starts fresh, and says so)."""
    if not path or not os.path.exists(path):
        return None
    try:
        StateFile.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
        return None
    except (OSError, ValueError, ValidationError) as exc:
        if isinstance(exc, ValidationError):
            e = exc.errors()[0]
            why = f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
        else:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    bad = f"{path}.bad"
    try:
        os.replace(path, bad)
        kept = f"kept as {bad}"
    except OSError as exc:
        kept = f"could not move it aside: {exc.strerror or exc}"
    return f"state file {path} is not a valid vllm-doctor state ({why[:200]}); starting fresh, {kept}"
