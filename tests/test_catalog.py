"""The catalog mirrors shared/contract/tenant_catalog.sql (reflected from a real database)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import inspect

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps, projection_steps

# shared/ lies beside the checkout (here, and in CI's fresh clone)
CONTRACT = Path(__file__).resolve().parents[2] / "shared" / "contract" / "tenant_catalog.sql"


def parse_contract(sql: str):
    """{table: {"columns": {name: (type, nullable)}, "indexes": {name: (cols, unique)}}}"""
    tables: dict[str, dict] = {}
    for m in re.finditer(r"CREATE TABLE `(\w+)` \((.*?)\n\);", sql, re.S):
        name, body = m.group(1), m.group(2)
        cols, idx = {}, {}
        for line in body.splitlines():
            line = line.split("--")[0].strip().rstrip(",")
            if cm := re.match(r"`(\w+)`\s+([A-Z]+(?:\(\d+\))?)\s*(.*)", line):
                cols[cm.group(1)] = (cm.group(2), "NOT NULL" not in cm.group(3))
            elif km := re.match(r"(UNIQUE )?KEY `(\w+)` \((.*)", line):
                idx[km.group(2)] = (re.findall(r"`(\w+)`", km.group(3)), bool(km.group(1)))
            elif pm := re.match(r"PRIMARY KEY \((.*)\)", line):
                idx["PRIMARY"] = (re.findall(r"`(\w+)`", pm.group(1)), True)
        tables[name] = {"columns": cols, "indexes": idx}
    # multi-line KEY definitions: join continuation lines
    for m in re.finditer(r"CREATE TABLE `(\w+)` \((.*?)\n\);", sql, re.S):
        body = re.sub(r",\s*\n\s+`", ", `", m.group(2))
        for km in re.finditer(r"(UNIQUE )?KEY `(\w+)` \(([^)]*)\)", body):
            tables[m.group(1)]["indexes"][km.group(2)] = (re.findall(r"`(\w+)`", km.group(3)), bool(km.group(1)))
    for m in re.finditer(r"ALTER TABLE `(\w+)` ADD COLUMN `(\w+)` (\w+) NULL;", sql):
        tables[m.group(1)]["columns"][m.group(2)] = (m.group(3), True)
    return tables


def normalise_type(sql_type: str) -> str:
    t = sql_type.upper()
    return {"BOOLEAN": "TINYINT(1)", "BOOL": "TINYINT(1)", "INT": "INTEGER"}.get(t, t)


def reflected_type(col) -> str:
    t = col["type"].compile(dialect=MYSQL_DIALECT).upper()
    t = t.replace("INTEGER(11)", "INTEGER").replace("BIGINT(20)", "BIGINT").replace("INT(11)", "INTEGER")
    return {"INT": "INTEGER", "TINYINT": "TINYINT(1)"}.get(t, t)


MYSQL_DIALECT = None


def test_contract_file_is_found():
    assert CONTRACT.exists(), CONTRACT


def test_catalog_names_every_table_and_column_of_the_contract():
    contract = parse_contract(CONTRACT.read_text())
    assert set(contract) == set(catalog.metadata.tables)
    for name, spec in contract.items():
        table = catalog.metadata.tables[name]
        assert list(spec["columns"]) == [c.name for c in table.columns], name
        for col, (_, nullable) in spec["columns"].items():
            assert table.c[col].nullable == nullable, f"{name}.{col}"


def test_part_a_has_no_part_b_objects():
    assert "_System_ConnectorProjectionProtocol" not in catalog.legacy_metadata.tables
    assert "InputStartOrdinal" not in catalog.legacy_metadata.tables["_System_WorkItem"].c
    assert "FieldHistoryEligible" not in catalog.legacy_metadata.tables["_System_AuditFieldChange"].c


def test_reflected_mariadb_schema_matches_the_contract(mysql_url):
    global MYSQL_DIALECT
    engine = make_engine(mysql_url)
    MYSQL_DIALECT = engine.dialect
    create_legacy_schema(engine)
    apply_steps(engine, projection_steps(engine))
    apply_steps(engine, field_history_steps(engine))
    contract = parse_contract(CONTRACT.read_text())
    insp = inspect(engine)
    assert set(insp.get_table_names()) == set(contract)
    for name, spec in contract.items():
        reflected = {c["name"]: c for c in insp.get_columns(name)}
        assert list(reflected) == list(spec["columns"]), name
        for col, (sql_type, nullable) in spec["columns"].items():
            assert reflected[col]["nullable"] == nullable, f"{name}.{col}"
            assert reflected_type(reflected[col]) == normalise_type(sql_type), f"{name}.{col}"
        indexes = {i["name"]: (i["column_names"], bool(i["unique"])) for i in insp.get_indexes(name)}
        indexes["PRIMARY"] = (insp.get_pk_constraint(name)["constrained_columns"], True)
        assert indexes == spec["indexes"], name
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_part_b_steps_are_idempotent_on_sqlite(sqlite_url, backend):
    engine = make_engine(sqlite_url)
    create_legacy_schema(engine)
    first = apply_steps(engine, projection_steps(engine))
    assert first == ["_System_WorkItem.InputStartOrdinal", "_System_ConnectorProjectionProtocol"]
    assert apply_steps(engine, projection_steps(engine)) == []
    engine.dispose()
