"""Explicit failures of the range runtime (each names what is wrong and what to do).

* :class:`InadmissibleReceipts` - receipts that cannot be admitted for a reason
  retrying does not remove. Never acknowledged, never retried: the batch is
  refused whole (nothing written), each receipt named; the materializer leaves
  them durable and unconfirmed for review and admits the pack's other receipts.
  Its kinds:

  * :class:`MissingCoverage` - a post-cutoff duplicate whose ordinal no WorkItem
    range of its identity contains. Never replayed automatically.
  * :class:`ReceiptCollision` - a receipt whose key (PackInstallId, SourceLane,
    ReceiptId) the tenant's collation equates with an admitted receipt's (or an
    earlier receipt's of the batch) while the bytes differ: a different source
    record, never a duplicate (contract, "Projection identity and ordinals").
  * :class:`InvalidReceipts` - an empty lane or receipt id, or a value longer
    than its Event column (exit 2, bad input).

* :class:`MissingMembership` - a payload read for a WorkId whose persisted
  interval or member Events are absent. There is no selected-payload-only fallback.
* :class:`NotActivated` - the activation gate refused (no version-1 protocol row,
  or incomplete WorkItem schema); exit 3 like any refusal.
* :class:`ReplayRefused` - a replay of work that is not a terminal range generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput, CutoverError, Refused

MISSING_COVERAGE = "missing_coverage"
COLLISION = "collision"
INVALID = "invalid"

_SHOWN = 10


@dataclass(frozen=True)
class Rejection:
    """One receipt that cannot be admitted: its key, why (``kind``), and what a person reads."""

    source_lane: str
    receipt_id: str
    kind: str
    detail: str
    ordinal: int | None = None  # missing coverage: the admitted Event's ordinal

    @property
    def key(self) -> tuple[str, str]:
        return self.source_lane, self.receipt_id


def _key_text(lane: str, receipt: str) -> str:
    """A receipt key as a person must read it: quoted, so that case and trailing spaces show."""
    return f"(lane {lane!r}, receipt {receipt!r})"


def _listed(parts: list[str]) -> str:
    more = f" (+{len(parts) - _SHOWN} more)" if len(parts) > _SHOWN else ""
    return "; ".join(parts[:_SHOWN]) + more


class InadmissibleReceipts(CutoverError):
    """Receipts that cannot be admitted for a reason retrying does not remove (see the module docstring)."""

    def __init__(self, pack_install_id: str, rejections: list[Rejection], message: str | None = None):
        self.pack_install_id = pack_install_id
        self.rejections = list(rejections)
        super().__init__(
            message
            or f"{len(self.rejections)} receipt(s) of pack {pack_install_id!r} cannot be admitted and are not retried: "
            + _listed([r.detail for r in self.rejections])
        )

    @property
    def keys(self) -> set[tuple[str, str]]:
        return {r.key for r in self.rejections}

    @classmethod
    def combined(cls, pack_install_id: str, rejections: list[Rejection]) -> InadmissibleReceipts:
        """One error for ``rejections`` of any kinds (the subclass when they are all of one kind)."""
        kinds = {r.kind for r in rejections}
        if kinds == {MISSING_COVERAGE}:
            return MissingCoverage.of(pack_install_id, rejections)
        if kinds == {COLLISION}:
            return ReceiptCollision(pack_install_id, rejections)
        return cls(pack_install_id, rejections)


class MissingCoverage(InadmissibleReceipts):
    """Post-cutoff duplicates without durable coverage; ``receipts`` names each (lane, receipt, ordinal)."""

    def __init__(self, pack_install_id: str, receipts: list[tuple[str, str, int]]):
        self.receipts = list(receipts)
        shown = ", ".join(f"{lane}/{rid}@{o}" for lane, rid, o in self.receipts[:_SHOWN])
        more = f" (+{len(self.receipts) - _SHOWN} more)" if len(self.receipts) > _SHOWN else ""
        rejections = [
            Rejection(lane, rid, MISSING_COVERAGE, f"{_key_text(lane, rid)} at ordinal {o} lies above the cutoff, "
                      "but no WorkItem range of its identity contains it", o)
            for lane, rid, o in self.receipts
        ]
        super().__init__(
            pack_install_id,
            rejections,
            f"missing coverage in pack {pack_install_id!r}: duplicate receipt(s) {shown}{more} lie above the "
            "cutoff but no WorkItem range of their identity contains them; this is not acknowledged and not "
            "replayed automatically - it needs a reviewed recovery decision (e.g. an explicit replay)",
        )

    @classmethod
    def of(cls, pack_install_id: str, rejections: list[Rejection]) -> MissingCoverage:
        return cls(pack_install_id, [(r.source_lane, r.receipt_id, r.ordinal) for r in rejections])


@dataclass(frozen=True)
class Collision:
    """A receipt key equal to ``other``'s as the collation compares them, different byte for byte.

    ``event_id``: the admitted Event holding ``other``; None when ``other`` is an earlier receipt of the same batch.
    ``replay_of_work_id``: set when ``other`` is the ReceiptId the runtime made up for a replay Event (of that
    WorkItem): then the keys may be equal byte for byte, and are a collision all the same (contract, "Projection
    identity and ordinals": a receipt duplicates only a source receipt; the replay holds none of its payload).
    """

    source_lane: str
    receipt_id: str
    other_lane: str
    other_receipt: str
    event_id: int | None
    replay_of_work_id: int | None = None

    def describe(self) -> str:
        where = f"admitted as EventId {self.event_id}" if self.event_id is not None else "earlier in the same batch"
        if self.replay_of_work_id is not None:
            return (
                f"receipt {_key_text(self.source_lane, self.receipt_id)} has the key of replay EventId {self.event_id} "
                f"(the runtime's replay of WorkItem {self.replay_of_work_id}, {_key_text(self.other_lane, self.other_receipt)}): "
                "a source receipt duplicates only a source receipt, and the replay holds none of this receipt's payload"
            )
        return (
            f"receipt {_key_text(self.source_lane, self.receipt_id)} collides with "
            f"{_key_text(self.other_lane, self.other_receipt)} ({where}): the tenant's collation treats the two keys "
            "as equal, but their bytes differ"
        )


class ReceiptCollision(InadmissibleReceipts):
    """Receipts whose keys collide with other receipts' keys (see :class:`Collision`); ``collisions`` names both keys."""

    def __init__(self, pack_install_id: str, collisions: list[Collision] | list[Rejection]):
        if collisions and isinstance(collisions[0], Rejection):
            rejections, self.collisions = list(collisions), []
        else:
            self.collisions = list(collisions)
            rejections = [Rejection(c.source_lane, c.receipt_id, COLLISION, c.describe()) for c in self.collisions]
        super().__init__(
            pack_install_id,
            rejections,
            f"receipt key collision in pack {pack_install_id!r}: " + _listed([r.detail for r in rejections])
            + ". A collision is a different source record (source ids such as 15-character CRM ids are "
            "case-sensitive): it is not acknowledged as a duplicate and not retried; the receipt stays durable and "
            "unconfirmed for review, and the pack's other receipts are admitted",
        )


class InvalidReceipts(InadmissibleReceipts, BadInput):
    """Receipts no admission can take (empty lane or receipt id, a value longer than its Event column)."""

    def __init__(self, pack_install_id: str, rejections: list[Rejection]):
        super().__init__(
            pack_install_id,
            rejections,
            f"invalid receipt(s) for pack {pack_install_id!r}, not admitted: " + _listed([r.detail for r in rejections]),
        )

    @staticmethod
    def rejection(lane: str, receipt: str, why: str) -> Rejection:
        return Rejection(lane, receipt, INVALID, f"{_key_text(lane, receipt)}: {why}")


class MissingMembership(CutoverError):
    """The persisted interval of a WorkId does not yield its member Events."""


class NotActivated(Refused):
    """The activation gate refused; ``reasons`` says what to fix."""

    def __init__(self, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__("activation gate refused: " + "; ".join(self.reasons))


class ReplayRefused(Refused):
    """Replay target is not a terminal range generation of a version-1 pack."""
