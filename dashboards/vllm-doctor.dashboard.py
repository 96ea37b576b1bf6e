"""grafanalib entry point for the vLLM dashboard: `generate-dashboard -o out/vllm-doctor.json vllm-doctor.dashboard.py`.

The panels are defined in vllm_doctor/monitoring/bundle.py (so `vllm-doctor export dashboards` prints the same
JSON from an installed package); dashboards/out/vllm-doctor.json is the committed output and
`python -m vllm_doctor.monitoring.bundle --write` regenerates it. tests/test_dashboards.py checks that it is
up to date, that every PromQL expression parses (promtool) and that every metric name is one
that vllm-doctor or vLLM exports.
"""

from vllm_doctor.monitoring.bundle import dashboard as _build

dashboard = _build()
