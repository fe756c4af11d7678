"""``field-history-eligibility``: the Field History stages of seed 003, without Airflow.

    field-history-eligibility status [-json]
    field-history-eligibility materialize [-batch-size 2000] [-timeout 30m] [-json]
    field-history-eligibility stage1 -stage1-release R [-namespace NS] [-json]
    field-history-eligibility stage2 -producer-release R [-namespace NS] [-batch-size N] [-timeout 30m] [-json]
    field-history-eligibility stage3 -producer-release R [-namespace NS] [-timeout 5m] [-json]
    field-history-eligibility stage3 -check [-producer-release R] [-namespace NS] [-json]

The target database comes from ``NEXUS_TENANT_DSN``. Exit codes: 0 done,
2 bad input (usage, malformed DSN, missing schema), 3 a gate stopped (its
report names what to fix; nothing was switched), a materialization batch's
read-equivalence proof broke (that batch rolled back, the earlier ones kept),
4 timed out or could not take the row locks (committed batches stay; rerun to
resume; stage 3 waiting for in-flight reservations or outbox rows past
``-timeout``), 1 other. A failed outbox row refuses stage 3 (exit 3), naming it,
with what to do next.
``stage3 -check`` says what stage 3 would do, in one read-only transaction,
switching nothing, by stage 3's own rules in its order
(:func:`nexus_cutover.field_history.gates.stage_3_check`), and exits with the code
stage 3 would give: 0 it would switch (or wait for outbox rows a live outbox
worker delivers), 3 it would refuse (the same reason), 4 it would wait for outbox
rows no live ``audit_outbox_worker`` delivers and time out. It prints the
whole-table read comparison, the reservation switch (stage 3 turns it off first
and waits for the mutations that saw it on), the open and failed outbox rows,
fields whose first sequence no lock can hold back, and, with
``-producer-release``, the deployed producers and pre-cutover outbox work it
would refuse. All logic lives in :mod:`nexus_cutover.field_history` (the same
gates the DAG runs).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..db import DSN_ENV_TENANT, Deadline, dsn_from_env, make_engine, mask_dsn, tls_line
from ..errors import ReadEquivalenceBroken
from ..field_history.steps import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCH_SIZE,
    FieldHistoryRun,
    FieldHistoryStatus,
    materialize,
    read_status,
    run_step,
    stage_3_check,
)
from ..field_history.transition import FIELD_HISTORY, steps_of_stage
from ..metrics import failure_reason
from ..recording import timed
from ..transition import Kind, Outcome
from ..tx import connection_tls
from .common import (
    configure_logging,
    default_holder,
    duration_arg,
    flag,
    namespace_arg,
    positive_int_arg,
    print_json,
    run_command,
)
from .recording import command_recorder, default_actor

PROGRAM = "field-history-eligibility"
log = logging.getLogger(PROGRAM)


def _batch_size_arg(text: str) -> int:
    value = positive_int_arg(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH_SIZE} rows per transaction (TiDB-safe), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description=(
            "Field History eligibility of one tenant database (NEXUS_TENANT_DSN). Exit 0 done, 2 bad input, "
            "3 a gate stopped, 4 timeout, 1 other."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{status,materialize,stage1,stage2,stage3}")
    status = commands.add_parser("status", help="NULL rows, eligible NULL rows, rows by value, switches, producers")
    status.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    mat = commands.add_parser("materialize", help="decide legacy NULL rows from their sequence/interval facts")
    flag(mat, "batch-size", type=_batch_size_arg, default=DEFAULT_BATCH_SIZE, metavar="N", help="rows per transaction")
    flag(mat, "timeout", type=duration_arg, default=1800.0, metavar="DURATION", help="bound of the whole call (30m)")
    mat.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    for name, release, help_text in (
        ("stage1", "stage1-release", "stage 1: the nullable column, and every runtime_api / outbox worker on the stage-1 release"),
        ("stage2", "producer-release", "stage 2: producers stamp, pre-cutover outbox work drained, legacy rows materialized"),
        ("stage3", "producer-release", "stage 3: equal readers over the whole table, producers and outbox done; then the switches"),
    ):
        gate = commands.add_parser(name, help=help_text, description=help_text)
        flag(gate, release, required=name != "stage3", metavar="RELEASE", help="the dotted release, e.g. 4.13.0")
        flag(gate, "namespace", type=namespace_arg, default=None, metavar="NS",
             help="only this namespace's processes (default: all)")
        if name == "stage2":
            flag(gate, "batch-size", type=_batch_size_arg, default=DEFAULT_BATCH_SIZE, metavar="N", help="rows per transaction")
            flag(gate, "timeout", type=duration_arg, default=1800.0, metavar="DURATION", help="bound of materialization (30m)")
        if name == "stage3":
            flag(
                gate,
                "check",
                action="store_true",
                help="only say what stage 3 would do (read comparison, switches, outbox, producers), read-only, "
                "switching nothing; exits as stage 3 would (0 switch, 3 refuse, 4 time out)",
            )
            flag(gate, "timeout", type=duration_arg, default=300.0, metavar="DURATION",
                 help="bound of the whole call, waits for in-flight reservations and outbox rows included (5m)")
        flag(gate, "actor", default=default_actor(), metavar="NAME",
             help="the person the delivery ledger (NEXUS_LEDGER_DSN) names for this stage (default: your user name)")
        gate.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    return parser


def field_history_run(args, engine):
    """The :class:`~nexus_cutover.field_history.steps.FieldHistoryRun` of a stage command's flags."""

    return FieldHistoryRun(engine, namespace=args.namespace, stage1_release=getattr(args, "stage1_release", "") or "",
                           producer_release=getattr(args, "producer_release", "") or "",
                           batch_size=getattr(args, "batch_size", DEFAULT_BATCH_SIZE),
                           materialize_timeout_s=getattr(args, "timeout", 300.0),
                           switch_timeout_s=getattr(args, "timeout", 300.0), updated_by=f"{PROGRAM}:cli")


