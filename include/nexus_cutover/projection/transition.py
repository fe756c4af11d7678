"""The connector projection range cutover (seed 000, "Existing-data cutover"), declared once.

:data:`CUTOVER` is the ordered list of steps: the DAG
``connector_projection_cutover`` builds its tasks and their order from it,
``nexus-cutover run`` runs it and ``nexus-cutover plan`` dry-runs it, step by
step, in this order (tests/test_transition.py fails when one of them
disagrees). Each step's body, the one the three of them run, is in
:mod:`.steps` (its ``calls``); what a stop
tells the engineer to do next is here (:mod:`.next_actions` and
docs/runbook.md show the same texts).

Every verdict reads a step's result in its JSON form (what XCom and ``-json``
carry), so the DAG, ``run`` and ``plan`` judge the same result the same way.
Light to import: the DAG file reads this at parse time.
"""

from __future__ import annotations

from typing import Any

from ..transition import PROCEED, Kind, Outcome, Stage, Step, Transition, Verdict, Wait

STEPS = "nexus_cutover.projection.steps"

#: The default of ``arm_when_drain_below`` (the form's and the command line's): the fence is armed once the old
#: backlog would drain within a minute, so at most about a minute of the admission pause is the tenant's own
#: residual drain (docs/performance.md, "Arming when the drain is short"). 0 arms at once.
DEFAULT_ARM_WHEN_DRAIN_BELOW_S = 60.0


def fence_verdict(result: dict[str, Any]) -> Verdict:
    """A refusal (``refused``) stops, and so does old-protocol work above a pack's cutoff (``old_work_above_cutoff``,
    which a dry run looks at: no step can proceed past it; named once when it is the refusal). ``not_needed``:
    every pack is already checkpointed and no cutover fence is in force, nothing to do."""
    found = [result["refused"]] if result.get("refused") else []
    if result.get("refusal") != "OldWorkAboveCutoff":  # that refusal's message names the work already
        found += [above["text"] for above in result.get("old_work_above_cutoff") or []]
    if found:
        return Verdict(Outcome.STOP, "; ".join(found))
    if result.get("outcome") == "not_needed":
        return Verdict(Outcome.DONE, "already cut over (every pack checkpointed, no cutover fence in force): nothing to do")
    return PROCEED


def drain_verdict(report: dict[str, Any]) -> Verdict:
    """Drained: proceed. Stuck (a blocker that cannot clear by the deadline, or the deadline): stop. Else wait."""
    if report["state"] == "drained":
        return PROCEED
    if report["state"] == "stuck":
        from .drain import blockers_text  # noqa: PLC0415 - the DAG files import the declaration at parse: kept light

        blockers = blockers_text(report.get("blocker_totals") or {})
        return Verdict(Outcome.STOP, "the drain is stuck: " + (blockers or "drain_timeout reached"),
                       timed_out=bool(report.get("timed_out")))
    return Verdict(Outcome.WAIT, f"the drain ({report['remaining']} old projection WorkItems remaining)")


def pre_arm_verdict(look: dict[str, Any]) -> Verdict:
    """Arm (proceed) when no old projection work remains, when ``arm_when_drain_below_s`` is 0 (arm at once), or
    when the remaining work would drain within it at the measured rate. Stop when it cannot drain (a stuck
    backlog: :func:`drain_verdict`'s stop, its blockers named). Else wait, naming the remaining work and the
    rate, with the fence not armed."""
    remaining, bound = look["remaining"], look["arm_when_drain_below_s"]
    if remaining == 0 or not bound:
        return PROCEED
    if look.get("state") == "stuck":  # the drain's own stop, in its words: said once where a dry run finds both
        return drain_verdict(look)
    eta = look.get("eta_s")
    if eta is not None and eta <= bound:
        return PROCEED
    rate = look.get("rate_per_min")
    measured = ("its drain rate is measured from the next look" if rate is None
                else f"{rate:+.1f} items/min, ETA " + (f"~{eta:.0f} s" if eta is not None else "none (not shrinking)"))
    return Verdict(Outcome.WAIT, f"the old projection backlog to drain within arm_when_drain_below ({bound:g} s) before "
                   f"the fence is armed ({remaining} remaining; {measured})")


