"""The Airflow Variables the product reads, declared once: ``make airflow`` creates them with these descriptions
(Admin > Variables) and the status view's settings page lists them with their values (issue 51, item 6).

Invariants: every Variable the product reads is listed here, by the constant of the module that reads it (the name
is spelled once, beside its reader). A Variable written per run (a rollout's control, a run's fence-alert record) is
listed by its prefix, never one row per run. A Variable a person names in a form (``tenants_variable``) is theirs,
not the product's, and is not listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from nexus_airflow.fence_watch import MARKER_PREFIX
from nexus_airflow.host_controllers import HOST_COMMAND_VARIABLE
from nexus_airflow.notify import VARIABLE as NOTIFY_VARIABLE
from nexus_airflow.rollout import CONTROL_PREFIX
from nexus_airflow.writers_stop import WRITERS_STOP_COMMAND_VARIABLE


@dataclass(frozen=True)
class ProductVariable:
    """One Variable the product reads: its key (a prefix when ``per_run``) and what it sets."""

    key: str
    description: str
    per_run: bool = False


VARIABLES: tuple[ProductVariable, ...] = (
    ProductVariable(NOTIFY_VARIABLE, "where every run's notices go unless its form names another: an smtp or "
                    "slackwebhook connection id. Unset: notices are logged only"),
    ProductVariable(HOST_COMMAND_VARIABLE, "host_controller=command: the new host's command, a JSON argv ({tenant} "
                    "replaced; the tenant DSN in its environment)"),
    ProductVariable(WRITERS_STOP_COMMAND_VARIABLE, "writers_stop_controller=command: the command that stops the "
                    "tenant's old writers and waits for them, a JSON argv ({tenant} replaced; no DSN). Unset: that "
                    "controller is refused by the run's first task"),
    ProductVariable(CONTROL_PREFIX, "one per rollout run: pause, resume or cancel (the rollouts page's buttons)",
                    per_run=True),
    ProductVariable(MARKER_PREFIX, "one per run whose fenced tenant was alerted about: the alert's record",
                    per_run=True),
)
