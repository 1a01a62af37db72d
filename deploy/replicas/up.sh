#!/usr/bin/env bash
# Start N sentdp replicas behind nginx on one PostgreSQL ledger and run the budget race.
#
#   bash deploy/replicas/up.sh [N]       # default 2 replicas; then: docker-compose down -v
#
# Needs the sentdp:cpu image (bash deploy/build.sh cpu) and docker-compose. Secrets (the
# database password, the metrics token) are generated once into deploy/replicas/.env (0600).
set -euo pipefail
cd "$(dirname "$0")"
N=${1:-2}
REPO=$(cd ../.. && pwd)
if [ ! -f .env ]; then
  (umask 077 && printf 'SENTDP_DB_PASSWORD=%s\nSENTDP_METRICS_TOKEN=%s\n' \
    "$(openssl rand -hex 16)" "$(openssl rand -hex 24)" > .env)
fi
docker image inspect "${SENTDP_IMAGE:-sentdp:cpu}" >/dev/null 2>&1 || bash ../build.sh cpu
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
docker-compose build -q
docker-compose up -d db
# One tenant whose users can each spend exactly epsilon 1, in the shared state volume.
key=$(docker-compose run --rm -T --no-deps sentdp sentdp-admin new-key --tenant race \
  --max-epsilon 1 --budget 1 2>/dev/null | tail -n 1)
started=$(date +%s)
docker-compose up -d --scale sentdp="$N"
deadline=$((started + 600))
for container in $(docker-compose ps -q sentdp); do
  until docker exec "$container" python -c \
    "import urllib.request as u; u.urlopen('http://127.0.0.1:3000/readyz', timeout=5)" 2>/dev/null; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
      docker logs "$container" 2>&1 | tail -n 20
      echo "replica $container not ready after 600 s" >&2
      exit 1
    fi
    sleep 2
  done
done
echo "$N replicas ready in $(($(date +%s) - started)) s"
port=$(docker-compose port lb 80 | cut -d: -f2)
out=$("$REPO/.venv/bin/python" race.py "http://127.0.0.1:$port" "$key" --calls 200)
echo "$out"
user=$(echo "$out" | sed -n 's/^USER=//p')
docker-compose exec -T sentdp sentdp-admin budget --tenant race --user "$user"
for container in $(docker-compose ps -q sentdp); do
  echo "replica $(docker inspect -f '{{.Name}}' "$container"): $(docker logs "$container" 2>&1 | grep -c 'method=POST,path=/privatize') /privatize calls served"
done
