"""Who acted, as a bounded column records it: unique at any length, never cut to fit.

The tenant's "who" columns (``_System_AdmissionFence.ArmedBy`` / ``ReleasedBy``, the protocol row's
``WrittenBy``, the Field History settings' ``UpdatedBy``, a WorkItem's ``LeaseOwner``) hold 128 characters; a
holder's name may be longer (``airflow:<dag_id>:<run_id>`` with a rollout's run id of up to 250 characters, a long
``-holder``). Invariants (contract, "One cutover per tenant at a time"):

* :func:`stored_holder` is the one spelling written to, and compared with, those columns: a name that fits is
  stored as it is; a longer one as its first characters, ``~h`` and 32 hex digits of the SHA-256 of the whole
  name, 128 characters in all. Two names that differ anywhere (also past the 128th character) are stored
  differently (short names as themselves; long ones unless SHA-256 collides).
* It is idempotent (a stored spelling given back, e.g. copied from a message into ``-adopt``, names the same
  holder), and every comparison of holders is made in Python on stored spellings, byte for byte: never by the
  column's collation, which may fold case or ignore trailing spaces.
* :func:`is_digested`: a stored spelling that no longer shows the whole name (whoever reads it back, e.g. to ask
  Airflow for a run's state, cannot parse the name from it).
* An Airflow run's holder name is ``airflow:<dag_id>:<run_id>`` (:func:`holder_of_airflow_run`, the one
  spelling); :func:`airflow_run_named` reads it back, for messages and for asking Airflow about it.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from . import settings

#: Width of the "who" columns (catalog: ``String(128)``).
HOLDER_WIDTH = 128
_DIGEST_HEX = 32
_MARK = "~h"
_DIGESTED = re.compile(rf"{re.escape(_MARK)}[0-9a-f]{{{_DIGEST_HEX}}}\Z")


def stored_holder(name: str, width: int = HOLDER_WIDTH) -> str:
    """``name`` as a ``width``-character column stores and compares it (module invariants)."""
    if len(name) <= width:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_DIGEST_HEX]
    return f"{name[: width - len(_MARK) - _DIGEST_HEX]}{_MARK}{digest}"


def is_digested(stored: str, width: int = HOLDER_WIDTH) -> bool:
    """True when ``stored`` is the digest spelling of a longer name (its tail is not the name's)."""
    return len(stored) == width and _DIGESTED.search(stored) is not None


AIRFLOW_HOLDER_PREFIX = "airflow"


def holder_of_airflow_run(dag_id: str, run_id: str) -> str:
    """The holder name of run ``run_id`` of ``dag_id`` (whole, not yet in its stored spelling)."""
    return f"{AIRFLOW_HOLDER_PREFIX}:{dag_id}:{run_id}"


def airflow_run_named(stored: str | None) -> tuple[str, str | None] | None:
    """``(dag_id, run_id)`` of the Airflow run a stored holder names (``run_id`` None when it was too long to store
    whole), or None when the holder is not an Airflow run (a CLI invocation, a fence armed by hand)."""
    prefix, _, rest = (stored or "").partition(":")
    dag_id, _, run_id = rest.partition(":")
    if prefix != AIRFLOW_HOLDER_PREFIX or not dag_id or not run_id:
        return None
    return dag_id, (None if is_digested(stored or "") else run_id)


def airflow_run_link(dag_id: str, run_id: str | None) -> str | None:
    """The run's page in the Airflow UI when the setting ``airflow_url`` names the UI (``NEXUS_AIRFLOW_URL``),
    else None."""
    base = (settings.value("airflow_url") or "").rstrip("/")
    if not base:
        return None
    return f"{base}/dags/{quote(dag_id, safe='')}" + (f"/runs/{quote(run_id, safe='')}" if run_id else "")


def same_holder(stored: str | None, name: str | None) -> bool:
    """Whether the stored spelling ``stored`` names ``name`` (a whole name, or a stored spelling copied back)."""
    return stored is not None and name is not None and stored == stored_holder(name)
