"""``nexus-cutover``: every step of the connector projection range cutover without Airflow.

    nexus-cutover <command> [-namespace NS] [options] [-json]

Commands (each a step of :mod:`nexus_cutover.projection.steps`; ``run`` and ``plan`` run their bodies):
``plan``, ``apply-schema``, ``arm-fence``, ``drain [--wait]``, ``stop-writers`` (the writer-stop controller),
``writers``,
``checkpoint`` (identical to ``connector-projection-cutover``), ``activate-pack``,
``digest`` (the history digest, ``-out FILE`` to keep it), ``readiness``,
``release-fence``, ``verify`` (``-expect FILE``: also re-check a saved digest), ``status``, ``report`` (the tenant's
history from the delivery ledger, ``NEXUS_LEDGER_DSN``), and ``run`` (all five
steps in order, stopping where the DAG stops; the writer-stop confirmation is
an interactive prompt or ``--confirm-writers-stopped``, never a default).

The tenant database comes from ``NEXUS_TENANT_DSN``. Exit codes: 0 done,
2 bad input, 3 refused or stopped (nothing written by the refusing step),
4 timed out, 1 other.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from collections.abc import Callable
from typing import Any

from .. import ledger, polling, settings, tx
from ..clock import utc_text, utcnow
from ..db import DSN_ENV_TENANT, dsn_from_env, make_engine, mask_dsn, tls_line, tls_report
from ..errors import BadInput
from ..holders import same_holder
from ..ledger import DSN_ENV_LEDGER, ledger_engine
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..namespaces import require_known_namespace
from ..projection import steps
from ..projection.digest_limits import DEFAULT_DIGEST_CONNECTIONS, MAX_DIGEST_CONNECTIONS
from ..projection.transition import BACK_OUT, CUTOVER, DEFAULT_ARM_WHEN_DRAIN_BELOW_S
from ..schema import require_tenant_schema
from ..tenant_status import read_tenant_state
from ..transition import Outcome
from ..watch import WAITING
from . import writers_stop
from .back_out import cmd_back_out
from .command import (
    CLI_TAKE_OVER,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    PROGRAM,
    Command,
    Stopped,
    TimedOut,
    recorded,
    save_digest,
)
from .common import (
    bounded_int_arg,
    configure_logging,
    default_holder,
    duration_arg,
    duration_or_zero_arg,
    flag,
    namespace_arg,
    print_json,
    run_command,
    utc_time_arg,
)
from .cutover_run import _confirm, _start_new_host, cmd_plan, cmd_run
from .recording import default_actor

__all__ = ["CLI_TAKE_OVER", "COMMANDS", "Command", "EXIT_OK", "EXIT_REFUSED", "EXIT_TIMEOUT", "Stopped", "TimedOut",
           "build_parser", "cmd_run", "main"]

log = logging.getLogger(PROGRAM)


# -- the commands -----------------------------------------------------------------------


def cmd_apply_schema(c: Command) -> tuple[int, dict[str, Any]]:
    result = steps.actions.apply_schema(c.engine, dry_run=c.args.dry_run, on_created=lambda label: c.say(f"{label}: created"))
    for label in result.present:
        c.say(f"{label}: present, skipped")
    for line in result.plan if c.args.dry_run else []:
        c.say(f"PLAN: {line}")
    return EXIT_OK, result.as_json()


def _arm(c: Command, packs: list[str], *, dry_run: bool = False):
    return steps.actions.arm_fence(c.engine, c.args.namespace, holder=c.args.holder, packs=packs, timeout_s=c.args.timeout,
                           adopt=c.args.adopt, take_over=CLI_TAKE_OVER, dry_run=dry_run)


def cmd_arm_fence(c: Command) -> tuple[int, dict[str, Any]]:
    packs = steps.actions.resolve_packs(c.engine, c.args.namespace, c.args.pack_install_id or ())
    result = _arm(c, packs, dry_run=c.args.dry_run)
    c.say(f"fence {result.fence_id}: {result.outcome}" + (f" (left by {result.previous_holder})" if result.previous_holder else ""))
    if result.outcome in ("armed", "reused", "adopted"):
        c.say(f"held by {c.args.holder}: give -holder '{c.args.holder}' to the later steps of this cutover "
              "(release-fence releases only the fence its holder holds)")
    return EXIT_OK, result.as_json()


def cmd_drain(c: Command) -> tuple[int, dict[str, Any]]:
    """One look (exit 0 drained, 3 stuck, 4 not yet), or with --wait the sensor's wait (0 drained, 3 stuck, 4 timeout):
    the declared watch of the drain (the DAG's trigger polls the same), its figures to the invocation's recorder."""
    deadline = utcnow() + dt.timedelta(seconds=c.args.drain_timeout)
    step = CUTOVER.for_command(c.args.command)
    watch = step.wait.watch_class()(c.engine, c.args.namespace, step.name, deadline,
                                    stale_heartbeat_s=c.stale.total_seconds(), record=c.recorder.emit)

    def look():
        looked = watch.poll()
        c.say(watch.last.domain.counts_text())
        return looked

    polling.wait_until(look, lambda looked: c.args.wait and looked["state"] == WAITING,
                       poll_interval=c.args.poll_interval)
    report, verdict = watch.last.domain, watch.last.verdict
    if verdict.proceeds:
        return EXIT_OK, report.as_json()
    c.say(report.report_text())
    if verdict.outcome is Outcome.STOP and verdict.timed_out:
        raise TimedOut("the drain did not finish within -drain-timeout; nothing was changed", report.as_json())
    if verdict.outcome is Outcome.STOP:
        raise Stopped("the drain of old projection work cannot finish on its own: stopped and reported "
                      "(no WorkItem was changed)", report.as_json())
    raise TimedOut(f"not drained yet: {report.counts_text()} (use --wait to wait)", report.as_json())


def cmd_writers(c: Command) -> tuple[int, dict[str, Any]]:
    ev = steps.writer_evidence(c.engine, c.args.namespace, stale_heartbeat=c.stale)
    c.say(ev.as_text())
    if not CUTOVER.for_command(c.args.command).verdict(ev.as_json()).proceeds:
        raise Stopped(f"{len(ev.live)} old-protocol writer(s) still live: "
                      + ", ".join(p["process_id"] for p in ev.live) + "; stop them (keep the fence)", ev.as_json())
    return EXIT_OK, ev.as_json()


def _checkpoint_outcome(c: Command, result) -> tuple[int, dict[str, Any]]:
    c.say(result.summary())
    for finding in result.findings:
        c.say("  " + finding.describe())
    return (EXIT_REFUSED if result.outcome == "refused" else EXIT_OK), result.as_json()


def cmd_checkpoint(c: Command) -> tuple[int, dict[str, Any]]:
    result = steps.checkpoint(c.engine, c.args.pack_install_id, timeout_s=c.args.timeout, written_by=c.args.holder,
                              dry_run=c.args.dry_run, stale_heartbeat=c.stale)
    return _checkpoint_outcome(c, result)


def cmd_activate_pack(c: Command) -> tuple[int, dict[str, Any]]:
    result = steps.activate_pack(c.engine, c.args.pack_install_id, timeout_s=c.args.timeout, written_by=c.args.holder,
                           stale_heartbeat=c.stale)
    return _checkpoint_outcome(c, result)


def cmd_readiness(c: Command) -> tuple[int, dict[str, Any]]:
    r = steps.readiness(c.engine, c.args.namespace, stale_heartbeat=c.stale)
    c.say("ready: " + ", ".join(h["process_id"] for h in r.ready_hosts) if r.ready else "not ready: " + "; ".join(r.reasons))
    return (EXIT_OK if CUTOVER.for_command(c.args.command).verdict(r.as_json()).proceeds else EXIT_REFUSED), r.as_json()


def _held_fence_id(c: Command) -> int:
    """The fence to release: ``-fence-id``, else the cutover fence in force, else the last one released when
    ``-holder`` released it (a rerun of a release that committed: its no-op success, never bad input)."""
    if c.args.fence_id is not None:
        return c.args.fence_id
    fence = steps.cutover_fence_in_force(c.engine, c.args.namespace)
    if fence is None:
        with tx.reading(c.engine, "reading the last released cutover fence") as conn:
            released = steps.last_released_cutover_fence(conn, c.args.namespace)
        if released is not None and same_holder(released.get("ReleasedBy"), c.args.holder):
            return int(released["FenceId"])
        raise BadInput(f"namespace {c.args.namespace!r} has no cutover fence in force: nothing to release")
    return int(fence["FenceId"])


def cmd_release_fence(c: Command) -> tuple[int, dict[str, Any]]:
    result = steps.release_fence(c.engine, c.args.namespace, _held_fence_id(c), holder=c.args.holder, stale_heartbeat=c.stale,
                                 timeout_s=c.args.timeout, dry_run=c.args.dry_run)
    again = (f"; already released by you at {utc_text(result.released_at)}: nothing to do"
             if result.outcome == "already_released" else "")
    c.say(f"fence {result.fence_id}: {result.outcome}" + steps.pause_text(result) + again)
    return EXIT_OK, result.as_json()


def _one_step(c: Command) -> tuple[int, dict[str, Any]]:
    """Run the body of the declared step this command runs alone (no earlier step's result: it reads the tenant as
    it is now)."""
    a, name = c.args, CUTOVER.for_command(c.args.command).name
    run = steps.CutoverRun(c.engine, a.namespace, a.holder, lock_timeout_s=a.timeout, stale_heartbeat_s=a.stale_heartbeat,
                           take_over=CLI_TAKE_OVER, say=c.say, recorder=c.recorder,
                           confirm=lambda ev: _confirm(c, ev), start_host=lambda _run, _live: _start_new_host(c),
                           writers_stop=writers_stop.controller_of(a))
    result = steps.run_step(name, run)
    if not result.verdict.proceeds:
        raise (TimedOut if result.verdict.timed_out else Stopped)(f"{name}: {result.stop_message}", result.stop_report)
    return EXIT_OK, result.value


def cmd_stop_writers(c: Command) -> tuple[int, dict[str, Any]]:
    """Stop the old writers by -writers-stop-controller, the cutover fence in force (its answer is evidence:
    ``writers`` and ``confirm-writers`` still judge the registry)."""
    return _one_step(c)


def cmd_confirm_writers(c: Command) -> tuple[int, dict[str, Any]]:
    """Show the old-writer evidence and take the person's confirmation (re-checked against the registry at once,
    and again under the locks at the checkpoint): the step-by-step form of ``run``'s question."""
    return _one_step(c)


