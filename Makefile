# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: deps test test-tidb test-stack demo airflow demo-tenant stack stack-down lock dist lint bench bench-stack

deps:
	@VENV=$(VENV) bash scripts/bootstrap.sh

# Every test, on throwaway MariaDBs (or NEXUS_TEST_MYSQL_URL) plus SQLite, and the TiDB-semantics run, in lanes, each
# one pytest on its own server, in three queues at once (scripts/run_tests.py): tests/stack, then tenant_rollout |
# tests/dags, then the TiDB-semantics run | the other suites that start an `airflow standalone`, then every other
# test, then the bench smoke test.
# NEXUS_DB_REQUIRED=1 turns any skipped test into a failure. Each lane's output is printed whole when it ends; then
# the wall time and the ten slowest tests. PYTEST_ARGS go to every lane but the TiDB one (TIDB_PYTEST_ARGS).
TEST_START := $(shell date +%s)
test: deps
	$(BIN)/ruff check .
	$(BIN)/python scripts/run_tests.py --since $(TEST_START) --pytest-args "$(PYTEST_ARGS)" \
		--tidb-suites "$(TIDB_SUITES)" --tidb-args "$(TIDB_PYTEST_ARGS)"

# The locking, concurrency, checkpoint, fence, materialize and runtime suites again, MySQL only, with TiDB's
# semantics on every session (snapshot fixed at BEGIN; a transaction over 5,000 statements or 10,000 rows
# written fails its test): tests/tidb_semantics.py. Its own server; TIDB_PYTEST_ARGS for extra pytest options.
TIDB_SUITES := tests/runtime tests/projection tests/field_history/test_materialize.py \
	tests/field_history/test_concurrency.py tests/field_history/test_gates.py tests/field_history/test_stage3_locked.py \
	tests/field_history/test_provenance.py tests/field_history/test_read_equivalence.py tests/field_history/test_stage3_live_producers.py \
	tests/test_tidb_semantics_harness.py
TIDB_TEST = NEXUS_DB_REQUIRED=1 NEXUS_TIDB_SEMANTICS=1 bash scripts/with-mariadb.sh \
	$(BIN)/python -m pytest -q $(TIDB_SUITES) $(TIDB_PYTEST_ARGS)

test-tidb: deps
	$(TIDB_TEST)

# The production-topology tests alone (tests/stack: real processes, SIGKILL and restarts; one stack per session).
test-stack: deps
	NEXUS_DB_REQUIRED=1 bash scripts/with-mariadb.sh $(BIN)/python -m pytest -q tests/stack $(PYTEST_ARGS)

# The main job end to end on the embedded default (a demo tenant on SQLite): real Airflow,
# the old runtime draining, the cutover over the REST API, Field History to stage 3; exits 0.
demo: deps
	$(BIN)/python scripts/demo.py

# The same Airflow with the demo tenant, left up (URL and login printed); Ctrl-C stops it.
airflow: deps
	$(BIN)/python scripts/airflow_up.py

# The production topology (issue 13), left up: PostgreSQL metadata, Redis, CeleryExecutor with scheduler,
# dag-processor, api-server, two triggerers and two Celery workers, the demo tenant on a throwaway MariaDB
# (scripts/stack.py; URL, login and settings printed). Ctrl-C, or `make stack-down` from another terminal, stops it all.
# One more demo tenant in `make airflow`'s Airflow (seeded SQLite file, its connection, its old runtime draining).
demo-tenant: deps
	$(BIN)/python scripts/add_demo_tenant.py $(TENANT)

stack: deps
	bash scripts/with-mariadb.sh $(BIN)/python scripts/stack.py up $(if $(PORT),--port $(PORT),)

stack-down:
	$(BIN)/python scripts/stack.py down

# The dev lock constraints-dev.txt (every installed version; bootstrap installs with it) and the release's constraints
# constraints.txt (only what the product adds on top of Airflow: scripts/lock.py, which asks the index for a fresh
# resolve of Airflow): run after a passing `make test`.
lock: deps
	$(BIN)/python scripts/lock.py

# What a release hands a team (README, "Install into your Airflow"), from a bare Python with pip (no dev venv: `dist`
# does not need `deps`), in seconds:
#   dist/nexus_cutover-<version>-py3-none-any.whl  the product, its plugin, provider, DAGs and DAG loader; no nexus_sim
#   dist/constraints-<version>.txt                  the release's constraints.txt
#   dist/nexus-cutover-deploy-<version>.tar.gz      a build context for deploy/Dockerfile: deploy/ (the Dockerfile, the
#                                                   Helm values, the settings, the local settings, the monitoring),
#                                                   the DAG loader in deploy/dags_folder/, constraints.txt, LICENSE and
#                                                   the wheel in dist/
PYTHON ?= python3
dist:
	rm -rf dist build
	$(PYTHON) -m pip wheel -q --no-deps -w dist .
	version=$$(sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -1) && \
		cp constraints.txt dist/constraints-$$version.txt && \
		stage=$$(mktemp -d) && tree=$$stage/nexus-cutover-deploy-$$version && mkdir -p $$tree/dist && \
		cp -R deploy LICENSE constraints.txt $$tree/ && cp dist/nexus_cutover-$$version-*.whl $$tree/dist/ && \
		$(PYTHON) plugins/dags_loader.py $$tree/deploy/dags_folder >/dev/null && \
		tar -czf dist/nexus-cutover-deploy-$$version.tar.gz --exclude=__pycache__ -C $$stage nexus-cutover-deploy-$$version && \
		rm -rf $$stage && ls dist

lint: deps
	$(BIN)/ruff check .

# Performance figures (docs/performance.md) on a throwaway MariaDB: prints a table, writes bench/results.json.
# Its server has a 2G InnoDB buffer pool (the tests' has 256M): the H=5000 audit workload (10M Events, 2M
# WorkItems) fits in memory, as a production tenant server's working set would.
# QUICK=1: small sizes, each figure still 3 repetitions: a few minutes (what the smoke test tests/bench runs).
bench: deps
	NEXUS_MARIADB_BUFFER_POOL=2G bash scripts/with-mariadb.sh $(BIN)/python bench/run_all.py $(if $(QUICK),--quick,) $(BENCH_ARGS)

# Issue 13's scale figures on the production topology (bench/bench_stack.py): 1,000 tenants waiting in the drain
# trigger on one real triggerer, then one of two triggerers SIGKILLed; an 11-tenant tenant_rollout (canary + one wave;
# BENCH_STACK_ARGS="--rollout-tenants 100 --rollout-limit 7200" for issue 13's 100) against the CLI floor. Starts and
# stops its own stack; writes the key `stack` of bench/results.json (QUICK=1: small sizes, key `stack_quick`, ~10
# minutes). Also issue 36's parts: levers (each of item 4's levers alone) and fleet (a production-shaped fleet whose
# backlogs are still draining). Not part of `make bench` or `make test` (about 60 minutes on 2 cores).
bench-stack: deps
	bash scripts/with-mariadb.sh $(BIN)/python bench/bench_stack.py $(if $(QUICK),--quick,) $(BENCH_STACK_ARGS)
