"""Writes DAG runs, task instances, XComs and Variables into a test Airflow's metadata DB (test data only).

Run as ``python -m tests.status_view.seed_runs`` with the stack's environment
(its ``AIRFLOW_HOME`` and metadata DB), a JSON spec on stdin::

    {"runs": [{"dag_id", "run_id", "state", "conf", "minutes": <run length, optional>,
               "tis": [{"task_id", "state"}], "xcoms": [{"task_id", "key", "value"}]}],
     "variables": {key: value}}

The status view's pages only read these tables; this writes what a rollout in
every state leaves there, without running the rollout DAG (being rewritten).
The DAGs of those runs must be paused (the test pauses them) so no scheduler
acts on a run written here.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid


def _dag_run(spec: dict, now: dt.datetime):
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    start = now - dt.timedelta(minutes=float(spec.get("minutes", 5)))
    run = DagRun(dag_id=spec["dag_id"], run_id=spec["run_id"], run_type=DagRunType.MANUAL, conf=spec.get("conf") or {},
                 state=spec["state"], run_after=spec.get("run_after_at", now), start_date=start,
                 triggered_by=DagRunTriggeredByType.TEST)
    if spec["state"] in ("success", "failed"):
        run.end_date = now
    return run


def _ti_row(spec: dict, ti: dict) -> dict:
    return {"id": uuid.uuid4(), "task_id": ti["task_id"], "dag_id": spec["dag_id"], "run_id": spec["run_id"],
            "map_index": -1, "state": ti["state"], "try_number": 1, "max_tries": 0, "pool": "default_pool",
            "pool_slots": 1, "queue": "default", "priority_weight": 1, "hostname": "", "unixname": "test"}


def seed(spec: dict) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.variable import Variable
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import insert

    now = dt.datetime.now(dt.UTC)
    with create_session() as session:
        for i, run in enumerate(spec.get("runs", [])):
            # in the order given, each after every run of an earlier spec (never read order from an id)
            session.add(_dag_run({**run, "run_after_at": now + dt.timedelta(milliseconds=i)}, now))
        session.flush()
        for run in spec.get("runs", []):
            tis = list(run.get("tis", []))
            listed = {ti["task_id"] for ti in tis}  # an XCom belongs to a task instance (a foreign key)
            tis += [{"task_id": t, "state": "success"} for t in dict.fromkeys(x["task_id"] for x in run.get("xcoms", []))
                    if t not in listed]
            if tis:
                session.execute(insert(TaskInstance.__table__), [_ti_row(run, ti) for ti in tis])
            for x in run.get("xcoms", []):
                XComModel.set(key=x["key"], value=x["value"], dag_id=run["dag_id"], task_id=x["task_id"],
                              run_id=run["run_id"], map_index=-1, session=session)
    for key, value in (spec.get("variables") or {}).items():
        Variable.set(key, value)


if __name__ == "__main__":
    seed(json.loads(sys.stdin.read()))
