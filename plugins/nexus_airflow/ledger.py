"""The delivery ledger from Airflow: the one place a run's events are recorded (:mod:`nexus_cutover.ledger`).

What is recorded, and from where (no other hook):

* every step's end (:func:`nexus_airflow.base.step_ended`, and each step of a fused task from
  :func:`~nexus_airflow.base.step_record_ended`): the events its result carries, by the declared table
  :data:`STEP_EVENTS` (the fence armed/reused/adopted with its holder, the drain done, the digest taken, each
  pack's checkpoint and cutoff, the host started, the fence released, the digest verified, a Field History gate);
* every step's failure (:func:`nexus_airflow.base.step_failed`): a ``stopped`` event with the reason;
* the questions (:mod:`nexus_airflow.hitl`, :mod:`nexus_airflow.rollout_confirm`): the evidence shown (its
  digest) when a question is asked, the answer (who, when, what, on which evidence) when it comes.

Invariants:

* Recording never blocks, fails or skips a step: every error is caught and logged here. The ledger's connection
  (:data:`LEDGER_CONN_ID`) is tried with a bound of a few seconds (:data:`TIMEOUT_S`).
* Never a silent loss: an event that cannot be written (the ledger down, no connection defined) is written to
  this machine's spool (:func:`spool_dir`, one JSON-lines file per call, fsynced) and counted
  (``nexus.ledger.spooled``); every later record call on the machine, any run's, first writes the spool to the
  ledger (:func:`catch_up`; counted as ``nexus.ledger.caught_up``, what is left as ``nexus.ledger.pending``).
  Writing is idempotent (each event's key), so a spool file caught up twice is one set of rows.
* A dry run records nothing (it is not a cutover), as it sends no metric.
* Nothing secret is recorded: ids, names, outcomes, digests and the reasons the task logs show.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import pathlib
import socket
import uuid
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

LEDGER_CONN_ID = "nexus_ledger"
#: The spool's directory (default ``$AIRFLOW_HOME/nexus-ledger-spool``).
SPOOL_DIR_ENV = "NEXUS_LEDGER_SPOOL_DIR"
#: The bound of one attempt to reach the ledger (connect, and each statement on PostgreSQL).
TIMEOUT_S = float(os.environ.get("NEXUS_LEDGER_TIMEOUT_S", "3"))
#: A spool file claimed by a flush that died is taken again after this long.
STALE_CLAIM_S = 600.0
_CLAIMED = ".claimed-"


# -- the connection ----------------------------------------------------------------------------------------------

def ledger_dsn(conn_id: str = LEDGER_CONN_ID) -> str | None:
    """The ledger's DSN from the Airflow connection ``conn_id`` (``sqlite``: the file path as host; ``mysql``: as a
    tenant's, TLS extras included; ``postgres``); None when the connection is not defined. Never logged: only
    :func:`nexus_cutover.db.mask_dsn` of it is."""
    from urllib.parse import quote_plus

    from airflow.sdk import BaseHook

    from nexus_airflow.hooks import mysql_dsn_of
    from nexus_cutover.errors import BadInput

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and a secrets backend's alike
        if "isn't defined" in str(exc) or type(exc).__name__ == "AirflowNotFoundException":
            return None
        raise
    kind = (conn.conn_type or "").lower()
    if kind == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise BadInput(f"connection {conn_id!r}: a sqlite ledger needs the database file's path as host")
        return f"sqlite:///{path}"
    if kind == "mysql":
        return mysql_dsn_of(conn, conn_id)
    if kind in ("postgres", "postgresql"):
        auth = (quote_plus(conn.login) + (f":{quote_plus(conn.password)}" if conn.password else "") + "@") if conn.login else ""
        port = f":{conn.port}" if conn.port else ""
        return f"postgresql+psycopg2://{auth}{conn.host or 'localhost'}{port}/{quote_plus(conn.schema or 'nexus_ledger')}"
    raise BadInput(f"connection {conn_id!r} has type {kind!r}: the ledger is a 'sqlite', 'mysql' (MySQL, MariaDB, "
                   "TiDB) or 'postgres' connection")


def masked_ledger(conn_id: str = LEDGER_CONN_ID) -> str:
    """What may be shown of the ledger's connection (its masked DSN), or why there is none."""
    from nexus_cutover.db import mask_dsn

    try:
        dsn = ledger_dsn(conn_id)
    except Exception as exc:  # noqa: BLE001 - shown, never raised
        return f"connection {conn_id}: {str(exc).splitlines()[0][:200]}"
    return mask_dsn(dsn) if dsn else f"no connection {conn_id}"


