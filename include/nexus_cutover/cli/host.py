"""``nexus-host --namespace <ns> [--process-id <id>] [--drain-and-exit]`` (contract, reference host).

Reads ``NEXUS_TENANT_DSN``. SIGTERM (and SIGINT) stop it cleanly: the current
item finishes, ``StoppedAt`` is set, exit 0. Exit 3 when ``--drain-and-exit``
meets a refusing activation gate; 2 for bad input; 1 otherwise. Logs go to
stderr and never show the DSN.
"""

from __future__ import annotations

import argparse
import threading

from .. import catalog
from ..db import DSN_ENV_TENANT, dsn_from_env, make_engine
from ..runtime.host import run_host
from .common import bounded_text_arg, configure_logging, flag, namespace_arg, run_command, stop_on_signals

PROGRAM = "nexus-host"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description=f"The reference range-protocol host. The tenant database comes from {DSN_ENV_TENANT}."
    )
    flag(parser, "namespace", type=namespace_arg, required=True, help="the tenant namespace to serve")
    flag(parser, "process-id", type=bounded_text_arg(catalog.ProcessRegistry.c.ProcessId.type.length), default=None,
         help="ProcessId to register (default: nexus-host-<host>-<pid>-<random>)")
    flag(parser, "drain-and-exit", action="store_true", help="exit 0 once no receipt and no range work is left")
    flag(parser, "verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    stop = threading.Event()
    stop_on_signals(stop)

    def body() -> int:
        engine = make_engine(dsn_from_env(DSN_ENV_TENANT))
        try:
            return run_host(
                engine,
                args.namespace,
                process_id=args.process_id,
                drain_and_exit=args.drain_and_exit,
                stop_event=stop,
            )
        finally:
            engine.dispose()

    return run_command(body, program=PROGRAM)


if __name__ == "__main__":
    raise SystemExit(main())
