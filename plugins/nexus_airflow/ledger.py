"""The delivery ledger and the metrics from Airflow: the task's :class:`~nexus_cutover.recording.Recorder`.

What a step's result means as events is the step's own (its declared ``records``, in the domain); the run's
events go through one recorder whichever path ran the step (:mod:`nexus_cutover.recording`). This module only
adds Airflow's part: the origin of a task's events (its DAG, run, map index and try), the ledger's DSN from the
Airflow connection :data:`LEDGER_CONN_ID`, and Airflow's metrics client (:func:`nexus_airflow.metrics.emit`). It is
called from the step hooks (:mod:`nexus_airflow.base`: a step's end, a fused task's steps one by one, a failure) and
the questions (:mod:`nexus_airflow.hitl`, :mod:`nexus_airflow.rollout_confirm`: the evidence shown, the answer).

Invariants:

* Recording never blocks, fails or skips a step (the recorder's rule); an outage is spooled on the machine, never
  lost (:mod:`nexus_cutover.ledger_spool`, whose spool defaults to ``$AIRFLOW_HOME/nexus-ledger-spool``).
* A dry run records nothing and sends no figure, as it is not a cutover.
* Nothing secret is recorded: ids, names, outcomes, digests and the reasons the task logs show.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nexus_cutover.recording import Recorder

# The domain's recording modules are imported where an event is recorded, not here: a DAG file parses this module
# (through the question operators) and may load only the declarations (tests/dags/test_cutover_dag_integrity.py).

log = logging.getLogger(__name__)

LEDGER_CONN_ID = "nexus_ledger"


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


def open_ledger(conn_id: str = LEDGER_CONN_ID, *, timeout_s: float | None = None):
    """An engine on the ledger (the caller disposes of it); :class:`~nexus_cutover.errors.BadInput` naming the
    connection when it is not defined."""
    from nexus_cutover.errors import BadInput
    from nexus_cutover.ledger import ledger_engine
    from nexus_cutover.ledger_spool import TIMEOUT_S

    dsn = ledger_dsn(conn_id)
    if dsn is None:
        raise BadInput(f"no Airflow connection {conn_id!r}: the delivery ledger's database (runbook, \"Delivery ledger\")")
    return ledger_engine(dsn, timeout_s=TIMEOUT_S if timeout_s is None else timeout_s)


def record(events: list) -> str:
    """Write ``events`` (:class:`~nexus_cutover.ledger.LedgerEvent`) to the ledger of :data:`LEDGER_CONN_ID`, this
    machine's spool first (:func:`nexus_cutover.ledger_spool.record`: never raises; an outage spools them)."""
    from nexus_airflow.metrics import emit
    from nexus_cutover import ledger_spool

    return ledger_spool.record(events, ledger_dsn, where=f"Airflow connection {LEDGER_CONN_ID}", send=emit)


# -- a task's recorder -------------------------------------------------------------------------------------------

def recorder_for(context, *, figures: bool = True) -> Recorder:
    """The recorder of this task's run: the delivery ledger, (unless ``figures`` is false: a trigger sent them
    already) Airflow's metrics client, and the notices no Airflow callback sends
    (:func:`nexus_airflow.notify.notice_sink`); :data:`~nexus_cutover.recording.NOT_RECORDING` for a dry run or a
    run with no tenant."""
    from nexus_airflow.metrics import emit
    from nexus_airflow.results import transition_of
    from nexus_cutover.recording import NOT_RECORDING, LedgerSink, MetricsSink, Origin, Recorder

    params = context.get("params") or {}
    if not params.get("tenant") or params.get("dry_run"):
        return NOT_RECORDING
    ti = context.get("ti")
    dag_id = str(getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", ""))
    try:
        transition = transition_of(dag_id)
    except KeyError:  # the rollout's DAG: its questions are ranked by wave
        transition = None
    map_index = getattr(ti, "map_index", -1)
    origin = Origin(tenant=str(params["tenant"]), dag_id=dag_id,
                    run_id=str(context.get("run_id") or getattr(ti, "run_id", "")), transition=transition,
                    map_index=map_index if isinstance(map_index, int) else -1,
                    try_number=int(getattr(ti, "try_number", 1) or 1))
    from nexus_airflow.notify import notice_sink

    ledger = LedgerSink(ledger_dsn, where=f"Airflow connection {LEDGER_CONN_ID}", send=emit)
    return Recorder(origin, [ledger, *([MetricsSink(emit)] if figures else []), notice_sink(context)])


def question_asked(context, step: str, subject: str, shown: Any) -> None:
    """A person is asked ``subject``; ``shown`` is the evidence the question shows (its digest is recorded)."""
    recorder_for(context).asked(step, subject, shown)


def question_answered(context, step: str, outcome: str, *, who: str | None, at: Any = None, shown: Any = None,
                      reason: str | None = None, **detail: Any) -> None:
    """A person's answer (``outcome``: confirmed, rejected, refused, timed out, ...), on the evidence ``shown``."""
    recorder_for(context).answered(step, outcome, who=who, at=at, shown=shown, reason=reason, **detail)


#: The XCom key under which a wave's question keeps the digests of the evidence it showed (tenant -> digest).
WAVE_DIGESTS_KEY = "ledger_evidence_digests"


def wave_asked(context, wave: int, rows: list[dict[str, Any]], subject: str) -> None:
    """A rollout's wave question is asked: one ``wave_asked`` event per tenant it shows, with its evidence's digest."""
    from nexus_cutover import events as E

    try:
        ready = {r["tenant"]: r for r in rows if r.get("evidence")}
        digests = {t: E.digest_of(r["evidence"]) for t, r in ready.items()}
        context["ti"].xcom_push(key=WAVE_DIGESTS_KEY, value=digests)
    except Exception as exc:  # noqa: BLE001 - never fails the question
        log.error("delivery ledger: wave %s's evidence digests not kept: %s", wave, exc)
        return
    step = context["ti"].task_id
    _wave_recorder(context, ready).emit(lambda: [
        E.Event(E.WAVE_ASKED, step, tenant=t, outcome="asked", digest=digests[t], reason=subject,
                detail={"wave": wave, "evidence_checked_at": r.get("checked_at")}) for t, r in ready.items()])


def wave_answered(context, wave: int, answer: dict[str, Any]) -> None:
    """A wave's answer (``answer`` as the wave task pushes it): one ``wave_answer`` event per tenant it showed."""
    from nexus_cutover import events as E

    ti = context["ti"]
    step = ti.task_id
    try:
        digests = ti.xcom_pull(task_ids=ti.task_id, key=WAVE_DIGESTS_KEY) or {}
    except Exception:  # noqa: BLE001 - the answer is recorded without the digests rather than not at all
        digests = {}
    shown = answer.get("evidence") or {}
    tenants = list(shown) or list(digests)
    _wave_recorder(context, tenants).emit(lambda: [
        E.Event(E.WAVE_ANSWER, step, tenant=t, outcome=str(answer.get("answer")), actor=answer.get("by"),
                at=E.time_of(answer.get("at")), digest=digests.get(t),
                detail={"wave": wave, "evidence_checked_at": shown.get(t)}) for t in tenants])


def _wave_recorder(context, tenants) -> Recorder:
    """A rollout's question names its tenants in each event; the run itself is the rollout's (no tenant param)."""
    from nexus_cutover.recording import NOT_RECORDING

    if not tenants:
        return NOT_RECORDING
    first = next(iter(tenants))
    return recorder_for({**context, "params": {**(context.get("params") or {}), "tenant": first, "dry_run": False}},
                        figures=False)