def open_ledger(conn_id: str = LEDGER_CONN_ID, *, timeout_s: float = TIMEOUT_S):
    """An engine on the ledger (the caller disposes of it); :class:`~nexus_cutover.errors.BadInput` naming the
    connection when it is not defined."""
    from nexus_cutover.errors import BadInput
    from nexus_cutover.ledger import ledger_engine

    dsn = ledger_dsn(conn_id)
    if dsn is None:
        raise BadInput(f"no Airflow connection {conn_id!r}: the delivery ledger's database (runbook, \"Delivery ledger\")")
    return ledger_engine(dsn, timeout_s=timeout_s)


# -- the spool ---------------------------------------------------------------------------------------------------

def spool_dir() -> pathlib.Path:
    base = os.environ.get(SPOOL_DIR_ENV) or os.path.join(os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"),
                                                         "nexus-ledger-spool")
    return pathlib.Path(base)


def spool(events: list) -> pathlib.Path:
    """Write ``events`` to a new spool file (written whole, fsynced, then renamed into place: a flush never reads
    half a file)."""
    folder = spool_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    tmp = folder / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event.as_json(), sort_keys=True, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())
    final = folder / name
    os.replace(tmp, final)
    return final


def pending() -> int:
    """Events waiting in this machine's spool (claimed files included)."""
    folder = spool_dir()
    if not folder.is_dir():
        return 0
    total = 0
    for path in folder.iterdir():
        if ".jsonl" in path.name and not path.name.startswith("."):
            try:
                total += sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            except OSError:
                continue
    return total


def _claimable(folder: pathlib.Path) -> list[pathlib.Path]:
    """The spool files to flush, oldest first: unclaimed ones, and claims older than :data:`STALE_CLAIM_S` (their
    flush died)."""
    import time

    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.name.endswith(".jsonl"):
            found.append(path)
        elif _CLAIMED in path.name:
            try:
                if time.time() - path.stat().st_mtime > STALE_CLAIM_S:
                    found.append(path)
            except OSError:
                continue
    return found


def catch_up(engine) -> int:
    """Write this machine's spool to the ledger ``engine``, file by file (each claimed by an atomic rename, so two
    flushes never take the same file); returns the events written. A file is removed once its events are in the
    ledger; one that fails is put back and the error raised (the caller spools its own events then)."""
    from nexus_cutover.ledger import LedgerEvent, append

    folder = spool_dir()
    if not folder.is_dir():
        return 0
    written = 0
    for path in _claimable(folder):
        original = path.name.split(_CLAIMED)[0]
        claimed = folder / f"{original}{_CLAIMED}{os.getpid()}"
        try:
            os.replace(path, claimed)
            os.utime(claimed)
        except FileNotFoundError:  # another flush took it
            continue
        try:
            lines = [line for line in claimed.read_text(encoding="utf-8").splitlines() if line.strip()]
            events = []
            for line in lines:
                try:
                    events.append(LedgerEvent.from_json(json.loads(line)))
                except Exception as exc:  # noqa: BLE001 - an unreadable line is kept aside, never dropped
                    _keep_aside(folder, original, line, exc)
            append(engine, events)
        except BaseException:
            os.replace(claimed, folder / original)
            raise
        written += len(events)
        _emit_caught_up(events)
        claimed.unlink(missing_ok=True)
    return written


def _keep_aside(folder: pathlib.Path, original: str, line: str, exc: Exception) -> None:
    """A spool line that is not an event (a damaged file): kept in ``unreadable/`` for a person, logged."""
    aside = folder / "unreadable"
    aside.mkdir(exist_ok=True)
    with open(aside / original, "a", encoding="utf-8") as out:
        out.write(line + "\n")
    log.error("delivery ledger: a spool line of %s is not an event (%s): kept in %s", original, exc, aside)


# -- recording ---------------------------------------------------------------------------------------------------

