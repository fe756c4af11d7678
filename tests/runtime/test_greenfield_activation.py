"""Greenfield pack activation (cutoff 0 in its own transaction) and a running host picking up a newly activated pack."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.catalog import ConnectorProjectionProtocol, IngressReceipt
from nexus_cutover.db import make_engine
from nexus_cutover.errors import BadInput, MissingSchema
from nexus_cutover.projection.audit import NOT_GREENFIELD
from nexus_cutover.projection.checkpoint import ALREADY_WRITTEN, REFUSED, WRITTEN
from nexus_cutover.projection.greenfield import activate_pack
from nexus_cutover.protocol_row import WrongProtocolVersion

from ..support import history_checksum
from .support import NS, PACK, range_tenant

NEW = "pk-2"


def _protocol_rows(engine):
    t = ConnectorProjectionProtocol
    with engine.connect() as conn:
        return conn.execute(select(t.c.PackInstallId, t.c.ProtocolVersion, t.c.LegacyMaxOrdinal, t.c.WrittenBy)).all()


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar()


# -- activate_pack -------------------------------------------------------------


def test_greenfield_pack_is_written_with_cutoff_zero(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.receipt(PACK, "a", "rc-1"))  # a receipt is not history
    result = activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.protocol_version, result.written_by) == (WRITTEN, 0, 1, "tester")
    assert result.ok and result.findings == [] and result.namespace == NS
    assert result.as_json()["outcome"] == "written" and result.as_json()["legacy_max_ordinal"] == 0
    assert [tuple(r) for r in _protocol_rows(range_engine)] == [(PACK, 1, 0, "tester")]
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.MaterializedAt.is_not(None)) == 0


def test_existing_row_is_returned_unchanged(range_engine):
    range_tenant(range_engine, legacy_max=7)
    before = _protocol_rows(range_engine)
    result = activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.written_by) == (ALREADY_WRITTEN, 7, "scenario")
    assert _protocol_rows(range_engine) == before
    again = activate_pack(range_engine, PACK, timeout_s=30, written_by="other")
    assert again.outcome == ALREADY_WRITTEN and _protocol_rows(range_engine) == before


def test_a_row_of_another_protocol_version_is_an_error(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.protocol_row(PACK, 0, version=2))
    with pytest.raises(WrongProtocolVersion, match="ProtocolVersion 2"):
        activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert [r.ProtocolVersion for r in _protocol_rows(range_engine)] == [2]


def _refusal(engine):
    before = history_checksum(engine)
    result = activate_pack(engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.ok) == (REFUSED, None, False)
    assert _protocol_rows(engine) == [] and history_checksum(engine) == before
    [finding] = result.as_json()["findings"]
    assert finding["finding"] == NOT_GREENFIELD and "not greenfield" in finding["explanation"]
    assert "REFUSED" in result.summary()
    return result, finding


def test_refused_with_an_event_names_it_and_writes_nothing(range_engine):
    def build(sc):
        lane = sc.packs[0].lane("a")
        for _ in range(3):
            lane.event(status="pending")

    range_tenant(range_engine, legacy_max=None, build=build)
    result, finding = _refusal(range_engine)
    assert finding["event_ids"] == [1, 2, 3] and finding["work_ids"] == []
    assert (finding["event_count"], finding["work_item_count"]) == (3, 0)
    assert "3 Event(s), 0 WorkItem(s)" in result.findings[0].describe()


def test_refused_with_a_work_item_names_it_and_writes_nothing(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.packs[0].lane("a").work_item(None, status="cancelled"))
    _result, finding = _refusal(range_engine)
    assert (finding["event_ids"], finding["work_ids"]) == ([], [1])
    assert (finding["event_count"], finding["work_item_count"]) == (0, 1)


def test_refusal_names_only_a_few_ids(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.packs[0].lane("a").generation(8))
    _result, finding = _refusal(range_engine)
    assert len(finding["event_ids"]) == 5 and finding["work_ids"] == [1]
    assert (finding["event_count"], finding["work_item_count"]) == (8, 1)


def test_unknown_inactive_or_missing_pack_is_bad_input(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.pack("pk-gone", status=catalog.PACK_UNINSTALLED))
    for pack, match in (("pk-nope", "unknown pack"), ("pk-gone", "not active"), ("", "required")):
        with pytest.raises(BadInput, match=match) as info:
            activate_pack(range_engine, pack, timeout_s=30, written_by="tester")
        assert info.value.exit_code == 2
    assert _protocol_rows(range_engine) == []


def test_missing_part_b_schema_is_missing_schema(legacy_engine):
    with pytest.raises(MissingSchema) as info:
        activate_pack(legacy_engine, PACK, timeout_s=30, written_by="tester")
    assert info.value.exit_code == 2


def test_four_concurrent_activations_write_one_row(range_engine, tenant_url):
    range_tenant(range_engine, legacy_max=None)

    def call(i):
        engine = make_engine(tenant_url)
        try:
            return activate_pack(engine, PACK, timeout_s=60, written_by=f"caller-{i}")
        finally:
            engine.dispose()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    assert sorted(r.outcome for r in results) == [ALREADY_WRITTEN] * 3 + [WRITTEN]
    rows = _protocol_rows(range_engine)
    assert len(rows) == 1 and rows[0].LegacyMaxOrdinal == 0
    assert {r.written_by for r in results} == {rows[0].WrittenBy} and {r.legacy_max_ordinal for r in results} == {0}
