"""``make airflow``: the demo's Airflow with the demo tenant, left up for a person to use the UI.

Starts ``airflow standalone`` (state in ``.run/airflow``, kept between runs), seeds
the demo tenant on first use (``--reseed`` starts it over), creates the
``nexus_tenant_demo`` connection, starts the old-protocol runtime (which stops
by itself once the cutover fence is armed and its work has drained, standing in
for step 3), prints the URL and the login, and waits. Trigger
``connector_projection_cutover`` with ``{"tenant": "demo"}`` from the UI (here the form's
``host_controller`` defaults to ``command``: the run starts the reference host itself); the
status view is under Browse -> Nexus tenants.

Ctrl-C stops everything it started: Airflow, the old runtime, and any new host
a cutover run started (its pid is in the run's ``start_new_host`` XCom).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import socket
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# the repository root, for scripts.*; the nexus packages are the installed (editable) distributions (make deps)
sys.path[:0] = [str(REPO)]

from scripts.demo import CONN_ID, CUTOVER_DAG, TENANT, Child, say, stop_pid_if_ours  # noqa: E402
from scripts.demo_airflow import AirflowStack, free_port  # noqa: E402
from scripts.demo_seed import NEW_PRODUCER_VERSION, seed  # noqa: E402
from scripts.metrics_log import MetricsLog  # noqa: E402
from scripts.notices_log import CONN_ID as NOTIFY_CONN_ID  # noqa: E402
from scripts.notices_log import NoticesLog  # noqa: E402


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def started_hosts(stack: AirflowStack) -> list[int]:
    pids = []
    with contextlib.suppress(Exception):
        runs = stack.request("GET", f"/api/v2/dags/{CUTOVER_DAG}/dagRuns?limit=100")["dag_runs"]
        for run in runs:
            result = stack.xcom(CUTOVER_DAG, run["dag_run_id"], "start_new_host") or {}
            if result.get("pid"):
                pids.append(int(result["pid"]))
    return pids


class DemoAirflow:
    """``make airflow``'s stack: Airflow (``airflow standalone``), the demo tenant and its connection, and the
    old-protocol runtime draining its work; :meth:`stop` stops all of it and any new host a run started.

    The browser tests (``tests/ui``) use exactly this, so they meet what a person meets after ``make airflow``.
    """

    def __init__(self, state: pathlib.Path, *, port: int | None = None, reseed: bool = False,
                 extra_env: dict[str, str] | None = None) -> None:
        self.state = pathlib.Path(state).resolve()
        self.state.mkdir(parents=True, exist_ok=True)
        self.tenant_db = self.state / f"tenant-{TENANT}.db"
        self.seeded: dict | None = None
        if reseed or not self.tenant_db.exists():
            # the clean demo tenant: the browser tests (tests/ui) walk its two packs by name; `make demo` runs on the
            # production-shaped one
            self.seeded = seed(str(self.tenant_db), TENANT, production=False)
        # The form's default host_controller is command here: the reference host starts by itself (a person's first
        # cutover reaches success with the defaults); `manual` stays one choice away.
        # Field History's producer gates name the demo's stand-in for a deployment's producer upgrade in their stops.
        upgrade = (f"NEXUS_TENANT_DSN=sqlite:///{self.tenant_db} {sys.executable} -m nexus_sim.upgrade "
                   f"--namespace {TENANT} --release {NEW_PRODUCER_VERSION}")
        # The nexus.* metrics go to a local listener that writes them to a file (runbook: "See the metrics locally").
        self.metrics = MetricsLog(self.state / "metrics.log")
        # The notices go to a local stand-in for a chat channel, a file (issue 51, item 10).
        self.notices = NoticesLog(self.state / "notices.log")
        metrics = {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                   "AIRFLOW__METRICS__STATSD_PORT": str(self.metrics.port)}
        env = {"NEXUS_DEFAULT_HOST_CONTROLLER": "command", "NEXUS_PRODUCER_UPGRADE_COMMAND": upgrade, **metrics,
               **(extra_env or {})}
        self.stack = AirflowStack(self.state / "home", port=port or free_port(), parallelism=4, extra_env=env)
        self.old_runtime: Child | None = None

    def start(self, timeout_s: float = 600.0) -> DemoAirflow:
        try:
            self.metrics.start()
            self.notices.start()
            self.stack.start(timeout_s=timeout_s)
            self.stack.put_connection(CONN_ID, "sqlite", host=str(self.tenant_db),
                                      description="demo tenant (embedded SQLite)")
            self.show_the_settings()
            env = {**os.environ, "NEXUS_TENANT_DSN": f"sqlite:///{self.tenant_db}", "PYTHONPATH": str(REPO)}
            self.old_runtime = Child("old runtime", [sys.executable, str(REPO / "scripts" / "demo_old_runtime.py"),
                                                     "--namespace", TENANT, "--stop-after-fenced-drain"],
                                     env, self.state / "old-runtime.log")
        except BaseException:
            self.stop()
            raise
        return self

    def show_the_settings(self) -> None:
        """What the product reads from Airflow, created where a person looks (Admin -> Connections, Admin -> Variables),
        each with what it is for (issue 51, item 6): the delivery ledger's connection (the environment defines it
        too, with the same value), the notices' connection and the product's Variables."""
        from nexus_airflow.host_controllers import HOST_COMMAND_VARIABLE, default_host_argv
        from nexus_airflow.notify import VARIABLE as NOTIFY_VARIABLE
        from nexus_airflow.variables import VARIABLES
        from nexus_airflow.writers_stop import WRITERS_STOP_COMMAND_VARIABLE
        from scripts.demo_airflow import ledger_file

        self.stack.put_connection("nexus_ledger", "sqlite", host=str(ledger_file(self.stack.home)),
                                  description="the delivery ledger: every fence, answer, checkpoint and stop of every "
                                  "run (embedded SQLite here; MySQL/MariaDB/TiDB or PostgreSQL in a deployment)")
        self.stack.put_connection(NOTIFY_CONN_ID, "slackwebhook", **self.notices.connection())
        demo = {NOTIFY_VARIABLE: (NOTIFY_CONN_ID, " (here: the local notices.log)"),
                HOST_COMMAND_VARIABLE: (json.dumps(default_host_argv()), ""),
                WRITERS_STOP_COMMAND_VARIABLE: ("", " (empty here: not configured)")}
        for declared in VARIABLES:  # each with what it sets, as the status view's settings page says it
            if declared.key not in demo:
                continue
            key, (value, here) = declared.key, demo[declared.key]
            description = declared.description + here
            self.stack.put("/api/v2/variables", key, {"key": key, "value": value, "description": description})

    def stop(self) -> None:
        if self.old_runtime:
            self.old_runtime.stop()
        for pid in started_hosts(self.stack) if self.stack.token else []:
            stop_pid_if_ours(pid, "nexus")
        self.stack.stop()
        if self.metrics.is_alive():
            self.metrics.stop()
        if self.notices.is_alive():
            self.notices.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=str(REPO / ".run" / "airflow"))
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--reseed", action="store_true", help="start the demo tenant over")
    args = parser.parse_args()
    demo = DemoAirflow(pathlib.Path(args.state_dir), port=args.port if _port_free(args.port) else free_port(),
                       reseed=args.reseed)
    if demo.seeded:
        say(f"seeded the demo tenant in {demo.tenant_db}: {demo.seeded['live_old_work']} old projection items in flight")
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        say("starting Airflow (airflow standalone) ...")
        demo.start(timeout_s=180.0)
        stack = demo.stack
        print(f"""
