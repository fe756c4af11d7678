"""nexus-cutover: the domain package behind the tenant cutover pipeline.

Pure Python + SQLAlchemy; nothing here imports Airflow. Layers, top to bottom:
``cli`` -> ``projection`` / ``runtime`` / ``field_history`` -> ``locks``, ``db``,
``identity``, ``schema`` -> ``catalog``.
"""

__version__ = "0.1.0"
