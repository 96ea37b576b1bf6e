"""The sidecar's checkpoint: a typed, versioned snapshot of the State (state/snapshot.py) and of the
pipeline's sources, in a state file whose version is read (ingest/statefile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_doctor.diagnosis.loader import load_rules
from vllm_doctor.ingest.statefile import StateFile, parse_state, read_state_file
from vllm_doctor.pipeline import Pipeline
from vllm_doctor.state.core import SAVED, VOLATILE, State
from vllm_doctor.state.snapshot import StateSnapshot

LOGS = Path(__file__).parent / "fixtures" / "logs"
V0_STORM = LOGS / "014-v0.5.0-chunked-prefill-swap-preemption-storm-tqdm.log"
V1_CPU = LOGS / "cpu-preemption-tiny-kv-cache.log"
V0_OOM = LOGS / "006-v0.7dev-mp-worker-cuda-oom-14GiB-gpu.log"


def _attr(field: str) -> str:
    """The State attribute behind a snapshot field (``log_preempt_base`` -> ``_log_preempt_base``)."""
    return field if hasattr(State(), field) else "_" + field


def test_every_state_attribute_is_saved_or_declared_volatile():
    attrs = set(vars(State()))
    undecided = attrs - SAVED - set(VOLATILE)
    assert not undecided, f"State attributes neither saved nor declared volatile: {sorted(undecided)}"
    assert not SAVED & set(VOLATILE)
    assert SAVED | set(VOLATILE) == attrs, sorted((SAVED | set(VOLATILE)) - attrs)  # nothing stale declared
    assert {_attr(f) for f in StateSnapshot.model_fields} == SAVED  # the schema is what SAVED says


def _fed(*logs: Path) -> Pipeline:
    p = Pipeline(load_rules(), follow=True, base_year=2025)
    for log in logs:
        p.feed(log.name, log.read_bytes())
        p.end(log.name)
    return p


def test_a_snapshot_through_the_state_file_restores_every_saved_attribute():
    old = _fed(V0_STORM, V0_OOM, V1_CPU)
    st = old.state
    # values the real logs leave at their default are set, so that each saved attribute is proven
    fresh = State()
    for name, value in {"_metrics_base": 40.0, "_metrics_last": 12.0, "unknown_flags": {"--kv-cache": None},
                        "_v1_interval_sum": 5, "_log_preempt_base": 9, "_log_preempt_cum": 2}.items():
        if getattr(st, name) == getattr(fresh, name):
            setattr(st, name, value)
    unchanged = [a for a in SAVED if getattr(st, a) == getattr(fresh, a)]
    assert not unchanged, unchanged
    assert st.oom_events_total == 1 and st.vllm_version == "0.32.0" and st.capacity["kv_cache_tokens"] == 4096

    text = json.dumps({"version": 2, "files": {}, **old.snapshot().model_dump(mode="json")})
    new = Pipeline(load_rules(), follow=True, base_year=2025)
    new.restore(parse_state(json.loads(text)).snapshot)
    for a in sorted(SAVED):
        assert getattr(new.state, a) == getattr(st, a), a
    assert new.state.facts()["max_num_seqs"] == st.facts()["max_num_seqs"]
    # line numbers continue where they stopped (the evidence of a resumed sidecar cites the right line)
    assert {n: c.lineno for n, c in new._sources.items()} == dict(st.lines_total)
    assert st.lines_total[V1_CPU.name] == 235


V1_FILE = {
    "version": 1,
    "files": {"/var/log/vllm.log": {"path": "/var/log/vllm.log", "dev": 64768, "ino": 1234, "offset": 5120,
                                    "tail": "", "rotated": [], "done": []}},
    "counters": {"state": {"oom_events_total": 2, "_log_preempt_base": 4, "_log_preempt_cum": 7,
                           "_v1_interval_sum": 0, "_metrics_base": 0.0, "_metrics_last": None,
                           "preemptions_total": 11, "preemptions_reported": True, "peak_running": 35,
                           "peak_waiting": 115, "peak_kv": 0.99, "lines_total": {"/var/log/vllm.log": 80},
                           "unparsed_total": {}, "_last_oom": [1733000000.0, 61]},
                 "sources": {"/var/log/vllm.log": {"lineno": 80, "parsed": 12}}},
    "sticky_state": {"config": {"max_num_seqs": [5, 256], "gpu_memory_utilization": [4, 0.9]},
                     "capacity": {"num_gpu_blocks": 2048}, "memory": {}, "vllm_version": "0.5.4",
                     "version_source": "banner", "engine": "v0", "unknown_flags": {}, "served": True},
}


def test_a_version_1_state_file_is_migrated_and_resumes_its_counters_and_facts(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(V1_FILE))
    saved, error = read_state_file(path)
    assert error is None and isinstance(saved, StateFile) and saved.version == 2
    assert saved.files["/var/log/vllm.log"].offset == 5120
    p = Pipeline(load_rules(), follow=True, base_year=2025)
    p.restore(saved.snapshot)
    st = p.state
    assert (st.preemptions_total, st._log_preempt_base, st._log_preempt_cum, st.oom_events_total) == (11, 4, 7, 2)
    assert st._last_oom == (1733000000.0, 61) and st.peak_kv == 0.99 and st.served is True
    assert st.facts()["max_num_seqs"] == 256 and st.facts()["num_gpu_blocks"] == 2048
    assert (st.vllm_version, st.engine) == ("0.5.4", "v0")
    assert p._sources["/var/log/vllm.log"].lineno == 80 and p._parsed["/var/log/vllm.log"] == 12
    assert list(st.preemption_timeline) == [(None, 11)]  # the base of the preemption windows


@pytest.mark.parametrize("version, why", [
    (3, "version 3: written by a newer vllm-doctor; this one reads versions 1-2"),
    ("2", "version '2': this one reads versions 1-2"),
    (None, "version None: this one reads versions 1-2"),
])
def test_a_state_file_of_a_version_this_tool_does_not_read_is_refused_in_one_line(tmp_path, version, why):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({**V1_FILE, "version": version}))
    saved, error = read_state_file(path)
    assert saved is None
    assert error == (f"state file {path} is not a valid vllm-doctor state ({why}); starting fresh, "
                     f"kept as {path}.bad")
    assert not path.exists() and (tmp_path / "state.json.bad").exists()


def test_a_version_2_file_with_a_wrong_type_is_refused(tmp_path):
    path = tmp_path / "state.json"
    bad = {"version": 2, "files": {}, "state": {"engine": "v7"}, "sources": {}}
    path.write_text(json.dumps(bad))
    saved, error = read_state_file(path)
    assert saved is None and error is not None and "(state.engine: String should match pattern '^v[01]$')" in error


def test_unparsed_lines_are_the_pipelines_and_resume_from_its_source_counters(tmp_path):
    """State keeps no unparsed count of its own (the one it had was never written): the lines that
    gave no event are Pipeline.unparsed, lines counted less lines parsed, both checkpointed."""
    assert not hasattr(State(), "unparsed_total") and "unparsed_total" not in StateSnapshot.model_fields
    old = _fed(V1_CPU)
    assert old.state.lines_total[V1_CPU.name] == 235 and old.unparsed(V1_CPU.name) == 235 - old._parsed[V1_CPU.name]
    assert 0 < old.unparsed(V1_CPU.name) < 235
    # a version-2 file written while State still had the (always empty) field is read, the field dropped
    data = {"version": 2, "files": {}, **old.snapshot().model_dump(mode="json")}
    data["state"]["unparsed_total"] = {}
    new = Pipeline(load_rules(), follow=True, base_year=2025)
    new.restore(parse_state(json.loads(json.dumps(data))).snapshot)
    assert new.unparsed(V1_CPU.name) == old.unparsed(V1_CPU.name)