def cmd_start_host(c: Command) -> tuple[int, dict[str, Any]]:
    """Start the new host with ``-host-command`` unless one already runs (without one: the person starts it now)."""
    return _one_step(c)


def _released_at(c: Command) -> dt.datetime:
    if c.args.since:
        return c.args.since
    with tx.reading(c.engine, "reading the last released cutover fence") as conn:
        fence = steps.last_released_cutover_fence(conn, c.args.namespace)
    if fence is None:
        raise BadInput(f"namespace {c.args.namespace!r} has no released cutover fence: give -since, or release it first")
    return dt.datetime.fromisoformat(fence["ReleasedAt"])


def cmd_digest(c: Command) -> tuple[int, dict[str, Any]]:
    digest = steps.actions.history_digest(c.engine, c.args.namespace, timeout_s=c.args.timeout, chunk_rows=c.args.chunk_rows,
                                  connections=c.args.digest_connections)
    c.value = digest.summary()  # the step's result as a DAG's history_digest records it
    if c.args.out:
        save_digest(digest, c.args.out)
        c.say(f"saved to {c.args.out}: check it later with `nexus-cutover verify -namespace {c.args.namespace} "
              f"-expect {c.args.out}`")
    c.say(digest.summary_text())
    return EXIT_OK, {"namespace": c.args.namespace, "digest": digest.summary(), "out": c.args.out}


