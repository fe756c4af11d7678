"""nexus-cutover: the domain package behind the tenant cutover pipeline.

Pure Python + SQLAlchemy; nothing here imports Airflow. Layers, top to bottom:
``cli`` -> ``projection`` / ``runtime`` / ``field_history`` -> ``locks``, ``db``,
``identity``, ``schema`` -> ``catalog``.
"""

import importlib.metadata

#: The installed distribution's version: one source, pyproject.toml's ``version`` (the wheel's metadata says it).
__version__ = importlib.metadata.version("nexus-cutover")
