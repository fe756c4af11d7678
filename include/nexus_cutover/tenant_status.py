"""One tenant's cutover state, as the status view and ``nexus-cutover status`` show it (read only).

:func:`read_tenant_state` returns a JSON-ready dict: the admission fence, the
drain of old projection work, the checkpoint of every active pack, the new
host(s), receipt materialization and the Field History stage. Read only: it
never writes to the tenant database. Each section fails on its own (a tenant
before the additive schema has no checkpoint table yet); the error text names
what is missing and never contains a DSN or a password. The packs and receipts sections read every pack of the
namespace in one statement, or one per hundred packs, never one per pack (TiDB bounds a transaction's statements; a
namespace may hold thousands of packs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, select

from . import catalog, tx
from .above_cutoff import packs_above_cutoff
from .admission_fences import cutover_fences, fences_in_force
from .clock import utc_text, utcnow
from .code_version import version_in_reason
from .db import make_engine, translate_errors
from .errors import CutoverError
from .field_history.status import read_status
from .liveness import DEFAULT_STALE_HEARTBEAT_S
from .projection.cutover_fence import admission_pause_s, last_released_cutover_fence
from .projection.drain import drain_report
from .projection.writers import readiness
from .protocol_row import active_protocol_rows
from .runtime.activation import active_packs
from .schema import has_column, has_table
from .standing import is_cut_over

STALE_HEARTBEAT = dt.timedelta(seconds=DEFAULT_STALE_HEARTBEAT_S)


def _section(fn: Callable[[], dict[str, Any]], what: str) -> dict[str, Any]:
    """``fn()``, or ``{"error": ...}`` saying in words why that section could not be read (never a driver repr)."""
    try:
        with translate_errors(f"reading the {what}"):
            return fn()
    except CutoverError as exc:
        return {"error": str(exc).splitlines()[0][:300]}
    except Exception as exc:  # noqa: BLE001 - one unreadable section must not hide the others
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def _reachable(engine: Engine) -> None:
    """Raise :class:`~nexus_cutover.errors.Unreachable` (exit 1) when the tenant database cannot be read at all:
    a state made of nothing but errors would read as "not started"."""
    tx.read(engine, lambda conn: conn.execute(select(1)).scalar(), what="reading the tenant's state")


def _fence(engine: Engine, ns: str) -> dict[str, Any]:
    """The fence section; ``holder`` is who holds the cutover fence in force, ``last_holder`` who released the
    last one (the run a person wants to read about: the one that holds the tenant or last changed it)."""

    with tx.reading(engine, "reading the admission fences") as conn:
        fences = fences_in_force(conn, ns, utcnow())
        cutover = cutover_fences(fences)
        last = None if cutover else last_released_cutover_fence(conn, ns)
    if len(cutover) > 1:
        text = (f"STOP: {len(cutover)} cutover fences in force ("
                + "; ".join(f"fence {f['FenceId']} by {f['ArmedBy']}" for f in cutover)
                + "): every step refuses until the tenant's delivery owner releases all but one")
    elif cutover:
        f = cutover[0]
        release = version_in_reason(f["Reason"])
        text = (f"armed (fence {f['FenceId']} '*' since {utc_text(f['ArmedAt'])}, by {f['ArmedBy']}"
                + (f" on nexus-cutover {release})" if release else ")"))
    elif fences:
        text = f"{len(fences)} other fence(s) in force"
    else:
        text = "none in force (admission open)"
    pause = admission_pause_s(last) if last else None
    if pause is not None:
        text += f"; last admission pause {pause:.1f} s (fence {last['FenceId']})"
    return {"armed": bool(cutover), "in_force": len(fences), "cutover_fences": len(cutover), "text": text,
            "held_by": [f["ArmedBy"] for f in cutover], "holder": cutover[0]["ArmedBy"] if len(cutover) == 1 else None,
            # the product version that armed or adopted the fence in force (None: not recorded)
            "holder_version": version_in_reason(cutover[0]["Reason"]) if len(cutover) == 1 else None,
            "last_holder": last["ArmedBy"] if last else None, "admission_pause_s": pause,
            "last_fence": {k: last[k] for k in ("FenceId", "ArmedBy", "ArmedAt", "ReleasedAt", "ReleasedBy")}
            if last else None}


def _drain(engine: Engine, ns: str) -> dict[str, Any]:
    r = drain_report(engine, ns, deadline=utcnow() + dt.timedelta(hours=1), stale_heartbeat=STALE_HEARTBEAT,
                     sample_limit=5)
    return {"remaining": r.remaining, "counts": dict(r.counts), "state": r.state, "text": r.counts_text(),
            "live_old_workers": list(r.live_old_workers), "ordinary_live": r.ordinary_live,
            "blockers": {k: v for k, v in r.blocker_totals.items() if v}}


def _packs(engine: Engine, ns: str) -> list[dict[str, Any]]:
    """Every active pack with its checkpoint and its old work above the cutoff: a few statements whatever the
    number of packs (a namespace may hold thousands; one read-only transaction, TiDB bounds its statements)."""

    out = []
    with tx.reading(engine, "reading the packs and their checkpoints") as conn:
        table = has_table(conn, catalog.ConnectorProjectionProtocol.name)
        packs = active_packs(conn, ns)
        rows = active_protocol_rows(conn, ns) if table else {}
        checkpointed = [(pack, rows[pack].legacy_max_ordinal) for pack in packs if pack in rows]
        above = {found.pack_install_id: found for found in packs_above_cutoff(conn, checkpointed)}
        for pack in packs:
            row = rows.get(pack)
            out.append({
                "pack_install_id": pack,
                "checkpoint": None if row is None else {
                    "protocol_version": row.protocol_version, "legacy_max_ordinal": row.legacy_max_ordinal,
                    "written_at": row.written_at.isoformat() if row.written_at else None,
                    "written_by": row.written_by},
                # old-protocol work an old runtime admitted above the cutoff: a stop, not "checkpointed"
                "old_work_above_cutoff": above[pack].as_json() if pack in above else None,
            })
    return out


def _hosts(engine: Engine, ns: str) -> dict[str, Any]:
    r = readiness(engine, ns, stale_heartbeat=STALE_HEARTBEAT)
    hosts = [{k: h[k] for k in ("process_id", "state", "binary_version", "activated_at", "heartbeat_age_s")}
             for h in r.hosts]
    return {"ready": r.ready, "reasons": list(r.reasons), "hosts": hosts,
            "live_old_writers": [p["process_id"] for p in r.live_old_writers]}


def _receipts(engine: Engine, ns: str) -> dict[str, Any]:
    """The ingress receipts of the namespace's active packs, counted in one statement (a range of
    ``ix_IngressReceipt_Pending`` per pack, joined from ``ix_PackInstall_Namespace``)."""
    t, p = catalog.IngressReceipt, catalog.PackInstall
    with tx.reading(engine, "reading the ingress receipts") as conn:
        total, materialized = conn.execute(
            select(func.count(t.c.PackInstallId), func.count(t.c.MaterializedAt))
            .select_from(p.join(t, t.c.PackInstallId == p.c.PackInstallId))
            .where(p.c.Namespace == ns, p.c.Status == catalog.PACK_ACTIVE)
        ).one()
    return {"total": int(total), "materialized": int(materialized)}


def field_history_stage(d: dict[str, Any], *, switches_final: bool) -> tuple[int, str]:
    """The seed-003 stage the tenant has completed, from a ``field-history-eligibility status`` dict.

    ``switches_final``: both switches at their stage-3 values (``FieldHistorySettings.final``, the one rule).
    """
    if switches_final:
        return 3, "stage 3 done: boolean-only reads, sequence reservation off"
    if d.get("materializable_rows", 1) == 0 and d.get("eligible_null_rows", 1) == 0:
        return 2, "stage 2 done: no materializable or eligible NULL row left (compat reads)"
    return 1, "stage 1: column present; materialization not finished"


def _field_history(engine: Engine, ns: str) -> dict[str, Any]:
    if not has_column(engine, catalog.FIELD_HISTORY_ELIGIBLE):
        return {"stage": 0, "stage_text": "stage 0: FieldHistoryEligible column absent"}
    status = read_status(engine, ns)
    d = status.as_json()
    stage, text = field_history_stage(d, switches_final=status.settings.final)
    decided = d["rows_by_value"]["true"] + d["rows_by_value"]["false"]
    return {"stage": stage, "stage_text": text, "rows_text": status.rows.text(), "read_mode": d["read_mode"],
            "sequence_reservation_enabled": d["sequence_reservation_enabled"],
            "null_rows": d["null_rows"], "eligible_null_rows": d["eligible_null_rows"],
            "materializable_rows": d["materializable_rows"], "decided_rows": decided,
            "total_rows": d["total_rows"]}


def read_tenant_state(bind: Engine | str, tenant: str) -> dict[str, Any]:
    """The tenant's state; ``bind`` is an engine (kept open) or a DSN (an engine made and disposed of here).

    Raises :class:`~nexus_cutover.errors.Unreachable` when the database cannot be reached at all; a section
    that cannot be read on its own carries its ``error``.
    """
    engine = make_engine(bind, connect_timeout=5.0) if isinstance(bind, str) else bind
    try:
        _reachable(engine)
        state: dict[str, Any] = {"tenant": tenant, "checked_at": utcnow().isoformat(timespec="seconds") + "Z"}
        state["fence"] = _section(lambda: _fence(engine, tenant), "admission fences")
        state["drain"] = _section(lambda: _drain(engine, tenant), "old projection work")
        packs = _section(lambda: {"packs": _packs(engine, tenant)}, "packs and their checkpoints")
        state["packs"] = packs.get("packs", [])
        if "error" in packs:
            state["packs_error"] = packs["error"]
        state["host"] = _section(lambda: _hosts(engine, tenant), "process registry")
        state["hosts"] = state["host"].get("hosts", [])
        state["receipts"] = _section(lambda: _receipts(engine, tenant), "ingress receipts")
        state["field_history"] = _section(lambda: _field_history(engine, tenant), "Field History state")
        state["field_history"].setdefault("stage_text", state["field_history"].get("error", "unknown"))
        state["phase"] = phase(state)
        return state
    finally:
        if isinstance(bind, str):
            engine.dispose()


def phase(state: dict[str, Any]) -> str:
    """One chip for the list: where the cutover stands. ``stop``: a pack holds old-protocol work above its cutoff,
    or several cutover fences are in force; either needs a person's decision, nothing goes on by itself.
    ``cut over``: the one definition (:func:`nexus_cutover.standing.is_cut_over`), as the rollout and ``plan``
    read it; the new host's health is its own section."""

    packs = state.get("packs") or []
    all_cut = bool(packs) and all(p["checkpoint"] for p in packs)
    fence = state.get("fence", {})
    above = [p for p in packs if p.get("old_work_above_cutoff")]
    if above or fence.get("cutover_fences", 0) > 1:
        return "stop"
    if "error" not in fence and is_cut_over(packs=len(packs), checkpointed=sum(1 for p in packs if p["checkpoint"]),
                                            cutover_fences=fence.get("cutover_fences", 0), above_cutoff=len(above)):
        return "cut over"
    if all_cut:
        return "checkpointed"
    if fence.get("armed"):  # what the tenant's people see is the pause; the drain is why it may still last
        return PAUSED_AND_DRAINING if state.get("drain", {}).get("remaining") else PAUSED
    return "not started"


#: The phases of a tenant whose admission a cutover fence pauses: its old work still draining, or drained (the
#: writers' stop, the confirmation and the checkpoint to come). Words a person sees, not the drain's state names.
PAUSED_AND_DRAINING, PAUSED = "paused and draining", "paused"
