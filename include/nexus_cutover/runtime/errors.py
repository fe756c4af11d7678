"""Explicit failures of the range runtime (each names what is wrong and what to do).

* :class:`MissingCoverage` - a post-cutoff duplicate whose ordinal no WorkItem
  range of its identity contains. Never acknowledged, never replayed automatically.
* :class:`MissingMembership` - a payload read for a WorkId whose persisted
  interval or member Events are absent. There is no selected-payload-only fallback.
* :class:`NotActivated` - the activation gate refused (no version-1 protocol row,
  or incomplete WorkItem schema); exit 3 like any refusal.
* :class:`ReplayRefused` - a replay of work that is not a terminal range generation.
"""

from __future__ import annotations

from ..errors import CutoverError, Refused


class MissingCoverage(CutoverError):
    """Post-cutoff duplicates without durable coverage; ``receipts`` names each (lane, receipt, ordinal)."""

    def __init__(self, pack_install_id: str, receipts: list[tuple[str, str, int]]):
        self.pack_install_id = pack_install_id
        self.receipts = list(receipts)
        shown = ", ".join(f"{lane}/{rid}@{o}" for lane, rid, o in self.receipts[:10])
        more = f" (+{len(self.receipts) - 10} more)" if len(self.receipts) > 10 else ""
        super().__init__(
            f"missing coverage in pack {pack_install_id!r}: duplicate receipt(s) {shown}{more} lie above the "
            "cutoff but no WorkItem range of their identity contains them; this is not acknowledged and not "
            "replayed automatically - it needs a reviewed recovery decision (e.g. an explicit replay)"
        )


class MissingMembership(CutoverError):
    """The persisted interval of a WorkId does not yield its member Events."""


class NotActivated(Refused):
    """The activation gate refused; ``reasons`` says what to fix."""

    def __init__(self, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__("activation gate refused: " + "; ".join(self.reasons))


class ReplayRefused(Refused):
    """Replay target is not a terminal range generation of a version-1 pack."""
