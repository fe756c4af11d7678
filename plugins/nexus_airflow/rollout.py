"""The fleet rollout's shared vocabulary: tenant run ids, wave XCom keys and the pause/resume/cancel control.

Used by ``dags/tenant_rollout.py`` (its tasks), by the per-tenant cutover's wave
confirmation and by the status view's rollout page, so each rule lives here once.

Invariants:

* a tenant's cutover run of a rollout has the run id :func:`run_id_for` (one per
  tenant per rollout run: deterministic, so a rerun finds it);
* the rollout's plan publishes XCom ``rollout`` (:data:`PLAN_KEY`): the waves in
  order (wave 0 is the canary) with their tenants, the approval mode, approvers
  and failure budget, and the tenants it skipped because they are already cut over;
* each wave's ``close`` task publishes XCom ``wave`` (:data:`WAVE_KEY`): its state
  (``succeeded`` / ``halted`` / ``cancelled``), succeeded and failed tenants (with
  the failing task and reason) and its approval (who, when, what);
* the control of a rollout run is the Airflow Variable :func:`control_variable`
  holding ``pause``, ``resume`` or ``cancel``; no Variable means run. Pause stops
  new tenants from starting (running ones finish); cancel also stops running
  tenants at their next safe point, which is always before a checkpoint.
"""

from __future__ import annotations

import re

ROLLOUT_DAG = "tenant_rollout"
CUTOVER_DAG = "connector_projection_cutover"
PLAN_KEY = "rollout"
WAVE_KEY = "wave"
SUMMARY_KEY = "summary"
CONTROL_ACTIONS = ("pause", "resume", "cancel")
#: Most waves of one rollout (the DAG declares this many wave groups; unused ones are skipped).
MAX_WAVES = 20


def run_id_for(rollout_run_id: str, tenant: str) -> str:
    """The run id of ``tenant``'s cutover run started by the rollout run ``rollout_run_id``."""
    return re.sub(r"[^A-Za-z0-9_.~:+-]", "_", f"rollout__{rollout_run_id}__{tenant}")[:250]


def wave_group(wave: int) -> str:
    """The task group of wave ``wave`` (``wave_00`` is the canary)."""
    return f"wave_{wave:02d}"


def control_variable(rollout_run_id: str) -> str:
    """The Airflow Variable that pauses, resumes or cancels the rollout run ``rollout_run_id``."""
    return "nexus_rollout_control__" + re.sub(r"[^A-Za-z0-9_.-]", "_", rollout_run_id)[:200]
