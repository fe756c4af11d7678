"""nexus-cutover's three Airflow DAGs, from the installed package: drop this one file into your dags folder.

``pip install "nexus-cutover[airflow]"`` installs the DAGs as the package ``nexus_cutover_dags``; Airflow's DAG
processor parses only files of its dags folder (or a bundle), so this file imports the three DAG objects, and the
processor finds them among its names. Each DAG's file location is this file. Keep its name: Airflow puts the dags
folder on ``sys.path``, so a file named like a package of ours (``nexus_cutover_dags.py``, ``nexus_cutover.py``) would
hide that package. A new release of the package changes
what this file loads (see docs/runbook.md, "Upgrading while cutovers are in flight").
"""

from nexus_cutover_dags.connector_projection_cutover import dag as connector_projection_cutover  # noqa: F401
from nexus_cutover_dags.field_history_eligibility import dag as field_history_eligibility  # noqa: F401
from nexus_cutover_dags.tenant_rollout import dag as tenant_rollout  # noqa: F401
