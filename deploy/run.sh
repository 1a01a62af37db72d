#!/usr/bin/env bash
# Run sentdp's image with its state (SQLite ledger, tenants, idempotency secret) on a named
# volume, create tenant `demo` on the first run, and send the README's request.
#
#   bash deploy/run.sh [image]        # default sentdp:cpu; sentdp:gpu runs with --gpus all
#
# Recreating the container keeps every user's spent epsilon: it lives on the volume.
set -euo pipefail
IMAGE=${1:-sentdp:cpu}
NAME=${SENTDP_CONTAINER:-sentdp}
VOLUME=${SENTDP_VOLUME:-sentdp-state}
PORT=${PORT:-3000}
gpus=()
case "$IMAGE" in *gpu*) gpus=(--gpus all) ;; esac
docker volume inspect "$VOLUME" >/dev/null 2>&1 || docker volume create "$VOLUME" >/dev/null
in_volume() { docker run --rm -v "$VOLUME:/state" --entrypoint "$1" "$IMAGE" "${@:2}"; }
if ! in_volume test -f /state/demo-api-key; then
  docker run --rm -v "$VOLUME:/state" "$IMAGE" sentdp-admin new-key --tenant demo \
    --max-epsilon 10 --budget 100 --key-file /state/demo-api-key >/dev/null
  echo "created tenant 'demo' in volume $VOLUME"
fi
if ! in_volume test -f /state/metrics-token; then
  in_volume sh -c 'umask 077 && python -c "import secrets; print(secrets.token_urlsafe(32))" > /state/metrics-token'
fi
key=$(in_volume cat /state/demo-api-key)
docker rm -f "$NAME" >/dev/null 2>&1 || true
started=$(date +%s.%N)
docker run -d --name "$NAME" -p "$PORT:3000" -v "$VOLUME:/state" "${gpus[@]}" \
  -e SENTDP_METRICS_TOKEN="$(in_volume cat /state/metrics-token)" "$IMAGE" >/dev/null
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT/readyz")" = 200 ]; do
  docker inspect -f '{{.State.Running}}' "$NAME" | grep -q true \
    || { docker logs "$NAME" 2>&1 | tail -n 20; exit 1; }
  sleep 0.5
done
echo "ready in $(echo "$(date +%s.%N) - $started" | bc) s"
curl -s -X POST "http://127.0.0.1:$PORT/privatize" \
  -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"user": "alice", "epsilon": 6, "documents": [{"text": "The striker scored twice in the second half. The home crowd cheered every touch. The manager praised his defence. It was their fifth win in a row."}]}' \
  | python3 -c 'import json, sys; r = json.load(sys.stdin); d = r["documents"][0]; b = r["budget"]; print("model %s: %d-d embedding of k=%d sentences; alice spent %g of %g" % (r["model"], len(d["embedding"]), d["k"], b["spent_epsilon"], b["limit"]))'
