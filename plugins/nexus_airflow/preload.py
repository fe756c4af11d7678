"""What a Celery worker imports once, before it forks, so no task pays the first import of our modules.

Airflow's Celery worker forks a process per task from its pool, and Airflow's own preload (its handler of
Celery's ``import_modules`` signal) imports only Airflow's operators: every task then imported the nexus modules
again (the DAG's declarations, the operators, the domain steps, SQLAlchemy's MySQL dialect) in a process that
exits with them. :func:`preload`, connected to the same signal by ``plugins/airflow_local_settings.py``, imports
them in the worker's main process, so every forked task inherits them (bench/bench_preload.py measures it).

Invariants: it only imports modules (no DAG built, no engine, no connection, no metrics client: those are
per process and made on first use, after the fork); a module that fails to import is logged and skipped (the
task that needs it reports the error where a person reads it), so a worker always starts.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

from nexus_cutover import settings

log = logging.getLogger(__name__)

#: The packages imported whole (every module a task may import lazily, once), and the third-party modules the
#: steps use. ``nexus_status`` is the API server's; ``nexus_sim`` is not the product's.
PACKAGES = ("nexus_airflow", "nexus_cutover")
MODULES = ("sqlalchemy.dialects.mysql.pymysql", "sqlalchemy.dialects.sqlite.pysqlite", "pymysql",
           "airflow.providers.mysql.hooks.mysql", "airflow.providers.standard.operators.trigger_dagrun")


def preload_names() -> list[str]:
    """Every module :func:`preload` imports, packages first (their modules in name order)."""
    names: list[str] = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names.extend(sorted(m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
                            if not m.name.endswith(".__main__")))  # a __main__ runs a command
    return [*names, *MODULES]


def preload(*_args, **_kwargs) -> list[str]:
    """Import every module of :func:`preload_names`; returns the ones that failed (each logged)."""
    failed, names = [], preload_names()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a worker starts whatever one module does
            failed.append(name)
            log.warning("nexus-cutover preload: %s not imported (%s: %s)", name, type(exc).__name__, exc)
    log.info("nexus-cutover preload: %d modules imported before the worker forks%s",
             len(names) - len(failed), f", {len(failed)} failed" if failed else "")
    return failed


#: The workers' environment switch of the preload (on unless ``0``: the bench's lever, measured alone).
PRELOAD_ENV = settings.BY_NAME["celery_preload"].alias


def connect_to_celery() -> bool:
    """Connect :func:`preload` to Celery's ``import_modules`` signal (sent once, in a worker's main process,
    before its pool forks); False where Celery is not installed or the setting ``celery_preload``
    (``$NEXUS_CELERY_PRELOAD``) is false."""
    try:
        wanted = settings.value("celery_preload")
    except settings.BadSetting as exc:  # a worker always starts: the default, said in its log
        log.warning("nexus-cutover preload: %s; preloading (the default)", exc)
        wanted = True
    if not wanted:
        return False
    try:
        from celery.signals import import_modules
    except ImportError:
        return False
    import_modules.connect(preload, weak=False, dispatch_uid="nexus_cutover.preload")
    return True
