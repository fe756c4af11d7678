"""Hostile text for property tests: keys that differ only in case, trailing spaces or characters a collation folds.

Production identities and receipt ids are not ASCII lanes that differ in more than
case. These Hypothesis strategies draw a few *base* values and then *variants* of
them, so that values the tenant's collation equates while their bytes differ turn
up in almost every example:

* :func:`hostile_text` - one value: ASCII, accented Latin, Greek final sigma,
  CJK, 4-byte emoji (which ``utf8mb4_general_ci`` treats as all equal), a
  combining accent, NBSP and tab, inner spaces; up to ``max_size`` characters.
* :func:`variant_of` - a value the collation may equate with ``base``: letters'
  case flipped at random, trailing spaces added (PAD SPACE collations, TiDB's
  ``utf8mb4_bin`` among them, ignore them), or the base itself.
* :func:`crm_id` - a 15-character case-sensitive CRM id (Salesforce style).
* :func:`family` / :func:`keys_from` - a handful of bases, then values drawn as
  variants of them: the common way to get collisions.
* :func:`long_value` - values near a column's length, so a trailing space can push
  a variant over it (an invalid input, not a collision).

Nothing here touches a database; the strategies are plain Hypothesis. Reuse them
in any test (the simulator's production-shaped tenant can draw its lanes and
receipt ids from :func:`family` and :func:`variant_of`).
"""

from __future__ import annotations

import string

from hypothesis import strategies as st

#: Characters beyond ASCII that collations treat differently (case pairs, folds, 4-byte, combining, spaces).
NON_ASCII = "éÉèÈüÜßẞσΣςıİ中文ü" + "\U0001f600\U0001f601" + "e\u0301" + "\u00a0"
#: Characters of an ordinary identifier.
ASCII = string.ascii_letters + string.digits + "-_./:"
ALPHABET = ASCII + NON_ASCII + " \t"

CRM_ID_ALPHABET = string.ascii_letters + string.digits


def hostile_text(min_size: int = 1, max_size: int = 24, alphabet: str = ALPHABET) -> st.SearchStrategy[str]:
    """One hostile value: never empty when ``min_size`` >= 1, never only spaces, never ending in a space (variants add them)."""
    return (
        st.text(alphabet=alphabet, min_size=min_size, max_size=max_size)
        .map(lambda s: s.rstrip(" "))
        .filter(lambda s: len(s) >= min_size and s.strip(" \t\u00a0") != "")
    )


@st.composite
def variant_of(draw, base: str, *, max_trailing: int = 2) -> str:
    """``base`` with the case of some letters flipped and up to ``max_trailing`` trailing spaces (or ``base`` itself)."""
    chars = list(base)
    flips = draw(st.lists(st.booleans(), min_size=len(chars), max_size=len(chars)))
    out = "".join(
        c.swapcase() if flip and c.swapcase() != c and len(c.swapcase()) == 1 else c for c, flip in zip(chars, flips, strict=True)
    )
    return out + " " * draw(st.integers(0, max_trailing))


def crm_id() -> st.SearchStrategy[str]:
    """A 15-character case-sensitive CRM id."""
    return st.text(alphabet=CRM_ID_ALPHABET, min_size=15, max_size=15)


def long_value(length: int) -> st.SearchStrategy[str]:
    """A value of ``length - 2`` to ``length`` characters: a variant with trailing spaces may exceed ``length``."""
    return st.integers(max(1, length - 2), length).flatmap(lambda n: hostile_text(min_size=n, max_size=n, alphabet=ASCII + NON_ASCII))


def family(bases: st.SearchStrategy[str] | None = None, *, min_size: int = 1, max_size: int = 3) -> st.SearchStrategy[list[str]]:
    """A few distinct base values (by bytes)."""
    return st.lists(bases if bases is not None else hostile_text(), min_size=min_size, max_size=max_size, unique=True)


def keys_from(bases: list[str], *, max_trailing: int = 2) -> st.SearchStrategy[str]:
    """A variant of one of ``bases``."""
    return st.sampled_from(bases).flatmap(lambda b: variant_of(b, max_trailing=max_trailing))


def identities_and_receipts() -> st.SearchStrategy[tuple[list[str], list[str]]]:
    """Lane bases and receipt-id bases for a tenant: hostile lanes (one may be long), CRM ids or hostile receipt ids."""
    lanes = family(st.one_of(hostile_text(), long_value(128)), max_size=3)
    receipts = family(st.one_of(crm_id(), hostile_text(max_size=16)), min_size=2, max_size=6)
    return st.tuples(lanes, receipts)
