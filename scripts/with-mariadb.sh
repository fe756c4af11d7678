#!/usr/bin/env bash
# Run a command with NEXUS_TEST_MYSQL_URL pointing at a MySQL-protocol server.
# If NEXUS_TEST_MYSQL_URL is already set (e.g. a real TiDB), use it as is;
# otherwise start a throwaway MariaDB (temp datadir, own socket and port) and
# stop it when the command ends, whatever its outcome. NEXUS_MARIADB_BUFFER_POOL sets its InnoDB buffer
# pool (default 256M, what the tests use; `make bench` gives its server 2G, see docs/performance.md).
set -euo pipefail
if [ -n "${NEXUS_TEST_MYSQL_URL:-}" ]; then exec "$@"; fi

MARIADBD=$(command -v mariadbd || echo /usr/sbin/mariadbd)
work=$(mktemp -d /tmp/nexus-mariadb.XXXXXX)
port=${NEXUS_TEST_MYSQL_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
cleanup() {
  if [ -f "$work/pid" ] && ! kill -0 "$(cat "$work/pid")" 2>/dev/null; then
    echo "with-mariadb: the server died during the run; last lines of its error log:" >&2
    tail -n 40 "$work/error.log" >&2 || true
  fi
  if [ -f "$work/pid" ]; then kill "$(cat "$work/pid")" 2>/dev/null || true; fi
  for _ in $(seq 50); do [ -f "$work/pid" ] && kill -0 "$(cat "$work/pid")" 2>/dev/null || break; sleep 0.1; done
  rm -rf "$work"
}
trap cleanup EXIT
# Its own tmpdir: several servers (make test's lanes) bootstrapping at once in one /tmp collided on temp tables.
mkdir "$work/tmp"
mariadb-install-db --no-defaults --datadir="$work/data" --tmpdir="$work/tmp" --user=root \
  --auth-root-authentication-method=normal --skip-test-db >"$work/install.log" 2>&1 \
  || { cat "$work/install.log"; exit 1; }
"$MARIADBD" --no-defaults --datadir="$work/data" --tmpdir="$work/tmp" --socket="$work/sock" --port="$port" \
  --bind-address=127.0.0.1 --user=root --pid-file="$work/pid" --log-error="$work/error.log" \
  --innodb-buffer-pool-size="${NEXUS_MARIADB_BUFFER_POOL:-256M}" --max-connections=300 --skip-name-resolve &
for _ in $(seq 100); do
  mariadb-admin --no-defaults --socket="$work/sock" -uroot ping >/dev/null 2>&1 && break
  sleep 0.1
done
mariadb --no-defaults --socket="$work/sock" -uroot -e \
  "CREATE USER IF NOT EXISTS 'nexus'@'127.0.0.1' IDENTIFIED BY 'nexus-test'; GRANT ALL ON *.* TO 'nexus'@'127.0.0.1' WITH GRANT OPTION;"
echo "with-mariadb: MariaDB $("$MARIADBD" --version | awk '{print $3}') on 127.0.0.1:$port"
export NEXUS_TEST_MYSQL_URL="mysql+pymysql://nexus:nexus-test@127.0.0.1:$port/"
"$@"
