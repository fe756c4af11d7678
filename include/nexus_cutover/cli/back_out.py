"""``nexus-cutover back-out``: the back-out's declared steps (:data:`~nexus_cutover.projection.transition.BACK_OUT`)
from the command line, as the DAG ``connector_projection_back_out`` runs them.

    nexus-cutover back-out -namespace NS -check             # what it would release, and why it would refuse
    nexus-cutover back-out -namespace NS -fence-id N        # release fence N without a cutover

The person's answer is naming the fence: ``-fence-id`` must be the fence the look shows (the one ``-check``
printed); any other, or none, releases nothing. Naming it takes over a holder nobody can ask about (a command, a
fence armed by hand); an Airflow run's fence needs ``-adopt`` naming the run too (this command cannot read whether
the run still waits, e.g. at its question: trigger the DAG ``connector_projection_back_out`` instead, which can).
The release re-reads everything under the namespace lock (:mod:`nexus_cutover.projection.back_out`): no pack
checkpointed, the same fence, a holder that may be taken over. Recorded as the DAG's run is (the delivery ledger's
``backed_out``, the metrics, the ``BACKED OUT`` notice). """

from __future__ import annotations

from typing import Any

from ..projection import steps
from ..projection.transition import BACK_OUT
from ..transition import Kind
from .command import CLI_TAKE_OVER, EXIT_OK, Command, Stopped
from .cutover_run import _run_declared


def cmd_back_out(c: Command) -> tuple[int, dict[str, Any]]:
    """The look, then (with ``-fence-id`` naming the fence it shows) the release without a cutover; ``-check``: the
    look only. Stops (exit 3) when there is nothing to back out, when a pack is checkpointed, or on a fence not named."""
    a = c.args
    out: dict[str, Any] = {"namespace": a.namespace, "holder": a.holder, "steps": []}
    results = steps.Results(BACK_OUT)
    run = steps.CutoverRun(c.engine, a.namespace, a.holder, adopt=a.adopt, lock_timeout_s=a.timeout, stale_heartbeat_s=a.stale_heartbeat,
                           take_over=CLI_TAKE_OVER, earlier=results.earlier, say=lambda line: c.say(f"  {line}"),
                           recorder=c.recorder, confirm=lambda look: _named(c, look), transition=BACK_OUT)
    for step in BACK_OUT:
        if a.check and step.kind is not Kind.READS:
            c.say(f"-check: nothing released; to back out, rerun with -fence-id {out['look'].get('fence_id')}"
                  if out["look"].get("fence_id") is not None and not out["look"].get("already") else "-check: nothing released")
            return EXIT_OK, out
        out["steps"].append(step.name)
        _run_declared(c, run, step, results, out)
    out["outcome"] = out["back_out"]["outcome"]
    return EXIT_OK, out


def _named(c: Command, look: dict[str, Any]) -> str:
    """The person's answer: ``-fence-id`` naming the fence the look showed (else a stop: nothing released)."""
    shown = look.get("fence_id")
    if c.args.fence_id is None:
        raise Stopped(f"not backed out: name the fence to release, -fence-id {shown} (the fence shown above), once you "
                      "have read it. Nothing was released.")
    if c.args.fence_id != shown:
        raise Stopped(f"not backed out: -fence-id {c.args.fence_id} is not the cutover fence in force ({shown}). "
                      "Nothing was released.")
    return f"-fence-id {shown}"
