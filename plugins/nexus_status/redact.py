"""The last guard before text reaches a page: no DSN, no password, whatever a task or a driver wrote.

Invariant: :func:`redact` replaces every ``scheme://...`` URL (a DSN names a
host, a user and possibly a password) and every ``password=...`` / ``pwd=...``
pair with a placeholder. Applied to every free text the status view shows
(failure reasons, read errors); ids and domain figures are not free text.
"""

from __future__ import annotations

import re
from typing import Any

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET = re.compile(r"(?i)\b(password|passwd|pwd|secret|token)(\s*[=:]\s*)[^\s,;'\"]+")
HIDDEN = "[DSN hidden]"


def redact(text: Any) -> str:
    """``text`` as a string with every URL and every ``password=`` value hidden."""
    return _SECRET.sub(r"\1\2***", _URL.sub(HIDDEN, str(text)))
