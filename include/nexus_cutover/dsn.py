"""Tenant DSNs as text: where they come from, whether they are well formed, and how they may be shown.

Split out of :mod:`nexus_cutover.db`, which re-exports every name here (importers may keep ``from .db import ...``).
Nothing here opens a connection: :mod:`nexus_cutover.db` makes the engines.

Invariants:

* A DSN comes only from the environment (:func:`dsn_from_env`; or, in Airflow, from a connection);
  it is validated here (:func:`parse_dsn`) and only ever printed through :func:`mask_dsn`.
* Two dialect families are accepted: MySQL protocol (TiDB, MySQL, MariaDB via
  ``mysql+pymysql`` / ``mysql+mysqldb``: :data:`MYSQL_DRIVERS`) and SQLite (the embedded default:
  :data:`SQLITE_DRIVERS`); any other scheme is :class:`~nexus_cutover.errors.BadInput`.
* :func:`mask_dsn` is the one masking function of the project and never raises; which query parameters it hides
  is :func:`is_secret_parameter`'s rule, and :func:`dsn_secrets` / :func:`hide_dsn_secrets` hide the same
  values in free text. A malformed DSN is never echoed, not even its password.
* A new host's environment (:func:`host_environment`) carries the tenant DSN and nothing of Airflow's or of any
  variable whose name says it holds a secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import quote_plus

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from . import settings
from .errors import BadInput

DSN_ENV_CUTOVER = "CONNECTOR_CUTOVER_DSN"
DSN_ENV_TENANT = "NEXUS_TENANT_DSN"
#: The delivery ledger's database (``nexus-cutover report``; :mod:`nexus_cutover.ledger`): never a tenant's.
DSN_ENV_LEDGER = "NEXUS_LEDGER_DSN"

#: The SQLAlchemy schemes accepted, by dialect family (:func:`parse_dsn`; :func:`~nexus_cutover.db.make_engine`
#: builds its engine by them).
MYSQL_DRIVERS = {"mysql", "mysql+pymysql", "mysql+mysqldb", "mariadb+pymysql", "mariadb+mysqldb"}
SQLITE_DRIVERS = {"sqlite", "sqlite+pysqlite"}


def dsn_from_env(*names: str) -> str:
    """The first non-empty variable of ``names``; :class:`BadInput` naming them all if none. A name that is a
    setting's alias (``NEXUS_TENANT_DSN``) is read as that setting (:func:`nexus_cutover.settings.value`)."""
    for name in names:
        setting = settings.BY_ALIAS.get(name)
        value = (settings.value(setting.name) or "") if setting else os.environ.get(name, "").strip()
        if value:
            return value
    raise BadInput(
        "no tenant database given: set "
        + " or ".join(names)
        + " to an SQLAlchemy URL such as mysql+pymysql://user:pw@host:3306/tenant_db or sqlite:///path"
    )


def parse_dsn(dsn: str) -> URL:
    """Validate ``dsn``; :class:`BadInput` (never echoing the password) when malformed."""
    try:
        url = make_url(dsn)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise BadInput(
            "malformed DSN: expected an SQLAlchemy URL such as "
            "mysql+pymysql://user:pw@host:3306/tenant_db or sqlite:///path"
        ) from exc
    driver = url.drivername
    if driver in SQLITE_DRIVERS:
        is_file = url.database and url.database != ":memory:" and not url.database.startswith("file:")
        if is_file and not os.path.exists(url.database):
            raise BadInput(f"malformed DSN: SQLite database file {url.database!r} does not exist")
        return url
    if driver in MYSQL_DRIVERS:
        if not url.host:
            raise BadInput(f"malformed DSN: {mask_dsn(url)} has no host")
        if "@" in url.host:  # an unencoded '@' in the password: its tail was taken for the host
            raise BadInput("malformed DSN: the host contains '@'; write an '@' of the user name or password as %40")
        if not url.database:
            raise BadInput(f"malformed DSN: {mask_dsn(url)} names no database (the tenant schema)")
        return url
    raise BadInput(
        f"malformed DSN: unsupported scheme {driver!r}; use mysql+pymysql://, mysql+mysqldb:// or sqlite:///"
    )


#: Query-parameter names (lower case, ``-`` read as ``_``) whose value :func:`mask_dsn` hides, by what they contain.
SECRET_PARAMETER_WORDS = ("password", "passwd", "pwd", "secret", "token", "credential")
#: ...and by how they end: TLS key material (``ssl_key``, ``ssl-key``, ``key``, ``private_key``, ``api_key``).
SECRET_PARAMETER_ENDINGS = ("key",)
#: The ``ssl`` parameter is hidden unless it is one of these words: as an Airflow connection's ``ssl`` extra it is a
#: mapping (``{'ca': ..., 'key': ...}``) that may carry key material.
_PLAIN_SSL_VALUES = {"", "0", "1", "true", "false", "yes", "no", "on", "off", "required", "disabled", "preferred"}
MASK = "***"
MALFORMED = "<malformed DSN>"
_MASK_TOKEN = "NEXUSMASKEDVALUE"  # rendered as is by SQLAlchemy, then shown as MASK


