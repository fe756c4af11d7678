"""What the current product breaks on a production-shaped tenant: minimal reproductions, one per breakage.

    bash scripts/with-mariadb.sh .venv/bin/python scripts/production_breakages.py [NAME ...] [--backend B ...]

Each reproduction builds its own tenant (the production-shaped one of :mod:`nexus_sim.scenario.production`, or a
few rows of :class:`nexus_sim.scenario.TenantScenario` where that is enough), runs the product's own code (the step
functions, or ``nexus-host`` as a process), and prints what the contract expects and what happened. Backends:
``sqlite``, ``utf8mb4`` (MariaDB's default utf8mb4 collation: case-insensitive, PAD SPACE), ``utf8mb4_bin``
(binary, PAD SPACE); the MariaDB ones need ``NEXUS_TEST_MYSQL_URL`` (``scripts/with-mariadb.sh`` sets it).

Exit 0 when nothing broke, 1 otherwise. Not a test: a reproduction for the engineers who own the fixes (issues 24,
25) and for phase 2, which turns the demo and the end-to-end tests onto this tenant once they are fixed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "include")]

from sqlalchemy import text  # noqa: E402

from nexus_cutover import catalog  # noqa: E402
from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.projection import steps  # noqa: E402
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps  # noqa: E402
from nexus_sim.scenario import TenantScenario, build_production_tenant  # noqa: E402
from nexus_sim.traffic import LiveTraffic  # noqa: E402

NS = "prod"
STALE = dt.timedelta(seconds=120)
BACKENDS = {"sqlite": None, "utf8mb4": None, "utf8mb4_bin": "utf8mb4_bin"}


@contextlib.contextmanager
def tenant_dsn(backend: str) -> Iterator[str]:
    """An empty tenant database on ``backend``, dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "tenant.db"
            path.touch()
            yield f"sqlite:///{path}"
        return
    from tests.support import mysql_database

    server = os.environ.get("NEXUS_TEST_MYSQL_URL")
    if not server:
        raise SystemExit("NEXUS_TEST_MYSQL_URL is not set: run under scripts/with-mariadb.sh")
    with mysql_database(server, charset="utf8mb4", collation=BACKENDS[backend]) as dsn:
        yield dsn


def cutover_until_checkpoint(engine, packs: list[str]) -> dict[str, object]:
    """Steps 1 and 4 as the DAG runs them (schema, fence, then one checkpoint per pack): pack -> result."""
    apply_steps(engine, projection_steps(engine))
    steps.arm_fence(engine, NS, holder="repro", packs=packs, timeout_s=30)
    return {p: steps.checkpoint(engine, p, timeout_s=60, written_by="repro") for p in packs}


