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

from nexus_cutover import settings as _settings


def _airflow_config(key: str) -> str | None:
    """``[nexus] key`` of Airflow's configuration (``airflow.cfg``, ``_cmd``/``_secret``, a secrets backend, the
    provider's default). Imported when first asked, never here: Airflow imports this package (``provider.py``) while
    it reads its configuration, so an import of ``airflow.configuration`` now would be a circle."""
    try:
        from airflow.configuration import conf
    except ImportError:  # Airflow not installed, or still reading its configuration: the environment decides
        return None
    return conf.get(_settings.SECTION, key, fallback=None)


_settings.install_source(_airflow_config)
