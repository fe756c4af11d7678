"""The demo's old-protocol runtime: the reference simulator, paced so a person can watch the drain.

``NEXUS_TENANT_DSN=... python scripts/demo_old_runtime.py --namespace demo [--pace 0.5]``

It is :class:`nexus_sim.old_runtime.OldRuntimeSimulator` (ingress
writer + projection worker + in-process dependency resolver), stepped every
``--pace`` seconds with a small ``work_per_step`` and one failed first attempt
per item, so old work drains over tens of seconds instead of instantly. It keeps
admitting one synthetic input per step and pack until the cutover fence stops
it. SIGTERM/SIGINT stop it cleanly: both registry rows get ``StoppedAt``.

With ``--stop-after-fenced-drain`` it also stops by itself once an admission
fence is in force and its old work has drained -- standing in for the delivery
engineer who stops the old writers at step 3 (used by ``make airflow``, where
the cutover is triggered from the UI).
"""

from __future__ import annotations

import argparse
import threading

from nexus_cutover.cli.common import stop_on_signals
from nexus_cutover.db import DSN_ENV_TENANT, dsn_from_env, make_engine
from nexus_sim.old_runtime import OldRuntimeSimulator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--process-id", default="old-runtime-1")
    parser.add_argument("--pace", type=float, default=0.5, help="seconds between steps")
    parser.add_argument("--work-per-step", type=int, default=1)
    parser.add_argument("--stop-after-fenced-drain", action="store_true")
    args = parser.parse_args()
    stop = threading.Event()
    stop_on_signals(stop)
    engine = make_engine(dsn_from_env(DSN_ENV_TENANT))
    sim = OldRuntimeSimulator(
        engine,
        args.namespace,
        process_id=args.process_id,
        synthetic_inputs_per_step=1,
        synthetic_lanes=2,
        work_per_step=args.work_per_step,
        fail_attempts=1,
        retry_delay_s=1.0,
        heartbeat_s=2.0,
    )
    try:
        sim.register()
        while not stop.is_set():
            report = sim.step()
            if args.stop_after_fenced_drain and report.fenced_sources and sim.drained():
                break
            stop.wait(args.pace)
    finally:
        sim.stop()
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
