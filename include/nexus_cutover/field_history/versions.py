"""Release versions: dotted numeric strings compared component by component.

Invariant (contract): "Versions compare numerically per dotted component", so
``4.10.0 > 4.9.3`` and ``4.12 == 4.12.0`` (missing components count as 0).
A version that is not dotted digits is rejected, never guessed at: a gate that
cannot read a version must not pass it.
"""

from __future__ import annotations

import re

from ..errors import BadInput

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def parse_version(version: str) -> tuple[int, ...]:
    """``"4.12.0"`` -> ``(4, 12)`` (trailing zeros dropped so equal releases compare equal)."""
    text = (version or "").strip()
    if not _VERSION.match(text):
        raise BadInput(f"not a dotted numeric release version: {version!r} (expected e.g. 4.12.0)")
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def is_valid_version(version: str) -> bool:
    return bool(_VERSION.match((version or "").strip()))


def older_than(version: str, release: str) -> bool:
    """True when ``version`` precedes ``release``.

    An unparseable ``version`` (a value found in the database) counts as older:
    its producer cannot be shown to be at the release, so the gate stays closed.
    """
    floor = parse_version(release)
    if not is_valid_version(version):
        return True
    return parse_version(version) < floor
