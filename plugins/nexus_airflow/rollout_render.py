"""What the rollout shows a person, as text: the wave question's table."""

from __future__ import annotations

import datetime as dt
from typing import Any


def wave_body(wave: int, rows: list[dict[str, Any]]) -> str:
    """The wave question's table: tenant, live/stopped writers, what stopped them (the writer-stop controller's
    answer, evidence only), last heartbeat age, drain result, evidence age."""
    from nexus_cutover.clock import utcnow

    lines = [f"## Wave {wave}: stop every old writer of these tenants before their checkpoints\n",
             "| tenant | writers live / stopped or silent | stopped by | newest heartbeat age (s) | drain | "
             "evidence age (s) |",
             "|---|---|---|---|---|---|"]
    now = utcnow()
    for r in rows:
        if r["status"] != "ready":
            lines.append(f"| `{r['tenant']}` | {r['status']} (not in this question) | - | - | - | - |")
            continue
        ev = r["evidence"]
        procs = ev.get("processes") or []
        ages = [p.get("heartbeat_age_s") for p in procs if p.get("heartbeat_age_s") is not None]
        age = (now - dt.datetime.fromisoformat(ev["checked_at"])).total_seconds()
        lines.append(f"| `{r['tenant']}` | {len(ev.get('live') or [])} / {len(procs) - len(ev.get('live') or [])} | "
                     f"{stopped_by(ev.get('writers_stop'))} | {min(ages) if ages else '-'} | {r['drain']} | {age:.0f} |")
    lines.append("\nConfirm only if every old ingress_writer, receipt_materializer, projection_worker and "
                 "dependency_resolver of every tenant above is stopped and will not be restarted. Each tenant "
                 "re-checks its own registry when the answer arrives and fails alone if a writer came back. "
                 "**Reject** (or no answer in time) fails the tenants in this question: cutover not performed. A tenant "
                 "not in it asks its own question when it is ready.")
    return "\n".join(lines)


def stopped_by(answer: Any) -> str:
    """A tenant's writer-stop controller's answer in one cell (its run's ``writers_stop`` beside the evidence): the
    controller, whether it reported success and how long it took; ``manual`` when none ran (a person stopped them)."""
    if not isinstance(answer, dict) or "ok" not in answer:
        return "manual (a person)"
    return f"{answer.get('controller')}: {'OK' if answer['ok'] else 'FAILED'}, {answer.get('seconds')} s"
