#!/usr/bin/env bash
# The README's "On a GPU" checks, on a machine with CUDA and the project installed: batch
# invariance per serving mode, the encoder and depth tests on CUDA, depth on CUDA against
# NumPy, and the service against its encoder. PYTHON names the interpreter (default .venv's).
# Offline machines: unpack what `loadtests/offline_pack.py pack` made first, and export what it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MODEL=${SENTDP_MODEL:-sentdp-bbc-news:latest}
"$PY" loadtests/cuda_invariance.py --model "$MODEL" --device cuda
SENTDP_TEST_DEVICE=cuda "$PY" -m pytest -q tests/sentdp/test_encoders.py tests/sentdp/test_depth.py
"$PY" loadtests/bench_mechanism.py --device cuda
SENTDP_TENANT_INFLIGHT_TOKENS=1000000 SENTDP_TENANT_INFLIGHT_REQUESTS=1000 "$PY" loadtests/bench_service.py --models "$MODEL" \
  --device cuda --documents 320 --concurrency 1 32 128 --gateway-workers 8 --worker-processes 1 2 \
  --client-processes 4
