"""The tenant listing of a 2,000-tenant fleet, served by a real ``airflow standalone`` API server.

2,000 ``AIRFLOW_CONN_NEXUS_TENANT_*`` connections in the stack's environment:
1,997 cheap SQLite tenants (one file, each tenant its own namespace) and 3 whose
file is missing (unreadable). The refresh interval is set longer than the test
(``NEXUS_STATUS_REFRESH_S``), so "at most one read per tenant per interval"
means exactly one read per tenant over the whole test: the API server's read
counter (``reads`` in the JSON) is asserted, never a duration. Paged, filtered,
with concurrent viewers, and every tenant accounted for in the counts.
"""

from __future__ import annotations

import threading

import pytest

from nexus_cutover.db import make_engine
from scripts.demo_airflow import AirflowStack
from tests.dags.airflow_harness import connection_json
from tests.support import make_cutover_ready

pytestmark = pytest.mark.airflow

FLEET, BROKEN = 2000, (5, 1000, 1999)
PAGE = 500


def _conn_id(i: int) -> str:
    return f"nexus_tenant_fleet{i:04d}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    shared = tmp / "fleet.db"
    shared.touch()
    engine = make_engine(f"sqlite:///{shared}")
    make_cutover_ready(engine)
    engine.dispose()
    good, missing = connection_json(f"sqlite:///{shared}"), connection_json(f"sqlite:///{tmp / 'missing.db'}")
    env = {f"AIRFLOW_CONN_{_conn_id(i).upper()}": missing if i in BROKEN else good for i in range(FLEET)}
    s = AirflowStack(tmp / "airflow", parallelism=2, extra_env={**env, "NEXUS_STATUS_REFRESH_S": "86400"})
    try:
        s.start(timeout_s=600)  # a loaded 2-core machine: the stack took 3 min to be healthy here
        yield s
    finally:
        s.stop()  # also when start() gave up: it leaves the stack's processes running


def _get(stack, query: str) -> dict:
    return stack.request("GET", f"/nexus-status/api/tenants?{query}", timeout=600)


def test_two_thousand_tenants_paged_one_read_each(stack):
    reads0 = _get(stack, "page_size=1&search=no-such-tenant")["reads"]  # reads nothing: no tenant matches
    first: list[dict] = []
    viewers = [threading.Thread(target=lambda: first.append(_get(stack, f"page=1&page_size={PAGE}")))
               for _ in range(3)]
    for v in viewers:
        v.start()
    for v in viewers:
        v.join(600)
    assert len(first) == 3 and all(b["tenants"] == first[0]["tenants"] for b in first)
    assert first[0]["reads"] - reads0 <= PAGE  # three viewers at once: the page's tenants read once

    seen = []
    for page in range(1, FLEET // PAGE + 1):
        body = _get(stack, f"page={page}&page_size={PAGE}")
        c = body["counts"]
        assert body["pages"] == FLEET // PAGE and c["total"] == FLEET
        assert c["shown"] + c["filtered_out"] + c["other_pages"] == FLEET and c["shown"] == PAGE
        seen += [t["conn_id"] for t in body["tenants"]]
    assert seen == [_conn_id(i) for i in range(FLEET)]  # every tenant, in order, none dropped
    assert body["reads"] - reads0 == FLEET  # one read per tenant

    unreadable = _get(stack, "state=unreadable&page_size=50")
    assert [t["conn_id"] for t in unreadable["tenants"]] == [_conn_id(i) for i in BROKEN]
    assert all("does not exist" in t["error"] for t in unreadable["tenants"])
    assert unreadable["counts"] == {"total": FLEET, "shown": 3, "filtered_out": FLEET - 3, "other_pages": 0,
                                    "matching": 3, "unreadable": 3}
    last = _get(stack, f"state=not+started&page=4&page_size={PAGE}")
    assert last["counts"] == {"total": FLEET, "shown": PAGE - 3, "filtered_out": 3, "other_pages": 3 * PAGE,
                              "matching": FLEET - 3, "unreadable": 0}
    again = _get(stack, f"page=2&page_size={PAGE}")
    assert again["reads"] - reads0 == FLEET  # filters and repeat views within the interval read nothing new
