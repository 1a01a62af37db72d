#!/usr/bin/env bash
# Build sentdp's base image from Debian packages alone, for machines that cannot pull from an
# image registry: bookworm (Python 3.11, pip, venv) plus uv, trusting a given CA bundle (a
# TLS-intercepting proxy's, or an air-gapped mirror's). BentoML's generated Dockerfile starts
# FROM it (bentofile's docker.base_image).
#
#   DEBIAN_MIRROR=http://deb.debian.org/debian CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
#     bash deploy/base-image.sh [tag]          # default tag sentdp-base:bookworm
set -euo pipefail
TAG=${1:-sentdp-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
UV_VERSION=${UV_VERSION:-0.13.9}
[ -r "$CA_BUNDLE" ] || { echo "CA bundle $CA_BUNDLE not readable (set CA_BUNDLE)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
root=$(mktemp -d /var/tmp/sentdp-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$MIRROR"
install -m 644 "$CA_BUNDLE" "$root/etc/ssl/certs/sentdp-ca-bundle.crt"
# uv from PyPI, installed from a wheel fetched on this host (the chroot needs no network).
mkdir -p "$root/tmp/wheels"
python3 -m pip download -q --only-binary=:all: --no-deps --platform manylinux_2_17_x86_64 \
  --python-version 3.11 -d "$root/tmp/wheels" "uv==$UV_VERSION"
wheel=$(basename "$root"/tmp/wheels/uv-*.whl)
chroot "$root" python3 -m pip install -q --no-index --break-system-packages "/tmp/wheels/$wheel"
rm -rf "$root/tmp/wheels" "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/root/.cache
tar -C "$root" -c . | docker import \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/sentdp-ca-bundle.crt' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/sentdp-ca-bundle.crt' \
  --change 'ENV UV_NATIVE_TLS=1' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$TAG"
docker image ls "$TAG"
