"""Stage 5's host steps: ``start_new_host`` (by the caller's controller) and ``verify_readiness``; what a start means
as events.
"""

from __future__ import annotations

from ... import events as E
from ...events import Event
from ...transition import StepResult
from .. import actions
from .context import CutoverRun, _judged
from .watching import CutoverWatch


def start_new_host(run: CutoverRun) -> StepResult:
    """The matching new host, started by the caller's way (``run.start_host``) unless one already runs."""
    r = actions.readiness(run.engine, run.namespace, stale_heartbeat=run.stale)
    live_hosts = [h["process_id"] for h in r.hosts if h["state"] == "live"]
    if run.dry_run:
        run.plan(f"start the new host (live new hosts now: {', '.join(live_hosts) or 'none'})")
        return StepResult({"dry_run": True})
    if live_hosts:
        run.say(f"a new host already runs for {run.namespace} ({', '.join(live_hosts)}): not starting another")
        return StepResult({"already_running": live_hosts})
    if run.start_host is None:
        raise RuntimeError("start_new_host needs its caller's way to start the host (CutoverRun.start_host)")
    value = run.start_host(run, live_hosts)
    run.seam("start_new_host.after_write")
    return StepResult(value, fields={"host_pid": value["host_pid"]} if "host_pid" in value else {})


def host_question(tenant: str, packs: list[str], command_line: str, *, approve: str, command_variable: str) -> str:
    """The body (Markdown) of the question a ``manual`` host start asks: what is written, what to start, the shell
    line that starts the reference host (``command_line``, its DSN masked), the controllers that start it instead."""
    return (
        f"## Tenant `{tenant}`: start the matching new host\n\n"
        f"Every pack checkpoint is written: {packs}.\n\n"
        "Start the new host and Connectors for this tenant (ProjectionProtocol 1), then choose "
        f"**{approve}**. verify_readiness checks that it registered and activated.\n\n"
        "The project's reference host, started from a shell that reaches the tenant database "
        "(the password is the connection's, shown masked here):\n\n"
        f"```\n{command_line}\n```\n\n"
        "Or let the run start it: trigger with host_controller `command` (the Variable "
        f"`{command_variable}` names the command) or `http` (a deployer).\n\n"
        "Do not restart an old writer after this point."
    )


def verify_readiness(run: CutoverRun) -> StepResult:
    """One look at the new host: registered, activated, heartbeating, and no live old writer."""
    r = actions.readiness(run.engine, run.namespace, stale_heartbeat=run.stale)
    run.say("new host: " + (f"ready ({', '.join(h['process_id'] for h in r.ready_hosts)})" if r.ready
                            else "not ready: " + "; ".join(r.reasons)))
    return _judged("verify_readiness", r.as_json(), domain=r)


def events(step: str, r: dict) -> list[Event]:
    """The new host started: by its controller, by a person (who answered), or already running."""
    if r.get("dry_run"):
        return []
    outcome = ("already running" if r.get("already_running") else
               "started by a person" if r.get("responded_by") else "started")
    return [Event(E.HOST_STARTED, step, outcome=outcome, actor=r.get("responded_by"),
                  detail={k: v for k, v in r.items() if k in ("already_running", "host_pid", "controller", "status",
                                                              "responded_at")})]


class ReadinessWatch(CutoverWatch):
    """The new host's readiness: ``ready``, ``timed_out`` at the deadline, else ``waiting``."""

    done = "ready"

    def poll(self) -> dict:
        looked = self.look()
        r = looked.domain
        message = (f"ready: activated integration_host(s) {', '.join(h['process_id'] for h in r.ready_hosts)}"
                   if looked.verdict.proceeds else "not ready: " + "; ".join(r.reasons))
        return self.looked(looked, message, report_text=message)
