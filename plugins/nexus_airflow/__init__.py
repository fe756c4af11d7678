"""Thin Airflow adapters over :mod:`nexus_cutover` (hooks, triggers, sensors, operators, views).

Nothing here holds cutover logic: every rule lives in the domain package.

* ``hooks``: Airflow connection -> SQLAlchemy engine (the DSN never leaves it);
* ``params``: the cutover DAG's trigger form and its run-time resolution;
* ``triggers``: :class:`~nexus_airflow.triggers.StatusPollTrigger`, a general
  deferrable poll of a domain status (poller class path + ids, off the event loop);
* ``pollers``: drain, old-writer and readiness pollers for it;
* ``sensors``: :class:`~nexus_airflow.sensors.StatusPollSensor` (general) and the
  cutover's wait_for_drain / check_old_writers / verify_readiness;
* ``operators``, ``hitl``, ``host_controllers``: the cutover's writing and human steps;
* ``base``: shared task plumbing (params, engine, how a task stops); ``faults``: test fault points.

Modules imported by DAG files (``params``, ``sensors``, ``operators``, ``hitl``)
import no database driver and no domain code at module level.
"""
