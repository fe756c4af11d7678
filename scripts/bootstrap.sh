#!/usr/bin/env bash
# Install what the project needs on a fresh Debian machine: the MariaDB server
# (tests), the mysqlclient build headers (providers-mysql), PostgreSQL and Redis
# (the production topology of `make stack` and tests/stack), and a venv with the
# project and its extras. Idempotent: skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
[ -e /usr/include/mysql/mysql.h ] || [ -e /usr/include/mariadb/mysql.h ] || need_apt+=(default-libmysqlclient-dev)
command -v gcc >/dev/null 2>&1 || need_apt+=(build-essential)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)  # make stack: metadata DB
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need_apt+=(redis-server)  # Celery broker
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium chromium-driver)  # status view test (headless)
command -v promtool >/dev/null 2>&1 || [ -x /usr/bin/promtool ] || need_apt+=(prometheus)  # promtool: the alert rules' tests
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Pinned: the dev lock constraints-dev.txt (`make lock` after a passing `make test`) holds every version the dev venv
# installs: the product's extras, the test tools of requirements-dev.txt (no extra of the product) and what they bring.
# (constraints.txt is the release's: only what the product adds on top of Airflow; scripts/lock.py writes both.)
# The product (nexus-cutover: nexus_cutover, nexus_airflow, nexus_status, the DAGs; Airflow finds its plugin through
# the entry point) and the simulators (nexus-sim, sim/pyproject.toml) are installed editable: the demo, the stack and
# the tests import the installed packages, and an edit of a file under include/, plugins/ or dags/ is live.
stamp="$VENV/.installed-$(cat pyproject.toml sim/pyproject.toml requirements-dev.txt constraints-dev.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -c constraints-dev.txt -r requirements-dev.txt -e '.[airflow,stack]' -e ./sim
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
echo "bootstrap: ready ($VENV)"
