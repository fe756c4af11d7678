"""Helpers shared by tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, Table, select

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps


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