def cmd_verify(c: Command) -> tuple[int, dict[str, Any]]:
    """The final check's two halves (the run's final_old_writer_check, judged by its declared verdict): with
    ``-expect FILE`` no history row changed since that digest; from the release (or ``-since``) no old writer."""
    report: dict[str, Any] = {"namespace": c.args.namespace}
    verdicts = []
    if c.args.expect:
        expected = steps.load_digest(c.args.expect)
        if expected.namespace != c.args.namespace:
            raise BadInput(f"{c.args.expect} is the digest of namespace {expected.namespace!r}, not {c.args.namespace!r}")
        history = steps.history_unchanged(c.engine, expected, timeout_s=c.args.timeout, say=c.say)
        report["history"] = history.fields["history"]
        verdicts.append(history.verdict)
        if history.verdict.proceeds:  # the digest verified, as the DAG's final check records it
            c.value = {"tenant": c.args.namespace, "history_digest": history.value}
    if c.args.since or not c.args.expect or _has_release(c):
        since = _released_at(c)
        seen = steps.old_writers_since_release(c.engine, c.args.namespace, since)
        report.update({"since": since.isoformat(), **seen.value})
        if isinstance(c.value, dict):
            c.value["released_at"] = since.isoformat()
        verdicts.append(seen.verdict)
        if seen.verdict.proceeds:
            c.say(f"no old-protocol writer ran after {utc_text(since)}")
    else:
        c.say("no released cutover fence yet: the old-writer check starts at the release")
    stops = [v.reason for v in verdicts if not v.proceeds]
    if stops:
        raise Stopped(" ".join(stops), report)
    return EXIT_OK, report


