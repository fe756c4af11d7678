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

from nexus_airflow import results
from nexus_airflow.base import DAG_TAKE_OVER, domain_errors, holder_state, params_of, plan, run_holder, stop, tenant_engine
from nexus_airflow.faults import fault_point
from nexus_cutover.projection.transition import CUTOVER
from nexus_cutover.transition import verdict_line

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
        from nexus_cutover.db import tls_report
        from nexus_cutover.projection import steps

        p = params_of(context)

        def created(label: str) -> None:
            self.log.info("%s: created", label)
            fault_point("apply_schema.after_first_write")

        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            result = steps.apply_schema(engine, dry_run=p.dry_run, on_created=created)
            with engine.connect() as conn:  # the run's first step that reports: the TLS its tenant connection used
                tenant_tls = tls_report(engine, conn)
        for label in result.present:
            self.log.info("%s: present, skipped", label)
        if p.dry_run:
            return {"dry_run": True, "plan": plan(self.log, result.plan), "tls": tenant_tls}
        return {"created": result.created, "present": result.present, "tls": tenant_tls}


class ArmFenceOperator(BaseOperator):
    """One non-expiring namespace-wide ``*`` fence held by this run.

    Reused on rerun, adopted from a finished run; stops at once when another
    unfinished run holds the tenant (naming it) or on active overrides (revokes nothing).
    """

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.projection import steps
        from nexus_cutover.projection.fence import ActiveOverrides, FenceHeld, OldWorkAboveCutoff, SeveralCutoverFences

        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            try:
                result = steps.arm_fence(engine, p.tenant, holder=_who(context), packs=results.packs(context["ti"]),
                                         timeout_s=p.checkpoint_timeout, holder_state=holder_state(context, self.log), adopt=p.adopt,
                                         take_over=DAG_TAKE_OVER, dry_run=p.dry_run)
            except ActiveOverrides as exc:
                stop(context, self.log, str(exc), {"active_overrides": exc.overrides})
            except FenceHeld as exc:
                stop(context, self.log, str(exc), {"held_by": exc.holder, "fence": exc.fence})
            except SeveralCutoverFences as exc:
                stop(context, self.log, str(exc), {"cutover_fences": exc.fences})
            except OldWorkAboveCutoff as exc:
                stop(context, self.log, str(exc), {"old_work_above_cutoff": exc.above})
        out = result.as_json()
        if p.dry_run:
            what = {"would_arm": "arm a new non-expiring '*' fence",
                    "would_adopt": f"adopt fence {result.fence_id} left by {result.previous_holder}"}.get(
                result.outcome, f"reuse fence {result.fence_id}")
            out["plan"] = plan(self.log, [f"_System_AdmissionFence: {what} on namespace {p.tenant!r}"])
            return out
        if result.not_needed:
            self.log.info("every pack of %s is already cut over and no cutover fence is in force: not fencing again "
                          "(last released cutover fence: %s)", p.tenant, result.fence_id)
            return out
        self.log.info("fence %s %s on namespace %s%s", result.fence_id, result.outcome, p.tenant,
                      f" (taken over from {result.previous_holder})" if result.previous_holder else "")
        if result.other_fences_in_force:
            self.log.warning("other fences in force (left as they are): %s", result.other_fences_in_force)
        fault_point("arm_fence.after_write")
        return out


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
            digest = steps.history_digest(engine, p.tenant, timeout_s=p.digest_timeout, connections=p.digest_connections,
                                          on_chunk=lambda _table, _chunk: fault_point("history_digest.mid_way"))
        self.log.info("%s; taken in %.1fs%s", digest.summary_text(), digest.seconds, " (dry run)" if p.dry_run else "")
        context["ti"].xcom_push(key=results.DIGEST_KEY, value=digest.as_json())
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
            armed = results.fence(context["ti"])
            result = steps.checkpoint(engine, self.pack_install_id, timeout_s=p.checkpoint_timeout,
                                      written_by=_who(context), dry_run=p.dry_run,
                                      fence_planned=p.dry_run and armed is not None and armed.planned)
        out = result.as_json()
        if not CUTOVER["audit_and_checkpoint"].verdict(out).proceeds:
            context["ti"].xcom_push(key=results.FINDINGS_KEY, value=out["findings"])
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
        armed = results.fence(context["ti"])
        fence_id = armed.fence_id if armed else None
        stale = dt.timedelta(seconds=p.stale_heartbeat)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            if p.dry_run:
                ready = steps.readiness(engine, p.tenant, stale_heartbeat=stale)
                return {"dry_run": True, "plan": plan(self.log, [
                    f"_System_AdmissionFence: set ReleasedAt on fence {fence_id or '(armed by arm_fence)'}"
                    f" once ready (now: {'ready' if ready.ready else '; '.join(ready.reasons)})"])}
            if armed and armed.not_needed:  # the last cutover fence was released by the run that held it
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
    verdicts = []
    for step in CUTOVER:
        if step.name != ti.task_id:
            verdicts += [(step.name, step.verdict(result)) for result in results.each(results.pulled(ti, step.name))]
    return CUTOVER.overall(verdicts)


class FinalOldWriterCheckOperator(BaseOperator):
    """No old-protocol writer after the fence release, no history row changed since the digest; then the Asset event."""

    def execute(self, context) -> dict[str, Any]:
        from airflow.sdk import Asset, AssetAlias

        p = params_of(context)
        ti = context["ti"]
        cutoffs = results.checkpoints(ti)
        if p.dry_run:
            verdict = dry_run_verdict(ti)
            self.log.info("VERDICT: %s", verdict_line(verdict, "the real run"))
            return {"dry_run": True, "plan": plan(self.log, []), "cutoffs": cutoffs, "verdict": verdict}
        armed = results.fence(ti)
        fence_id = armed.fence_id if armed else None
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
        armed = results.fence(context["ti"])
        if fence_id is None and armed is not None and armed.not_needed:
            released_at = utcnow()  # no release to date: look at live ones
        elif not fence or not fence.get("ReleasedAt"):
            stop(context, self.log, f"fence {fence_id} is not released: clear resume_admission")
        else:
            released_at = dt.datetime.fromisoformat(fence["ReleasedAt"])
        seen = {"old_writers_after_release": steps.verify_no_old_writer(engine, p.tenant, released_at=released_at),
                "released_at": released_at.isoformat()}
        verdict = CUTOVER["final_old_writer_check"].verdict(seen)
        if not verdict.proceeds:
            stop(context, self.log, verdict.reason, seen)
        return released_at

    def _history_unchanged(self, context, engine, p) -> dict[str, Any]:
        """The digest of ``history_digest`` verified against the rows now; stops naming every difference."""
        from nexus_cutover.projection import steps

        expected = results.digest(context["ti"])
        if expected is None:
            stop(context, self.log, "this run has no history digest in XCom (history_digest did not run, or its XCom "
                 "was cleared): the run cannot prove that history is unchanged. Clearing history_digest takes a new "
                 "digest, which proves only from then on")
        verification = steps.verify_history(engine, expected, timeout_s=p.digest_timeout)
        history = {**verification.as_json(), "summary": verification.summary()}
        verdict = CUTOVER["final_old_writer_check"].verdict({"history": history})
        if not verdict.proceeds:
            stop(context, self.log, verdict.reason, {"message": verification.summary(), "history": history})
        self.log.info("%s", verification.summary())
        return {"hash": verification.expected.short_hash, "rows": verification.rows_now, "verified": True,
                "chunks": verification.expected.chunk_count, "seconds": round(verification.seconds, 3)}
