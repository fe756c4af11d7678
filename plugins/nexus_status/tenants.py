"""Which tenants the status view lists, how it opens them, and how often: the ``nexus_tenant_<tenant>`` connections.

Tenants are the Airflow connections whose id starts with ``nexus_tenant_``:
those in the metadata database and those defined as ``AIRFLOW_CONN_NEXUS_TENANT_*``
environment variables, all of them (no silent limit). Each is opened with
:class:`nexus_airflow.hooks.NexusTenantHook` (a connect timeout of
``CONNECT_TIMEOUT_S``); only the database kind and the TLS mode it was read with leave this module, never a DSN.

Invariants of :class:`StateCache` (the one every request of this API server shares):

* a tenant is read at most once per ``REFRESH_S`` (the page's refresh period),
  however many viewers ask: a fresh state is served from the cache, and a read
  already under way is joined, not repeated;
* a viewer waits for tenants never read yet, and for the page's rows at most
  ``fresh_wait_s`` (``FRESH_WAIT_S``) for the re-read of a state older than the
  interval; a state still older than the interval when it is served carries
  ``stale`` (when it was read, how long ago, and that a re-read is under way),
  so a row is either fresh or says so plainly (issue 34.5: the view opened
  after a run ended showed the state of minutes before beside the run's
  success). A fleet-wide filter (``fresh_wait_s`` 0) answers at once after the
  first sweep;
* reads run on a pool of ``READERS`` threads (bounded concurrency: a fleet of
  2,000 never opens 2,000 connections at once);
* ``reads`` counts every read per connection id (what the tests assert on and
  the JSON reports), and each completed read adds a drain sample (``history``).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from nexus_airflow.compat import model
from nexus_airflow.compat import session as metadata_session
from nexus_cutover import settings

PREFIX = "nexus_tenant_"
ENV_PREFIX = "AIRFLOW_CONN_" + PREFIX.upper()
REFRESH_S = settings.value("status_refresh_s")
READERS = settings.value("status_readers")
CONNECT_TIMEOUT_S = 5.0
#: How long one request waits for the reads it needs; a tenant still being read after that shows as such.
WAIT_S = settings.value("status_wait_s")
#: How long the page's rows wait for the re-read of a state older than the interval before being served as stale.
FRESH_WAIT_S = settings.value("status_fresh_wait_s")
#: The sections of ``read_tenant_state``: a tenant none of them can be read from is ``unreadable``.
SECTIONS = ("fence", "drain", "host", "receipts", "field_history")


def tenant_conn_ids() -> list[str]:
    """Every tenant connection id, sorted: the metadata DB's (one indexed LIKE query) and the environment's."""
    ids: set[str] = set()
    try:
        Connection = model("Connection")
        from sqlalchemy import select

        with metadata_session() as session:
            ids.update(session.execute(select(Connection.conn_id).where(Connection.conn_id.like(f"{PREFIX}%"))).scalars())
    except Exception:  # noqa: BLE001 - no metadata DB (e.g. a unit test): the environment still counts
        pass
    ids.update(k[len("AIRFLOW_CONN_"):].lower() for k in os.environ if k.startswith(ENV_PREFIX))
    return sorted(ids)


def tenant_of(conn_id: str) -> str:
    return conn_id[len(PREFIX):]


def read_tenant(conn_id: str) -> dict[str, Any]:
    """The state of the tenant behind ``conn_id``; ``phase`` ``unreadable`` with an ``error`` when it cannot be
    opened or none of its sections can be read (one unreadable section alone shows in that section)."""
    from nexus_airflow.hooks import NexusTenantHook
    from nexus_cutover.tenant_status import read_tenant_state

    tenant = tenant_of(conn_id)
    try:
        hook = NexusTenantHook(conn_id)
        engine = hook.get_engine(connect_timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - shown on the page; the hook's messages name no password
        return unreadable(conn_id, f"{type(exc).__name__}: {exc}")
    try:
        state = read_tenant_state(engine, tenant)
    except Exception as exc:  # noqa: BLE001 - one tenant's failure must not fail the fleet's page
        return unreadable(conn_id, f"{type(exc).__name__}: {exc}")
    finally:
        engine.dispose()
    state["conn_id"] = conn_id
    state["database"] = hook.masked_dsn.split("://", 1)[0]
    if hook.tls_settings is not None:  # the mode the view connected with (``TLS VERIFY_IDENTITY``); never a path or a key
        state["tls"] = hook.tls_text
    errors = [state[k]["error"] for k in SECTIONS if "error" in state.get(k, {})]
    if len(errors) == len(SECTIONS):  # opened, but nothing in it can be read: the database is gone or closed to us
        return {**unreadable(conn_id, errors[0]), "database": state["database"]}
    return state


def unreadable(conn_id: str, error: str) -> dict[str, Any]:
    from nexus_status.redact import redact

    return {"tenant": tenant_of(conn_id), "conn_id": conn_id, "phase": "unreadable", "error": redact(error)[:300]}


class StateCache:
    """Tenant states, each read at most once per ``interval_s`` on a bounded pool (see the module invariants)."""

    def __init__(self, reader: Callable[[str], dict[str, Any]] = read_tenant, *, interval_s: float = REFRESH_S,
                 workers: int = READERS, clock: Callable[[], float] = time.time):
        self.reader, self.interval_s, self.clock = reader, interval_s, clock
        self.reads: Counter[str] = Counter()
        self._entries: dict[str, tuple[float, dict[str, Any]]] = {}
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nexus-status-read")

    def get(self, conn_ids: Iterable[str], wait_s: float = WAIT_S, fresh_wait_s: float = 0.0) -> dict[str, dict[str, Any]]:
        """conn_id -> state for ``conn_ids``: the never-read ones read (or joined) now, waiting at most ``wait_s``;
        the ones older than the interval re-read, waiting at most ``fresh_wait_s`` for that, and served marked
        ``stale`` if still older than the interval then."""
        conn_ids = list(conn_ids)
        first_reads, rereads = self._due(conn_ids)
        if first_reads:
            wait(first_reads, timeout=wait_s)
        if rereads and fresh_wait_s > 0:
            wait(rereads, timeout=fresh_wait_s)
        with self._lock:
            now = self.clock()
            return {c: self._served(self._entries[c], now) if c in self._entries else unreadable(c, "read still in progress")
                    for c in conn_ids}

    def _served(self, entry: tuple[float, dict[str, Any]], now: float) -> dict[str, Any]:
        """A cached state as served: itself when read within the interval, else a copy that says it is stale."""
        read_at, state = entry
        age_s = now - read_at
        if age_s < self.interval_s:
            return state
        at = dt.datetime.fromtimestamp(read_at, dt.UTC).strftime("%H:%M:%S UTC")
        return {**state, "stale": {"read_at": dt.datetime.fromtimestamp(read_at, dt.UTC).isoformat(), "age_s": round(age_s),
                                   "text": f"stale: this row was read at {at} ({round(age_s)} s ago); a new read is under way"}}

    def settle(self, timeout_s: float = WAIT_S) -> None:
        """Wait for the reads under way (the background re-reads included)."""
        with self._lock:
            futures = list(self._inflight.values())
        wait(futures, timeout=timeout_s)

    def fresh(self, conn_id: str) -> dict[str, Any] | None:
        """The cached state of ``conn_id`` if read within the interval (no read started)."""
        with self._lock:
            entry = self._entries.get(conn_id)
        return entry[1] if entry and self.clock() - entry[0] < self.interval_s else None

    def _due(self, conn_ids: list[str]) -> tuple[list[Future], list[Future]]:
        """Start the reads ``conn_ids`` need; return those of the tenants with no state yet and those re-reading
        a state older than the interval."""
        now = self.clock()
        first_reads, rereads = [], []
        with self._lock:
            for conn_id in conn_ids:
                entry = self._entries.get(conn_id)
                if entry and now - entry[0] < self.interval_s:
                    continue
                future = self._inflight.get(conn_id)
                if future is None:
                    future = self._inflight[conn_id] = self._pool.submit(self._read, conn_id)
                (first_reads if entry is None else rereads).append(future)
        return first_reads, rereads

    def _read(self, conn_id: str) -> None:
        from nexus_status import history

        try:
            state = self.reader(conn_id)
        except Exception as exc:  # noqa: BLE001 - a reader bug shows on the tenant's row, not as a hung page
            state = unreadable(conn_id, f"{type(exc).__name__}: {exc}")
        if "error" not in state:
            history.record(state["tenant"], state, now=self.clock())
        with self._lock:
            self._entries[conn_id] = (self.clock(), state)
            self._inflight.pop(conn_id, None)
            self.reads[conn_id] += 1

    def total_reads(self) -> int:
        with self._lock:
            return sum(self.reads.values())

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


CACHE = StateCache()
