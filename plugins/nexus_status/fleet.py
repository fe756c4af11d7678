"""The tenant list at fleet scale: filtered, paged, every tenant accounted for.

Invariants of :func:`listing`:

* every tenant connection counts: ``counts.total == counts.shown +
  counts.filtered_out + counts.other_pages`` (nothing is dropped silently);
  ``counts.unreadable`` is how many of the tenants read for this answer could
  not be read (shown with their error);
* only the tenants the answer needs are read: the page's, plus, for a
  ``state`` filter, every tenant left by the other filters (a state is only
  known by reading it); each through the shared :data:`tenants.CACHE`, so at
  most once per refresh interval whatever the number of viewers;
* ``wave`` / ``rollout`` filter by the rollout's plan (XCom ``rollout`` of a
  ``tenant_rollout`` run: the latest run unless ``rollout`` names one),
  ``search`` by a substring of the tenant name;
* a row shown is read within the refresh interval or carries ``stale`` (when
  it was read): the page's rows wait a little for their re-read
  (:data:`tenants.FRESH_WAIT_S`), a ``state`` filter does not.
"""

from __future__ import annotations

import math
from typing import Any

STATES = ("not started", "paused and draining", "paused", "checkpointed", "cut over", "unreadable")
MAX_PAGE_SIZE = 500


def _filtered(conn_ids: list[str], *, search: str | None, members: dict[str, int] | None,
              wave: int | None) -> list[str]:
    from nexus_status.tenants import tenant_of

    out = conn_ids
    if search:
        out = [c for c in out if search.lower() in tenant_of(c).lower()]
    if members is not None:
        out = [c for c in out if tenant_of(c) in members and (wave is None or members[tenant_of(c)] == wave)]
    return out


def listing(*, page: int = 1, page_size: int = 50, state: str | None = None, wave: int | None = None,
            rollout: str | None = None, search: str | None = None, cache=None,
            conn_ids: list[str] | None = None) -> dict[str, Any]:
    """One page of tenant states with the counts of what is not shown (see the module invariants)."""
    from nexus_status import history, tenants
    from nexus_status.rollouts import membership
    from nexus_status.runs import latest_runs

    cache = cache or tenants.CACHE
    page_size = max(1, min(int(page_size), MAX_PAGE_SIZE))
    all_ids = tenants.tenant_conn_ids() if conn_ids is None else conn_ids
    rollout_id, members = membership(rollout) if (rollout or wave is not None) else (None, None)
    matching = _filtered(all_ids, search=search, members=members, wave=wave)
    if state:
        states = cache.get(matching)
        matching = [c for c in matching if states[c].get("phase") == state]
    pages = max(1, math.ceil(len(matching) / page_size))
    page = max(1, min(int(page), pages))
    shown_ids = matching[(page - 1) * page_size: page * page_size]
    shown = cache.get(shown_ids, fresh_wait_s=tenants.FRESH_WAIT_S)  # a row is fresh or marked stale
    holders = {tenants.tenant_of(c): _holder(shown[c]) for c in shown_ids}
    runs = latest_runs(list(holders), holders) if shown_ids else {}
    rows = [_row(shown[c], runs, history) for c in shown_ids]
    counts = {"total": len(all_ids), "shown": len(rows), "filtered_out": len(all_ids) - len(matching),
              "other_pages": len(matching) - len(rows), "matching": len(matching),
              "unreadable": sum(1 for r in rows if "error" in r)}
    return {"tenants": rows, "counts": counts, "page": page, "pages": pages, "page_size": page_size,
            "filters": {"state": state, "wave": wave, "rollout": rollout_id, "search": search},
            "states": list(STATES), "refresh_s": cache.interval_s, "reads": cache.total_reads()}


def _holder(state: dict[str, Any]) -> str | None:
    """Who holds the tenant's cutover fence, else who held the last one released (the run a row describes)."""
    fence = state.get("fence") or {}
    return fence.get("holder") or fence.get("last_holder")


#: Most drain samples a row carries (evenly thinned, the last kept): a page of 500 tenants stays small.
CHART_POINTS = 120


def chart_points(samples: list[dict[str, Any]], most: int = CHART_POINTS) -> list[dict[str, Any]]:
    """At most ``most`` of ``samples``, evenly spaced, always with the first and the last."""
    if len(samples) <= most:
        return samples
    step = (len(samples) - 1) / (most - 1)
    return [samples[round(i * step)] for i in range(most)]


def _row(state: dict[str, Any], runs: dict[str, Any], history) -> dict[str, Any]:
    from nexus_status.runs import with_tenant_state

    row = dict(state)
    tenant = row["tenant"]
    samples = history.samples(tenant) if "error" not in row else []
    draining = (row.get("fence") or {}).get("armed") or (row.get("drain") or {}).get("remaining")
    row["samples"] = chart_points(samples) if draining else []
    row["eta"] = history.drain_eta(samples)
    drain = row.get("drain") or {}
    if drain.get("blockers"):  # a stuck drain: its causes with their counts, beside the count and the ETA
        from nexus_cutover.projection.steps import blockers_text

        row["drain"] = {**drain, "blockers_text": "stuck: " + blockers_text(drain["blockers"])}
    found = runs.get(tenant, {})
    row["runs"] = with_tenant_state(found.get("runs", {}), state)
    row["proofs"] = found.get("proofs", {})
    row["chip"] = chip_of(row)
    return row


#: The chip of a tenant whose cutover run is under way but has not paused it yet (issue 51, item 9).
STARTING = "starting, admission open"


def chip_of(row: dict[str, Any]) -> str:
    """The phase chip a person reads: the tenant's phase (what its database says; the state filter's word), except
    that a tenant whose cutover run is queued or running before it armed the fence is :data:`STARTING` (the run
    checks the form, adds the schema and waits for a short drain: the pause is still ahead), not "not started"."""
    cutover = (row.get("runs") or {}).get("cutover") or {}
    if row.get("phase") == "not started" and cutover.get("state") in ("queued", "running"):
        return STARTING
    return str(row.get("phase") or "")