Airflow is up: {stack.base_url}
  login:        admin / {stack.admin_password()}
  status view:  {stack.base_url}/nexus-status/  (Browse -> Nexus tenants)
  tenant:       {TENANT} (connection {CONN_ID}, SQLite {demo.tenant_db})
  cutover:      trigger {CUTOVER_DAG} with {{"tenant": "{TENANT}"}} (host_controller defaults to command here:
                the run starts the reference host itself)
  old runtime:  pid {demo.old_runtime.proc.pid}, stops by itself once the fence is armed and its work drained
  metrics:      the nexus.* metrics, as StatsD lines: tail -f {demo.metrics.path}
  notices:      what a run tells its channel (a question waiting, a stop, the pause, a cut-over):
                tail -f {demo.notices.path}
  back out:     a cutover stopped before its checkpoint: trigger connector_projection_back_out with
                {{"tenant": "{TENANT}"}} (it asks, then releases the fence without a cutover)
  field history: first upgrade the demo's producers (what a deployment's rollout does), then trigger
                field_history_eligibility with {{"tenant": "{TENANT}"}}:
                {demo.stack.env["NEXUS_PRODUCER_UPGRADE_COMMAND"]}
Ctrl-C stops everything.""", flush=True)
        while not stop["now"]:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        say("stopping ...")
        demo.stop()
        say("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
