"""Sources that follow a running vLLM for ``vllm-doctor serve`` (issue 3).

- :mod:`.follow`: a log file followed across rotation, ``copytruncate``, truncation,
  delete/re-create and late appearance, with an offset checkpoint; or a pipe (``-``).
- :mod:`.scrape`: vLLM's own Prometheus ``/metrics``, parsed with prometheus-client's text
  parser into :class:`vllm_doctor.events.VllmMetricsSample`.
- :mod:`.nvml`: per-GPU samples from NVML (nvidia-ml-py) into
  :class:`vllm_doctor.events.GpuSample`, polled in a background thread.

Each source only hands bytes or events to callbacks; the wiring to the pipeline is in
:mod:`vllm_doctor.export.serve`.
"""
