"""The command line's writer-stop controller (issue 50): its flags, and the controller they configure.

``-writers-stop-controller manual|command|http`` (default ``manual``: a person stops the old writers, as before);
the command and the URL are the deployment's configuration: ``-writers-stop-command`` (or
``NEXUS_WRITERS_STOP_COMMAND``), ``-writers-stop-url`` (or ``NEXUS_WRITERS_STOP_URL``); the tenant DSN is never
in either. An unknown controller is refused by the parser (exit 2), a missing command or URL before anything runs.
"""

from __future__ import annotations

import argparse

from .. import settings
from ..projection import steps
from .common import duration_arg, flag

ws = steps.writers_stop


def add_flags(p: argparse.ArgumentParser) -> None:
    """The writer-stop controller's flags (``run`` and ``stop-writers``)."""
    flag(p, "writers-stop-controller", choices=ws.CONTROLLERS, default=ws.MANUAL,
         help="how the old writers are stopped at step 3, the fence held: manual (default: you stop them), command "
         "(-writers-stop-command) or http (-writers-stop-url); its answer is evidence, never proof")
    flag(p, "writers-stop-command", default=settings.value("writers_stop_command"), metavar="CMD",
         help=f"the command that stops the tenant's old writers and waits for them ({{tenant}} replaced; the tenant "
         f"as {ws.TENANT_ENV} in its environment, never the DSN; default ${ws.COMMAND_ENV})")
    flag(p, "writers-stop-url", default=settings.value("writers_stop_url"), metavar="URL",
         help=f"the deployment API the http controller POSTs to ({{tenant}} replaced; default ${ws.URL_ENV})")
    flag(p, "writers-stop-controller-timeout", type=duration_arg, default=ws.DEFAULT_TIMEOUT_S, metavar="DURATION",
         help=f"the controller's bound: a command still running then is killed (default {ws.DEFAULT_TIMEOUT_S:g}s)")


def controller_of(args: argparse.Namespace):
    """The controller the flags configure (None for a command without them); bad input raised here."""
    kind = getattr(args, "writers_stop_controller", None)
    if kind is None:
        return None
    return ws.controller(kind, argv=args.writers_stop_command, url=args.writers_stop_url,
                         timeout_s=args.writers_stop_controller_timeout)
