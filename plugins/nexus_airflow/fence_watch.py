"""A fenced tenant never waits forgotten: a run that still holds its tenant's admission fence ``fence_alert_after``
seconds after it was armed alerts once (issue 38, item 2).

Where the check runs (the decision; docs/runbook.md, "Notifications"): at the looks of the waits inside the fenced
window, by the run itself. Airflow's Deadline Alerts do not fit: a deadline is fixed when the run is created or
queued (``DAGRUN_QUEUED_AT`` / ``DAGRUN_LOGICAL_DATE`` plus an interval known at parse time, or a custom reference
evaluated then), while the fence is armed later, after a pre-arm wait of any length, and ``fence_alert_after`` is
a field of the run's form. A scheduled watchdog DAG does not fit either: a task cannot list the running runs or the
tenant connections through the Task SDK, and it would add a run every few minutes to every Airflow. The run knows
its fence (``arm_fence``'s XCom), and every wait inside its window comes back to a worker by construction:

* ``wait_for_drain``, ``check_old_writers`` and the readiness wait of ``resume_admission`` look at each poke on a
  worker, and while deferred their trigger wakes them when the alert is due (:mod:`nexus_airflow.sensors`);
* the writer-stop confirmation and a manual host start, parked in ``awaiting_input`` (no code runs), park until
  the alert is due at the latest; Airflow's timeout sweep resumes them then, they alert and park again on the
  same question for the rest of ``confirm_timeout`` (:mod:`nexus_airflow.hitl`);
* ``per_wave``'s wait for the wave's answer looks each time it defers to the triggerer, whose trigger wakes it
  when the alert is due.

The steps that run (the history digest, the audits) are bounded by their own timeouts; a due alert is sent at the
next wait's first look.

Invariants:

* Only a run that holds the fence in force (the fence ``arm_fence`` armed, reused or adopted for this run, still
  held by this run's name) alerts; a dry run never does. The time is the fence row's ``ArmedAt``: how long
  admission has been paused (an adopted fence's pause began when it was first armed).
* Once per run, across retries, reschedules and clears: the alert is recorded in the Airflow Variable
  :func:`marker` before it is sent (a failed send is logged, not retried: the run's own stop or end will still
  reach a person); the Variable is left as the record of when and at which step it alerted.
* A look never fails the task: a read or a Variable error is logged and the wait goes on.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

MARKER_PREFIX = "nexus_fence_alert__"


def marker(dag_id: str, run_id: str) -> str:
    """The Airflow Variable that records a run's fence alert (hashed when the ids would make it too long)."""
    key = f"{MARKER_PREFIX}{dag_id}__{run_id}"
    return key if len(key) <= 250 else MARKER_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if hours else (f"{rest // 60} min {rest % 60} s" if rest >= 60 else f"{rest} s")


def held_since(context, log) -> dt.datetime | None:
    """When the fence this run holds was armed (naive UTC), or None: a dry run, no fence armed by this run (before
    ``arm_fence``, or nothing to do), or the fence no longer in force or held by another."""
    from nexus_airflow import results
    from nexus_airflow.base import params_of, tenant_engine
    from nexus_cutover.projection import steps

    p = params_of(context)
    armed = results.fence(context["ti"])
    if p.dry_run or armed is None or armed.not_needed or not armed.holder:
        return None
    with tenant_engine(p.conn_id, log) as engine:
        fence, _ = steps.fence_and_checkpoints(engine, p.tenant, [])
    if not fence or fence.get("ArmedBy") != armed.holder or not fence.get("ArmedAt"):
        return None
    since = fence["ArmedAt"]
    return dt.datetime.fromisoformat(since) if isinstance(since, str) else since


def look(context, step: str, log, *, question: bool = False) -> dt.datetime | None:
    """One look of a fenced wait at ``step``: alert once when the fence has been held ``fence_alert_after``; the
    moment the next look must happen (aware UTC) while the alert is not due yet, else None. ``question``: the step
    waits for an answer to its own question (the alert links its Required-actions page). Never raises."""
    try:
        return _look(context, step, log, question)
    except Exception as exc:  # noqa: BLE001 - the wait goes on; its own timeout still bounds it
        log.warning("fence alert: could not look (%s: %s); the wait goes on", type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "")
        return None


def _look(context, step: str, log, question: bool) -> dt.datetime | None:
    from airflow.sdk import Variable

    from nexus_airflow.base import params_of
    from nexus_cutover.clock import utcnow

    since = held_since(context, log)
    if since is None:
        return None
    p = params_of(context)
    due = since + dt.timedelta(seconds=p.fence_alert_after)
    now = utcnow()
    if now < due:
        return due.replace(tzinfo=dt.UTC)
    ti = context["ti"]
    key = marker(ti.dag_id, ti.run_id)
    if Variable.get(key, default=None) is not None:
        return None  # alerted once already (an earlier step, try or look)
    paused = (now - since).total_seconds()
    Variable.set(key, json.dumps({"step": step, "at": now.isoformat(), "armed_at": since.isoformat(),
                                  "paused_s": round(paused, 1)}),
                 description="nexus: this run's fenced-tenant alert was sent (issue 38); kept as its record")
    send_alert(context, step, since, paused, p.fence_alert_after, log, question=question)
    return None


def send_alert(context, step: str, since: dt.datetime, paused_s: float, after_s: int, log, *,
               question: bool = False) -> None:
    from nexus_airflow.notify import FENCE_WAITING, links, send
    from nexus_cutover.clock import utc_text
    from nexus_cutover.notices import WORDS, Message

    ti, tenant = context["ti"], context["params"].get("tenant", "?")
    facts = [("event", WORDS[FENCE_WAITING]), ("tenant", tenant), ("run", ti.run_id),
             ("waits at", step), ("admission paused", f"{_duration(paused_s)}, since {utc_text(since)} (fence held "
                                                       f"by this run)"),
             ("fence_alert_after", _duration(after_s))]
    text = ("The tenant's admission is paused while this run waits. Answer its question, or resolve what the step "
            "waits for (runbook: the step's row); the run keeps waiting until its own timeout. This alert is sent "
            "once per run.")
    message = Message(f"[nexus] {WORDS[FENCE_WAITING]}: tenant {tenant} for {_duration(paused_s)}, at {step}",
                      facts, text, links(context, question=question, tenant=tenant))
    send(context, message, log)

