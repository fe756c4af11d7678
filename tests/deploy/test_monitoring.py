"""What ``deploy/`` gives a team to load: the StatsD exporter's mapping (``deploy/statsd/nexus-mapping.yml``), the
Prometheus alert rules (``deploy/prometheus/``) and the Grafana dashboard (``deploy/grafana/``).

The rules are checked and unit-tested by the real ``promtool`` (Debian's ``prometheus`` package, installed here when
missing, as ``scripts/bootstrap.sh`` does); every series a rule or a panel queries is one the mapping makes of a
metric ``nexus_airflow.metrics.ALL`` declares (the mapping applied to a real run's StatsD lines:
``tests/dags/test_metrics.py``). Each series expires from the exporter after its mapping's ``ttl``, but the fence gauge and
the spools' pending count, which keep their last value."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from nexus_airflow.metrics import ALL, COUNTER, TIMER, named
from tests import statsd_mapping

REPO = pathlib.Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "nexus-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "nexus-alerts.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "nexus-fleet.json"
#: The StatsD line type of each kind of metric (Airflow's client: timing ms, incr c, gauge g).
STATSD_TYPE = {TIMER: "ms", COUNTER: "c"}
#: A series name in PromQL: ours all start with nexus_ (a label name, a function or a keyword never does).
SERIES = re.compile(r"\bnexus_[a-zA-Z0-9_]+")
#: Grafana's variables and macros, as a query reaches Prometheus.
GRAFANA_MACROS = {"$__rate_interval": "5m", "$__range": "6h", "$__interval": "1m", "$tenant": ".*"}


def emitted_series(mappings: list[dict]) -> dict[str, str]:
    """Every Prometheus series the exporter makes of the declared metrics (series -> the metric's nexus name), by
    applying the mapping to the StatsD line each metric's per-tenant name form is sent as."""
    out = {}
    for metric in ALL:
        line = f"airflow.{named(metric, {t: f'some-{t}' for t in metric.tags})}:1|{STATSD_TYPE.get(metric.kind, 'g')}"
        sample = statsd_mapping.apply(mappings, line)
        assert sample is not None, f"{metric.name}: no entry of {statsd_mapping.MAPPING_FILE.name} maps {line!r}"
        assert set(sample.labels) == set(metric.tags), (metric.name, sample.labels)
        for series in sample.series:
            out[series] = metric.name
    return out


def rule_queries(path: pathlib.Path = RULES) -> list[str]:
    return [r["expr"] for g in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"] for r in g["rules"]]


def dashboard_queries(path: pathlib.Path = DASHBOARD) -> list[str]:
    dash = json.loads(path.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets") or []]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("type") == "query"]
    return exprs


def runbook_queries() -> list[str]:
    """The sample queries of the runbook's "Watching a fleet" (its ``promql`` blocks), comments left out."""
    text = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```promql\n(.*?)```", text, re.DOTALL)
    return [line for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]


def unknown_series(queries: list[str], emitted: dict[str, str]) -> dict[str, list[str]]:
    """Each query -> the series it names that the product does not emit (only the queries that name one)."""
    return {q: sorted(s for s in set(SERIES.findall(q)) if s not in emitted) for q in queries
            if any(s not in emitted for s in SERIES.findall(q))}


def test_every_declared_metric_is_mapped_by_exactly_one_entry():
    mappings = statsd_mapping.load()
    emitted = emitted_series(mappings)
    assert set(emitted.values()) == {m.name for m in ALL}
    for metric in ALL:
        name = f"airflow.{named(metric, {t: 'x' for t in metric.tags})}"
        assert len(statsd_mapping.matching(mappings, name)) == 1, name
    # the bare (tag-less) form plain StatsD aggregates fleet-wide is left to the exporter's default
    tagged = [m for m in ALL if m.tags]
    assert all(not statsd_mapping.matching(mappings, f"airflow.{m.name}") for m in tagged)


#: The metrics whose series the exporter keeps with no ttl (deploy/statsd/nexus-mapping.yml's comments): the fence's
#: arming time (a fence left armed by a dead run keeps alerting until someone releases it). The spools' pending count
#: is one series per machine (``host``), so it expires too: a worker that is gone must not keep its last value.
NEVER_EXPIRE = {"nexus.fence.armed_at"}


def test_the_series_of_a_finished_run_expire_but_the_fence():
    mappings, default = statsd_mapping.load(), statsd_mapping.defaults()
    ttl = {}
    for metric in ALL:
        line = f"airflow.{named(metric, {t: f'some-{t}' for t in metric.tags})}:1|{STATSD_TYPE.get(metric.kind, 'g')}"
        ttl[metric.name] = statsd_mapping.apply(mappings, line, default).ttl_s
    assert {name for name, s in ttl.items() if s is None} == NEVER_EXPIRE, ttl
    # every other series goes once its tenant or rollout is done, and not before a run is: at least the 6 h a drain
    # gauge keeps (each poll re-sends it), at most a day
    assert all(6 * 3600 <= s <= 24 * 3600 for name, s in ttl.items() if name not in NEVER_EXPIRE), ttl
    assert {name for name, s in ttl.items() if s == 24 * 3600} >= {
        "nexus.step.duration", "nexus.step.failed", "nexus.admission.pause", "nexus.lock.wait",
        "nexus.digest.rows_per_second", "nexus.ledger.spooled", "nexus.ledger.caught_up", "nexus.ledger.pending"}
    # each entry carries its own ttl, never a default: the exporter gives a default ttl to every entry without one
    # of its own (an entry's ttl: 0 does not opt out), so a default would expire the fence gauge too (and the
    # chart's statsd.extraMappings cannot carry a default: scripts/deploy_settings.py check says so)
    assert default == {}
    fence = next(m for m in mappings if m["match"] == "airflow.nexus.fence.armed_at.*")
    assert "ttl" not in fence
    assert statsd_mapping.ttl_s({**fence, "ttl": 0}, {"ttl": "24h"}) == 24 * 3600
    assert statsd_mapping.ttl_s(fence, {}) is None
    with pytest.raises(ValueError, match="not a Go duration"):
        statsd_mapping.ttl_s({**fence, "ttl": "1d"})  # the exporter's durations stop at hours


def test_every_series_a_rule_or_a_panel_queries_is_emitted():
    emitted = emitted_series(statsd_mapping.load())
    queries = rule_queries() + dashboard_queries() + runbook_queries()
    assert len(queries) >= 25 and all(SERIES.search(q) for q in queries)
    assert unknown_series(queries, emitted) == {}
    # what the issue asks the dashboard and the rules to show is there
    used = {s for q in queries for s in SERIES.findall(q)}
    assert {"nexus_rollout_tenants", "nexus_fence_armed_at_seconds", "nexus_drain_remaining", "nexus_drain_eta",
            "nexus_step_duration_seconds_bucket", "nexus_lock_wait_seconds_bucket", "nexus_step_failed_total",
            "nexus_rollout_halted", "nexus_admission_pause_seconds_bucket"} <= used


def test_a_query_of_a_series_the_product_does_not_emit_is_found(tmp_path):
    emitted = emitted_series(statsd_mapping.load())
    rules = tmp_path / RULES.name
    rules.write_text(RULES.read_text(encoding="utf-8").replace("nexus_drain_remaining >", "nexus_drain_left >", 1))
    assert unknown_series(rule_queries(rules), emitted) == {
        "nexus_drain_left > 0 and nexus_drain_remaining >= max_over_time(nexus_drain_remaining[15m])":
            ["nexus_drain_left"]}
    dash = tmp_path / DASHBOARD.name
    dash.write_text(DASHBOARD.read_text(encoding="utf-8").replace("nexus_lock_wait_seconds_bucket",
                                                                  "nexus_lock_wait_bucket"))
    assert [v for v in unknown_series(dashboard_queries(dash), emitted).values()] == [["nexus_lock_wait_bucket"]]
    # a declared metric the mapping leaves out is named
    fewer = [m for m in statsd_mapping.load() if "drain" not in m["match"]]
    with pytest.raises(AssertionError, match="nexus.drain.remaining: no entry"):
        emitted_series(fewer)


def test_promtool_checks_the_rules_and_their_unit_tests_pass(promtool):
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 4 rules found" in check.stdout, check.stdout + check.stderr
    run = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    # every alert is tested both firing and not firing, on series the mapping names
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for r in g["rules"]}
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts == {c["alertname"] for c in cases
                                                                            if not c["exp_alerts"]}
    emitted = emitted_series(statsd_mapping.load())
    inputs = [s["series"] for t in tests for s in t["input_series"]]
    assert unknown_series(inputs, emitted) == {}


def test_a_broken_rule_fails_promtool(promtool, tmp_path):
    """The tests can fail: a rule whose bound moved no longer passes its unit test."""
    (tmp_path / RULES.name).write_text(RULES.read_text(encoding="utf-8").replace("> 600 and", "> 1200 and"))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    run = subprocess.run([promtool, "test", "rules", str(tmp_path / RULE_TESTS.name)], capture_output=True, text=True)
    assert run.returncode != 0 and "NexusAdmissionPauseOverBound" in run.stdout + run.stderr


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    """promtool parses each panel's query (as a recording rule, Grafana's macros given values)."""
    exprs = dashboard_queries()
    for macro, value in GRAFANA_MACROS.items():
        exprs = [e.replace(macro, value) for e in exprs]
    exprs = [e for e in exprs if not e.startswith("label_values(")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in check.stdout