def host_drain(dsn: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "PYTHONPATH": str(REPO / "include"), "NEXUS_HOST_POLL_S": "0.2"}
    return subprocess.run([str(REPO / ".venv" / "bin" / "nexus-host"), "--namespace", NS, "--drain-and-exit"], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


# -- the reproductions: each returns (broken?, what happened) --------------------------------------------------


def registry_cap(backend: str) -> tuple[bool, str]:
    """Contract "Process registry": a live old writer is found wherever its row sorts (10,000 stopped rows)."""
    with tenant_dsn(backend) as dsn:
        engine = make_engine(dsn)
        planted = build_production_tenant(engine, namespace=NS, live_old_writers=True).planted
        evidence = steps.writer_evidence(engine, NS, stale_heartbeat=STALE)
        live = sorted(p["process_id"] for p in evidence.live)
        engine.dispose()
    expected = sorted(planted.live_processes)
    return live != expected, (f"writer evidence lists {len(evidence.processes)} processes, live {live}; "
                              f"expected live {expected} (all_stopped_or_silent={evidence.all_stopped_or_silent})")


def ordinary_audited(backend: str) -> tuple[bool, str]:
    """Contract "Ordinary work": ordinary Events are not audited; live ordinary work is never live_work."""
    with tenant_dsn(backend) as dsn:
        engine = make_engine(dsn)
        tenant = build_production_tenant(engine, namespace=NS, registry_stopped_rows=0)
        ordinary_work = {w["WorkId"] for w in tenant.scenario.work_items if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY}
        results = cutover_until_checkpoint(engine, tenant.planted.active_packs)
        engine.dispose()
    lines = []
    for pack, r in results.items():
        about_ordinary = [f for f in r.findings if (f.identity is not None and f.identity.work_type.startswith("crm."))
                          or (f.identity is None and set(f.work_ids) <= ordinary_work)]
        if r.outcome != "written":
            lines.append(f"{pack[:24]}: {r.outcome}, " + ", ".join(
                f"{f.finding}({len(f.event_ids)} Events, {len(f.work_ids)} WorkItems"
                f"{', ' + f.identity.work_type if f.identity else ''})" for f in r.findings)
                + f" [{len(about_ordinary)} of {len(r.findings)} about ordinary rows]")
    return bool(lines), "; ".join(lines) or "every pack written"


def digest_counts_ordinary(backend: str) -> tuple[bool, str]:
    """Contract "History digest": ordinary rows that appear or change after the digest never fail its verification."""
    with tenant_dsn(backend) as dsn:
        engine = make_engine(dsn)
        tenant = build_production_tenant(engine, namespace=NS, registry_stopped_rows=0)
        apply_steps(engine, projection_steps(engine))
        steps.arm_fence(engine, NS, holder="repro", packs=tenant.planted.active_packs, timeout_s=30)
        digest = steps.history_digest(engine, NS, timeout_s=60)
        traffic = LiveTraffic(engine, tenant.planted, receipts_per_tick=0, future_per_tick=0, ordinary_per_tick=1,
                              complete_ordinary_per_tick=1)
        traffic.tick()  # one new ordinary item per pack, one planted pending ordinary item completed
        result = steps.verify_history(engine, digest, timeout_s=60)
        engine.dispose()
    report = traffic.report
    ok = bool(getattr(result, "ok", False))
    texts = [d.text for d in getattr(result, "differences", [])] or [str(result)[:300]]
    return not ok, (f"after {len(report.ordinary)} new ordinary WorkItems and {len(report.ordinary_completed)} completed "
                    f"one(s): verified={ok}; " + " | ".join(t[:260] for t in texts))


def collision_receipt(backend: str) -> tuple[bool, str]:
    """Contract "Projection identity": a receipt the collation equates with an admitted one but whose bytes differ is a
    collision: an error naming both keys, left unconfirmed, and the pack's other receipts keep being admitted."""
    admitted = "003Xx000004ABcD"
    variant = {"sqlite": "003xX000004abCd", "utf8mb4": "003xX000004abCd", "utf8mb4_bin": admitted + " "}[backend]
    with tenant_dsn(backend) as dsn:
        engine = make_engine(dsn)
        create_legacy_schema(engine)
        sc = TenantScenario(namespace=NS)
        lane = sc.pack("pk-1").lane("Lane-A")
        lane.work_item(lane.event(receipt_id=admitted))
        sc.receipt("pk-1", "Lane-A", variant)
        sc.receipt("pk-1", "Lane-A", "003Xx000009ZZzz")  # an unrelated receipt of the same pack
        sc.write(engine)
        cutover_until_checkpoint(engine, ["pk-1"])
        host = host_drain(dsn)
        with engine.connect() as conn:
            confirmed = dict(conn.execute(text(
                "SELECT ReceiptId, ConfirmedAt IS NOT NULL FROM _System_IngressReceipt")).all())
        engine.dispose()
    other_ok = bool(confirmed.get("003Xx000009ZZzz"))
    variant_confirmed = bool(confirmed.get(variant))
    equal = backend != "sqlite"  # the two MariaDB collations equate the keys; SQLite's BINARY does not
    broken = (not other_ok) or (equal and variant_confirmed) or (not equal and not variant_confirmed)
    last = [line for line in host.stderr.splitlines() if "rror" in line][-1:] or ["(no error line)"]
    return broken, (f"host exit {host.returncode}; unrelated receipt confirmed={other_ok}; variant {variant!r} of admitted "
                    f"{admitted!r} confirmed={variant_confirmed}; last error line: {last[0][:220]}")


def case_variant_batch(backend: str) -> tuple[bool, str]:
    """Contract "Projection identity": whatever the collation, an admitted input belongs to exactly one generation,
    as the server's own join on the identity columns sees it (receipts on 'Lane-A', 'lane-a', 'Lane-A ' in one batch)."""
    with tenant_dsn(backend) as dsn:
        engine = make_engine(dsn)
        create_legacy_schema(engine)
        sc = TenantScenario(namespace=NS)
        lane = sc.pack("pk-1").lane("Lane-A")
        lane.work_item(lane.event(receipt_id="003Xx0000000001"))
        for i, spelling in enumerate(("Lane-A", "lane-a", "Lane-A ", "Lane-A", "LANE-A")):
            sc.receipt("pk-1", spelling, f"003Xx00000001{i:02d}")
        sc.write(engine)
        cutover_until_checkpoint(engine, ["pk-1"])
        host = host_drain(dsn)
        with engine.connect() as conn:
            owners = conn.execute(text("""
                SELECT e.EventId, e.SourceLane, COUNT(w.WorkId) AS owners FROM _System_Event e
                JOIN _System_ConnectorProjectionProtocol p ON p.PackInstallId = e.PackInstallId
                LEFT JOIN _System_WorkItem w ON w.PackInstallId = e.PackInstallId AND w.EventKind = e.EventKind
                  AND w.RouteVersion = e.RouteVersion AND w.FlowVersion = e.FlowVersion AND w.WorkType = e.WorkType
                  AND w.SourceLane = e.SourceLane AND w.InputStartOrdinal IS NOT NULL
                  AND w.InputStartOrdinal <= e.EnqueueOrdinal AND e.EnqueueOrdinal <= w.LaneOrdinal
                WHERE e.EnqueueOrdinal > p.LegacyMaxOrdinal GROUP BY e.EventId, e.SourceLane ORDER BY e.EventId""")).all()
            generations = conn.execute(text(
                "SELECT SourceLane, InputStartOrdinal, LaneOrdinal FROM _System_WorkItem WHERE InputStartOrdinal IS NOT NULL"
                " ORDER BY WorkId")).all()
        engine.dispose()
    bad = [(lane_, n) for _, lane_, n in owners if n != 1]
    return bool(bad) or host.returncode != 0, (
        f"host exit {host.returncode}; generations {[(g[0], g[1], g[2]) for g in generations]}; "
        f"Events not owned by exactly one generation: {bad or 'none'}")


REPRODUCTIONS: dict[str, Callable[[str], tuple[bool, str]]] = {
    "registry_cap": registry_cap,
    "ordinary_audited": ordinary_audited,
    "digest_counts_ordinary": digest_counts_ordinary,
    "collision_receipt": collision_receipt,
    "case_variant_batch": case_variant_batch,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *REPRODUCTIONS], default=[], metavar="NAME",
                        help=f"reproductions to run (default: all): {', '.join(REPRODUCTIONS)}")
    parser.add_argument("--backend", action="append", choices=list(BACKENDS), help="default: all three")
    args = parser.parse_args()
    broken_any = False
    for name in args.names or list(REPRODUCTIONS):
        doc = (REPRODUCTIONS[name].__doc__ or "").split("\n")[0]
        print(f"\n== {name}: {doc}", flush=True)
        for backend in args.backend or list(BACKENDS):
            broken, observed = REPRODUCTIONS[name](backend)
            broken_any |= broken
            print(f"   {'BROKEN' if broken else 'ok    '} {backend:<12} {observed}", flush=True)
    return 1 if broken_any else 0


if __name__ == "__main__":
    raise SystemExit(main())
