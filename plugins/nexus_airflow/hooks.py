"""One hook: an Airflow connection -> a SQLAlchemy engine on a tenant database.

* ``mysql`` connections (MySQL, MariaDB, TiDB) go through ``MySqlHook``'s URI,
  then :func:`nexus_cutover.db.make_engine` (PyMySQL driver, pre-ping).
* ``sqlite`` connections (the embedded demo default) use the connection's host
  as the database path, as Airflow's own SqliteHook does.

The DSN and password never leave this object: it is neither logged, nor put in
XCom, nor returned; :attr:`masked_dsn` is what may be shown.
"""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook
from sqlalchemy import Engine
from sqlalchemy.pool import NullPool

from nexus_cutover.db import make_engine, mask_dsn, parse_dsn
from nexus_cutover.errors import BadInput


class NexusTenantHook(BaseHook):
    conn_name_attr = "nexus_conn_id"
    default_conn_name = "nexus_tenant_default"
    hook_name = "Nexus tenant database"

    def __init__(self, nexus_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nexus_conn_id = nexus_conn_id

    @cached_property
    def _dsn(self) -> str:
        try:
            conn = self.get_connection(self.nexus_conn_id)
        except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and secrets-backend errors alike
            if "isn't defined" not in str(exc) and type(exc).__name__ != "AirflowNotFoundException":
                raise
            raise BadInput(
                f"no Airflow connection {self.nexus_conn_id!r}: create it (Admin -> Connections, or "
                f"`airflow connections add {self.nexus_conn_id} --conn-type mysql --conn-host <tidb-host> --conn-port 4000 "
                "--conn-schema <tenant_db> --conn-login <user> --conn-password <password>`; type sqlite with the file path "
                "as host for the embedded demo), or name another connection in the form's conn_id"
            ) from None
        conn_type = (conn.conn_type or "").lower()
        if conn_type == "mysql":
            from airflow.providers.mysql.hooks.mysql import MySqlHook

            uri = MySqlHook(mysql_conn_id=self.nexus_conn_id).get_uri()
        elif conn_type == "sqlite":
            path = conn.host or conn.schema
            if not path:
                raise BadInput(f"connection {self.nexus_conn_id!r}: a sqlite connection needs the database path as host")
            uri = f"sqlite:///{path}"
        else:
            generic = (" (Airflow stores a type it does not know, such as sqlite without "
                       "apache-airflow-providers-sqlite, as 'generic': install it, part of nexus-cutover[airflow])"
                       if conn_type == "generic" else "")
            raise BadInput(
                f"connection {self.nexus_conn_id!r} has type {conn_type!r}: use a 'mysql' (MySQL/MariaDB/TiDB) "
                f"or 'sqlite' connection{generic}"
            )
        parse_dsn(uri)  # a malformed connection fails here, with a message that names no password
        return uri

    @property
    def masked_dsn(self) -> str:
        return mask_dsn(self._dsn)

    def get_engine(self, *, connect_timeout: float = 10.0, pooled: bool = True) -> Engine:
        """A new engine; the caller disposes of it.

        ``pooled=False`` opens a connection per use and keeps none idle, and keeps no compiled statements
        (SQLAlchemy's per-engine cache, ~115 KB for a drain's statements): for long waits (one per waiting
        tenant on a triggerer) that poll rarely, where memory per tenant counts more than compiling a
        poll's few statements again.
        """
        kwargs = {} if pooled else {"poolclass": NullPool, "query_cache_size": 0}
        return make_engine(self._dsn, connect_timeout=connect_timeout, **kwargs)

    def dsn_for_child_process(self) -> str:
        """The DSN, only to be placed in a child process's environment (``NEXUS_TENANT_DSN``); never log it."""
        return self._dsn