def is_secret_parameter(name: str, value: str = "") -> bool:
    """Whether :func:`mask_dsn` hides the value of the DSN query parameter ``name`` (see its docstring)."""
    key = name.strip().lower().replace("-", "_")
    if any(word in key for word in SECRET_PARAMETER_WORDS) or key.endswith(SECRET_PARAMETER_ENDINGS):
        return True
    return key == "ssl" and str(value).strip().lower() not in _PLAIN_SSL_VALUES


def mask_dsn(dsn: str | URL) -> str:
    """``dsn`` as it may be shown: every secret it carries replaced by ``***``; never raises.

    The one masking function of the project: every log line, message and page that shows a DSN shows this.
    Hidden: the password before the ``@``; the value of every query parameter whose name (case-insensitive,
    ``-`` read as ``_``) contains ``password``, ``passwd``, ``pwd``, ``secret``, ``token`` or ``credential``
    (PyMySQL takes ``?password=``/``?passwd=`` as the password), or ends in ``key`` (``ssl_key``, ``ssl-key``,
    ``key``: TLS key material; PyMySQL reads ``ssl_key`` as a file path, but a path to a private key is hidden too,
    since the text cannot tell a path from key contents); and ``ssl`` unless it is a plain switch such as
    ``true`` (an Airflow connection's ``ssl`` extra is a mapping that may hold the key). Certificate paths
    (``ssl_ca``, ``ssl_cert``) and every other parameter are shown: they are not secret and they help find a
    wrong setting. A DSN that cannot be parsed, or whose host contains ``@`` (part of an unencoded password,
    see :func:`parse_dsn`), is shown as ``<malformed DSN>``.
    """
    try:
        url = dsn if isinstance(dsn, URL) else make_url(dsn)
        if url.host and "@" in url.host:
            return MALFORMED
        query = {name: tuple(_MASK_TOKEN if is_secret_parameter(name, v) else v for v in values)
                 if isinstance(values, tuple) else (_MASK_TOKEN if is_secret_parameter(name, values) else values)
                 for name, values in url.query.items()}
        return url.set(query=query).render_as_string(hide_password=True).replace(_MASK_TOKEN, MASK)
    except Exception:  # noqa: BLE001 - a malformed DSN is shown as a placeholder only
        return MALFORMED


def dsn_secrets(dsn: str) -> list[str]:
    """The secret values ``dsn`` carries (those :func:`mask_dsn` hides), as written and percent-decoded; never raises."""
    found = {dsn}  # the whole DSN, should a message quote it
    try:
        url = make_url(dsn)
    except Exception:  # noqa: BLE001 - unparseable: only the whole text is known to be secret
        return [dsn] if dsn else []
    if url.password:
        found.add(str(url.password))
    for name, values in url.query.items():
        for value in values if isinstance(values, tuple) else (values,):
            if is_secret_parameter(name, value):
                found.update({value, quote_plus(value)})
    if url.host and "@" in url.host:  # an unencoded '@' in the password: everything between '://' and the last '@'
        found.add(dsn.split("://", 1)[-1].rsplit("@", 1)[0])
    return sorted((s for s in found if len(s) >= MIN_SECRET_SEARCHED), key=len, reverse=True)


def host_environment(environ: Mapping[str, str], dsn: str) -> dict[str, str]:
    """The environment a new host is started with: ``environ`` (its starter's) without what the host must not hold,
    and ``dsn`` as ``NEXUS_TENANT_DSN``, the one secret it needs (with its TLS parameters, so it connects as the run
    does). Withheld (:func:`withheld_from_host`): Airflow's configuration and connections (``AIRFLOW*``: the metadata
    database's URL, the Fernet key, the broker's password, every other tenant's connection), the other DSN variables,
    every setting declared secret (the ledger's DSN, the notify webhook), and every variable whose name says it
    holds a secret (as :func:`mask_dsn` reads a parameter's name). A setting
    given as ``AIRFLOW__NEXUS__<NAME>`` reaches the host as its alias ``NEXUS_<NAME>``, a secret one excepted."""
    env = {name: value for name, value in environ.items() if not withheld_from_host(name)}
    env.update(settings.host_aliases(environ))  # AIRFLOW__NEXUS__* is withheld: the host reads its NEXUS_* alias
    if dsn:
        env[DSN_ENV_TENANT] = dsn
    return env


def withheld_from_host(name: str) -> bool:
    """Whether :func:`host_environment` leaves the variable ``name`` out."""
    key = name.strip().upper()
    return (key.startswith("AIRFLOW") or key in (DSN_ENV_TENANT, DSN_ENV_CUTOVER) or is_secret_parameter(name)
            or key in _SECRET_ALIASES)


#: The aliases of the settings declared secret (the ledger's DSN, the notify webhook): a host needs none of them.
_SECRET_ALIASES = frozenset(s.alias for s in settings.SETTINGS if s.secret)


#: Secrets shorter than this are not searched for in free text by :func:`hide_dsn_secrets`: they would hide ordinary
#: words and protect nothing (a password that short is no secret).
MIN_SECRET_SEARCHED = 4


def hide_dsn_secrets(text: str, dsn: str) -> str:
    """``text`` (an error message, a driver's text) with the whole ``dsn`` shown masked and each secret it carries
    (:func:`dsn_secrets`) replaced by ``***``: the last guard before an error line is printed."""
    if dsn and dsn in text:
        text = text.replace(dsn, mask_dsn(dsn))
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, MASK)
    return text
