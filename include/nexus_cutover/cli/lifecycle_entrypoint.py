"""``connector-projection-cutover``: the lifecycle entrypoint of cutover step 4.

    connector-projection-cutover -pack-install-id <incarnation> [-timeout 5m] [-json]

The target database comes from ``CONNECTOR_CUTOVER_DSN``, falling back to
``NEXUS_TENANT_DSN``. Exit codes: 0 written or already present, 2 bad input,
3 refused by the audit, 4 timed out / could not take the locks, 1 other.
All logic lives in :func:`nexus_cutover.projection.checkpoint.run_checkpoint`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..db import DSN_ENV_CUTOVER, DSN_ENV_TENANT, dsn_from_env, make_engine, mask_dsn
from ..metrics import failure_reason
from ..projection.steps import REFUSED, pack_namespace, run_checkpoint
from ..projection.transition import CUTOVER
from ..recording import timed
from .common import configure_logging, default_holder, duration_arg, flag, print_json, run_command
from .recording import command_recorder, default_actor

PROGRAM = "connector-projection-cutover"
log = logging.getLogger(PROGRAM)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description=(
            "Audit retained projection responsibility of one pack incarnation under the namespace and pack "
            "locks and write its one-time LegacyMaxOrdinal checkpoint. Reads CONNECTOR_CUTOVER_DSN "
            "(or NEXUS_TENANT_DSN). Exit 0 written/already present, 2 bad input, 3 refused, 4 timeout, 1 other."
        ),
    )
    flag(parser, "pack-install-id", required=True, metavar="ID", help="the installed-pack incarnation")
    flag(parser, "timeout", type=duration_arg, default=300.0, metavar="DURATION", help="bound of the whole call (default 5m)")
    flag(parser, "actor", default=default_actor(), metavar="NAME",
         help="the person the delivery ledger (NEXUS_LEDGER_DSN) names for this checkpoint (default: your user name)")
    parser.add_argument("-json", "--json", dest="json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()

    def body() -> int:
        dsn = dsn_from_env(DSN_ENV_CUTOVER, DSN_ENV_TENANT)
        engine = make_engine(dsn, connect_timeout=min(10.0, args.timeout))
        log.info("target %s, pack %s, timeout %.0fs", mask_dsn(dsn), args.pack_install_id, args.timeout)
        args.holder = default_holder(PROGRAM)
        # Recorded as the cutover's checkpoint step (this entrypoint is `nexus-cutover checkpoint`): the ledger's
        # checkpoint row, or its stop with the reason, and the step's figures.
        step = CUTOVER.for_command("checkpoint")
        recorder = command_recorder(args, program=PROGRAM, tenant=pack_namespace(engine, args.pack_install_id),
                                    transition=CUTOVER)
        try:
            with timed(recorder, step.name, failure_of=failure_reason) as clock:
                result = run_checkpoint(engine, args.pack_install_id, timeout_s=args.timeout, written_by=args.holder)
                verdict = step.verdict(result.as_json())
                if verdict.proceeds:
                    clock.passed(result.as_json())
                else:
                    clock.stopped(verdict.reason, failure="refused")
        finally:
            engine.dispose()
        if args.json:
            print_json(result.as_json())
        else:
            print(result.summary())
            for finding in result.findings:
                print("  " + finding.describe())
        return 3 if result.outcome == REFUSED else 0

    error_fields = {"pack_install_id": args.pack_install_id, "outcome": "error", "legacy_max_ordinal": None, "findings": []}
    code = run_command(body, program=PROGRAM, json_errors=args.json, json_fields=error_fields)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