def _proceed_unless(found: list[str], outcome: Outcome, reason: str) -> Verdict:
    """Proceed when nothing was ``found``; else ``outcome`` with ``reason`` (``{n}`` and ``{names}`` filled in)."""
    return PROCEED if not found else Verdict(outcome, reason.format(n=len(found), names=", ".join(found)))


def writers_verdict(evidence: dict[str, Any]) -> Verdict:
    """No live old writer: proceed. Else wait for them to be stopped (a person confirms afterwards either way)."""
    return _proceed_unless(list(evidence.get("live") or []), Outcome.WAIT,
                           "{n} live old writer(s) to be stopped ({names}), then a person's confirmation")


def writers_stop_verdict(answer: dict[str, Any]) -> Verdict:
    """The writer-stop controller's answer: a failure (an exit other than 0, a refusing or non-2xx answer, a timeout)
    stops with the fence held; manual (nothing run), a dry run or a success proceeds. A success proves nothing by
    itself: ``check_old_writers`` and the confirmation still judge the registry."""
    if answer.get("ok", True):
        return PROCEED
    return Verdict(Outcome.STOP, f"{answer.get('failure') or 'the writer-stop controller failed'}. The fence stays "
                   "armed; nothing after it ran", timed_out=bool(answer.get("timed_out")))


def confirmation_verdict(recheck: dict[str, Any]) -> Verdict:
    """The confirmation holds only if no old writer came back since the evidence the person saw."""
    return _proceed_unless(list(recheck.get("came_back") or []), Outcome.STOP,
                           "cutover not performed: old writer(s) {names} came back after the evidence was taken. "
                           "Nothing was confirmed; the fence stays armed.")


def checkpoint_verdict(result: dict[str, Any]) -> Verdict:
    """A refusal stops (every finding named); written, already written or would write proceeds."""
    if result.get("outcome") != "refused":
        return PROCEED
    findings = ", ".join(f.get("finding", "?") for f in result.get("findings") or [])
    return Verdict(Outcome.STOP, f"pack {result['pack_install_id']} is refused by the audit: {findings}")


def readiness_verdict(report: dict[str, Any]) -> Verdict:
    if report.get("ready"):
        return PROCEED
    return Verdict(Outcome.WAIT, "the new host (" + "; ".join(report.get("reasons") or ["not ready"]) + ")")


def final_verdict(result: dict[str, Any]) -> Verdict:
    """No old writer after the release and no history row changed since the digest; anything else stops."""
    seen = result.get("old_writers_after_release") or []
    if seen:
        at = f" at {result['released_at']}" if result.get("released_at") else ""
        return Verdict(Outcome.STOP, f"{len(seen)} old-protocol writer(s) ran after the fence release{at}: "
                       + ", ".join(p["process_id"] for p in seen)
                       + ". Do not restart an old writer after this point: stop them now and review what they admitted.")
    history = result.get("history") or {}
    if history and not history.get("ok"):
        return Verdict(Outcome.STOP, f"{history.get('summary', 'the history digest does not verify')}. The cutover "
                       "must never change a history row: stop whatever changed them and review the rows named "
                       "(report.history) against the tenant's backup.")
    return PROCEED


