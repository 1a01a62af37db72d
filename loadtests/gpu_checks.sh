#!/usr/bin/env bash
# The README's "On a GPU" checks, on a machine with CUDA and the project installed: the encoder
# and depth tests on CUDA, batch invariance per serving mode, the service against its encoder,
# and depth on CUDA against NumPy. PYTHON names the interpreter (default .venv's); REPORT_DIR,
# when set, receives each step's output as it runs (a step cut short still leaves its part).
# Every step runs even when one before it failed; the exit status says whether any did.
# Offline machines: unpack what `loadtests/offline_pack.py pack` made first, and export what it prints.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-.venv/bin/python}
MODEL=${SENTDP_MODEL:-sentdp-bbc-news:latest}
REPORT=${REPORT_DIR:-}
failed=0
step() {
  local name=$1
  shift
  echo "== $name: $*"
  if [ -n "$REPORT" ]; then
    mkdir -p "$REPORT"
    "$@" 2>&1 | tee "$REPORT/$name.txt"
  else
    "$@"
  fi
  local status=$?
  [ "$status" -eq 0 ] || { echo "== $name failed ($status)"; failed=1; }
}
# The encoder tests read the bundle's own encoder files (the machine may lack the encoder package).
ENCODER_DIR=$("$PY" -c "import sys; sys.path.insert(0, '.'); from training.store import load_from_store; print(load_from_store('$MODEL').encoder_dir)")
step pytest env SENTDP_TEST_DEVICE=cuda SENTDP_TEST_ENCODER_DIR="$ENCODER_DIR" \
  "$PY" -m pytest -q -p no:cacheprovider tests/sentdp/test_encoders.py tests/sentdp/test_depth.py
step invariance "$PY" loadtests/cuda_invariance.py --model "$MODEL" --device cuda
step service env SENTDP_TENANT_INFLIGHT_TOKENS=1000000 SENTDP_TENANT_INFLIGHT_REQUESTS=1000 \
  "$PY" loadtests/bench_service.py --models "$MODEL" --device cuda --documents 320 \
  --concurrency ${CONCURRENCY:-1 32 64} --gateway-workers 8 --worker-processes ${WORKERS:-1 2 4} \
  --client-processes 4
step mechanism "$PY" loadtests/bench_mechanism.py --device cuda
exit "$failed"
