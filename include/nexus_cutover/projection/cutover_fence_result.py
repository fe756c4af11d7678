"""What arming and releasing the cutover fence did (:class:`FenceResult`), and the admission pause it records.

Split out of :mod:`.cutover_fence`, which re-exports every name here (importers may keep
``from .cutover_fence import ...``). A plain value: it crosses task boundaries as :meth:`FenceResult.as_json`
(an XCom) and is read back with :meth:`FenceResult.from_json`; nothing here touches the database.

Invariants:

* The admission pause of a released cutover fence is ``ReleasedAt - ArmedAt`` of its own row
  (:func:`admission_pause_s`), read back in the releasing transaction; never derived from ids. An adoption keeps
  ``ArmedAt``: the pause runs from the first arming, whoever releases.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FenceResult:
    """What arming/releasing did (``outcome``) and on which fence."""

    namespace: str
    #: armed | reused | adopted | not_needed | would_arm | would_reuse | would_adopt
    #: | released | already_released | would_release
    outcome: str
    fence_id: int | None
    other_fences_in_force: list[dict[str, Any]] = field(default_factory=list)
    previous_holder: str | None = None
    holder: str | None = None
    #: The fence row's own ``ArmedAt`` (once armed, adopted, kept or released: when the admission pause began) and
    #: ``ReleasedAt`` (once released: ``released``, ``already_released``).
    armed_at: str | None = None
    released_at: str | None = None

    @property
    def admission_pause_s(self) -> float | None:
        """Seconds nothing new was admitted for the tenant (:func:`admission_pause_s`); None before the release."""
        return admission_pause_s({"ArmedAt": self.armed_at, "ReleasedAt": self.released_at})

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "outcome": self.outcome,
            "fence_id": self.fence_id,
            "holder": self.holder,
            "previous_holder": self.previous_holder,
            "other_fences_in_force": self.other_fences_in_force,
            "armed_at": self.armed_at,
            "released_at": self.released_at,
            "admission_pause_s": self.admission_pause_s,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FenceResult:
        """The result :meth:`as_json` serialized (what another task reads back)."""
        return cls(raw["namespace"], raw["outcome"], raw.get("fence_id"), list(raw.get("other_fences_in_force") or []),
                   raw.get("previous_holder"), raw.get("holder"), raw.get("armed_at"), raw.get("released_at"))

    @property
    def not_needed(self) -> bool:
        """Every pack already checkpointed and no cutover fence in force: nothing was (or would be) fenced."""
        return self.outcome == "not_needed"

    @property
    def planned(self) -> bool:
        """A dry run's fence that a real run would arm or adopt (none is in force for this run yet)."""
        return self.outcome in ("would_arm", "would_adopt")


def _as_datetime(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def admission_pause_s(fence: dict[str, Any]) -> float | None:
    """The admission pause of a cutover fence row: ``ReleasedAt - ArmedAt`` in seconds (None while in force).

    Both are the row's own columns (microseconds on MySQL-protocol servers), written in the arming and the
    releasing transaction by :func:`~nexus_cutover.clock.utcnow` of the process that wrote each. An adoption
    keeps ``ArmedAt``: the pause runs from the first arming, when admission stopped, whoever releases.
    """
    armed, released = _as_datetime(fence.get("ArmedAt")), _as_datetime(fence.get("ReleasedAt"))
    if armed is None or released is None:
        return None
    return round((released - armed).total_seconds(), 6)
