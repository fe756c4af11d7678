"""The rollout's plan (``tenant_rollout``'s ``plan`` task): which tenants run, in which waves, and which are skipped.

Invariants (the vocabulary is :mod:`nexus_airflow.rollout`):

* The preflight refuses bad input before any tenant database is read (:func:`check_form`), the plan
  again on the waves it makes; both before any tenant starts (the rollout fails with the
  reason in its summary): malformed, duplicated or no tenants, an unknown shared
  field, a shared value the per-tenant form would refuse (named with the schema's
  reason), more waves than the DAG declares, ``per_wave`` with a wave larger than
  ``max_parallel`` (its tenants must all wait at the question at once).
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
from nexus_airflow.params import ROLLOUT_FIELDS, SHARED_FIELDS, resolve


def _tenants(params: dict[str, Any]) -> list[str]:
    tenants = list(params.get("tenants") or [])
    if params.get("tenants_variable"):
        from airflow.sdk import Variable
        from airflow.sdk.exceptions import AirflowRuntimeError

        try:
            extra = Variable.get(params["tenants_variable"], deserialize_json=True)
        except (KeyError, ValueError, AirflowRuntimeError) as exc:  # missing, or not JSON: name the Variable
            raise ValueError(f"tenants_variable: Variable {params['tenants_variable']!r} is missing or not JSON "
                             f"({type(exc).__name__})") from None
        if not isinstance(extra, list) or not all(isinstance(t, str) for t in extra):
            raise ValueError(f"Variable {params['tenants_variable']} must hold a JSON list of tenant names")
        tenants += extra
    return tenants


def _shared_conf(params: dict[str, Any]) -> dict[str, Any]:
    """The shared per-tenant fields, each validated by the per-tenant form's own schema (the API's reason)."""
    from nexus_airflow.params import CUTOVER_FIELDS

    given = dict(params.get("cutover_conf") or {})
    unknown = sorted(set(given) - set(SHARED_FIELDS))
    if unknown:
        raise ValueError(f"cutover_conf: unknown or per-tenant fields {unknown}; allowed {', '.join(SHARED_FIELDS)}")
    for name, value in given.items():
        try:
            CUTOVER_FIELDS[name].param().resolve(value)
        except Exception as exc:  # noqa: BLE001 - ParamValidationError: its text is the schema's reason
            raise ValueError(f"cutover_conf.{name}={value!r} is refused by the per-tenant form: "
                             f"{str(exc).splitlines()[0][:300]}") from None
    return given


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


def form_tenants(params: dict[str, Any]) -> list[str]:
    """The rollout's tenants in order (``tenants``, then ``tenants_variable``'s); ValueError naming a malformed
    or duplicated one, or an empty list."""
    import re

    from nexus_airflow.params import TENANT_PATTERN

    tenants = _tenants(params)
    bad = [t for t in tenants if not re.match(TENANT_PATTERN, t)]
    dupes = sorted({t for t in tenants if tenants.count(t) > 1})
    if bad or dupes or not tenants:
        raise ValueError(f"tenants: malformed {bad}, duplicated {dupes}, or empty list")
    return tenants


def check_form(params: dict[str, Any]) -> list[str]:
    """The form's own refusals, before any tenant database is read (the preflight's first step): the tenants,
    the shared fields, the budget, and the waves the whole list would make (the canary, the number of waves,
    ``per_wave`` wider than ``max_parallel``). Returns the tenants; ValueError naming what to fix."""
    tenants = form_tenants(params)
    _shared_conf(params)
    ro.failure_budget(params["max_failed"], 1)
    canary = params["canary"]
    _check_waves(params, ro.plan_waves(tenants, canary if isinstance(canary, int) else list(canary),
                                       params["wave_size"]))
    return tenants


def _check_waves(params: dict[str, Any], waves: list[dict[str, Any]]) -> None:
    widest, max_parallel = max((len(w["tenants"]) for w in waves), default=0), params["max_parallel"]
    if params["approval"] == "per_wave" and widest > max_parallel:
        raise ValueError(f"approval per_wave needs every tenant of a wave waiting at once: the widest wave has "
                         f"{widest} tenants but max_parallel is {max_parallel}; lower wave_size or raise max_parallel")


def build_plan(params: dict[str, Any], run_id: str, requested_by: str | None, ti, log,
               preflight: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The rollout's plan (XCom ``rollout``); raises ValueError naming what to fix. ``preflight``: the
    preflight's rows; a tenant whose verdict is stop is skipped, or halts the rollout (``on_preflight_stop``)."""
    from nexus_airflow.rollout_preflight import halt_reason, stopped_tenants

    params = resolve(ROLLOUT_FIELDS, params)  # a field left empty on the form is its default
    tenants = form_tenants(params)
    shared = _shared_conf(params)
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
    _check_waves(params, waves)
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
    return {"conf": conf, "trigger_run_id": ro.run_id_for(run_id, tenant), "reset_dag_run": reset}