CUTOVER = Transition("connector_projection_cutover", (
    Stage(1, "Additive schema and the admission fence", group_id="step_1_fence", steps=(
        Step("resolve_packs", Kind.READS, f"{STEPS}:resolve_packs",
             task_doc=("Reads the tenant's active packs (or checks `pack_install_ids`). Writes nothing. **Stops** on an "
             "unknown/inactive/foreign pack or a namespace without active packs: fix the form."),
             key="packs", role="packs",
             dry_run="the same read; a tenant another holder holds stops here too",
             next_action="fix the form or the connection; trigger again. A tenant another run or command holds: the "
             "message names the holder and how to take it over (`adopt`)"),
        Step("apply_schema", Kind.WRITES, f"{STEPS}:apply_schema",
             task_doc=("Additive DDL only: `_System_WorkItem.InputStartOrdinal` and `_System_ConnectorProjectionProtocol`, "
             "each skipped when present. **Refuses** when the v2 prerequisite `ReplayOfWorkId` is missing (it is "
             "never manufactured): land the WorkItem-only v2 handoff first, then clear."),
             commands=("apply-schema",),
             key="schema",
             dry_run="the DDL it would run, one PLAN line per missing object",
             next_action="land the v2 handoff first, then clear the task"),
        Step("wait_for_short_drain", Kind.WAITS, f"{STEPS}:wait_for_short_drain", records=f"{STEPS}.pre_arm:events",
             task_doc=("Deferrable, before the fence: waits, with admission still open, until the old projection backlog "
             "would drain within `arm_when_drain_below` seconds at its measured rate (two looks give the rate), so "
             "the admission pause holds only a short residual drain; 0 arms at once. Writes nothing and holds "
             "nothing. **Stops and reports** (nothing written, the fence not armed) when the backlog cannot drain "
             "(its blockers by cause) or at `pre_arm_timeout` (the remaining work and the rate). The drain the "
             "cutover relies on is still `wait_for_drain`, after the fence."),
             key="pre_arm", bound="pre_arm_timeout", verdict=pre_arm_verdict,
             dry_run="one look at the old projection backlog (its rate needs a second look): the run would wait, "
             "with the fence not armed, while it would take longer than arm_when_drain_below to drain",
             next_action="nothing was written and the fence is not armed. A stuck backlog: resolve its blockers "
             "with the old runtime. One that does not drain fast enough: let the old runtime catch up (more old "
             "workers), or trigger with a larger arm_when_drain_below (0 arms at once, as before). Clear the task",
             wait_action="nothing: the old runtime drains its backlog while admission stays open; the run arms the "
             "fence by itself once the rest would drain within arm_when_drain_below",
             wait=Wait("pre_arm", watch=f"{STEPS}.pre_arm:PreArmWatch",
                       ran_out="the old projection backlog did not get short enough to arm the fence within "
                       "pre_arm_timeout: stopped and reported (nothing was written; the fence is not armed)",
                       plan="wait until the old backlog would drain within arm_when_drain_below, then arm",
                       late="waiting for its old backlog to be short before it arms")),
        Step("arm_fence", Kind.WRITES, f"{STEPS}:arm_fence", records=f"{STEPS}.fence:events",
             task_doc=("Arms one non-expiring namespace-wide `*` admission fence held by this run (`ArmedBy`), reuses it on "
             "rerun, or adopts the one a failed/finished run left. **Stops** at once, writing nothing, while "
             "another unfinished run holds the tenant (named in XCom `report`), and while any fence override is "
             "active (listed; it revokes nothing): have the tenant's delivery owner revoke them, then clear. Keep the old workers and "
             "dependency resolvers running."),
             commands=("arm-fence",), role="fence",
             key="fence", verdict=fence_verdict,
             dry_run="whether it would arm, reuse or adopt the fence; refusals as in the real run",
             next_action="active overrides: have the tenant's delivery owner revoke them, then clear. Several cutover "
             "fences: have the tenant's delivery owner release all but the one of the cutover in progress, then "
             "clear. A held tenant: the message names the holder and how to take it over. Old work above a cutoff: a "
             "separately reviewed recovery decision (Rollback stance)"),
    )),
    Stage(2, "Old projection work drains", group_id="step_2_drain", steps=(
        Step("wait_for_drain", Kind.WAITS, f"{STEPS}:wait_for_drain", records=f"{STEPS}.draining:events",
             task_doc=("Deferrable: waits until no old projection WorkItem is pending, blocked, retry or processing, logging "
             "the remaining counts and trend each poll. **Stops and reports** (XCom `report`, log) as soon as the "
             "drain provably cannot finish within `drain_timeout` -- retry not due before the deadline, blocked on "
             "an external dependency while no live old dependency_resolver heartbeats (with one, blocked items are "
             "progressing), expired lease, no live old worker -- or at the timeout, reporting everything still "
             "remaining. It never changes a WorkItem. Resolve the blockers with the old runtime, then clear."),
             commands=("drain",),
             key="drain", bound="drain_timeout", verdict=drain_verdict,
             dry_run="one look: drained, stuck (a stop) or still draining (the run would wait)",
             next_action="read the report (grouped by cause, with WorkIds). Resolve with the old runtime or a "
             "separately reviewed operational decision. **Never change WorkItem status to proceed.** Clear the task",
             wait_action="nothing while it drains: the old runtime finishes its work and the run goes on by itself. "
             "Stuck items (named by cause) need the old runtime or a separately reviewed operational decision",
             role="drain",
             wait=Wait("drain", watch=f"{STEPS}.draining:DrainWatch",
                       ran_out="the drain of old projection work cannot finish within drain_timeout: stopped and "
                       "reported (no WorkItem was changed; the fence stays armed)",
                       plan="wait for the drain",
                       late="fenced, waiting for the rest of its old backlog to drain")),
    )),
    Stage(3, "Old writers stopped, confirmed; the history digest", group_id="step_3_old_writers", steps=(
        Step("stop_old_writers", Kind.WRITES, f"{STEPS}:stop_old_writers", records=f"{STEPS}.writers:events",
             role="writers_stop",
             kind_text="stops the old writers by `writers_stop_controller`; nothing when it is `manual`",
             task_doc=("Stops every old writer by `writers_stop_controller`, the fence held: `manual` (the default) "
             "runs nothing (you stop them; `check_old_writers` waits), `command` runs the Variable "
             "`nexus_writers_stop_command` (a JSON argv, `{tenant}` replaced; `NEXUS_TENANT` in its environment, no "
             "DSN) and waits for it, `http` POSTs to the connection `writers_stop_http_conn_id` and checks the answer. "
             "Bounded by `writers_stop_controller_timeout` (a hang is killed). Its answer (what it stopped, when, exit "
             "code or HTTP status, output tail) is XCom, shown at the confirmation and in the delivery ledger; it is "
             "evidence, never proof. **Stops** (fence held, nothing after it) when the controller fails or times "
             "out."),
             commands=("stop-writers",),
             key="writers_stop", verdict=writers_stop_verdict, planned=False,
             dry_run="how it would stop the old writers; runs nothing",
             next_action="read the controller's output in the report; fix the deployment or its configuration (or "
             "stop the old writers yourself and trigger with writers_stop_controller manual), then clear the task. "
             "The fence stays armed; nothing after it ran"),
        Step("check_old_writers", Kind.WAITS, f"{STEPS}:check_old_writers",
             task_doc=("Now stop every old ingress_writer, receipt_materializer, projection_worker and dependency_resolver "
             "(keep the fence). Waits until `_System_ProcessRegistry` shows each one stopped or silent beyond "
             "`stale_heartbeat`; the evidence is in XCom. **Stops** at `writers_stop_timeout`."),
             commands=("writers",),
             key="writers", bound="writers_stop_timeout", verdict=writers_verdict,
             dry_run="one look at the old writers: the run would wait for every live one",
             next_action="stop it; clear the task",
             wait_action="stop every live old writer named (keep the fence); the run goes on by itself once none is "
             "live, then asks you to confirm",
             role="writers",
             wait=Wait("old_writers", watch=f"{STEPS}.writers:WritersWatch",
                       ran_out="old-protocol writers are still live after writers_stop_timeout: stop them (keep the "
                       "fence), then clear check_old_writers",
                       plan="wait until every old writer is stopped",
                       late="waiting for a live old writer to be stopped")),
        Step("confirm_writers_stopped", Kind.ASKS, f"{STEPS}:confirm_writers_stopped",
             task_doc=("Human in the loop: shows the process evidence (and when it was taken) and asks the engineer to "
             "confirm that no old writer will resume. The registry is read again when the answer arrives: a writer "
             "that is live, or started or heartbeated since the evidence, fails the run. No default: **Reject or "
             "no answer** ends the run FAILED, cutover not performed, fence still armed, no checkpoint written."),
             commands=("confirm-writers",),
             key="confirmation", planned=False, verdict=confirmation_verdict, role="confirmation",
             dry_run="asks nothing; logs the evidence it would show",
             next_action="confirm only when no old binary can resume; the database cannot prove it. If a writer came "
             "back: stop it, clear `check_old_writers`"),
        Step("history_digest", Kind.READS, f"{STEPS}:history_digest", records=f"{STEPS}.history:events",
             task_doc=("Read only: the digest of every history `_System_Event` / `_System_WorkItem` row of the tenant "
             "(chunks by primary key, each checksum computed in the server), taken now that no old writer can "
             "change them. Summary (hash, rows, chunks) in the log and XCom; `final_old_writer_check` verifies it "
             "at the end. **Stops** at `digest_timeout` or on a missing column (named): it wrote nothing, clear "
             "it."),
             commands=("digest",),
             planned=False, heavy_read=True, role="digest",
             cancel_point="the history digest (the last step before the checkpoints)",
             dry_run="the same read (once the schema exists)",
             next_action="it is read only and wrote nothing: a timeout or a lost connection, clear the task; a "
             "missing column, clear `apply_schema` first"),
    )),
    Stage(4, "Audit and one-time checkpoint, per pack", group_id="step_4_checkpoint", steps=(
        Step("audit_and_checkpoint", Kind.WRITES, f"{STEPS}:audit_and_checkpoint", records=f"{STEPS}.checkpoints:events",
             task_doc=("One per pack: the Controlplane lifecycle entrypoint (same as `connector-projection-cutover`) with a "
             "bounded `lock_timeout`. Under the namespace/pack locks it verifies the fence is in force with no "
             "active override, audits retained responsibility and writes only `LegacyMaxOrdinal`; an existing "
             "checkpoint is returned unchanged. **Refusals** fail with every finding in the log and XCom `report`: "
             "they need a separately reviewed recovery decision."),
             commands=("checkpoint", "activate-pack"),
             key="checkpoints", verdict=checkpoint_verdict, role="checkpoints",
             per_pack_of="resolve_packs", provisional_while=("wait_for_drain",),
             dry_run="the audit, and the LegacyMaxOrdinal it would write",
             next_action="a fence finding: clear `arm_fence` (or have the tenant's delivery owner revoke the override), then this task; a "
             "refusal needs a **separately reviewed recovery decision**; the cutoff is never used to hide it. Do not "
             "mark input processed/skipped, delete it, raise the cutoff or replay a source to pass. A lock timeout: "
             "clear and rerun"),
    )),
    Stage(5, "New host, admission resumes, the proofs", group_id="step_5_release", steps=(
        Step("start_new_host", Kind.ASKS, f"{STEPS}:start_new_host",
             role="host", kind_text="starts the new host by `host_controller`; asks a person only when it is `manual`",
             records=f"{STEPS}.new_host:events",
             task_doc=("Starts the matching new host per `host_controller`: `manual` asks you (HITL) to start it, `command` "
             "runs the Variable `nexus_host_command` (default: the reference `nexus-host`), `http` POSTs to the "
             "deployer connection. Skips when a new host already runs. **Abort** fails the run; the fence stays "
             "armed."),
             commands=("start-host",),
             key="host", planned=False,
             dry_run="how it would start the host, and the new hosts live now",
             next_action="fix the host, clear the task"),
        Step("verify_readiness", Kind.WAITS, f"{STEPS}:verify_readiness",
             task_doc=("Deferrable: waits for a registered ProjectionProtocol=1 integration_host with ActivatedAt and a "
             "fresh heartbeat, and no live old writer. **Stops** at `readiness_timeout`: check the host log, "
             "clear."),
             commands=("readiness",),
             key="readiness", bound="readiness_timeout", verdict=readiness_verdict, dry_run_judged=False,
             dry_run="one look at the new host's readiness (the run starts the host first: not part of the verdict)",
             next_action="check the host's log; clear",
             wait_action="start or fix the new host (its log says why it is not ready); the run goes on by itself "
             "once it is ready",
             role="readiness",
             # one task with the release: inside the admission pause every task costs Airflow a start and a handoff
             fused_into="resume_admission",
             wait=Wait("readiness", watch=f"{STEPS}.new_host:ReadinessWatch",
                       ran_out="the new host did not become ready within readiness_timeout; admission stays fenced. "
                       "Check the host's logs, fix, then clear resume_admission (it waits for readiness, then releases)",
                       plan="wait for the new host to be ready")),
        Step("resume_admission", Kind.WRITES, f"{STEPS}:resume_admission", records=f"{STEPS}.release:events",
             task_doc=("Re-checks readiness, then releases the fence this run holds (sets ReleasedAt): admission resumes "
             "through the new host. Already released: no-op success; held by another run: stops."),
             commands=("release-fence",),
             key="release", planned=False, role="release", fused_into="resume_admission",
             dry_run="the fence it would release once ready",
             next_action="check the new host's log, then clear `resume_admission` (in the DAG it waits for readiness "
             "again, then releases); a fence held by another run is that run's to release"),
        Step("final_old_writer_check", Kind.READS, f"{STEPS}:final_old_writer_check", records=f"{STEPS}.final_check:events",
             task_doc=("Reports any old-protocol writer seen after the fence release (**do not restart an old writer after "
             "this point**), then verifies the history digest: any history row changed, missing or extra since "
             "`history_digest` fails the task, named by key with the columns that differ (rows admitted above the "
             "cutoffs and range work may change). On success emits the Asset event nexus://<tenant>/connector- "
             "projection-ranges with the per-pack cutoffs and the verified digest as extra."),
             commands=("verify",),
             key="final", planned=False, verdict=final_verdict, role="final",
             # its own task: a heavy read queues for the cluster's read pool, which must never delay the release
             heavy_read=True,
             dry_run="the run's verdict (proceed, wait for what, or stop and why) from every step's dry run",
             next_action="**do not restart an old writer after this point**: stop it and review what it admitted. A "
             "history difference names the rows changed since the digest: stop whatever changed them and review "
             "those rows against the tenant's backup; nothing here rewrites them"),
    )),
))


