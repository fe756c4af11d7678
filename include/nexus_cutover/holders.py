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
"""

from __future__ import annotations

import hashlib
import re

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


def same_holder(stored: str | None, name: str | None) -> bool:
    """Whether the stored spelling ``stored`` names ``name`` (a whole name, or a stored spelling copied back)."""
    return stored is not None and name is not None and stored == stored_holder(name)
