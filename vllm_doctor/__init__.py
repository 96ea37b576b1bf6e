"""vllm-doctor: diagnose vLLM incidents from vLLM's logs, /metrics and NVML, and name the flag fix.

Public API: :func:`diagnose` (paths -> :class:`~vllm_doctor.pipeline.Report`),
:func:`~vllm_doctor.diagnosis.load_rules`, :class:`~vllm_doctor.pipeline.Pipeline`.
"""

from vllm_doctor.about import __version__  # noqa: F401 - the package's version


def diagnose(paths, rules_dirs=(), metrics_files=(), since=None, until=None):
    """Diagnose vLLM log files (paths; "-" is stdin; .gz read directly); ``since`` / ``until``:
    epoch seconds (log clock) bounding what is judged. See vllm_doctor.ingest.oneshot."""
    from vllm_doctor.ingest.oneshot import diagnose as _d

    return _d(paths, rules_dirs=rules_dirs, metrics_files=metrics_files, since=since, until=until)
