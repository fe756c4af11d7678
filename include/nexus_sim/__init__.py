"""Simulators and builders for tests, the demo and the benchmarks -- not part of the product.

* :mod:`.old_runtime` -- the old-protocol runtime (``ProjectionProtocol = 0``),
  also a command: ``python -m nexus_sim.old_runtime --namespace <ns>``; the statements it runs
  are :mod:`.old_runtime_sql`'s;
* :mod:`.scenario` -- the deterministic tenant-history builder and ready-made histories, among them
  :func:`.scenario.production.production_tenant`, the production-shaped tenant (issues 24, 25;
  its names and data in :mod:`.scenario.production_model`, its planner in :mod:`.scenario.production_plan`);
* :mod:`.collation` -- what the tenant's server holds and treats as equal, asked of the server;
* :mod:`.traffic` -- live traffic after the release (receipts, ordinary work), stoppable, reporting what it wrote;
* :mod:`.producers`, :mod:`.outbox_worker` -- reference producers of
  ``_System_AuditFieldChange`` rows (the single stamping producer, a pre-cutover
  binary) and the Audit V2 outbox worker.

This package imports :mod:`nexus_cutover` (never the other way round). Only
``tests/``, ``scripts/`` (the demo) and ``bench/`` import it; the product
(``nexus_cutover``, the Airflow plugins and the DAGs) never does, which
``tests/test_architecture.py`` checks.
"""