def back_out_look_verdict(look: dict[str, Any]) -> Verdict:
    """Nothing to back out, or too late (a pack is checkpointed): stop, naming why. Else proceed to the question."""
    return Verdict(Outcome.STOP, look["refused"]) if look.get("refused") else PROCEED


BACK_OUT_STEPS = "nexus_cutover.projection.steps.back_out"

#: The back-out of a tenant before its checkpoint (runbook, "Rollback stance"; :mod:`.back_out`): the DAG
#: ``connector_projection_back_out`` and ``nexus-cutover back-out`` run these steps, in this order.
BACK_OUT = Transition("connector_projection_back_out", (
    Stage(1, "Back out before the checkpoint: release the fence without a cutover", group_id=None, steps=(
        Step("look_before_back_out", Kind.READS, f"{BACK_OUT_STEPS}:look_before_back_out",
             task_doc=("Reads what backing out would release: the cutover fence in force and what is known of its "
             "holder, the packs already checkpointed, the old writers. Writes nothing. **Stops** when no cutover "
             "fence is in force (nothing to back out) or when any pack of the tenant has its checkpoint (too late: "
             "finish the cutover instead)."),
             key="look", role="back_out_look", verdict=back_out_look_verdict,
             dry_run="the same read",
             next_action="nothing to back out: the tenant's admission is not paused by a cutover. A checkpointed pack: "
             "do not restart the old writers; keep the fence and finish the cutover with a rerun (Rollback stance)"),
        Step("confirm_back_out", Kind.ASKS, f"{BACK_OUT_STEPS}:confirm_back_out",
             task_doc=("Human in the loop: shows the fence (its holder) and the old writers, and asks whether to release "
             "the fence without a cutover. No default: **Keep the fence** or no answer ends the run FAILED with the "
             "fence still armed."),
             key="answer", role="back_out_answer", planned=False,
             dry_run="asks nothing; logs what it would ask",
             next_action="the fence stays armed: trigger the cutover again to go on with it, or this DAG again to "
             "back out"),
        Step("back_out", Kind.WRITES, f"{BACK_OUT_STEPS}:back_out", records=f"{BACK_OUT_STEPS}:events",
             task_doc=("Under the namespace lock: re-reads the fence shown, refuses once any pack is checkpointed (and "
             "again after its write), then releases the fence without a cutover (`ReleasedBy` this run; `ArmedBy` "
             "kept). The delivery ledger records `backed_out`. Admission is open again: restart the old writers. "
             "Already backed out by this run: a no-op success."),
             key="back_out", role="back_out", planned=False,
             dry_run="writes nothing; the release it would make",
             next_action="a checkpoint written meanwhile: do not restart the old writers, finish the cutover. A fence "
             "held by a run still at work: let it finish (or fail), then trigger this DAG again"),
    )),
))