def _has_release(c: Command) -> bool:
    with tx.reading(c.engine, "reading the last released cutover fence") as conn:
        return steps.last_released_cutover_fence(conn, c.args.namespace) is not None


def cmd_status(c: Command) -> tuple[int, dict[str, Any]]:
    # The view shows an unreadable section as such; the command first refuses, as every other command does (exit 2),
    # a session unfit for any command (db.session_problem), a database without the tenant schema and a namespace the
    # database does not have (a mistyped one), rather than print the refusal into every section and exit 0.
    with tx.reading(c.engine, "checking the tenant schema") as conn:
        require_tenant_schema(conn)
        require_known_namespace(conn, c.args.namespace)
        state_tls = tls_report(c.engine, conn)
    state = {**read_tenant_state(c.engine, c.args.namespace), "tls": state_tls}
    c.say(f"tenant {state['tenant']}: {state['phase']}")
    if state_tls is not None:
        c.say(f"  {tls_line(state_tls)}")
    c.say(f"  fence: {state['fence'].get('text', state['fence'].get('error'))}")
    c.say(f"  drain: {state['drain'].get('text', state['drain'].get('error'))}")
    for pack in state["packs"]:
        cp = pack["checkpoint"]
        c.say(f"  pack {pack['pack_install_id']}: " + (f"LegacyMaxOrdinal={cp['legacy_max_ordinal']}" if cp else "no checkpoint"))
        if pack.get("old_work_above_cutoff"):
            c.say(f"    STOP: {pack['old_work_above_cutoff']['text']}")
    host = state["host"]
    c.say("  new host: " + ("ready" if host.get("ready") else "; ".join(host.get("reasons", [host.get("error", "?")]))))
    fh = state["field_history"]
    c.say(f"  field history: {fh.get('stage_text')}" + (f"; {fh['rows_text']}" if fh.get("rows_text") else ""))
    return EXIT_OK, state


# -- parsing ----------------------------------------------------------------------------------

def cmd_report(c: Command) -> tuple[int, dict[str, Any]]:
    """The tenant's whole history from the delivery ledger (``NEXUS_LEDGER_DSN``), in order: text lines, ``-json``
    or ``-csv`` (a file a reviewer keeps). Read only; it needs no tenant database and no Airflow."""

    rows = ledger.history(c.engine, c.args.namespace)
    if c.args.csv:
        sys.stdout.write(ledger.to_csv(rows))
        return EXIT_OK, {}
    if not rows:
        c.say(f"the delivery ledger has no event of tenant {c.args.namespace}")
    for row in rows:
        c.say(ledger.line_of(row))
    return EXIT_OK, {"tenant": c.args.namespace, "events": rows}


