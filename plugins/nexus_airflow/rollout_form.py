"""The rollout's form (``tenant_rollout``'s params): its refusals, before any tenant database is read.

Invariants:

* The preflight refuses bad input before any tenant database is read (:func:`check_form`), the plan
  (:mod:`.rollout_plan`) again on the waves it makes (:func:`check_waves`); both before any tenant
  starts (the rollout fails with the reason in its summary): malformed, duplicated or no tenants, an
  unknown shared field, a shared value the per-tenant form would refuse (named with the schema's
  reason), more waves than the DAG declares, ``per_wave`` with a wave larger than ``max_parallel``
  (its tenants must all wait at the question at once).
* Every refusal is a ValueError naming what to fix; nothing here reads a tenant database or writes anything.
"""

from __future__ import annotations

from typing import Any

from nexus_airflow import rollout as ro
from nexus_airflow.params import SHARED_FIELDS


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


def shared_conf(params: dict[str, Any]) -> dict[str, Any]:
    """The shared per-tenant fields, each validated by the per-tenant form's own schema (the API's reason)."""
    from nexus_airflow.params import CUTOVER_FIELDS, renamed_fields

    given = renamed_fields(dict(params.get("cutover_conf") or {}))
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
    shared_conf(params)
    ro.failure_budget(params["max_failed"], 1)
    canary = params["canary"]
    check_waves(params, ro.plan_waves(tenants, canary if isinstance(canary, int) else list(canary),
                                      params["wave_size"]))
    return tenants


def check_waves(params: dict[str, Any], waves: list[dict[str, Any]]) -> None:
    """``per_wave`` needs every tenant of a wave waiting at its question at once: ValueError when the widest of
    ``waves`` is wider than ``max_parallel``."""
    widest, max_parallel = max((len(w["tenants"]) for w in waves), default=0), params["max_parallel"]
    if params["approval"] == "per_wave" and widest > max_parallel:
        raise ValueError(f"approval per_wave needs every tenant of a wave waiting at once: the widest wave has "
                         f"{widest} tenants but max_parallel is {max_parallel}; lower wave_size or raise max_parallel")
