#!/usr/bin/env bash
# Runs its arguments as a command, with a throwaway PostgreSQL on loopback where this machine has one: the search's
# story of a study shared by machines through a database server (tests/test_tune_workers.py reads
# TUNE_TEST_POSTGRES_URL, and skips those tests without it). PostgreSQL refuses to run as root, so its cluster
# belongs to the postgres user: the server starts only as root with that user present, and is stopped and removed
# however the command ends.
set -euo pipefail

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -n "$pg_bin" ] && [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
    pg_dir=$(mktemp -d)
    pg_port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    chown postgres "$pg_dir"
    runuser -u postgres -- "$pg_bin/initdb" -D "$pg_dir/data" -A trust -U postgres >/dev/null
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w \
        -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1" start >/dev/null
    trap 'runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast stop >/dev/null; rm -rf "$pg_dir"' EXIT
    export TUNE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$pg_port/postgres"
fi
"$@"