COMMANDS: dict[str, tuple[Callable[[Command], tuple[int, dict[str, Any]]], str, tuple[str, ...]]] = {
    "plan": (cmd_plan, "what every step would do for this tenant, and the verdict (proceed, wait, stop)", ("ns", "packs", "waits")),
    "apply-schema": (cmd_apply_schema, "step 1: the additive schema (skips what is present)", ("dry",)),
    "arm-fence": (cmd_arm_fence, "step 1: arm (or reuse) the namespace's non-expiring '*' fence as -holder", ("ns", "packs", "dry")),
    "drain": (cmd_drain, "step 2: the drain of old projection work (--wait: until drained or stuck)", ("ns", "waits")),
    "stop-writers": (cmd_stop_writers, "step 3: stop the old writers by -writers-stop-controller (command or http), "
                     "the fence in force; its answer is evidence, never proof", ("ns", "stop")),
    "writers": (cmd_writers, "step 3: the old-writer evidence (exit 3 while one is live)", ("ns",)),
    "confirm-writers": (cmd_confirm_writers, "step 3: show the old-writer evidence and confirm every old writer stopped "
                        "(a prompt, or --confirm-writers-stopped after reading it; re-checked at once)", ("ns", "confirm")),
    "checkpoint": (cmd_checkpoint, "step 4: audit + one-time checkpoint of one pack (= connector-projection-cutover)", ("pack", "dry")),
    "activate-pack": (cmd_activate_pack, "greenfield: write cutoff 0 for a pack with no Event and no WorkItem", ("pack",)),
    "digest": (cmd_digest, "step 3: the history digest of every history Event/WorkItem row (-out FILE keeps it)",
               ("ns", "digest")),
    "start-host": (cmd_start_host, "step 5: start the new host with -host-command unless one already runs", ("ns", "host")),
    "readiness": (cmd_readiness, "step 5: is the new host registered, activated and heartbeating (exit 3 if not)", ("ns",)),
    "release-fence": (cmd_release_fence, "step 5: release the fence -holder holds, once the new host is ready", ("ns", "fence", "dry")),
    "verify": (cmd_verify, "step 5: no old-protocol writer ran after the fence release; with -expect FILE, no history "
               "row changed since that digest (exit 3 otherwise)", ("ns", "since", "expect")),
    "status": (cmd_status, "one tenant's state, as the status view shows it", ("ns",)),
    "run": (cmd_run, "all five steps in order in one process, stopping where the DAG stops",
            ("ns", "packs", "waits", "run", "digest")),
    "back-out": (cmd_back_out, "before any checkpoint: release the cutover fence without a cutover (-check: what it "
                 "would release; -fence-id N: the fence it shows, released under the namespace lock)", ("ns", "backout")),
    "report": (cmd_report, "the tenant's history from the delivery ledger (NEXUS_LEDGER_DSN, not the tenant's): every "
               "fence, answer, checkpoint, digest and stop of every run, in order; -json or -csv to keep it",
               ("ns", "ledger")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Every step of the connector projection range cutover, without Airflow. Reads NEXUS_TENANT_DSN. "
        "Exit 0 done, 2 bad input, 3 refused/stopped, 4 timed out, 1 other.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_fn, help_text, groups) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
        flag(p, "timeout", type=duration_arg, default=300.0, metavar="DURATION", help="bound of each locked step (default 5m)")
        flag(p, "stale-heartbeat", type=duration_arg, default=DEFAULT_STALE_HEARTBEAT_S, metavar="DURATION",
             help=f"a process heartbeating less recently is silent, not live (default {DEFAULT_STALE_HEARTBEAT_S:g}s)")
        flag(p, "holder", default=default_holder(), metavar="NAME",
             help="who holds the fence and writes, and the run the delivery ledger records this command in (default: "
             "cli:user@host:pid:time, unique to this invocation: give one -holder to every step of one cutover)")
        flag(p, "actor", default=default_actor(), metavar="NAME",
             help="the person the delivery ledger names for what this command does (default: your user name)")
        if name in ("arm-fence", "run", "plan", "back-out"):
            flag(p, "adopt", metavar="HOLDER", help="take over the cutover fence HOLDER holds, once you know HOLDER is "
                 "finished (a fence armed by hand or by another command is never adopted without this)")
        if "ledger" in groups:
            p.add_argument("-csv", "--csv", dest="csv", action="store_true", help="print the history as CSV on stdout")
        if "ns" in groups:
            flag(p, "namespace", type=namespace_arg, required=True, metavar="NS", help="the tenant's namespace")
        if "packs" in groups:
            flag(p, "pack-install-id", action="append", metavar="ID", help="a pack of the run (repeat; default: every active pack)")
        if "pack" in groups:
            flag(p, "pack-install-id", required=True, metavar="ID", help="the installed-pack incarnation")
        if "dry" in groups:
            flag(p, "dry-run", action="store_true", help="read and print the plan; write nothing")
        if "backout" in groups:
            flag(p, "fence-id", type=int, metavar="N", help="the fence to release, as -check shows it (nothing is "
                 "released without it)")
            flag(p, "check", action="store_true", help="show what backing out would release, and release nothing")
        if "fence" in groups:
            flag(p, "fence-id", type=int, metavar="N", help="the fence to release (default: the cutover fence in force)")
        if "since" in groups:
            flag(p, "since", type=utc_time_arg, metavar="ISO",
                 help="check from this UTC time, ISO 8601 (default: the last cutover fence release)")
        if "digest" in groups:
            flag(p, "chunk-rows", type=int, default=steps.DEFAULT_CHUNK_ROWS, metavar="N",
                 help=f"history rows per digest chunk (default {steps.DEFAULT_CHUNK_ROWS})")
            flag(p, "digest-connections", type=bounded_int_arg(1, MAX_DIGEST_CONNECTIONS),
                 default=DEFAULT_DIGEST_CONNECTIONS, metavar="N",
                 help=f"connections the digest reads its chunks on at once, 1 to {MAX_DIGEST_CONNECTIONS} "
                      f"(default {DEFAULT_DIGEST_CONNECTIONS}; SQLite reads on one)")
            flag(p, "digest-out" if name == "run" else "out", metavar="FILE", help="save the full digest (JSON) here")
        if "expect" in groups:
            flag(p, "expect", metavar="FILE", help="a digest saved by `digest -out` or `run -digest-out`: re-check it")
        if "waits" in groups:
            if name == "drain":
                p.add_argument("--wait", action="store_true", help="wait until drained or stuck")
            flag(p, "drain-timeout", type=duration_arg, default=3600.0, metavar="DURATION", help="bound of the drain (default 1h)")
            if name in ("plan", "run"):
                flag(p, "arm-when-drain-below", type=duration_or_zero_arg, default=DEFAULT_ARM_WHEN_DRAIN_BELOW_S,
                     metavar="DURATION", help="arm the fence only once the old backlog would drain within this, at its "
                     f"measured rate (0: arm at once; default {DEFAULT_ARM_WHEN_DRAIN_BELOW_S:g}s)")
                flag(p, "pre-arm-timeout", type=duration_arg, default=3600.0, metavar="DURATION",
                     help="how long to wait for that before stopping, nothing written (default 1h)")
            flag(p, "poll-interval", type=duration_arg, default=30.0, metavar="DURATION",
                 help="the longest gap between looks: a wait looks again after 1s, 2s, 4s, ... up to it (default 30s)")
        if "run" in groups:
            flag(p, "writers-stop-timeout", type=duration_arg, default=3600.0, metavar="DURATION",
                 help="how long to wait for every old writer to stop (default 1h)")
            flag(p, "readiness-timeout", type=duration_arg, default=1800.0, metavar="DURATION",
                 help="how long to wait for the new host (default 30m)")
        if "run" in groups or "confirm" in groups:
            p.add_argument("--confirm-writers-stopped", action="store_true",
                           help="the person's confirmation, given after reading `nexus-cutover writers` (still re-checked)")
        if "run" in groups or "stop" in groups:
            writers_stop.add_flags(p)
        if "run" in groups or "host" in groups:
            flag(p, "host-command", metavar="CMD", help="start the new host with this command (e.g. 'nexus-host --namespace NS')")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
    fn = COMMANDS[args.command][0]
    fields: dict[str, Any] = {"command": args.command}  # the error JSON; a stop adds its report

    def body() -> int:
        if "ledger" in COMMANDS[args.command][2]:  # the ledger's own database, never the tenant's
            dsn = settings.value("ledger_dsn")
            if not dsn:
                raise BadInput(f"no delivery ledger given: set {DSN_ENV_LEDGER} to its SQLAlchemy URL (the Airflow "
                               "connection nexus_ledger's database: sqlite:////path/ledger.db, mysql+pymysql://... or "
                               "postgresql+psycopg2://...)")
            engine = ledger_engine(dsn, timeout_s=min(10.0, args.timeout), create=False)
        else:
            dsn = dsn_from_env(DSN_ENV_TENANT)
            engine = make_engine(dsn, connect_timeout=min(10.0, args.timeout))
        log.info("%s on %s", args.command, mask_dsn(dsn))
        try:
            code, result = recorded(Command(args, engine), fn, loop={cmd_run: CUTOVER, cmd_back_out: BACK_OUT}.get(fn))
        except (Stopped, TimedOut) as exc:
            fields["report"] = exc.report
            raise
        finally:
            engine.dispose()
        if args.json:
            print_json({"command": args.command, "exit_code": code, **result})
        return code

    code = run_command(body, program=PROGRAM, json_errors=args.json, json_fields=fields)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
