"""Hostile text for tenant builders: lane spellings, CRM receipt ids, non-ASCII payloads, values at column limits.

Nothing here decides equality: the spellings are *candidates*; which of them a
tenant treats as one identity (or one receipt key) is the server's answer
(:class:`nexus_sim.collation.ServerCollation`). Everything drawn from a
:class:`random.Random` is deterministic for its seed.

Column limits come from the catalog (``SourceLane`` VARCHAR(128), ``EventKind``
VARCHAR(128), ``Payload`` TEXT: 65,535 bytes on MySQL-family servers).
"""

from __future__ import annotations

import random
import string

from nexus_cutover import catalog

SOURCE_LANE_MAX = catalog.Event.c.SourceLane.type.length
EVENT_KIND_MAX = catalog.Event.c.EventKind.type.length
#: TEXT on MySQL-family servers holds 65,535 bytes; a long payload stays this far below it in UTF-8 bytes.
TEXT_MAX_BYTES = 65_535
LONG_PAYLOAD_BYTES = TEXT_MAX_BYTES - 535

#: Latin-1 letters only, so that a latin1 column holds it too.
_LONG_LANE_BASE = ("Øresund-Ærøskøbing-" + "øå" * SOURCE_LANE_MAX)[: SOURCE_LANE_MAX - 1]

#: Groups of lane spellings a tenant may hold side by side: within a group they differ only in case, trailing
#: spaces, or both. Under a case-insensitive PAD SPACE collation each group is one identity; under a binary one
#: (``utf8mb4_bin``) only the trailing-space variants are; under SQLite's BINARY every spelling is its own.
LANE_SPELLINGS: tuple[tuple[str, ...], ...] = (
    ("Lane-A", "lane-a", "LANE-A"),  # case only
    ("Lane-B", "Lane-B ", "Lane-B  "),  # trailing spaces only
    ("Lane-C", "lane-c "),  # case and a trailing space
    ("Ærø-ß", "ærø-ß", "ÆRØ-ß"),  # non-ASCII case variants (ß has no one-letter upper case here)
    ("Kunde-Straße", "Kunde-Strasse"),  # equal under some Unicode collations, not under general_ci or bin
    ("客户-📇",),  # four-byte UTF-8: a utf8mb4 column holds it, a latin1 one does not
    (_LONG_LANE_BASE, _LONG_LANE_BASE + " ", _LONG_LANE_BASE.upper()),  # at the column limit (127 and 128 characters)
)

#: An Event kind exactly at the column limit.
LONG_EVENT_KIND = ("custom.object.Überweisungsbestätigung." + "x" * EVENT_KIND_MAX)[:EVENT_KIND_MAX]

#: Characters payloads and free text are drawn from, besides ASCII letters; a builder keeps those the server holds.
NON_ASCII_ALPHABET = "äöüßÄÖÜÆØÅæøåéèêçñÑłŁşğİıΩλΣύ客户名称데이터📇🚀"

_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
#: Key prefixes of 15-character CRM ids (case-sensitive ids: ``001`` accounts, ``003`` contacts, ``00Q`` leads...).
CRM_PREFIXES = ("001", "003", "00Q", "006", "a0B")


def crm_id(rng: random.Random, prefix: str = "003") -> str:
    """A 15-character case-sensitive CRM-style id: a 3-character key prefix and 12 base-62 characters."""
    return prefix + "".join(rng.choice(_BASE62) for _ in range(12))


def case_variant(receipt_id: str) -> str:
    """``receipt_id`` with the case of every letter after the key prefix swapped (same length, same letters)."""
    return receipt_id[:3] + receipt_id[3:].swapcase()


def receipt_variants(receipt_id: str) -> list[str]:
    """Ids a source could send that differ from ``receipt_id`` only in case or trailing spaces."""
    return [case_variant(receipt_id), receipt_id + " ", case_variant(receipt_id) + "  "]


def free_text(rng: random.Random, alphabet: str, length: int) -> str:
    """``length`` characters of words drawn from ASCII letters and ``alphabet`` (the held non-ASCII characters)."""
    pool = string.ascii_letters + alphabet * 3
    out: list[str] = []
    while len(out) < length:
        out.extend(rng.choice(pool) for _ in range(rng.randint(2, 9)))
        out.append(" ")
    return "".join(out[:length]).strip() or "x"


def payload(rng: random.Random, alphabet: str, *, tag: str, size_bytes: int | None = None) -> str:
    """A JSON payload with non-ASCII text; with ``size_bytes``, padded to at most that many UTF-8 bytes."""
    head = f'{{"id": "{tag}", "name": "{free_text(rng, alphabet, 24)}", "note": "'
    tail = '"}'
    if size_bytes is None:
        return head + free_text(rng, alphabet, rng.randint(10, 80)) + tail
    budget = size_bytes - len((head + tail).encode())
    body: list[str] = []
    used = 0
    while True:
        ch = rng.choice(string.ascii_letters + " " + alphabet)
        n = len(ch.encode())
        if used + n > budget:
            break
        body.append(ch)
        used += n
    return head + "".join(body) + tail
