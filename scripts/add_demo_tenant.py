"""``make demo-tenant TENANT=<name>``: add one more demo tenant to ``make airflow``'s Airflow, as a person would.

Seeds a SQLite tenant ``<state>/tenant-<name>.db`` (the same clean demo tenant as ``demo``: two packs, old
projection work still in flight), creates its Airflow connection ``nexus_tenant_<name>`` (type ``sqlite``, the file
path as host: the ``airflow connections add`` line a person would type, against ``make airflow``'s metadata), and
starts an old-protocol runtime for it that drains its work and stops by itself once a cutover fence is armed and
its work drained (as ``make airflow`` does for ``demo``). Then trigger ``connector_projection_cutover`` with
``{"tenant": "<name>"}``. Refuses (exit 2) a name the form would refuse, or an existing tenant file unless
``--reseed``. Idempotent otherwise: the connection is replaced.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# the repository root, for scripts.*; the nexus packages are the installed (editable) distributions (make deps)
sys.path[:0] = [str(REPO)]

from nexus_airflow.params import TENANT_PATTERN  # noqa: E402 - the trigger form's rule for a tenant name
from scripts.demo import Child  # noqa: E402
from scripts.demo_seed import seed  # noqa: E402

TENANT_NAME = re.compile(TENANT_PATTERN)


def airflow_cli(home: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW_HOME": str(home),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}
    airflow = pathlib.Path(sys.executable).with_name("airflow")
    return subprocess.run([str(airflow), *args], env=env, capture_output=True, text=True, timeout=300)


def add_tenant(state: pathlib.Path, tenant: str, *, reseed: bool = False, old_runtime: bool = True) -> dict:
    """Seed the tenant, create its connection, start its old runtime; what was done (for the caller to print)."""
    if not TENANT_NAME.match(tenant):
        raise SystemExit(f"add_demo_tenant: {tenant!r} is not a tenant name the form takes (lower-case letters, "
                         "digits, _ and -, at most 64 characters)")
    home = state / "home"
    if not (home / "airflow.db").exists():
        raise SystemExit(f"add_demo_tenant: no Airflow metadata in {home}: run `make airflow` first (it creates it)")
    db = state / f"tenant-{tenant}.db"
    if db.exists() and not reseed:
        raise SystemExit(f"add_demo_tenant: {db} exists: tenant {tenant!r} was added before (--reseed starts it over)")
    seeded = seed(str(db), tenant, production=False)
    conn_id = f"nexus_tenant_{tenant}"
    airflow_cli(home, "connections", "delete", conn_id)  # replaced when it exists
    added = airflow_cli(home, "connections", "add", conn_id, "--conn-type", "sqlite", "--conn-host", str(db),
                        "--conn-description", f"demo tenant {tenant} (embedded SQLite)")
    if added.returncode != 0:
        raise SystemExit(f"add_demo_tenant: airflow connections add failed: {added.stderr.strip()[-500:]}")
    done = {"tenant": tenant, "database": str(db), "connection": conn_id, "live_old_work": seeded["live_old_work"]}
    if old_runtime:
        env = {**os.environ, "NEXUS_TENANT_DSN": f"sqlite:///{db}", "PYTHONPATH": str(REPO)}
        child = Child(f"old runtime of {tenant}", [sys.executable, str(REPO / "scripts" / "demo_old_runtime.py"),
                                                   "--namespace", tenant, "--stop-after-fenced-drain"],
                      env, state / f"old-runtime-{tenant}.log")
        done["old_runtime_pid"] = child.proc.pid
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tenant")
    parser.add_argument("--state-dir", default=str(REPO / ".run" / "airflow"), help="make airflow's state (default)")
    parser.add_argument("--reseed", action="store_true", help="start an existing demo tenant over")
    args = parser.parse_args()
    done = add_tenant(pathlib.Path(args.state_dir).resolve(), args.tenant, reseed=args.reseed)
    print(f"added demo tenant {done['tenant']}: {done['database']} ({done['live_old_work']} old projection items in "
          f"flight), connection {done['connection']} (type sqlite, the path as host)"
          + (f", old runtime pid {done['old_runtime_pid']}" if "old_runtime_pid" in done else ""), flush=True)
    print(f'next: trigger connector_projection_cutover with {{"tenant": "{done["tenant"]}"}}', flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
