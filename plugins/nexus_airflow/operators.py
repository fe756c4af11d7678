"""The writing steps of the cutover DAG, as thin operators over :mod:`nexus_cutover`.

Every operator: resolves the run's params, opens the tenant engine from the
connection id, calls one domain function, logs what it did (or, on a dry run,
the ``PLAN:`` of the writes it would make and writes nothing), returns a
JSON-serializable result, and converges when cleared and rerun:

* ``resolve_packs``: read only; stops a tenant another holder holds (one cutover per tenant) before anything is
  written;
* ``apply_schema``: present objects are skipped; the v2 prerequisite is checked first, never created;
* ``arm_fence``: reuses the identical fence; refuses (listing them) on active overrides;
* ``history_digest``: read only; taken again from the rows on rerun (the same rows give the same digest);
* ``audit_and_checkpoint``: the checkpoint returns an existing row unchanged; a refusal fails with every finding;
* ``resume_admission``: gated on readiness; an already released fence is a no-op success;
* ``final_old_writer_check``: read only; reports any old writer seen after the release and any history row
  changed since the digest; emits the Asset event.

Heavy imports (SQLAlchemy, the domain package) happen inside ``execute`` only.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import BaseOperator

from nexus_airflow.base import DAG_TAKE_OVER, domain_errors, holder_state, params_of, plan, run_holder, stop, tenant_engine
from nexus_airflow.faults import fault_point

ASSET_ALIAS = "nexus-connector-projection-ranges"


def asset_uri(tenant: str) -> str:
    return f"nexus://{tenant}/connector-projection-ranges"


def _who(context) -> str:
    return run_holder(context)


class ResolvePacksOperator(BaseOperator):
    """The pack incarnations of the run (``pack_install_ids`` or every active pack of the namespace).

    Also the run's first look at who holds the tenant (read only): another holder that this run may not adopt
    stops it here, naming the holder, before ``apply_schema`` writes anything. ``arm_fence`` decides again under
    the namespace lock, where it acts.
    """

    def execute(self, context) -> list[str]:
        from nexus_airflow.params import CUTOVER_FIELDS, CUTOVER_RULES, check_form
        from nexus_cutover.projection import steps
        from nexus_cutover.projection.fence import FenceHeld, SeveralCutoverFences

        with domain_errors(context, self.log):
            check_form(context, CUTOVER_FIELDS, CUTOVER_RULES)  # the run's first task: a bad form fails before anything is read
        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            packs = steps.resolve_packs(engine, p.tenant, p.pack_install_ids)
            try:
                steps.held_by_another(engine, p.tenant, holder=_who(context), holder_state=holder_state(context, self.log),
                                      adopt=p.adopt, take_over=DAG_TAKE_OVER)
            except FenceHeld as exc:
                stop(context, self.log, str(exc), {"held_by": exc.holder, "fence": exc.fence})
            except SeveralCutoverFences as exc:
                stop(context, self.log, str(exc), {"cutover_fences": exc.fences})
        self.log.info("tenant %s: packs %s%s", p.tenant, ", ".join(packs), " (dry run)" if p.dry_run else "")
        return packs


class ApplySchemaOperator(BaseOperator):
    """Additive DDL of the range protocol, each object skipped when present; refuses without ReplayOfWorkId."""

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.projection import steps

        p = params_of(context)

        def created(label: str) -> None:
            self.log.info("%s: created", label)
            fault_point("apply_schema.after_first_write")

        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            result = steps.apply_schema(engine, dry_run=p.dry_run, on_created=created)
        for label in result.present:
            self.log.info("%s: present, skipped", label)
        if p.dry_run:
            return {"dry_run": True, "plan": plan(self.log, result.plan)}
        return {"created": result.created, "present": result.present}


class ArmFenceOperator(BaseOperator):
    """One non-expiring namespace-wide ``*`` fence held by this run.

    Reused on rerun, adopted from a finished run; stops at once when another
    unfinished run holds the tenant (naming it) or on active overrides (revokes nothing).
    """

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.projection import steps
        from nexus_cutover.projection.fence import ActiveOverrides, FenceHeld, SeveralCutoverFences

        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            try:
                packs = context["ti"].xcom_pull(task_ids="resolve_packs") or []
                result = steps.arm_fence(engine, p.tenant, holder=_who(context), packs=packs, timeout_s=p.checkpoint_timeout,
                                         holder_state=holder_state(context, self.log), adopt=p.adopt,
                                         take_over=DAG_TAKE_OVER, dry_run=p.dry_run)
            except ActiveOverrides as exc:
                stop(context, self.log, str(exc), {"active_overrides": exc.overrides})
            except FenceHeld as exc:
                stop(context, self.log, str(exc), {"held_by": exc.holder, "fence": exc.fence})
            except SeveralCutoverFences as exc:
                stop(context, self.log, str(exc), {"cutover_fences": exc.fences})
        out = result.as_json()
        if p.dry_run:
            what = {"would_arm": "arm a new non-expiring '*' fence",
                    "would_adopt": f"adopt fence {result.fence_id} left by {result.previous_holder}"}.get(
                result.outcome, f"reuse fence {result.fence_id}")
            out["plan"] = plan(self.log, [f"_System_AdmissionFence: {what} on namespace {p.tenant!r}"])
            return out
        if result.outcome == "not_needed":
            self.log.info("every pack of %s is already cut over and no cutover fence is in force: not fencing again "
                          "(last released cutover fence: %s)", p.tenant, result.fence_id)
            return out
        self.log.info("fence %s %s on namespace %s%s", result.fence_id, result.outcome, p.tenant,
                      f" (taken over from {result.previous_holder})" if result.previous_holder else "")
        if result.other_fences_in_force:
            self.log.warning("other fences in force (left as they are): %s", result.other_fences_in_force)
        fault_point("arm_fence.after_write")
        return out


DIGEST_KEY = "digest"  # XCom key of the full digest (chunks); return_value holds its summary


class HistoryDigestOperator(BaseOperator):
    """The history digest of the tenant, once old writers are confirmed stopped (read only, also on a dry run).

    Pushes the full digest (XCom ``digest``, what ``final_old_writer_check``
    verifies) and returns its summary: hash, rows and chunks per table.
    """

    def execute(self, context) -> dict[str, Any]:
        from nexus_airflow.rollout import stop_if_cancelled
        from nexus_cutover.projection import steps
        from nexus_cutover.schema import missing_projection_schema

        stop_if_cancelled(context, self.log, "the history digest (the last step before the checkpoints)")
        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            missing = missing_projection_schema(engine)
            if p.dry_run and missing:
                # The digest reads InputStartOrdinal and the checkpoints; on a dry run apply_schema created nothing.
                return {"dry_run": True, "taken": False, "missing_schema": missing,
                        "plan": plan(self.log, [f"(read only) take the history digest once apply_schema has created "
                                                f"{', '.join(missing)}"])}
            digest = steps.history_digest(engine, p.tenant, timeout_s=p.digest_timeout,
                                          on_chunk=lambda _table, _chunk: fault_point("history_digest.mid_way"))
        self.log.info("%s; taken in %.1fs%s", digest.summary_text(), digest.seconds, " (dry run)" if p.dry_run else "")
        context["ti"].xcom_push(key=DIGEST_KEY, value=digest.as_json())
        return digest.summary()


class AuditCheckpointOperator(BaseOperator):
    """Audit one pack under the namespace/pack locks and write its one-time LegacyMaxOrdinal (mapped per pack)."""

    template_fields = ("pack_install_id",)

    def __init__(self, *, pack_install_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pack_install_id = pack_install_id

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.projection import steps
        from nexus_cutover.schema import missing_projection_schema

        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            missing = missing_projection_schema(engine)
            if p.dry_run and missing:
                # The audit reads the Part B objects; on a dry run apply_schema created nothing.
                return {"pack_install_id": self.pack_install_id, "outcome": "not_audited", "missing_schema": missing,
                        "plan": plan(self.log, [f"audit pack {self.pack_install_id} and write its checkpoint once "
                                                f"apply_schema has created {', '.join(missing)}"])}
            planned = (context["ti"].xcom_pull(task_ids="arm_fence") or {}).get("outcome") in ("would_arm", "would_adopt")
            result = steps.checkpoint(engine, self.pack_install_id, timeout_s=p.checkpoint_timeout,
                                      written_by=_who(context), dry_run=p.dry_run, fence_planned=p.dry_run and planned)
        out = result.as_json()
        if result.outcome == "refused":
            context["ti"].xcom_push(key="findings", value=out["findings"])
            stop(context, self.log,
                 f"{result.summary()}. Old missing or ambiguous responsibility needs a separately reviewed recovery "
                 "decision; the cutoff is never used to hide it. The fence stays armed.", out)
        self.log.info("%s", result.summary())
        if p.dry_run:
            out["plan"] = plan(self.log, [
                f"_System_ConnectorProjectionProtocol: insert ({self.pack_install_id}, ProtocolVersion=1, "
                f"LegacyMaxOrdinal={result.legacy_max_ordinal})"] if result.outcome == "would_write" else [])
            return out
        fault_point("audit_and_checkpoint.after_write")
        return out


class ResumeAdmissionOperator(BaseOperator):
    """Release the fence this run holds (ReleasedAt), readiness re-checked in the releasing transaction."""

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.projection import steps

        p = params_of(context)
        armed = context["ti"].xcom_pull(task_ids="arm_fence") or {}
        fence_id = armed.get("fence_id")
        stale = dt.timedelta(seconds=p.stale_heartbeat)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            if p.dry_run:
                ready = steps.readiness(engine, p.tenant, stale_heartbeat=stale)
                return {"dry_run": True, "plan": plan(self.log, [
                    f"_System_AdmissionFence: set ReleasedAt on fence {fence_id or '(armed by arm_fence)'}"
                    f" once ready (now: {'ready' if ready.ready else '; '.join(ready.reasons)})"])}
            if armed.get("outcome") == "not_needed":  # the last cutover fence was released by the run that held it
                self.log.info("the tenant was already cut over and no cutover fence is in force: nothing to release "
                              "(last released cutover fence: %s)", fence_id)
                return {"namespace": p.tenant, "outcome": "already_released" if fence_id else "nothing_to_release",
                        "fence_id": fence_id}
            if fence_id is None:
                stop(context, self.log, "arm_fence left no fence id in XCom: clear arm_fence (it reuses the fence)")
            result = steps.release_fence(engine, p.tenant, int(fence_id), holder=_who(context), stale_heartbeat=stale,
                                         timeout_s=p.checkpoint_timeout)
        self.log.info("fence %s %s: admission resumes through the new host", fence_id, result.outcome)
        fault_point("resume_admission.after_write")
        return result.as_json()


def dry_run_verdict(ti) -> str:
    """What the real run would do, from the dry run's own looks: each declared step's verdict on its result, combined
    as ``nexus-cutover plan`` combines them (proceed, wait for what, or stop and why)."""
    from nexus_cutover.projection.transition import CUTOVER

    verdicts = []
    for step in CUTOVER:
        if step.name != ti.task_id:
            verdicts += [(step.name, step.verdict(result)) for result in _results(ti.xcom_pull(task_ids=step.name))]
    return CUTOVER.overall(verdicts)


def _results(pulled) -> list[dict[str, Any]]:
    """A task's XCom results as a list: a mapped task's one per map index, one pack's the dict itself."""
    return [r for r in ([pulled] if isinstance(pulled, dict) else list(pulled or [])) if isinstance(r, dict)]


