"""The last guard before text reaches a page: no DSN, no password, whatever a task or a driver wrote.

Invariant: :func:`redact` replaces every ``scheme://...`` URL (a DSN names a
host, a user and possibly a password) and every ``password=...`` / ``pwd=...``
pair with a placeholder; a file database's ``sqlite:///path`` names none of them and stays. Applied to every free text the status view shows
(failure reasons, read errors); ids and domain figures are not free text.
"""

from __future__ import annotations

import re
from typing import Any

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET = re.compile(r"(?i)\b(password|passwd|pwd|secret|token)(\s*[=:]\s*)[^\s,;'\"]+")
HIDDEN = "[DSN hidden]"


#: A file database's URL (``sqlite:///path``, any driver): no host, no user, no password; shown whole, so a command
#: a page shows with it can be pasted (issue 51, item 2: the demo's producer-upgrade command).
_FILE_URL = re.compile(r"sqlite(\+[a-z0-9_]+)?:///[^@\s'\"<>]*", re.IGNORECASE)


def _hidden(match: re.Match) -> str:
    url = match.group(0)
    return url if _FILE_URL.fullmatch(url) else HIDDEN


def redact(text: Any) -> str:
    """``text`` as a string with every URL that names a host (a user, a password) and every ``password=`` value
    hidden; a file database's URL is no secret and stays."""
    return _SECRET.sub(r"\1\2***", _URL.sub(_hidden, str(text)))
