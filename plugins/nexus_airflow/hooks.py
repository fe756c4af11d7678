"""One hook: an Airflow connection -> a SQLAlchemy engine on a tenant database.

* ``mysql`` connections (MySQL, MariaDB, TiDB): the URL is built here from the
  connection's fields and extras, as ``MySqlHook.get_uri()`` builds it (each extra a
  query parameter, ``client`` choosing the driver) except for TLS, which ``get_uri``
  loses (it flattens a mapping extra to text): the TLS extras ``ssl_mode``
  (``DISABLED``, ``PREFERRED``, ``REQUIRED``, ``VERIFY_CA``, ``VERIFY_IDENTITY``),
  ``ssl_ca``, ``ssl_cert``, ``ssl_key`` (file paths), and MySqlHook's own ``ssl``
  mapping (``{"ca": ..., "cert": ..., "key": ...}``, or its JSON text) become the DSN's
  TLS query parameters, which :mod:`nexus_cutover.tls` reads (the default without
  ``ssl_mode``: ``VERIFY_CA`` with a CA, else ``PREFERRED`` on a local server and
  ``REQUIRED`` on any other). Then :func:`nexus_cutover.db.make_engine` (PyMySQL, pre-ping).
* ``sqlite`` connections (the embedded demo default) use the connection's host
  as the database path, as Airflow's own SqliteHook does.

The DSN and password never leave this object: it is neither logged, nor put in
XCom, nor returned; :attr:`masked_dsn` is what may be shown, :attr:`tls_text` the TLS
mode it connects with. The one exception, :meth:`dsn_for_child_process`, registers the
DSN and its password with Airflow's secrets masker first (``mask_secret``).
"""

from __future__ import annotations

import json
from functools import cached_property
from urllib.parse import quote_plus, urlencode

from airflow.sdk import BaseHook
from sqlalchemy import Engine
from sqlalchemy.pool import NullPool

from nexus_cutover import tls
from nexus_cutover.db import dsn_secrets, make_engine, mask_dsn, parse_dsn
from nexus_cutover.errors import BadInput


def mysql_dsn_of(conn, conn_id: str) -> str:
    """The DSN of an Airflow ``mysql`` connection: ``MySqlHook.get_uri()``'s, with the TLS extras as the DSN's TLS
    query parameters (see the module docstring); :class:`BadInput` naming the extra when one is malformed."""
    extra = dict(conn.extra_dejson)
    client = str(extra.pop("client", "mysqlclient"))
    prefix = {"pymysql": "mysql+pymysql", "mysql-connector-python": "mysql+mysqlconnector"}.get(client, "mysql")
    where = f"connection {conn_id!r}"
    tls_extras: dict[str, str] = {}
    mapping = extra.pop("ssl", None)
    if isinstance(mapping, str) and mapping.strip().startswith("{"):
        try:
            mapping = json.loads(mapping)
        except ValueError:
            raise BadInput(f"{where}: its ssl extra is not a JSON mapping: give {{\"ca\": ..., \"cert\": ..., \"key\": ...}} "
                           "or the extras ssl_mode, ssl_ca, ssl_cert, ssl_key") from None
    if isinstance(mapping, dict):
        for name, value in mapping.items():
            key = tls.parameter_name(f"ssl_{name}")
            if key not in tls.TLS_PARAMETERS or key == "ssl_mode":
                raise BadInput(f"{where}: its ssl extra has the key {name!r}, which nexus-cutover does not read: "
                               "give ca, cert and key (file paths), and the mode as the ssl_mode extra")
            tls_extras[key] = str(value)
    elif mapping not in (None, ""):
        raise BadInput(f"{where}: its ssl extra is not a mapping: give {{\"ca\": ..., \"cert\": ..., \"key\": ...}} "
                       "or the extras ssl_mode, ssl_ca, ssl_cert, ssl_key")
    query: dict[str, str] = {}
    for name, value in extra.items():
        if not value:
            continue
        if tls.is_tls_parameter(name):
            key = tls.parameter_name(name)
            if key in tls_extras:
                raise BadInput(f"{where} gives {key} twice (as the extra {name} and in its ssl mapping): give it once")
            tls_extras[key] = str(value)
        else:
            query[name] = str(value)
    query.update(tls_extras)
    auth = ""
    if conn.login:
        auth = quote_plus(conn.login) + (f":{quote_plus(conn.password)}" if conn.password else "") + "@"
    host = (conn.host or "localhost") + (f":{conn.port}" if conn.port else "")
    schema = f"/{quote_plus(conn.schema)}" if conn.schema else ""
    return f"{prefix}://{auth}{host}{schema}" + (f"?{urlencode(query)}" if query else "")


class NexusTenantHook(BaseHook):
    conn_name_attr = "nexus_conn_id"
    default_conn_name = "nexus_tenant_default"
    hook_name = "Nexus tenant database"

    def __init__(self, nexus_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nexus_conn_id = nexus_conn_id

    def read_pool(self) -> str | None:
        """The connection's extra ``nexus_read_pool`` (its database cluster's Airflow pool for heavy reads); None
        without one, or without the connection (its run then stops at its first read, naming the connection)."""
        from nexus_airflow.params import READ_POOL_EXTRA

        try:
            pool = self.get_connection(self.nexus_conn_id).extra_dejson.get(READ_POOL_EXTRA)
        except Exception:  # noqa: BLE001 - AirflowNotFoundException and secrets-backend errors alike
            return None
        return str(pool) if pool else None

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
            uri = mysql_dsn_of(conn, self.nexus_conn_id)
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

    @cached_property
    def tls_settings(self) -> tls.TlsSettings | None:
        """The TLS the connection is made with (None for SQLite); :class:`BadInput` when its extras are bad."""
        url = parse_dsn(self._dsn)
        if url.drivername.startswith("sqlite"):
            return None
        _, values = tls.split_tls(dict(url.query))
        return tls.settings_of(values, local=tls.is_local_host(url.host, dict(url.query)),
                               where=f"connection {self.nexus_conn_id!r}")

    @property
    def tls_text(self) -> str:
        """``TLS VERIFY_IDENTITY`` (see :meth:`nexus_cutover.tls.TlsSettings.describe`), or ``no TLS (SQLite file)``."""
        settings = self.tls_settings
        return settings.describe() if settings is not None else "no TLS (SQLite file)"

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
        """The DSN with its TLS parameters, only to be placed in a child process's environment (``NEXUS_TENANT_DSN``);
        never log it. Registered with Airflow's secrets masker first, with each secret it carries (the password, a
        query password, the key's path), so a log line that quotes it shows ``***``."""
        from airflow.sdk.log import mask_secret

        for secret in dsn_secrets(self._dsn):
            mask_secret(secret)
        return self._dsn
