"""``field-history-eligibility``: status and stage-2 materialization of Field History eligibility.

    field-history-eligibility status [-json]
    field-history-eligibility materialize [-batch-size 2000] [-timeout 30m] [-json]

The target database comes from ``NEXUS_TENANT_DSN``. Exit codes: 0 done,
2 bad input (usage, malformed DSN, missing schema), 4 timed out or could not
take the row locks (committed batches stay; rerun to resume), 1 other.
All logic lives in :mod:`nexus_cutover.field_history`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..db import DSN_ENV_TENANT, Deadline, dsn_from_env, make_engine, mask_dsn
from ..field_history.materialize import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, materialize
from ..field_history.status import FieldHistoryStatus, read_status
from .common import configure_logging, duration_arg, flag, positive_int_arg, print_json, run_command

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
        description=("Field History eligibility of one tenant database (NEXUS_TENANT_DSN). Exit 0 done, 2 bad input, 4 timeout, 1 other."),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{status,materialize}")
    status = commands.add_parser("status", help="NULL rows, eligible NULL rows, rows by value, switches, producers")
    status.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    mat = commands.add_parser("materialize", help="decide legacy NULL rows from their sequence/interval facts")
    flag(mat, "batch-size", type=_batch_size_arg, default=DEFAULT_BATCH_SIZE, metavar="N", help="rows per transaction")
    flag(mat, "timeout", type=duration_arg, default=1800.0, metavar="DURATION", help="bound of the whole call (30m)")
    mat.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    return parser


def _print_status(st: FieldHistoryStatus) -> None:
    d = st.as_dict()
    print(f"read mode: {d['read_mode']}; sequence reservation enabled: {d['sequence_reservation_enabled']}")
    print(
        f"rows: {d['total_rows']} total, {d['rows_by_value']['true']} TRUE, {d['rows_by_value']['false']} FALSE, "
        f"{d['null_rows']} NULL ({d['eligible_null_rows']} eligible, {d['materializable_rows']} materializable, "
        f"{d['null_rows_without_sequence']} without sequence, {d['null_rows_without_field_id']} without FieldId)"
    )
    for p in st.processes:
        state = "stopped" if p.stopped else f"heartbeat {p.heartbeat_age_s:.0f}s ago"
        print(f"process {p.process_id}: {p.role} {p.binary_version} ({state})")
    for c in st.outbox:
        print(f"outbox: {c.rows} {c.status} row(s) from producer {c.producer_version}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()

    def body() -> int:
        dsn = dsn_from_env(DSN_ENV_TENANT)
        engine = make_engine(dsn, connect_timeout=10.0)
        log.info("target %s: %s", mask_dsn(dsn), args.command)
        try:
            if args.command == "status":
                st = read_status(engine)
                print_json(st.as_dict()) if args.json else _print_status(st)
                return 0
            result = materialize(engine, batch_size=args.batch_size, deadline=Deadline(args.timeout))
        finally:
            engine.dispose()
        if args.json:
            print_json({"outcome": "materialized" if result.rows else "unchanged", **result.as_dict()})
        else:
            print(
                f"materialized {result.rows} row(s): {result.set_true} TRUE, {result.set_false} FALSE "
                f"in {result.batches} batch(es); {result.remaining} materializable row(s) remain"
            )
        return 0

    code = run_command(body, program=PROGRAM, json_errors=getattr(args, "json", False), json_fields={"outcome": "error"})
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
