"""Field History eligibility (seed 003): readers, materialization, status, stage gates.

Modules, one role each:

* :mod:`.readers` -- the compatibility and boolean-only readers as SQLAlchemy
  expressions; the only copy of the interval predicate.
* :mod:`.materialize` -- stage 2: keyset batches deciding legacy NULL rows.
* :mod:`.status` -- counts, switches and producer inventory (read-only).
* :mod:`.gates` -- the three stage gates, each returning a report.
* :mod:`.inventory`, :mod:`.settings`, :mod:`.versions`, :mod:`.prerequisites` --
  producers/outbox, the two runtime switches, dotted versions, required schema.
* :mod:`.provenance` -- the one provenance rule shared by producers and the stage-2 gate.

The reference producers (the single stamping producer, a pre-cutover binary)
and the Audit V2 outbox worker are :mod:`nexus_sim.producers` and
:mod:`nexus_sim.outbox_worker`, outside the product.

Nothing here UPDATEs or DELETEs ``_System_Event`` / ``_System_WorkItem`` rows,
and nothing imports Airflow.
"""