def record(events: list, *, conn_id: str = LEDGER_CONN_ID) -> str:
    """Write ``events`` (:class:`~nexus_cutover.ledger.LedgerEvent`) to the ledger, this machine's spool first;
    on any failure they are spooled and counted. Never raises. Returns ``written``, ``spooled`` or ``nothing``."""
    try:
        dsn = ledger_dsn(conn_id)
    except Exception as exc:  # noqa: BLE001 - a bad connection is reported, the events kept
        return _spooled(events, f"connection {conn_id}: {str(exc).splitlines()[0][:200]}")
    if dsn is None:
        return _spooled(events, f"no Airflow connection {conn_id} (runbook, \"Delivery ledger\")") if events else "nothing"
    engine = None
    try:
        from nexus_cutover.ledger import append, ledger_engine

        engine = ledger_engine(dsn, timeout_s=TIMEOUT_S)
        caught = catch_up(engine)
        if caught:
            log.info("delivery ledger: caught up %d spooled event(s)", caught)
        if events:
            append(engine, events)
        _emit_pending()
        return "written" if events else "nothing"
    except Exception as exc:  # noqa: BLE001 - a ledger outage never fails a step
        from nexus_cutover.db import hide_dsn_secrets

        return _spooled(events, hide_dsn_secrets(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", dsn))
    finally:
        if engine is not None:
            engine.dispose()


def _spooled(events: list, why: str) -> str:
    if not events:
        log.warning("delivery ledger not reachable (%s); %d event(s) wait in %s", why, pending(), spool_dir())
        _emit_pending()
        return "nothing"
    try:
        path = spool(events)
    except Exception as exc:  # noqa: BLE001 - not even the spool: said loudly, the step still goes on
        log.error("delivery ledger: %d event(s) could not be written (%s) nor spooled (%s): %s", len(events), why,
                  exc, [e.as_json() for e in events])
        return "lost"
    log.warning("delivery ledger not written (%s): %d event(s) spooled in %s, written at the next record call on "
                "this machine", why, len(events), path)
    from nexus_airflow.metrics import LEDGER_SPOOLED, emit

    for tenant, count in _per_tenant(events).items():
        emit(LEDGER_SPOOLED, count, tenant=tenant)
    _emit_pending()
    return "spooled"


def _per_tenant(events: Iterable) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        counts[e.tenant] = counts.get(e.tenant, 0) + 1
    return counts


def _emit_caught_up(events: list) -> None:
    from nexus_airflow.metrics import LEDGER_CAUGHT_UP, emit

    for tenant, count in _per_tenant(events).items():
        emit(LEDGER_CAUGHT_UP, count, tenant=tenant)


def _emit_pending() -> None:
    from nexus_airflow.metrics import LEDGER_PENDING, emit

    emit(LEDGER_PENDING, pending())


# -- a run's events ----------------------------------------------------------------------------------------------

def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _seq(dag_id: str, step: str, kind: str) -> int:
    """The event's declared place in its run: its step's place in the DAG's declared transition (a wave's number
    for a rollout's question), then its kind's (:data:`nexus_cutover.ledger.KINDS`)."""
    from nexus_cutover.ledger import KINDS

    rank = 0
    try:
        from nexus_airflow.results import transition_of

        rank = transition_of(dag_id).names.index(step) + 1
    except (KeyError, ValueError):
        digits = "".join(ch for ch in step if ch.isdigit())
        rank = int(digits) if digits else 0
    return rank * 100 + (KINDS.index(kind) if kind in KINDS else 99)


def event(context, step: str, kind: str, *, tenant: str | None = None, at: dt.datetime | str | None = None, **fields):
    """One :class:`~nexus_cutover.ledger.LedgerEvent` of this task's run (its DAG, run, map index and try)."""
    from nexus_cutover.ledger import LedgerEvent

    ti = context.get("ti")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "")
    when = at if at is not None else _now()
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            when = _now()
    when = when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    map_index = getattr(ti, "map_index", -1)
    return LedgerEvent(
        tenant=str(tenant or (context.get("params") or {}).get("tenant") or ""), dag_id=str(dag_id),
        run_id=str(context.get("run_id") or getattr(ti, "run_id", "")), step=step, kind=kind, recorded_at=when,
        seq=_seq(str(dag_id), step, kind), map_index=map_index if isinstance(map_index, int) else -1,
        try_number=int(getattr(ti, "try_number", 1) or 1), **fields)


def _recording(context) -> bool:
    params = context.get("params") or {}
    return bool(params.get("tenant")) and not params.get("dry_run")


def _safely(what: str, build: Callable[[], list]) -> None:
    """Build the events and record them; nothing here ever fails the step."""
    try:
        events = [e for e in build() if e is not None]
    except Exception as exc:  # noqa: BLE001 - a ledger's bug never fails a cutover step; said in the log
        log.error("delivery ledger: the events of %s could not be built: %s", what, exc)
        return
    if events:
        record(events)


# -- the declared table: what each step's result says -------------------------------------------------------------

def _fence(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    kind = {"armed": L.FENCE_ARMED, "reused": L.FENCE_REUSED, "adopted": L.FENCE_ADOPTED}.get(r.get("outcome"))
    if kind is None:
        return []
    return [event(context, step, kind, outcome=r["outcome"], holder=r.get("holder"),
                  detail={"fence_id": r.get("fence_id"), "previous_holder": r.get("previous_holder"),
                          "armed_at": r.get("armed_at")})]


def _drain(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    if r.get("state") != "drained":
        return []
    return [event(context, step, L.DRAIN_DONE, outcome="drained",
                  detail={k: r.get(k) for k in ("remaining", "counts", "checked_at") if k in r})]


def _digest(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    if not r.get("hash"):
        return []
    return [event(context, step, L.DIGEST_TAKEN, outcome="taken", digest=str(r["hash"]),
                  detail={k: r.get(k) for k in ("rows", "chunks", "cutoffs", "taken_at", "seconds")})]


def _checkpoint(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    cutoff = r.get("legacy_max_ordinal")
    return [event(context, step, L.CHECKPOINT, outcome=r.get("outcome"), pack=r.get("pack_install_id"),
                  cutoff=int(cutoff) if cutoff is not None else None, holder=r.get("written_by"))]


def _host(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    if r.get("dry_run"):
        return []
    outcome = ("already running" if r.get("already_running") else
               "started by a person" if r.get("responded_by") else "started")
    return [event(context, step, L.HOST_STARTED, outcome=outcome, actor=r.get("responded_by"),
                  detail={k: v for k, v in r.items() if k in ("already_running", "host_pid", "controller", "status",
                                                              "responded_at")})]


def _release(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    if r.get("outcome") not in ("released", "already_released"):
        return []
    return [event(context, step, L.FENCE_RELEASED, outcome=r["outcome"], holder=r.get("holder"),
                  detail={k: r.get(k) for k in ("fence_id", "armed_at", "released_at", "admission_pause_s")})]


def _verified(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    history = r.get("history_digest") or {}
    if not history:
        return []
    return [event(context, step, L.DIGEST_VERIFIED, outcome="verified" if history.get("verified") else "not verified",
                  digest=str(history.get("hash")),
                  detail={"rows": history.get("rows"), "cutoffs": r.get("cutoffs"), "released_at": r.get("released_at")})]


def _gate(context, step: str, r: dict) -> list:
    from nexus_cutover import ledger as L

    if not r.get("passed"):
        return []
    return [event(context, step, L.GATE_PASSED, outcome=f"stage {r.get('stage')} passed"
                  + (" (already done)" if r.get("already_done") else ""), reason=r.get("summary"),
                  detail={"stage": r.get("stage"), "actions": r.get("actions") or [], "counts": r.get("counts") or {}})]


#: Per declared step (its name), the events its result carries (context, step, result) -> events. A step that is
#: not here records its stop only.
STEP_EVENTS: dict[str, Callable[[Any, str, dict], list]] = {
    "arm_fence": _fence,
    "wait_for_drain": _drain,
    "history_digest": _digest,
    "audit_and_checkpoint": _checkpoint,
    "start_new_host": _host,
    "resume_admission": _release,
    "final_old_writer_check": _verified,
    "stage_1": _gate,
    "stage_2_producers": _gate,
    "stage_2_materialize": _gate,
    "stage_3": _gate,
}


def step_passed(context, step: str, result: Any) -> None:
    """A step ended with ``result``: the events :data:`STEP_EVENTS` derives from it."""
    derive = STEP_EVENTS.get(step)
    if derive is None or not isinstance(result, dict) or not _recording(context):
        return
    _safely(step, lambda: derive(context, step, result))


def step_stopped(context, step: str) -> None:
    """A step failed: a ``stopped`` event with its reason (the exception's text, as the task log ends)."""
    from nexus_cutover import ledger as L

    if not _recording(context):
        return
    exc = context.get("exception")
    reason = (str(exc) or type(exc).__name__) if exc is not None else "the task failed"
    _safely(step, lambda: [event(context, step, L.STOPPED, outcome="stopped", reason=reason[:4000],
                                 detail={"error": type(exc).__name__} if exc is not None else {})])


# -- questions ---------------------------------------------------------------------------------------------------

def question_asked(context, step: str, subject: str, shown: Any) -> None:
    """A person is asked ``subject``; ``shown`` is the evidence the question shows (its digest is recorded)."""
    from nexus_cutover import ledger as L

    if not _recording(context):
        return
    checked_at = shown.get("checked_at") if isinstance(shown, dict) else None
    _safely(step, lambda: [event(context, step, L.EVIDENCE_SHOWN, outcome="asked", digest=L.digest_of(shown),
                                 reason=subject, detail={"evidence_checked_at": checked_at} if checked_at else {})])


def question_answered(context, step: str, outcome: str, *, who: str | None, at: Any = None, shown: Any = None,
                      reason: str | None = None, **detail: Any) -> None:
    """A person's answer (``outcome``: confirmed, rejected, refused, timed out, ...), on the evidence ``shown``."""
    from nexus_cutover import ledger as L

    if not _recording(context):
        return
    checked_at = shown.get("checked_at") if isinstance(shown, dict) else None
    _safely(step, lambda: [event(context, step, L.ANSWER, outcome=outcome, actor=who, at=at if at not in (None, "None") else None,
                                 digest=L.digest_of(shown) if shown else None, reason=reason,
                                 detail={**detail, **({"evidence_checked_at": checked_at} if checked_at else {})})])


#: The XCom key under which a wave's question keeps the digests of the evidence it showed (tenant -> digest).
WAVE_DIGESTS_KEY = "ledger_evidence_digests"


def wave_asked(context, wave: int, rows: list[dict[str, Any]], subject: str) -> None:
    """A rollout's wave question is asked: one ``wave_asked`` event per tenant it shows, with its evidence's digest."""
    from nexus_cutover import ledger as L

    try:
        ready = {r["tenant"]: r for r in rows if r.get("evidence")}
        digests = {t: L.digest_of(r["evidence"]) for t, r in ready.items()}
        context["ti"].xcom_push(key=WAVE_DIGESTS_KEY, value=digests)
    except Exception as exc:  # noqa: BLE001 - never fails the question
        log.error("delivery ledger: wave %s's evidence digests not kept: %s", wave, exc)
        return
    step = context["ti"].task_id
    _safely(step, lambda: [event(context, step, L.WAVE_ASKED, tenant=t, outcome="asked", digest=digests[t],
                                 reason=subject, detail={"wave": wave, "evidence_checked_at": r.get("checked_at")})
                           for t, r in ready.items()])


def wave_answered(context, wave: int, answer: dict[str, Any]) -> None:
    """A wave's answer (``answer`` as the wave task pushes it): one ``wave_answer`` event per tenant it showed."""
    from nexus_cutover import ledger as L

    ti = context["ti"]
    step = ti.task_id
    try:
        digests = ti.xcom_pull(task_ids=ti.task_id, key=WAVE_DIGESTS_KEY) or {}
    except Exception:  # noqa: BLE001 - the answer is recorded without the digests rather than not at all
        digests = {}
    shown = answer.get("evidence") or {}
    tenants = list(shown) or list(digests)
    _safely(step, lambda: [event(context, step, L.WAVE_ANSWER, tenant=t, outcome=str(answer.get("answer")),
                                 actor=answer.get("by"), at=answer.get("at") if answer.get("at") not in (None, "None") else None,
                                 digest=digests.get(t), detail={"wave": wave, "evidence_checked_at": shown.get(t)})
                           for t in tenants])
