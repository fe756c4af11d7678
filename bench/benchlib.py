"""Shared plumbing of the bench scripts: the results file, throwaway databases, the server under test.

* Figures go to ``$NEXUS_BENCH_RESULTS`` (default ``bench/results.json``), merged
  key by key, so each script owns its keys and a QUICK run (the CI smoke test)
  never overwrites the recorded full figures.
* Every figure is the median of its repetitions (3 in a full run); the
  repetitions themselves go to the results file's ``samples`` (figure ->
  list), which is merged figure by figure like the top-level keys.
* Every measurement runs in a fresh database on the server named by
  ``NEXUS_TEST_MYSQL_URL`` (what ``scripts/with-mariadb.sh`` exports), dropped
  afterwards, whatever happens. The DSN is never printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine

BENCH = Path(__file__).resolve().parent
DEFAULT_RESULTS = BENCH / "results.json"


def results_path() -> Path:
    return Path(os.environ.get("NEXUS_BENCH_RESULTS") or DEFAULT_RESULTS)


def merge_results(figures: dict) -> Path:
    """Merge ``figures`` into the results file (other scripts' keys are kept)."""
    return merge_results_to(results_path(), figures)


def merge_results_to(path: Path, figures: dict) -> Path:
    merged = json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}
    samples = {**merged.get("samples", {}), **figures.get("samples", {})}
    merged.update(figures)
    if samples:
        merged["samples"] = samples
    path.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str) + "\n")
    return path


#: Flush-rate limits (pages/s) while :func:`settle` waits; the server's own are restored before anything is timed.
SETTLE_IO_CAPACITY = 20000


def settle(engine, limit_s: float = 120.0, below: int = 50) -> float:
    """Wait (bounded) until InnoDB has (almost) no dirty pages, flushing at full speed meanwhile; seconds waited.

    Timed runs must not race the page cleaner writing back what an earlier step dirtied. While waiting, the
    dirty-page target is 0 and the flush-rate limits (``innodb_io_capacity``, ``innodb_io_capacity_max``) are
    raised; all three are restored before returning, so no timed run sees a changed server. A server without
    these InnoDB counters (TiDB) is not waited for. Bench only.
    """
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        dirty = conn.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")).first()
        if dirty is None:
            return 0.0
        saved = conn.execute(
            text("SELECT @@GLOBAL.innodb_max_dirty_pages_pct, @@GLOBAL.innodb_io_capacity, @@GLOBAL.innodb_io_capacity_max")
        ).one()
        conn.execute(text("SET GLOBAL innodb_max_dirty_pages_pct = 0"))
        conn.execute(text("SET GLOBAL innodb_io_capacity_max = :v"), {"v": max(SETTLE_IO_CAPACITY, saved[2])})
        conn.execute(text("SET GLOBAL innodb_io_capacity = :v"), {"v": max(SETTLE_IO_CAPACITY, saved[1])})
        try:
            while int(dirty[1]) >= below and time.perf_counter() - started < limit_s:
                time.sleep(0.2)
                dirty = conn.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")).one()
        finally:
            conn.execute(text("SET GLOBAL innodb_io_capacity = :v"), {"v": saved[1]})
            conn.execute(text("SET GLOBAL innodb_io_capacity_max = :v"), {"v": saved[2]})
            conn.execute(text("SET GLOBAL innodb_max_dirty_pages_pct = :v"), {"v": saved[0]})
    return time.perf_counter() - started


def median(samples) -> float:
    """The median of a figure's repetitions (the figure itself); at least one is required."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("a figure needs at least one repetition")
    return statistics.median(values)


def figure(name: str, samples, digits: int = 3) -> dict:
    """``{name: median, "samples": {name: [each repetition]}}``, ready for :func:`merge_results`."""
    values = [round(float(v), digits) for v in samples]  # as precise as the figure: its median lies within them
    return {name: round(median(values), digits), "samples": {name: values}}


def figures(**named) -> dict:
    """Several :func:`figure` results in one dict: ``figures(a=[...], b=([...], digits))``."""
    out: dict = {"samples": {}}
    for name, spec in named.items():
        values, digits = spec if isinstance(spec, tuple) else (spec, 3)
        one = figure(name, values, digits)
        out["samples"].update(one.pop("samples"))
        out.update(one)
    return out


def server_url() -> str:
    url = os.environ.get("NEXUS_TEST_MYSQL_URL", "").strip()
    if not url:
        sys.exit("set NEXUS_TEST_MYSQL_URL (or run through scripts/with-mariadb.sh)")
    return url


def server_version() -> str:
    engine = make_engine(make_url(server_url()).set(database="mysql"))
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT VERSION()")).scalar_one())
    finally:
        engine.dispose()


@contextlib.contextmanager
def fresh_database(prefix: str = "bench", charset: str | None = None) -> Iterator[str]:
    """A new empty database on the server (in ``charset``, else the server's default); yields its URL
    (with password: never print it)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    server = make_url(server_url())
    admin = make_engine(server.set(database="mysql"))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`" + (f" CHARACTER SET {charset}" if charset else "")))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
