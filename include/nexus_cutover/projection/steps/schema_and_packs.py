"""Stage 1's first steps: ``resolve_packs`` (the run's packs, the first look at who holds the tenant, the TLS it
uses) and ``apply_schema`` (the additive schema).
"""

from __future__ import annotations

from ...db import tls_line
from ...transition import Outcome, StepResult, Verdict
from ...tx import connection_tls
from .. import actions, cutover_fence
from .context import CutoverRun


def resolve_packs(run: CutoverRun) -> StepResult:
    """The run's packs; and its first, read-only look at who holds the tenant: a holder this run may not adopt
    stops it here, naming the holder, before ``apply_schema`` writes anything (``arm_fence`` decides again under
    the namespace lock, where it acts). As the run's first step it reports the TLS its tenant connection uses
    (:func:`nexus_cutover.tx.connection_tls`: the mode, the certificate paths, the TLS version negotiated; no key,
    no password): a line, the result keyed ``tls`` (the DAG's XCom) and the ``tls`` field (``run``/``plan -json``)."""

    packs = actions.resolve_packs(run.engine, run.namespace, run.requested_packs)
    run.say(f"packs: {', '.join(packs)}")
    tenant_tls = connection_tls(run.engine)  # the run's report says how it reached the tenant (XCom ``tls``, -json)
    run.say(tls_line(tenant_tls))
    said = {"keyed": {"tls": tenant_tls}, "fields": {"tls": tenant_tls}}
    try:
        actions.held_by_another(run.engine, run.namespace, holder=run.holder, holder_state=run.holder_state,
                                adopt=run.adopt, take_over=run.take_over)
    except (cutover_fence.FenceHeld, cutover_fence.SeveralCutoverFences) as exc:
        return StepResult(packs, Verdict(Outcome.STOP, str(exc)), report=exc.report, **said)
    return StepResult(packs, **said)


def apply_schema(run: CutoverRun) -> StepResult:
    """The additive schema, each object skipped when present; the TLS the tenant connection uses."""

    def created(label: str) -> None:
        run.say(f"{label}: created")
        run.seam("apply_schema.after_first_write")

    result = actions.apply_schema(run.engine, dry_run=run.dry_run, on_created=created)
    tenant_tls = connection_tls(run.engine)
    value = {"created": result.created, "present": result.present, "tls": tenant_tls}
    if run.dry_run:
        run.plan(*result.plan)
        run.say("schema: " + (f"would create {', '.join(result.missing)} (the DDL: -json, schema.plan)"
                              if result.missing else "complete"))
        return StepResult({**value, "dry_run": True, "missing": result.missing})
    for label in result.present:
        run.say(f"{label}: present, skipped")
    return StepResult(value)

