"""Release versions compare numerically per dotted component."""

from __future__ import annotations

import pytest

from nexus_cutover.errors import BadInput
from nexus_cutover.field_history.versions import older_than, parse_version


@pytest.mark.parametrize(
    ("version", "release", "older"),
    [
        ("4.9.3", "4.10.0", True),
        ("4.10.0", "4.9.3", False),
        ("4.12", "4.12.0", False),
        ("4.12.0", "4.12", False),
        ("4.12.0", "4.12.1", True),
        ("10.0", "9.99.99", False),
        ("4.2.10", "4.2.9", False),
        ("garbage", "4.0", True),  # unreadable in the database: counts as older, keeps the gate closed
        ("", "4.0", True),
    ],
)
def test_older_than(version, release, older):
    assert older_than(version, release) is older


def test_parse_version_rejects_a_bad_release_parameter():
    with pytest.raises(BadInput, match="dotted numeric"):
        parse_version("4.x")
    assert parse_version("4.12.0") == parse_version("4.12") == (4, 12)
