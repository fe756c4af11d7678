"""``deploy/grafana/nexus-fleet.json`` as Grafana's file provisioning loads it, and its "Last admission pause" panel.

Grafana's dashboard provider of type ``file`` (a ``provisioning/dashboards/*.yaml`` whose ``options.path`` holds the
file) reads each JSON file as the dashboard model itself. Nothing imports it: no step replaces an export's
``__inputs`` placeholders, so a ``${DS_PROMETHEUS}`` stays literal, names no data source, and every panel says so.
The file must be the plain model -- a ``title`` (Grafana refuses a provisioned dashboard without one), a ``uid`` (its
URL stays the same across restarts), ``schemaVersion``, ``panels``, no top-level ``id`` -- and its Prometheus data
source a dashboard variable (type ``datasource``, query ``prometheus``) that every panel, target and query variable
names as ``${datasource}``. The same file still imports by hand (Dashboards → New → Import): the variable offers the
Prometheus data sources there too.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "nexus-fleet.json"
#: How a panel, a target or a variable names the data source variable (the object form is what Grafana writes).
VARIABLE = {"${datasource}", "$datasource"}
#: Grafana's own variables and macros (``$__interval``, ``$__range``...): not the dashboard's to define.
MACRO = "__"


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, a row's collapsed panels too."""
    for panel in dash.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def datasource_refs(node: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """``(where, value)`` of every ``datasource`` key anywhere in the model."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield where or "dashboard", value
            else:
                yield from datasource_refs(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            label = (value.get("title") or value.get("name") or value.get("refId")) if isinstance(value, dict) else None
            yield from datasource_refs(value, f"{where}[{label or i}]")


def provisioning_problems(text: str) -> list[str]:
    """What keeps ``text`` (a dashboard file) from loading as Grafana's file provisioning reads it; [] when none."""
    dash = json.loads(text)
    if not isinstance(dash, dict):
        return ["the file is not a JSON object"]
    out = []
    if "dashboard" in dash and "panels" not in dash:
        out.append("the file is the HTTP API's {\"dashboard\": ...} envelope: provisioning reads the model itself")
    out += [f"no {key}" for key in ("title", "uid", "schemaVersion", "panels") if not dash.get(key)]
    if dash.get("uid") and not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", str(dash["uid"])):
        out.append(f"uid {dash['uid']!r} is not 1-40 letters, digits, - or _")
    if dash.get("id") is not None:
        out.append(f"a top-level id {dash['id']!r}: a provisioned dashboard is found by its uid")
    out += [f"an export's {key}: nothing resolves it when the file is provisioned" for key in dash if key.startswith("__")]
    out += [f"an export's placeholder {p}: it stays literal when the file is provisioned"
            for p in sorted(set(re.findall(r"\$\{DS_[A-Za-z0-9_]+\}", text)))]
    variables = (dash.get("templating") or {}).get("list") or []
    names = [v.get("name") for v in variables]
    sources = [v for v in variables if v.get("type") == "datasource"]
    if [(v.get("name"), v.get("query")) for v in sources] != [("datasource", "prometheus")]:
        out.append("the data source is not one variable `datasource` of type datasource, query prometheus: "
                   f"{[(v.get('name'), v.get('query')) for v in sources]}")
    elif any(list(datasource_refs(v)) for v in variables[:variables.index(sources[0])]):
        out.append("a variable that queries a data source comes before the variable `datasource`")
    for where, ref in datasource_refs(dash):
        if isinstance(ref, dict):
            if ref.get("type") != "prometheus" or ref.get("uid") not in VARIABLE:
                out.append(f"{where}: datasource {ref} is not {{\"type\": \"prometheus\", \"uid\": \"${{datasource}}\"}}")
        elif ref not in VARIABLE:
            out.append(f"{where}: datasource {ref!r} is not the variable ${{datasource}}")
    ids = [p.get("id") for p in panels(dash)]
    out += [f"panel id {i} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for panel in panels(dash):
        for target in panel.get("targets") or []:
            if "datasource" not in panel and "datasource" not in target:
                out.append(f"panel {panel.get('title')!r} target {target.get('refId')}: no datasource")
            for name in re.findall(r"\$\{?([A-Za-z_]\w*)", target.get("expr", "")):
                if not name.startswith(MACRO) and name not in names:
                    out.append(f"panel {panel.get('title')!r}: ${name} is no variable of the dashboard")
    return out


def test_the_dashboard_file_is_what_grafana_provisions():
    text = DASHBOARD.read_text(encoding="utf-8")
    assert provisioning_problems(text) == []
    dash = json.loads(text)
    refs = list(datasource_refs(dash))
    queried = [p for p in panels(dash) if p.get("targets")]
    # each queried panel and each of its targets, and the tenant variable: all through the variable
    assert len(refs) == len(queried) + sum(len(p["targets"]) for p in queried) + 1
    assert dash["templating"]["list"][0]["name"] == "datasource"


def test_an_export_for_sharing_is_refused():
    """The tests can fail: the file as Grafana's "Export for sharing externally" writes it (an ``__inputs`` block,
    ``${DS_PROMETHEUS}`` everywhere, no variable), and a panel pinned to one data source's uid."""
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    dash["templating"]["list"] = [v for v in dash["templating"]["list"] if v["type"] != "datasource"]
    exported = json.dumps({"__inputs": [{"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}],
                           **dash}).replace("${datasource}", "${DS_PROMETHEUS}")
    problems = provisioning_problems(exported)
    assert problems[:2] == ["an export's __inputs: nothing resolves it when the file is provisioned",
                            "an export's placeholder ${DS_PROMETHEUS}: it stays literal when the file is provisioned"]
    assert any(p.startswith("the data source is not one variable") for p in problems)
    assert any(p.startswith("templating.list[tenant]: datasource") for p in problems), problems
    reordered = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    reordered["templating"]["list"].reverse()  # the tenant variable would query before its data source is chosen
    assert provisioning_problems(json.dumps(reordered)) == [
        "a variable that queries a data source comes before the variable `datasource`"]
    pinned = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    pinned["panels"][1]["datasource"] = {"type": "prometheus", "uid": "PBFA97CFB590B2093"}
    assert provisioning_problems(json.dumps(pinned)) == [
        "panels[Tenants by state]: datasource {'type': 'prometheus', 'uid': 'PBFA97CFB590B2093'} is not "
        '{"type": "prometheus", "uid": "${datasource}"}']


def test_the_last_admission_pause_is_the_last_observation_not_the_mean(promtool, tmp_path):
    """Why this query and ``lastNotNull``: ``nexus.admission.pause`` reaches Prometheus as a histogram (the StatsD
    exporter's timer), which keeps no single observation, only cumulative ``_sum`` and ``_count``. Their ratio -- the
    panel's old query -- is the mean of every pause since the series began: a tenant paused 3 s, then 40 s, showed
    21.5 s. One pause is one observation (the run that released the fence sends it once), so the last pause is the
    jump of ``_sum`` over the step it landed in, divided by the jump of ``_count`` (1; more only when two landed in one
    step, then their mean). A series the exporter just made (the tenant's first pause, or its first after the ttl or an
    exporter restart) has no sample a step earlier: it jumped from 0 (``or ... * 0``). Steps with no new pause give no
    sample (``> 0``), and the stat panel's ``lastNotNull`` keeps the last step that had one: the last pause in the
    dashboard's time range. Here Grafana's range query and that reduction are the subquery ``[30m:1m]`` and
    ``last_over_time``, run by the real promtool on the series the mapping makes."""
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panel = next(p for p in panels(dash) if p["title"].startswith("Last admission pause"))
    assert panel["type"] == "stat" and panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
    (target,) = panel["targets"]
    assert target["range"] is True and not target.get("instant")
    expr = target["expr"].replace("$__interval", "1m").replace('tenant=~"$tenant"', 'tenant=~".*"')
    the_mean = "nexus_admission_pause_seconds_sum / nexus_admission_pause_seconds_count"

    def series(tenant: str, sums: str, counts: str) -> list[dict[str, str]]:
        return [{"series": f'nexus_admission_pause_seconds_sum{{tenant="{tenant}"}}', "values": sums},
                {"series": f'nexus_admission_pause_seconds_count{{tenant="{tenant}"}}', "values": counts}]

    # one sample a minute from 0: "_x3" no series yet, "stale" the exporter restarted (its series gone)
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            *series("once", "_x5 12.5x25", "_x5 1x25"),  # one cutover: its pause, 12.5 s
            *series("twice", "_x3 3x16 43x10", "_x3 1x16 2x10"),  # 3 s, then 40 s: the last is 40, the mean 21.5
            *series("restarted", "_x2 9x5 stale _x4 7x17", "_x2 1x5 stale _x4 1x17"),  # 9 s; after a restart, 7 s
            *series("quiet", "_x30", "_x30"),  # no pause in the range: no value
        ],
        "promql_expr_test": [
            {"expr": f"last_over_time(({expr})[30m:1m])", "eval_time": "30m",
             "exp_samples": [{"labels": '{tenant="once"}', "value": 12.5},
                             {"labels": '{tenant="twice"}', "value": 40},
                             {"labels": '{tenant="restarted"}', "value": 7}]},
            # each pause at the step it landed in (a series' first, from 0), and nothing between two pauses (the
            # panel keeps the last value it had)
            {"expr": expr, "eval_time": "3m", "exp_samples": [{"labels": '{tenant="twice"}', "value": 3}]},
            {"expr": expr, "eval_time": "20m", "exp_samples": [{"labels": '{tenant="twice"}', "value": 40}]},
            {"expr": expr, "eval_time": "25m", "exp_samples": []},
            # the old query: the mean since the series began
            {"expr": the_mean, "eval_time": "30m",
             "exp_samples": [{"labels": '{tenant="once"}', "value": 12.5},
                             {"labels": '{tenant="twice"}', "value": 21.5},
                             {"labels": '{tenant="restarted"}', "value": 7}]},
        ]}]}
    path = tmp_path / "last-pause.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
