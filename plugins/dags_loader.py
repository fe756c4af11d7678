"""The one-file DAG loader a deployment puts into its dags folder, from the installed package (issue 49).

    python -m nexus_cutover_airflow.dags_loader                    # prints the loader
    python -m nexus_cutover_airflow.dags_loader $AIRFLOW_HOME/dags # writes <dir>/load_nexus_cutover_dags.py

The DAGs themselves are the package ``nexus_cutover_dags``; Airflow's DAG processor parses only files of its dags
folder (or a bundle), so the loader imports the four DAG objects there. It is the same for every release (it imports
whatever the installed package holds), and it is written by the installed package, so nothing of a deployment comes
from a checkout. deploy/Dockerfile writes it into the image's dags folder; ``make dist`` puts it into the deploy
tarball. Imports nothing (``python plugins/dags_loader.py`` runs from a bare Python).
"""

from __future__ import annotations

import pathlib
import sys

#: The file's name in the dags folder. Keep it: Airflow puts the dags folder on ``sys.path``, so a file named like a
#: package of ours (``nexus_cutover_dags.py``, ``nexus_cutover.py``) would hide that package.
LOADER_NAME = "load_nexus_cutover_dags.py"

LOADER_SOURCE = '''\
"""nexus-cutover's four Airflow DAGs, from the installed package: this one file in your dags folder.

``pip install "nexus-cutover[airflow]"`` installs the DAGs as the package ``nexus_cutover_dags``; Airflow's DAG
processor parses only files of its dags folder (or a bundle), so this file imports the four DAG objects, and the
processor finds them among its names. Each DAG's file location is this file. Keep its name: Airflow puts the dags
folder on ``sys.path``, so a file named like a package of ours (``nexus_cutover_dags.py``, ``nexus_cutover.py``) would
hide that package. A new release of the package changes what this file loads (see docs/runbook.md, "Upgrading while
cutovers are in flight"). Written by ``python -m nexus_cutover_airflow.dags_loader <dags folder>``.
"""

from nexus_cutover_dags.connector_projection_back_out import dag as connector_projection_back_out  # noqa: F401
from nexus_cutover_dags.connector_projection_cutover import dag as connector_projection_cutover  # noqa: F401
from nexus_cutover_dags.field_history_eligibility import dag as field_history_eligibility  # noqa: F401
from nexus_cutover_dags.tenant_rollout import dag as tenant_rollout  # noqa: F401
'''


def write(folder: pathlib.Path) -> pathlib.Path:
    """Write the loader into ``folder`` (created when missing); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOADER_NAME
    path.write_text(LOADER_SOURCE, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in ([], ["-"]):
        sys.stdout.write(LOADER_SOURCE)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m nexus_cutover_airflow.dags_loader [DAGS_FOLDER]  (prints {LOADER_NAME}, or writes it "
              "into DAGS_FOLDER)", file=sys.stderr)
        return 2
    print(write(pathlib.Path(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
