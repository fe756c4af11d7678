"""``nexus-cutover run`` and ``plan``: every declared step in order, in one process (``run``), or dry (``plan``).

``run`` is the command line's loop over the declaration: each step's body (the DAG's), a waiting step looked at
again until its verdict is no longer ``wait``, a per-pack step once per pack; it stops where the DAG stops, and
records each step's end (or stop) through the invocation's recorder, as a DAG's task does.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shlex
import subprocess
import sys
from typing import Any

from .. import polling, settings
from ..clock import utcnow
from ..db import host_environment
from ..errors import BadInput
from ..events import run_ended
from ..metrics import failure_reason
from ..projection import dry_run, steps
from ..projection.next_actions import next_action
from ..projection.transition import CUTOVER
from ..recording import timed
from ..transition import PROCEED, Outcome, Transition, Verdict, verdict_line
from ..watch import WAITING
from . import writers_stop
from .command import CLI_TAKE_OVER, EXIT_OK, EXIT_REFUSED, PROGRAM, Command, Stopped, TimedOut, save_digest

log = logging.getLogger(PROGRAM)


def plan_options(c: Command) -> dry_run.PlanOptions:
    """The dry run's options from this invocation's flags."""
    a = c.args
    return dry_run.PlanOptions(namespace=a.namespace, holder=a.holder, packs=tuple(a.pack_install_id or ()),
                               adopt=a.adopt, timeout_s=a.timeout, drain_timeout_s=a.drain_timeout,
                               arm_when_drain_below_s=a.arm_when_drain_below,
                               stale_heartbeat_s=a.stale_heartbeat, take_over=CLI_TAKE_OVER)


def cmd_plan(c: Command) -> tuple[int, dict[str, Any]]:
    """Every declared step's dry run, in the declared order, and the verdict: proceed, wait (for what) or stop (why)."""
    out = dry_run.plan(c.engine, plan_options(c), c.say)
    c.say(f"VERDICT: {verdict_line(out['verdict'])}")
    return (EXIT_REFUSED if out["verdict"].startswith("stop") else EXIT_OK), out


def _now() -> dt.datetime:
    return utcnow()


def cmd_run(c: Command, transition: Transition = CUTOVER) -> tuple[int, dict[str, Any]]:
    """The declared steps in the declared order, in one process: each step's body (the DAG's), a waiting step
    looked at again until its verdict is no longer ``wait``, a per-pack step once per pack. Stops where the DAG
    stops (each step's declared verdict decides: proceed, stop with the step's next action, or done when nothing
    is left to do)."""
    out: dict[str, Any] = {"namespace": c.args.namespace, "holder": c.args.holder, "steps": []}
    results = steps.Results(transition)
    run = _cutover_run(c, results)
    run.transition = transition
    stage = None
    for step in transition:
        if transition.stage_of(step.name) is not stage:
            stage = transition.stage_of(step.name)
            c.say(f"step {stage.number}: {stage.title.lower()}")
        out["steps"].append(step.name)
        verdict = _run_declared(c, run, step, results, out)
        if verdict.outcome is Outcome.DONE:
            c.say(verdict.reason)
            out["outcome"] = "nothing_to_do"
            return EXIT_OK, out
    out["outcome"] = "cut_over"
    c.recorder.emit([run_ended("cut_over", admission_pause_s=out.get("admission_pause_s"), checkpoints={
        r["pack_install_id"]: r["legacy_max_ordinal"] for r in out["checkpoints"]})])
    c.say(f"cutover complete for {c.args.namespace}: "
          + ", ".join(f"{r['pack_install_id']}={r['legacy_max_ordinal']}" for r in out["checkpoints"])
          + ". Do not restart an old writer after this point.")
    return EXIT_OK, out


def _cutover_run(c: Command, results: steps.Results) -> steps.CutoverRun:
    a = c.args
    return steps.CutoverRun(
        c.engine, a.namespace, a.holder, requested_packs=tuple(a.pack_install_id or ()), adopt=a.adopt,
        lock_timeout_s=a.timeout, drain_timeout_s=a.drain_timeout, digest_timeout_s=a.timeout,
        arm_when_drain_below_s=a.arm_when_drain_below,
        digest_connections=a.digest_connections, chunk_rows=a.chunk_rows, stale_heartbeat_s=a.stale_heartbeat,
        take_over=CLI_TAKE_OVER, earlier=results.earlier, say=lambda line: c.say(f"  {line}"), recorder=c.recorder,
        confirm=lambda ev: _confirm(c, ev), start_host=lambda _run, _live: _start_new_host(c),
        writers_stop=writers_stop.controller_of(a))


