"""The sidecar's ``--state-file`` as a typed, versioned schema (pydantic): the followed files'
checkpoints and the pipeline's snapshot written with them (follow.save_checkpoints,
:class:`~vllm_doctor.state.snapshot.PipelineSnapshot`).

Its ``version`` is read first. Version 2 (:data:`STATE_VERSION`) is read as is; version 1 (the
counters and sticky facts by State attribute name, ``counters`` and ``sticky_state``, written up to
0.x of this tool) is migrated to it (:func:`migrate_v1`). Any other version, and a file that is
valid JSON with a wrong type (a ``lineno`` that is a string, a counter that is not a number, a
negative offset), is not half-used: :func:`read_state_file` tells it at start, the sidecar says so
in one line, moves the file aside (``<path>.bad``) and starts fresh.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, model_validator

from vllm_doctor.state.snapshot import PipelineSnapshot, SourceCounters, StateSnapshot

log = logging.getLogger(__name__)

#: The version this tool writes; :data:`READS` the versions it reads (older ones migrated).
STATE_VERSION: Literal[2] = 2
READS = (1, 2)
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


class StateCountersV1(BaseModel):
    """Version 1's ``counters.state``: State attributes by name; counts are numbers >= 0, finite."""

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


class CountersV1(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: StateCountersV1 = Field(default_factory=lambda: StateCountersV1.model_validate({}))
    sources: dict[str, SourceCounters] = Field(default_factory=dict)


class StateFileV1(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: Literal[1] = 1
    files: dict[str, FileCheckpoint] = Field(default_factory=dict)
    counters: CountersV1 = Field(default_factory=CountersV1)
    sticky_state: dict = Field(default_factory=dict)


class StateFile(BaseModel):
    """Version 2: the followed files' checkpoints and the pipeline's typed snapshot."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[2] = STATE_VERSION
    files: dict[str, FileCheckpoint] = Field(default_factory=dict)
    state: StateSnapshot = Field(default_factory=StateSnapshot)
    sources: dict[str, SourceCounters] = Field(default_factory=dict)

    @property
    def snapshot(self) -> PipelineSnapshot:
        return PipelineSnapshot(state=self.state, sources=self.sources)


def migrate_v1(old: StateFileV1) -> StateFile:
    """A version-1 file as version 2: its counters (by State attribute name, ``_log_preempt_base``)
    and sticky facts become the typed snapshot's fields; values it left null keep their default.
    Raises ValidationError when a sticky fact has the wrong type."""
    fields = StateSnapshot.model_fields
    # by field name (no leading underscore); a counter left null keeps its default
    counters = {k: v for k, v in old.counters.state.model_dump(exclude_none=True).items() if k in fields}
    if "preemptions_reported" in counters:
        counters["preemptions_reported"] = bool(counters["preemptions_reported"])
    sticky = {k: v for k, v in old.sticky_state.items() if v is not None and k in fields}
    state = StateSnapshot.model_validate(sticky | counters)
    return StateFile(files=old.files, state=state, sources=old.counters.sources)


def parse_state(data: object) -> StateFile:
    """A state file's JSON as version 2, by its ``version``. Raises ValueError (one line) for a
    version this tool does not read, ValidationError for a wrong field."""
    version = data.get("version") if isinstance(data, dict) else None
    if version == STATE_VERSION:
        return StateFile.model_validate(data)
    if version == 1:
        return migrate_v1(StateFileV1.model_validate(data))
    newer = isinstance(version, int) and not isinstance(version, bool) and version > STATE_VERSION
    raise ValueError(f"version {version!r}: " + ("written by a newer vllm-doctor; " if newer else "")
                     + f"this one reads versions {READS[0]}-{READS[-1]}")


def read_state_file(path: str | os.PathLike[str] | None) -> tuple[StateFile | None, str | None]:
    """(the state, None) when ``path`` is a state file this tool reads (version 1 migrated);
    (None, None) when it is absent; else (None, the reason in one line), after moving the file
    aside to ``<path>.bad`` (the sidecar then starts fresh, and says so)."""
    if not path or not os.path.exists(path):
        return None, None
    try:
        return parse_state(json.loads(Path(path).read_text(encoding="utf-8"))), None
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
    return None, f"state file {path} is not a valid vllm-doctor state ({why[:200]}); starting fresh, {kept}"


def check_state_file(path: str | os.PathLike[str] | None) -> str | None:
    """None when ``path`` is absent or a state file this tool reads; else the reason in one line
    (the file moved aside, see :func:`read_state_file`)."""
    return read_state_file(path)[1]
