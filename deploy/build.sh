#!/usr/bin/env bash
# Build sentdp's container image: the offline base image (once), the Bento, the image.
#
#   bash deploy/build.sh cpu     # sentdp:cpu, CPU torch wheel (the one the tests run)
#   bash deploy/build.sh gpu     # sentdp:gpu, the same torch version's CUDA build from PyPI
#
# SENTDP_MODEL picks the bundle (default sentdp-bbc-news:latest; train it first, or run
# `bash .ci/serve` once). TORCH_CPU_WHEEL points at the CPU wheel (default /opt/wheels/...).
# BentoML's docker backend forces BuildKit, which needs the buildx plugin; the classic builder
# (DOCKER_BUILDKIT=0) needs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT=${1:-cpu}
TAG=${2:-sentdp:$VARIANT}
BASE=sentdp-base:bookworm
case "$VARIANT" in cpu | gpu) ;; *) echo "usage: $0 cpu|gpu [image tag]" >&2; exit 2 ;; esac
export SENTDP_MODEL=${SENTDP_MODEL:-sentdp-bbc-news:latest}
export BENTOML_DO_NOT_TRACK=${BENTOML_DO_NOT_TRACK:-true}  # no usage reports to BentoML
.venv/bin/bentoml models get "$SENTDP_MODEL" >/dev/null 2>&1 \
  || { echo "no model $SENTDP_MODEL in the BentoML store: train it first (sentdp-train)" >&2; exit 1; }
docker image inspect "$BASE" >/dev/null 2>&1 || bash deploy/base-image.sh "$BASE"
mkdir -p build/deploy/wheels
if [ "$VARIANT" = cpu ]; then
  wheel=${TORCH_CPU_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}
  [ "$(basename "$wheel")" = torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ] \
    || { echo "the CPU image is built with torch 2.13.0+cpu (the tests' version)" >&2; exit 1; }
  cp "$wheel" build/deploy/wheels/
  torch_line="./wheels/$(basename "$wheel")"
else
  torch_line="torch==$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')"
fi
.venv/bin/python deploy/pin_requirements.py --torch "$torch_line" > "build/deploy/requirements-$VARIANT.txt"
# The image serves the bundle it carries: SENTDP_MODEL is set to its full tag.
model=$(.venv/bin/python -c 'import bentoml, sys; print(bentoml.models.get(sys.argv[1]).tag)' "$SENTDP_MODEL")
bentofile="build/deploy/bentofile-$VARIANT.yaml"
cp "deploy/bentofile-$VARIANT.yaml" "$bentofile"
printf '  - name: SENTDP_MODEL\n    value: "%s"\n' "$model" >> "$bentofile"
started=$(date +%s)
bento=$(.venv/bin/bentoml build -f "$bentofile" -o tag . | tail -n 1)
bento=${bento#__tag__:}
DOCKER_BUILDKIT=0 .venv/bin/bentoml containerize "$bento" --backend docker -t "$TAG"
echo "built $TAG from $bento in $(($(date +%s) - started)) s"
docker image ls "$TAG"