def _run_declared(c: Command, run: steps.CutoverRun, step, results: steps.Results, out: dict[str, Any]) -> Verdict:
    """One declared step (once per pack for a per-pack step, the first stop ending it), recorded as a DAG's task
    records it (its events when it passes, ``stopped`` with the reason when it stops): its verdict; a stop is
    raised (Stopped, or TimedOut at a wait's bound) with the step's next action."""
    verdict = PROCEED
    for pack in run.packs() if step.per_pack_of else [None]:
        run.pack = pack
        with timed(c.recorder, step.name, failure_of=failure_reason) as clock:
            result = _wait(c, run, step) if step.bound else steps.run_step(step.name, run)
            results.record(step.name, result)
            out[step.out_key] = results.earlier(step.name)
            out.update(result.fields)
            if step.name == "history_digest" and c.args.digest_out:
                save_digest(result.domain, c.args.digest_out)
                c.say(f"  saved to {c.args.digest_out}")
            verdict = result.verdict
            if verdict.outcome is Outcome.STOP or verdict.outcome is Outcome.WAIT:
                raise (TimedOut if verdict.timed_out else Stopped)(_stop_message(step.name, result), out)
            clock.passed(result.value)
        if verdict.outcome is Outcome.DONE:
            break
    return verdict


def _stop_message(step: str, result) -> str:
    reason = result.stop_message.rstrip().rstrip(".")
    return f"{step}: {reason}." if "Next:" in reason else f"{step}: {reason}. Next: {next_action(step)}."


def _wait(c: Command, run: steps.CutoverRun, step):
    """Poll a waiting step's declared watch (the one the DAG's trigger polls) until its look no longer waits; at its
    bound (the flag named by the step's :attr:`~nexus_cutover.transition.Step.bound`) a stop that says it timed out.
    The figures a look measures (a drain's remaining work, rate and ETA) go to the invocation's recorder."""
    timeout_s = float(getattr(c.args, step.bound))
    run.deadline = _now() + dt.timedelta(seconds=timeout_s)
    watch = step.wait.watch_class()(run.engine, run.namespace, step.name, run.deadline,
                                    stale_heartbeat_s=run.stale_heartbeat_s, record=c.recorder.emit, run=run)
    looked, ran_out = polling.wait_until(watch.poll, lambda look: look["state"] == WAITING,
                                         poll_interval=c.args.poll_interval, timeout_s=timeout_s)
    result = watch.last
    if ran_out or looked["state"] == "timed_out":
        result.verdict = Verdict(Outcome.STOP, f"{step.name} did not pass within {timeout_s:g}s: "
                                 f"{result.verdict.reason}", timed_out=True)
    return result


def _confirm(c: Command, ev) -> str:
    """The person's confirmation: the flag (given after reading the evidence) or an interactive answer."""
    print(ev.as_text(), file=sys.stderr if c.args.json else sys.stdout, flush=True)
    if c.args.confirm_writers_stopped:
        return "--confirm-writers-stopped"
    if not sys.stdin.isatty():
        raise BadInput("the writer-stop confirmation needs a person: run in a terminal, or read the evidence "
                       "(nexus-cutover writers) and pass --confirm-writers-stopped")
    answer = input("Every old ingress_writer, receipt_materializer, projection_worker and dependency_resolver of this "
                   "tenant is stopped and will not be restarted? Type 'confirm' to continue: ").strip().lower()
    if answer != "confirm":
        raise Stopped("cutover not performed: the confirmation was not given. The fence stays armed; no checkpoint "
                      "was written.")
    return f"interactive:{c.args.holder}"


def _start_new_host(c: Command) -> dict[str, Any]:
    """Start the host with ``-host-command``; without one the person starts it now (readiness waits for it)."""
    c.say("  start the new host" + (f" ({c.args.host_command})" if c.args.host_command else " now"))
    if not c.args.host_command:
        return {"controller": "manual"}
    return {"controller": "command", "host_pid": _start_host(c.args.host_command)}


def _start_host(command: str) -> int:
    """Start the new host detached, with the tenant DSN in its environment only (and no other secret of ours:
    :func:`nexus_cutover.db.host_environment`)."""
    env = host_environment(os.environ, settings.value("tenant_dsn") or "")
    proc = subprocess.Popen(shlex.split(command), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log.info("started the new host (pid %d)", proc.pid)
    return proc.pid


