"""The rollout's plan (``tenant_rollout``'s ``plan`` task): which tenants run, in which waves, and which are skipped.

Invariants (the vocabulary is :mod:`nexus_airflow.rollout`):

* The form's refusals (:mod:`.rollout_form`) come first, before any tenant starts: the preflight checks the
  whole form (:func:`~nexus_airflow.rollout_form.check_form`) before any tenant database is read, the plan
  again on the waves it makes (the rollout fails with the reason in its summary).
* A tenant whose preflight verdict is stop (:mod:`.rollout_preflight`) is skipped with
  that reason (``on_preflight_stop: skip``), or the rollout halts before any wave
  (``halt``), naming every such tenant; ``run`` starts it anyway (its own run stops
  where the preflight said, counted against ``max_failed``).
* Idempotent by tenant: a tenant already cut over (:mod:`nexus_cutover.standing`,
  the one definition) is skipped; one holding old work above a cutoff is skipped
  as a stop; one whose earlier run failed (it left its fence, or this rollout
  run's own earlier run failed) is retried only with ``retry_failed``.
"""

from __future__ import annotations

from typing import Any

from nexus_airflow import rollout as ro
from nexus_airflow.params import ROLLOUT_FIELDS, resolve
from nexus_airflow.rollout_form import check_waves, form_tenants, shared_conf


def standings(tenants: list[str], log, concurrency: int) -> dict[str, dict[str, Any] | None]:
    """Each tenant's cutover standing (:func:`nexus_cutover.standing`'s), read ``concurrency`` tenants at a time
    (the form's ``preflight_concurrency``), not one after another: None for a tenant whose database cannot be
    read (its run will say why). Engines come from the tenants' connections as the preflight's do."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from nexus_airflow.rollout_preflight import tenant_engine_of
    from nexus_cutover.projection import steps

    airflow = threading.Lock()

    def one(tenant: str) -> dict[str, Any] | None:
        try:
            with tenant_engine_of(tenant, log, airflow) as engine:
                return steps.cutover_standing(engine, tenant)
        except Exception as exc:  # noqa: BLE001 - unreadable here; the tenant's own run reports it
            log.warning("tenant %s: standing not readable (%s); it runs and its run reports why",
                        tenant, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return None

    if not tenants:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(tenants))), thread_name_prefix="standing") as pool:
        return dict(zip(tenants, pool.map(one, tenants), strict=True))


def _earlier_failure(ti, tenant: str, own_run_id: str, standing: dict[str, Any] | None) -> tuple[str | None, bool]:
    """(why the tenant failed before, whether this rollout run's own earlier run of it exists)."""
    exists = ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[own_run_id]) > 0
    if exists:
        state = ro.state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=own_run_id))
        if state == "success":
            return "succeeded", True
        if state == "failed":
            return f"failed in run {own_run_id}", True
        return f"still {state} in run {own_run_id}", True
    holder = (standing or {}).get("fence_held_by") or ""
    if not isinstance(holder, str):  # several cutover fences: their own runs say so (a refusal naming each)
        holder = ""
    prefix, _, rest = holder.partition(":")
    dag_id, _, run_id = rest.partition(":")
    if prefix == "airflow" and dag_id == ro.CUTOVER_DAG and run_id:
        try:
            state = ro.state_word(ti.get_dagrun_state(dag_id=dag_id, run_id=run_id))
        except Exception:  # noqa: BLE001 - the holder run is gone: treat as an earlier failure
            state = "failed"
        if state == "failed":
            return f"failed in run {run_id} (its fence is still armed)", False
    return None, False