def _run_gate(args, engine) -> tuple[int, dict]:
    """The declared steps of one stage, in order, each step's body as the DAG runs it (the outbox drain looked at
    once, not waited for): (exit code, the report(s)). The first step that does not proceed ends the stage."""

    fields = {"tls": connection_tls(engine)}  # what the command reached the tenant with (mode, TLS version; no key)
    log.info("%s", tls_line(fields["tls"]))
    run, reports = field_history_run(args, engine), []
    recorder = command_recorder(args, program=PROGRAM, tenant=args.namespace or engine.url.database,
                                transition=FIELD_HISTORY)
    for step in steps_of_stage(int(args.command.removeprefix("stage"))):
        with timed(recorder, step.name, failure_of=failure_reason) as clock:
            result = run_step(step.name, run)
            verdict = result.verdict
            if verdict.proceeds:
                clock.passed(result.value)
            elif verdict.outcome is Outcome.STOP:  # a gate that refused: its stop, as the DAG's task stops
                clock.stopped(result.stop_message, failure="refused")
            else:
                clock.settled = True  # the outbox not drained yet: a look, not a stop
        if step.kind is Kind.WAITS:
            if not verdict.proceeds:
                return (3 if verdict.outcome is Outcome.STOP else 4), {
                    "passed": False, "reports": [r.as_json() for r in reports], "outbox": result.value,
                    "summary": verdict.reason, **fields}
            continue
        reports.append(result.domain)
        if not verdict.proceeds:
            break
    passed = all(r.passed for r in reports)
    return (0 if passed else 3), {
        **fields,
        "passed": passed,
        "reports": [r.as_json() for r in reports],
        "summary": "; ".join(r.summary for r in reports),
        "rendered": [r.render() for r in reports],
    }


def _print_status(st: FieldHistoryStatus) -> None:
    d = st.as_json()
    print(f"read mode: {d['read_mode']}; sequence reservation enabled: {d['sequence_reservation_enabled']}")
    print(f"rows: {st.rows.text()}")
    for p in st.processes:
        state = "stopped" if p.stopped else f"heartbeat {p.heartbeat_age_s:.0f}s ago"
        print(f"process {p.process_id}: {p.role} {p.binary_version} ({state})")
    for c in st.outbox:
        print(f"outbox: {c.rows} {c.status} row(s) from producer {c.producer_version}")


def _check_stage_3(engine, args) -> int:
    """``stage3 -check``: what stage 3 would do, read-only, by its own rules; exits with the code stage 3 would give."""

    found = stage_3_check(engine, producer_release=args.producer_release, namespace=args.namespace)
    if args.json:
        print_json({"command": "stage3", "check": True, **found.as_json()})
    else:
        print("\n".join(found.lines()))
    return found.exit_code


def _materialize(engine, args) -> int:
    try:
        result = materialize(engine, batch_size=args.batch_size, deadline=Deadline(args.timeout))
    except ReadEquivalenceBroken as exc:
        sys.stderr.write(f"{PROGRAM}: error: {exc}\n")
        if args.json:
            print_json(
                {
                    "outcome": "refused",
                    "error": str(exc),
                    "error_class": type(exc).__name__,
                    "exit_code": exc.exit_code,
                    "differences": exc.rows,
                    "batches": exc.batches,
                    "decided_rows": exc.decided_rows,
                    "decided_digest": exc.decided_digest,
                }
            )
        return exc.exit_code
    if args.json:
        print_json({"outcome": "materialized" if result.rows else "unchanged", **result.as_json()})
    else:
        print(
            f"materialized {result.rows} row(s): {result.set_true} TRUE, {result.set_false} FALSE "
            f"in {result.batches} batch(es); {result.remaining} materializable row(s) remain; "
            f"decided digest {result.decided_digest} over {result.decided_rows} row(s) (this run's)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "stage3" and not args.check and not args.producer_release:
        parser.error("stage3 needs -producer-release RELEASE (or -check, to print the read comparison only)")
    configure_logging()
    args.holder = default_holder(PROGRAM)  # this invocation's run in the delivery ledger

    def body() -> int:
        dsn = dsn_from_env(DSN_ENV_TENANT)
        engine = make_engine(dsn, connect_timeout=10.0)
        log.info("target %s: %s", mask_dsn(dsn), args.command)
        try:
            if args.command == "status":
                st = read_status(engine)
                print_json(st.as_json()) if args.json else _print_status(st)
                return 0
            if args.command == "stage3" and args.check:
                return _check_stage_3(engine, args)
            if args.command.startswith("stage"):
                code, out = _run_gate(args, engine)
                if args.json:
                    print_json({"command": args.command, "exit_code": code, **{k: v for k, v in out.items() if k != "rendered"}})
                else:
                    print("\n".join(out.get("rendered") or [out["summary"]]))
                return code
            return _materialize(engine, args)
        finally:
            engine.dispose()

    code = run_command(body, program=PROGRAM, json_errors=getattr(args, "json", False), json_fields={"outcome": "error"})
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
