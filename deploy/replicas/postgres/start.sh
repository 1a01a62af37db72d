#!/bin/sh
# First start: a cluster with a password-protected role and database `sentdp`. The password
# reaches PostgreSQL as a psql variable (quoted by psql), never spliced into SQL text.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  trap 'rm -rf "$PGDATA"/* "$PGDATA"/.[!.]* 2>/dev/null' EXIT  # a failed first start retries cleanly
  initdb -U postgres --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  echo "host sentdp sentdp all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
  psql -h /tmp -v ON_ERROR_STOP=1 -q -U postgres -v password="$POSTGRES_PASSWORD" <<'SQL'
CREATE ROLE sentdp LOGIN PASSWORD :'password';
CREATE DATABASE sentdp OWNER sentdp;
SQL
  pg_ctl -m fast -w stop >/dev/null
  trap - EXIT
fi
exec postgres -c listen_addresses='*' -c unix_socket_directories=/tmp
