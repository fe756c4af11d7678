"""Helpers shared by tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, Table, select, text
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps

#: Backends of ``collated_tenant_url`` (conftest.py) -> (charset, collation) of the database: the embedded SQLite
#: default (BINARY), and MySQL-protocol databases created ``CHARACTER SET utf8mb4`` with the server's default utf8mb4
#: collation (MariaDB 10.11: ``utf8mb4_general_ci``, case-insensitive, PAD SPACE) and with ``utf8mb4_bin`` (binary,
#: PAD SPACE, as TiDB's default). The server's own default character set (MariaDB 10.11: latin1) is ``mysql_url``'s.
COLLATED_BACKENDS = {"sqlite": None, "mysql-utf8mb4": ("utf8mb4", None), "mysql-utf8mb4_bin": ("utf8mb4", "utf8mb4_bin")}

_SQL_NAME = re.compile(r"^[A-Za-z0-9_]+$")


@contextlib.contextmanager
def mysql_database(server_url: str, *, charset: str | None = None, collation: str | None = None) -> Iterator[str]:
    """A fresh, empty database on the MySQL-protocol server at ``server_url``; its URL; dropped afterwards.

    ``charset`` / ``collation`` become the database's defaults (so every table created in it, e.g. by
    ``create_legacy_schema``, has them); None keeps the server's. Names are checked against ``[A-Za-z0-9_]+``.
    """
    options = []
    for keyword, value in (("CHARACTER SET", charset), ("COLLATE", collation)):
        if value is not None:
            if not _SQL_NAME.match(value):
                raise ValueError(f"not a character set or collation name: {value!r}")
            options.append(f"{keyword} {value}")
    name = f"nx_{uuid.uuid4().hex[:12]}"
    server = make_url(server_url)
    admin = make_engine(server.set(database="mysql"))
    try:
        with admin.begin() as conn:
            conn.execute(text(" ".join([f"CREATE DATABASE `{name}`", *options])))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.begin() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()


def table_checksum(engine: Engine, table: Table) -> str:
    """A digest of every row of ``table`` (all columns present in the database), in primary-key order."""
    from sqlalchemy import inspect

    present = {c["name"] for c in inspect(engine).get_columns(table.name)}
    cols = [c for c in table.columns if c.name in present]
    digest = hashlib.sha256()
    with engine.connect() as conn:
        for row in conn.execute(select(*cols).order_by(*table.primary_key.columns)):
            digest.update(repr(tuple(row)).encode())
    return digest.hexdigest()


def history_checksum(engine: Engine) -> tuple[str, str]:
    """Checksums of ``_System_Event`` and ``_System_WorkItem``: the history the pipeline must never change."""
    return table_checksum(engine, catalog.Event), table_checksum(engine, catalog.WorkItem)


def make_cutover_ready(engine: Engine) -> None:
    """Part A plus the projection Part B objects (cutover step 1 applied)."""
    create_legacy_schema(engine)
    apply_steps(engine, projection_steps(engine))


@contextlib.contextmanager
def prepared_engine(url: str, prepare: Callable[[Engine], None]) -> Iterator[Engine]:
    """An engine on ``url`` after ``prepare(engine)`` (e.g. a schema step); disposed afterwards."""
    engine = make_engine(url)
    try:
        prepare(engine)
        yield engine
    finally:
        engine.dispose()


def fence_pack_namespace(engine: Engine, pack_install_id: str, armed_by: str = "test") -> None:
    """Arm the cutover fence (cutover step 1) of ``pack_install_id``'s namespace, as the checkpoint's precondition needs.

    Does nothing for an unknown pack (the checkpoint's own error is what such a test checks).
    """
    from nexus_cutover.projection.cutover_fence import arm_fence

    with engine.connect() as conn:
        namespace = conn.execute(
            select(catalog.PackInstall.c.Namespace).where(catalog.PackInstall.c.PackInstallId == pack_install_id)
        ).scalar()
    if namespace is not None:
        arm_fence(engine, namespace, armed_by=armed_by, timeout_s=30)
