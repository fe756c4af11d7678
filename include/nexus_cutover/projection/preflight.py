"""The fleet preflight: every tenant's ``plan`` verdict, read with bounded concurrency, as one table.

Before a fence is armed anywhere, a rollout asks each tenant what ``nexus-cutover plan``
would say: proceed, wait (for what) or stop (on which finding), with its old work
remaining, its live old writers and the drain's ETA when known.

Invariants:

* One rule: each tenant's verdict is :func:`.dry_run.plan`'s, the function behind
  ``nexus-cutover plan`` (same steps, same declared verdicts); nothing is re-judged here.
* Read only, like ``plan``: nothing is armed, created or written in any tenant database.
* At most ``concurrency`` tenants are read at once (a thread pool of that size; each
  tenant's engine is opened and disposed inside its own slot).
* One row per tenant, in the order given, whatever happens to the others: a
  database that cannot be reached, a connection that does not exist or a refusal of
  the dry run itself is that tenant's ``stop`` row with the reason in words (never a
  driver traceback, never a DSN), never an exception of the whole preflight.
* No Airflow here: the caller opens each tenant's engine (``open_engine``), so a DSN
  never passes through this module's results.
"""

from __future__ import annotations

import contextlib
import csv
import io
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Engine

from ..db import make_engine
from ..errors import BadInput, CutoverError
from ..spreadsheet import safe_cell
from .dry_run import PlanOptions, plan

PROCEED, WAIT, STOP, DONE = "proceed", "wait", "stop", "done"
DEFAULT_CONCURRENCY = 8
MAX_CONCURRENCY = 64
#: The table's columns, in order (the XCom rows' keys, the CSV's header, the log table's columns).
COLUMNS = ("tenant", "verdict", "reason", "old_work_remaining", "live_old_writers", "drain_eta_min", "drain_eta",
           "packs", "plan_verdict", "seconds")

EngineOpener = Callable[[str], AbstractContextManager[Engine]]


def preflight(tenants: Sequence[str], open_engine: EngineOpener, options: Callable[[str], PlanOptions], *,
              concurrency: int = DEFAULT_CONCURRENCY) -> list[dict[str, Any]]:
    """One row per tenant (see :data:`COLUMNS`), in the order of ``tenants``, read ``concurrency`` at a time.

    ``open_engine(tenant)`` is a context manager yielding the tenant's engine (and disposing it);
    ``options(tenant)`` the dry run's options. Raises :class:`BadInput` only for a concurrency out of
    ``1..MAX_CONCURRENCY``, before any tenant is read."""
    if not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise BadInput(f"preflight concurrency must be an integer in 1..{MAX_CONCURRENCY}, got {concurrency!r}")
    if not tenants:
        return []
    with ThreadPoolExecutor(max_workers=min(concurrency, len(tenants)), thread_name_prefix="preflight") as pool:
        return list(pool.map(lambda t: tenant_row(t, open_engine, options), tenants))


def tenant_row(tenant: str, open_engine: EngineOpener, options: Callable[[str], PlanOptions]) -> dict[str, Any]:
    """One tenant's row: its plan's verdict, or ``stop`` with why its plan could not be read."""
    started = time.monotonic()
    try:
        with open_engine(tenant) as engine:
            out = plan(engine, options(tenant))
    except Exception as exc:  # noqa: BLE001 - one tenant's failure is its row, never the fleet's
        return _row(tenant, STOP, why_unreadable(exc), started, plan_verdict=f"{STOP}: {why_unreadable(exc)}")
    return _row(tenant, *split_verdict(out["verdict"]), started, plan_verdict=out["verdict"], out=out)


def split_verdict(verdict: str) -> tuple[str, str]:
    """``("wait", "the drain (...)")`` from ``"wait: the drain (...)"``; ``("proceed", "")`` from ``"proceed"``."""
    word, _, reason = verdict.partition(": ")
    return word, reason


def why_unreadable(exc: BaseException) -> str:
    """The reason a tenant's plan could not be read, in words: a contract error's own message (it names what to
    fix and never holds a DSN), else the error's kind and its first line."""
    if isinstance(exc, CutoverError):
        return str(exc) or type(exc).__name__
    first = (str(exc).splitlines() or [""])[0][:300]
    if "://" in first or "@" in first:  # it may quote a DSN: its kind only (the XCom, the log and the CSV show it)
        first = ""
    return f"the plan could not be read ({type(exc).__name__}{': ' + first if first else ''})"


def _row(tenant: str, verdict: str, reason: str, started: float, *, plan_verdict: str,
         out: dict[str, Any] | None = None) -> dict[str, Any]:
    drain = (out or {}).get("drain") or {}
    remaining = drain.get("remaining")
    eta_min, eta = drain_eta(drain)
    return {"tenant": tenant, "verdict": verdict, "reason": reason, "old_work_remaining": remaining,
            "live_old_writers": list(((out or {}).get("writers") or {}).get("live") or []),
            "drain_eta_min": eta_min, "drain_eta": eta, "packs": list((out or {}).get("packs") or []),
            "plan_verdict": plan_verdict, "seconds": round(time.monotonic() - started, 3)}


def drain_eta(drain: dict[str, Any]) -> tuple[int | None, str]:
    """The drain's ETA from one look: 0 when drained; unknown otherwise (a rate needs two looks apart in time:
    the rollout page measures it while the tenant's run drains). Never guessed."""
    if not drain:
        return None, "not read"
    if drain.get("state") == "drained":
        return 0, "drained"
    if drain.get("state") == "stuck":
        return None, "never on its own (stuck)"
    return None, f"unknown from one look ({drain.get('remaining')} remaining)"


# -- the table, as the log and the CSV show it -------------------------------------------------------------------

def cell(row: dict[str, Any], column: str) -> str:
    """One value as text: lists joined with ``, ``, None as empty."""
    value = row.get(column)
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {v: sum(1 for r in rows if r.get("verdict") == v) for v in (PROCEED, WAIT, STOP, DONE)}


def text_table(rows: Sequence[dict[str, Any]]) -> str:
    """A readable table for a log: tenant, verdict, old work, live writers, drain ETA, reason (never cut)."""
    head = ("tenant", "verdict", "old work", "live writers", "drain ETA", "reason")
    body = [(r["tenant"], r["verdict"], cell(r, "old_work_remaining") or "-", str(len(r.get("live_old_writers") or [])),
             cell(r, "drain_eta"), cell(r, "reason") or "-") for r in rows]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head[:-1])]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
             for line in [head, *body]]
    c = counts(rows)
    return "\n".join(lines + [f"{len(rows)} tenant(s): {c[PROCEED]} proceed, {c[WAIT]} wait, {c[STOP]} stop, "
                              f"{c[DONE]} done (already cut over)"])


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The table as CSV (RFC 4180 quoting by the csv module: commas, quotes, newlines and trailing spaces of a
    hostile id survive a round trip; every cell quoted), one header line of :data:`COLUMNS`; a cell a spreadsheet
    would run as a formula gets a leading ``'`` (:func:`nexus_cutover.spreadsheet.safe_cell`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([safe_cell(cell(row, c)) for c in COLUMNS])
    return buffer.getvalue()


@contextlib.contextmanager
def engine_of(url: str, *, connect_timeout: float = 10.0):
    """An engine on ``url`` for one tenant's read, disposed afterwards (tests, bench and the command line)."""

    engine = make_engine(url, connect_timeout=connect_timeout)
    try:
        yield engine
    finally:
        engine.dispose()
