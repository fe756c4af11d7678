"""The reference runtime of the durable input-range protocol (seed 000; contract, "reference host").

One role per module:

* :mod:`.model` - plain values passed between the modules (inputs, results, claims, payloads, routing);
* :mod:`.errors` - the runtime's explicit failures (missing coverage, missing membership, refusals);
* :mod:`.tx` - the pack transaction (pack lock row, bounded waits, retried id conflicts) and id/ordinal allocation;
* :mod:`.packs` - the per-batch pack context (namespace, version-1 protocol row);
* :mod:`.generations` - generation lookups on ``ix_WorkItem_ProjectionOrder`` and the extend-or-successor rule;
* :mod:`.duplicates` - duplicate verification (cutoff acknowledgement, durable coverage, ``MissingCoverage``);
* :mod:`.admission` - fresh ingress in one pack transaction (:func:`.admission.admit_batch`);
* :mod:`.replay` - explicit replay of a terminal generation (:func:`.replay.replay`);
* :mod:`.claim` - claim / complete / retry of projection WorkItems by WorkId;
* :mod:`.payload` - the range reader (:func:`.payload.load_payloads`);
* :mod:`.activation` - the activation gate (:func:`.activation.check_activation`);
* :mod:`.fences` - whether an admission fence is in force for a source;
* :mod:`.registry` - ``_System_ProcessRegistry`` registration, heartbeat, activation, stop;
* :mod:`.materializer` - durable ingress receipts -> range admission -> confirmation;
* :mod:`.worker` - the projection worker (gate-checked, process-wide or standalone);
* :mod:`.host` - :func:`.host.run_host`, behind the ``nexus-host`` command.

The old-protocol runtime (protocol 0) simulated for demos and tests is
:mod:`nexus_sim.old_runtime`, outside the product.

Nothing here imports Airflow. The runtime, being the runtime, changes the
status of the work it claims and completes; it never UPDATEs any other column of
an Event, and never changes a generation's ``InputStartOrdinal``.
"""
