# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: deps test demo airflow lint bench

deps:
	@VENV=$(VENV) bash scripts/bootstrap.sh

# Every test, on a throwaway MariaDB (or NEXUS_TEST_MYSQL_URL) plus SQLite.
# NEXUS_DB_REQUIRED=1 turns any skipped test into a failure.
test: deps
	$(BIN)/ruff check .
	NEXUS_DB_REQUIRED=1 bash scripts/with-mariadb.sh $(BIN)/python -m pytest $(PYTEST_ARGS)

# The main job end to end on the embedded default (a demo tenant on SQLite): real Airflow,
# the old runtime draining, the cutover over the REST API, Field History to stage 3; exits 0.
demo: deps
	$(BIN)/python scripts/demo.py

# The same Airflow with the demo tenant, left up (URL and login printed); Ctrl-C stops it.
airflow: deps
	$(BIN)/python scripts/airflow_up.py

lint: deps
	$(BIN)/ruff check .

# Performance figures (docs/performance.md) on a throwaway MariaDB: prints a table, writes bench/results.json.
# QUICK=1: small sizes, about a minute (what the smoke test tests/bench runs).
bench: deps
	bash scripts/with-mariadb.sh $(BIN)/python bench/run_all.py $(if $(QUICK),--quick,) $(BENCH_ARGS)
