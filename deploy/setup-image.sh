#!/bin/sh
# Runs as root while the image is built (bentofile docker.setup_script), after the Bento is in.
set -eu
# sentdp-admin on PATH: tenants and keys, written to the state volume.
cat > /usr/local/bin/sentdp-admin <<'SCRIPT'
#!/bin/sh
cd "$BENTO_PATH/src" && exec /app/.venv/bin/python -m service.admin "$@"
SCRIPT
chmod 755 /usr/local/bin/sentdp-admin
# The state folder: mount a volume here (a new named volume takes this owner and mode).
mkdir -p /state
chown bentoml:bentoml /state
chmod 700 /state
