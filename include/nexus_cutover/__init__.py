"""nexus-cutover: the domain package behind the tenant cutover pipeline.

Pure Python + SQLAlchemy; nothing here imports Airflow. Layers, top to bottom:
``cli`` -> ``projection`` / ``runtime`` / ``field_history`` -> ``locks``, ``db``,
``identity``, ``schema`` -> ``catalog``.

``__version__`` is the installed distribution's version, read once, when this package is first imported: the
version of the code this process loaded (:mod:`nexus_cutover.code_version`), not of whatever is on disk later.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

try:
    __version__ = _installed_version("nexus-cutover")
except PackageNotFoundError:  # a source tree on sys.path that was never installed: no release to pin
    __version__ = "0+unknown"
