"""The one rule for a CSV cell a spreadsheet would run as a formula (OWASP, "CSV Injection").

Every CSV this product hands a person -- the fleet preflight (:func:`nexus_cutover.projection.preflight.to_csv`) and
the delivery ledger's report (:func:`nexus_cutover.ledger.to_csv`: ``nexus-cutover report -csv`` and the status
view's download) -- writes each text cell through :func:`safe_cell`.

Invariants:

* A text that starts with one of :data:`FORMULA_STARTS` (``=``, ``+``, ``-``, ``@``, a tab, a carriage return) is
  written with a leading ``'``: a spreadsheet shows it as text (and hides the ``'``), never runs it. Any other text
  is written exactly, so an id or a reason reads back as stored.
* Text only: a number (an ``int`` such as a map index of -1 or a cutoff) is a value, not a formula, and is left to
  the caller to write as it is.
* No Airflow, no plugin: the domain package owns the rule, the status view reuses it.
"""

from __future__ import annotations

#: A cell a spreadsheet would run as a formula starts with one of these.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(text: str) -> str:
    """``text`` with a leading ``'`` when it starts with one of :data:`FORMULA_STARTS`, else ``text`` itself."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
