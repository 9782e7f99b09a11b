#!/usr/bin/env bash
# Start a PostgreSQL server on localhost for the shared-study tests.
#
#   eval "$(tests/services/postgres.sh)"   # prints `export AUTOTUNE_TEST_POSTGRES=postgresql://...`
#   tests/services/postgres.sh stop
#
# Needs root (the server runs as the `postgres` user). Installs Debian's postgresql when missing.
# The cluster lives in $AUTOTUNE_PG_DIR (default /tmp/autotune-postgres) on port
# $AUTOTUNE_PG_PORT (default 55432), apart from the Debian cluster; role and database `autotune`,
# trusted on 127.0.0.1. Idempotent: a running server is reused. Exit codes: 3 not root
# (package missing), 4 apt-get failed.
set -euo pipefail

DIR="${AUTOTUNE_PG_DIR:-/tmp/autotune-postgres}"
PORT="${AUTOTUNE_PG_PORT:-55432}"
URL="postgresql://autotune@127.0.0.1:$PORT/autotune"

log() { echo "postgres.sh: $*" >&2; }

bindir() {
  local found
  found=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] && [ -x "$found/pg_ctl" ] && echo "$found"
}

install() {
  bindir >/dev/null && return
  if [ "$(id -u)" != 0 ]; then
    log "postgresql is missing and installing it needs root"; exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends postgresql >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends postgresql >&2; } \
    || { log "apt-get could not install postgresql"; exit 4; }
}

as_postgres() { runuser -u postgres -- "$@"; }

ready() { as_postgres "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; }

start() {
  install
  BIN=$(bindir)
  if ready; then
    as_postgres "$BIN/psql" -q -h 127.0.0.1 -p "$PORT" -U autotune -d autotune -c 'select 1' \
      >/dev/null 2>&1 && { echo "export AUTOTUNE_TEST_POSTGRES=$URL"; return; }
    log "port $PORT answers but not as the autotune test server; set AUTOTUNE_PG_PORT"; exit 1
  fi
  mkdir -p "$DIR"
  chown postgres:postgres "$DIR"
  if [ ! -s "$DIR/data/PG_VERSION" ]; then
    as_postgres "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    cat >>"$DIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  fi
  as_postgres "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 30 start >/dev/null
  as_postgres "$BIN/psql" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 <<SQL >/dev/null
SELECT 'CREATE ROLE autotune LOGIN CREATEDB'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'autotune')\gexec
SELECT 'CREATE DATABASE autotune OWNER autotune'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'autotune')\gexec
SQL
  echo "export AUTOTUNE_TEST_POSTGRES=$URL"
}

stop() {
  BIN=$(bindir) || return 0
  [ -s "$DIR/data/postmaster.pid" ] && as_postgres "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
  return 0
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) log "usage: $0 [start|stop]"; exit 2 ;;
esac