class FinalOldWriterCheckOperator(BaseOperator):
    """No old-protocol writer after the fence release, no history row changed since the digest; then the Asset event."""

    def execute(self, context) -> dict[str, Any]:
        from airflow.sdk import Asset, AssetAlias

        p = params_of(context)
        ti = context["ti"]
        cutoffs = {r["pack_install_id"]: r.get("legacy_max_ordinal")
                   for r in _results(ti.xcom_pull(task_ids="audit_and_checkpoint"))}
        if p.dry_run:
            verdict = dry_run_verdict(ti)
            self.log.info("VERDICT: the real run would %s", verdict)
            return {"dry_run": True, "plan": plan(self.log, []), "cutoffs": cutoffs, "verdict": verdict}
        fence_id = (ti.xcom_pull(task_ids="arm_fence") or {}).get("fence_id")
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            released_at = self._no_old_writer_since_release(context, engine, p, fence_id)
            history = self._history_unchanged(context, engine, p)
        fault_point("final_old_writer_check.before_emit")
        extra = {"tenant": p.tenant, "cutoffs": cutoffs, "fence_id": fence_id, "released_at": released_at.isoformat(),
                 "history_digest": history}
        context["outlet_events"][AssetAlias(ASSET_ALIAS)].add(Asset(asset_uri(p.tenant)), extra=extra)
        self.log.info("cutover complete for %s: %s. Do not restart an old writer after this point.", p.tenant, extra)
        return extra

    def _no_old_writer_since_release(self, context, engine, p, fence_id) -> dt.datetime:
        from nexus_cutover import tx
        from nexus_cutover.clock import utcnow
        from nexus_cutover.projection import steps
        from nexus_cutover.projection.fence import fence_row

        with tx.reading(engine, "reading the released fence") as conn:
            fence = fence_row(conn, int(fence_id)) if fence_id is not None else None
        if fence_id is None and (context["ti"].xcom_pull(task_ids="arm_fence") or {}).get("outcome") == "not_needed":
            released_at = utcnow()  # no release to date: look at live ones
        elif not fence or not fence.get("ReleasedAt"):
            stop(context, self.log, f"fence {fence_id} is not released: clear resume_admission")
        else:
            released_at = dt.datetime.fromisoformat(fence["ReleasedAt"])
        seen = steps.verify_no_old_writer(engine, p.tenant, released_at=released_at)
        if seen:
            stop(context, self.log,
                 f"{len(seen)} old-protocol writer(s) ran after the fence release at {released_at.isoformat()}: "
                 + ", ".join(x["process_id"] for x in seen)
                 + ". Do not restart an old writer after this point: stop them now and review what they admitted.",
                 {"old_writers_after_release": seen})
        return released_at

    def _history_unchanged(self, context, engine, p) -> dict[str, Any]:
        """The digest of ``history_digest`` verified against the rows now; stops naming every difference."""
        from nexus_cutover.projection import steps
        from nexus_cutover.projection.digest import HistoryDigest

        raw = context["ti"].xcom_pull(task_ids="history_digest", key=DIGEST_KEY)
        if raw is None:
            stop(context, self.log, "this run has no history digest in XCom (history_digest did not run, or its XCom "
                 "was cleared): the run cannot prove that history is unchanged. Clearing history_digest takes a new "
                 "digest, which proves only from then on")
        verification = steps.verify_history(engine, HistoryDigest.from_json(raw), timeout_s=p.digest_timeout)
        if not verification.ok:
            stop(context, self.log,
                 f"{verification.summary()}. The cutover must never change a history row: stop whatever changed "
                 "them and review the rows named (XCom report.history) against the tenant's backup.",
                 {"message": verification.summary(), "history": verification.as_json()})
        self.log.info("%s", verification.summary())
        return {"hash": verification.expected.short_hash, "rows": verification.rows_now, "verified": True,
                "chunks": verification.expected.chunk_count, "seconds": round(verification.seconds, 3)}
