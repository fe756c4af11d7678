"""Arm only what the workers can carry (issue 50, item 4): a tenant is armed while fewer than ``[nexus] armed_slots``
cutover runs of this Airflow are armed.

A tenant's admission pause is the time from arming its fence to releasing it; every task of that window needs a
worker slot when it starts. When more tenants are armed than the deployment has slots for armed work, their tasks
queue behind each other *inside* their pauses (measured: a wave of 13 on 4 slots paused its drained tenants 61.7 s at
the median). The bound moves that queue to before arming, where the tenant's admission is still open: the fence step
waits (rescheduled, no worker slot held) until an armed slot is free, then arms (the same wave with 2 armed slots:
17.1 s; docs/performance.md, "Armed slots on the stack").

Invariants:

* The count is read from Airflow's own task states, as counts (the Task SDK's ``get_ti_count``: three indexed counts
  of the cutover DAG's fence and release tasks, whatever the number of runs it ever had; :func:`counted`). A run is
  **armed** when its fence task succeeded and its release task has not finished (a run stopped after arming has its
  release ``upstream_failed`` and uses no slot), **arming** when its fence task is running. Both count against the
  bound, so two fence tasks looking at once never both take the last slot: a task is ``running`` from before its
  first count until it ends, so the one whose counts start later sees the other. Only ever too many counted, never
  too few: a dry run's window counts (seconds), and so does a run created between two counts, for one look. The
  runs are read by name only for a stop's report (:func:`slots`, over the DAG's every run).
* A tenant whose fence is already in force (this run's rerun, or a failed run's fence to adopt) is paused already:
  it never waits for a slot. A dry run arms nothing and never waits.
* A rollout's wave arms its tenants in the wave's declared order as slots free: a tenant arms only when more
  slots are free than tenants before it in its wave wait for one (their fence tasks waiting or about to look).
* ``armed_slots`` 0 (the default) bounds nothing: the fence step arms as before.
* The wait is bounded by the run's ``pre_arm_timeout`` from its first look; past it the step stops and reports
  (nothing written, the fence not armed), naming the runs that held the slots.
* The command line (``nexus-cutover run``) is one tenant by hand: not bounded here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nexus_cutover import settings

#: The states of a task that has not finished (None: not yet scheduled).
UNFINISHED = frozenset({None, "none", "scheduled", "queued", "running", "deferred", "up_for_reschedule", "up_for_retry",
                        "restarting", "awaiting_input"})
#: The states of a fence task waiting for a slot, or about to look for one.
WAITING = frozenset({"up_for_reschedule", "scheduled", "queued"})
#: The Airflow pool the armed window's tasks run in when it exists (:mod:`nexus_airflow.policies`).
ARMED_POOL = "nexus_armed"


@dataclass(frozen=True)
class Slots:
    """The armed slots as one fence task sees them: the bound, how many runs are armed and arming (not its own), the
    runs of its wave ahead of it in the wave's declared order that wait for a slot (they arm first), and, when they
    were read, the armed and arming runs by name (a stop's report)."""

    bound: int
    armed: int
    arming: int
    ahead: tuple[str, ...] = ()
    armed_runs: tuple[str, ...] = ()
    arming_runs: tuple[str, ...] = ()

    @property
    def taken(self) -> int:
        return self.armed + self.arming

    @property
    def free(self) -> bool:
        return self.bound <= 0 or self.taken + len(self.ahead) < self.bound

    def text(self) -> str:
        named = [*self.armed_runs, *(f"{r} (arming)" for r in self.arming_runs)]
        runs = f" (runs: {', '.join(named)})" if named else ""
        arming = f", {self.arming} arming now" if self.arming else ""
        ahead = f"; {len(self.ahead)} of its wave ahead of it wait too" if self.ahead else ""
        return f"{self.armed} of {self.bound} armed slots taken{arming}{runs}{ahead}"


def _state(raw: Any) -> str | None:
    if raw is None:
        return None
    return str(getattr(raw, "value", raw)).lower()


def slots(task_states: Mapping[str, Mapping[str, Any]], *, fence_task: str, release_task: str, me: str,
          bound: int, before_me: Sequence[str] = ()) -> Slots:
    """The armed slots from ``task_states`` (run id -> task id -> state, as the Task SDK's ``get_task_states``
    returns them) for the run ``me``: the runs armed (fence succeeded, release unfinished) and arming (fence
    running), never ``me``; of ``before_me`` (the runs of its wave before it, in the wave's order), those whose fence
    task waits for a slot."""
    armed: list[str] = []
    arming: list[str] = []
    for run_id, states in task_states.items():
        if run_id == me:
            continue
        fence, release = _state(states.get(fence_task)), _state(states.get(release_task))
        if fence == "success" and release in UNFINISHED:
            armed.append(run_id)
        elif fence == "running":
            arming.append(run_id)
    return Slots(bound, len(armed), len(arming), waiting_ahead(task_states, fence_task, before_me, me),
                 tuple(sorted(armed)), tuple(sorted(arming)))


def waiting_ahead(task_states: Mapping[str, Mapping[str, Any]], fence_task: str, before_me: Sequence[str],
                  me: str) -> tuple[str, ...]:
    """Of ``before_me`` (the runs of a wave before ``me``, in the wave's order), those whose fence task waits for a
    slot or is about to look for one."""
    return tuple(r for r in before_me if r != me and _state((task_states.get(r) or {}).get(fence_task)) in WAITING)


#: Airflow's names (``get_ti_count``'s ``states``; ``null``: not yet scheduled) of a fence task that has not looked
#: yet, and of a release task that has not finished.
NOT_STARTED_STATES = ("null", "scheduled", "queued", "up_for_reschedule", "up_for_retry", "deferred", "restarting")
UNFINISHED_STATES = ("null", "scheduled", "queued", "running", "deferred", "up_for_reschedule", "up_for_retry",
                     "restarting", "awaiting_input")


def counted(ti, *, dag_id: str, fence_task: str, release_task: str, bound: int, before_me: Sequence[str],
            me: str) -> Slots:
    """The armed slots as :func:`slots` sees them, read as counts (three indexed counts, whatever the number of runs
    the DAG ever had, and the states of the wave's runs before ``me``): armed or arming = runs whose release has not
    finished less those whose fence task has not looked yet, less ``me`` (looking now). The fence tasks not yet
    looking are counted first: a run that starts looking between the two counts is then counted (never too few), and
    a run created between them only adds one (too many, for one look)."""
    not_started = ti.get_ti_count(dag_id=dag_id, task_ids=[fence_task], states=list(NOT_STARTED_STATES))
    unfinished = ti.get_ti_count(dag_id=dag_id, task_ids=[release_task], states=list(UNFINISHED_STATES))
    taken = max(0, unfinished - not_started - 1)
    arming = min(taken, max(0, ti.get_ti_count(dag_id=dag_id, task_ids=[fence_task], states=["running"]) - 1))
    states = ti.get_task_states(dag_id=dag_id, task_ids=[fence_task], run_ids=list(before_me)) if before_me else {}
    return Slots(bound, taken - arming, arming, waiting_ahead(states, fence_task, before_me, me))


def runs_before(order: Sequence[str], tenant: str, run_id_of: Callable[[str], str]) -> list[str]:
    """The run ids of the tenants before ``tenant`` in ``order`` (a wave's declared order); empty when it is not in
    it."""
    return [run_id_of(t) for t in order[: order.index(tenant)]] if tenant in order else []


def bound() -> int:
    """``[nexus] armed_slots``: the most runs armed at once (0: no bound)."""
    return max(0, int(settings.value("armed_slots") or 0))


def waited_s(first_look: dt.datetime | None, now: dt.datetime) -> float:
    return 0.0 if first_look is None else max(0.0, (now - first_look).total_seconds())


def wait_for_a_slot(op, context, *, fence_task: str, release_task: str, fenced: Callable[[], bool]) -> None:
    """Before the fence step's body: return when this run may arm; otherwise reschedule the task (no slot held) or,
    past ``pre_arm_timeout``, stop it. ``fenced()``, called only when no slot is free: whether the tenant's fence is
    already in force (then it is paused already and never waits)."""
    from nexus_airflow.base import params_of, stop
    from nexus_airflow.rollout import later, run_id_for, wave_order

    limit = bound()
    p = params_of(context)
    if limit <= 0 or p.dry_run:
        return
    ti = context["ti"]
    rollout = dict(context["params"].get("rollout") or {})
    before_me = runs_before(wave_order(ti, rollout), p.tenant, lambda t: run_id_for(rollout["run_id"], t))
    seen = counted(ti, dag_id=op.dag_id, fence_task=fence_task, release_task=release_task, bound=limit,
                   before_me=before_me, me=context["run_id"])
    first = ti.get_first_reschedule_date(context)
    waited = waited_s(first, dt.datetime.now(dt.UTC))
    if seen.free:
        if first is not None:
            op.log.info("tenant %s: an armed slot is free after %.0f s (%s): arms now", p.tenant, waited, seen.text())
        return
    if fenced():
        op.log.info("tenant %s: %s, but its fence is in force already (paused): goes on without waiting", p.tenant,
                    seen.text())
        return
    if waited >= p.pre_arm_timeout:  # the runs by name, read once: every run of the DAG's fence and release tasks
        named = slots(ti.get_task_states(dag_id=op.dag_id, task_ids=[fence_task, release_task]), fence_task=fence_task,
                      release_task=release_task, me=context["run_id"], bound=limit, before_me=before_me)
        stop(context, op.log, f"no armed slot was free within pre_arm_timeout ({p.pre_arm_timeout} s): "
             f"{named.text()}. Nothing was written; the fence is not armed, admission stays open.",
             {"armed_slots": limit, "armed": list(named.armed_runs), "arming": list(named.arming_runs),
              "waited_s": round(waited)},
             next_action="let the armed runs finish (or stop them), or raise [nexus] armed_slots with the workers' "
             "slots; then clear this task")
    again = max(1, int(p.poll_interval))
    op.log.info("tenant %s: waits before arming, admission open: %s; looks again in %d s", p.tenant, seen.text(), again)
    raise later(again)
