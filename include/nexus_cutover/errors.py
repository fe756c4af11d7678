"""Errors that end a command, each with the exit code of the contract.

| exit | class |
|------|-------|
| 2 | :class:`BadInput` (usage, unknown pack, malformed DSN, missing prerequisite schema) |
| 3 | :class:`Refused` (the audit or a gate refused; nothing written) |
| 4 | :class:`LockTimeout` (timed out or could not take the locks; nothing written) |
| 1 | :class:`CutoverError` and anything else |

Every message says what is wrong and what to fix; none carries a password.
"""

from __future__ import annotations


class CutoverError(Exception):
    exit_code = 1


class BadInput(CutoverError):
    exit_code = 2


class MissingSchema(BadInput):
    """A prerequisite table or column is absent; ``missing`` names each one."""

    def __init__(self, missing: list[str], hint: str = ""):
        self.missing = list(missing)
        msg = "missing prerequisite schema: " + ", ".join(self.missing)
        super().__init__(msg + (f" ({hint})" if hint else ""))


class Refused(CutoverError):
    """A refusal; ``report`` is what it reports besides its message (a stop's report: the XCom ``report`` of the
    task it stops, the ``-json`` of the command), None when the message says everything."""

    exit_code = 3
    report: dict | None = None


class LockTimeout(CutoverError):
    exit_code = 4


class Unreachable(CutoverError):
    """The database could not be reached (exit 1: not the caller's input)."""

    exit_code = 1


class ReadEquivalenceBroken(Refused):
    """A Field History materialization batch would change what a reader returns; that batch was rolled back.

    ``rows`` holds one dict per differing row (``change_id``, ``before``, ``after``, ``why``);
    the message names each of them. Batches committed before it stay committed:
    ``batches``, ``decided_rows`` and ``decided_digest`` describe them.
    """

    def __init__(self, message: str, rows: list[dict] | None = None):
        self.rows = list(rows or [])
        self.batches = 0
        self.decided_rows = 0
        self.decided_digest: str | None = None
        super().__init__(message)