def build_plan(params: dict[str, Any], run_id: str, requested_by: str | None, ti, log,
               preflight: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The rollout's plan (XCom ``rollout``); raises ValueError naming what to fix. ``preflight``: the
    preflight's rows; a tenant whose verdict is stop is skipped, or halts the rollout (``on_preflight_stop``)."""
    from nexus_airflow.rollout_preflight import halt_reason, stopped_tenants

    channel = (params or {}).get("notify_conn_id")  # one channel for the rollout and its tenants (nexus_airflow.notify)
    params = resolve(ROLLOUT_FIELDS, params)  # a field left empty on the form is its default
    tenants = form_tenants(params)
    shared = {**shared_conf(params), **({"notify_conn_id": channel} if channel else {})}
    stops = stopped_tenants(preflight) if params["on_preflight_stop"] != "run" else {}
    if stops and params["on_preflight_stop"] == "halt":
        raise ValueError(halt_reason(stops))
    approval, max_parallel = params["approval"], params["max_parallel"]
    ro.failure_budget(params["max_failed"], 1)  # refuses a negative budget up front
    runnable, skipped, reset = [], {}, set()
    standing_of = standings([t for t in tenants if t not in stops], log, params["preflight_concurrency"])
    for tenant in tenants:
        if tenant in stops:  # its plan would stop: no fence is armed for it, it is named in the summary
            skipped[tenant] = stops[tenant]
            continue
        own = ro.run_id_for(run_id, tenant)
        standing = standing_of[tenant]
        if standing and standing.get("old_work_above_cutoff"):  # no run can pass it: a reviewed recovery decision
            skipped[tenant] = "stop: " + "; ".join(a["text"] for a in standing["old_work_above_cutoff"])
            continue
        if standing and standing["cut_over"]:
            skipped[tenant] = f"already cut over ({standing['checkpointed']} pack(s) checkpointed, admission resumed)"
            continue
        before, exists = _earlier_failure(ti, tenant, own, standing)
        if before == "succeeded" or (before and before.startswith("still")):
            skipped[tenant] = f"{before} (this rollout run)"
            continue
        if before and not params["retry_failed"]:
            skipped[tenant] = f"{before}; not retried (set retry_failed to retry it)"
            continue
        if exists:
            reset.add(tenant)  # the rerun of this rollout run's own failed run: cleared and run again
        runnable.append(tenant)
    canary = params["canary"]
    waves = ro.plan_waves(runnable, canary if isinstance(canary, int) else list(canary), params["wave_size"])
    check_waves(params, waves)
    triggers = {t: _trigger(t, w["wave"], run_id, shared, params, requested_by, t in reset)
                for w in waves for t in w["tenants"]}
    return {"waves": waves, "approval": approval, "approvers": list(params["approvers"]),
            "allow_self_approval": params["allow_self_approval"], "max_failed": params["max_failed"],
            "max_parallel": max_parallel, "requested_by": requested_by, "skipped": skipped, "triggers": triggers}


def _trigger(tenant: str, wave: int, run_id: str, shared: dict[str, Any], params: dict[str, Any],
             requested_by: str | None, reset: bool) -> dict[str, Any]:
    conf = {"tenant": tenant, **shared, "approval": params["approval"], "approvers": list(params["approvers"]),
            "allow_self_approval": params["allow_self_approval"],
            "rollout": {"run_id": run_id, "wave": wave, "requested_by": requested_by}}
    if not conf.get("read_pool") and (pool := cluster_pool(tenant)):
        conf["read_pool"] = pool
    return {"conf": conf, "trigger_run_id": ro.run_id_for(run_id, tenant), "reset_dag_run": reset}


def cluster_pool(tenant: str) -> str | None:
    """The pool of ``tenant``'s database cluster, as its connection's extra names it (refused when it is not a
    pool's name: ValueError naming the connection)."""
    from nexus_airflow.hooks import NexusTenantHook
    from nexus_airflow.params import READ_POOL_EXTRA, conn_id_for, is_pool_name

    pool = NexusTenantHook(conn_id_for(tenant)).read_pool()
    if pool and not is_pool_name(pool):
        raise ValueError(f"connection {conn_id_for(tenant)}: extra {READ_POOL_EXTRA}={pool!r} is not an Airflow pool "
                         "name (letters, digits, _ . -)")
    return pool
