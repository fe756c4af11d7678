"""DAG integrity: parses from the real dags/ folder, does no DB work at parse time, validates its form."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nexus_airflow.declared import FUSED
from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.projection.transition import CUTOVER
from tests.dags.airflow_harness import DAGS_FOLDER, PLUGINS_FOLDER, load_dag

DAG_ID = "connector_projection_cutover"
ORDER = CUTOVER.names
#: What the DAG file may import of the domain at parse time: the declarations (standard library only), no more.
#: The domain modules a DAG file may load at parse time: declarations with no imports of their own (the steps of
#: each migration; the digest's connection bound, which the form declares).
#: What parsing a DAG file may import of the domain: the declarations of the steps and of the settings (the
#: form's default host controller and the fused tasks are settings; ``settings`` imports ``errors`` for its error).
DECLARATIONS = ["nexus_cutover", "nexus_cutover.errors", "nexus_cutover.field_history",
                "nexus_cutover.field_history.transition", "nexus_cutover.projection",
                "nexus_cutover.projection.digest_limits", "nexus_cutover.projection.transition",
                "nexus_cutover.settings", "nexus_cutover.transition"]


@pytest.fixture(scope="module")
def dag(airflow_db):
    return load_dag(DAG_ID)


def declared_order_holds(dag, transition) -> None:
    """The DAG's tasks are exactly the declared steps (a fused task its consecutive steps, in order), each task the
    only upstream of the next, in the declared stage's TaskGroup (when it names one): the DAG cannot run them in
    another order than the declaration's."""
    from nexus_airflow.declared import steps_of, task_of

    order = list(dict.fromkeys(task_of(transition.name, name) for name in transition.names))
    assert set(dag.task_ids) == set(order)
    assert [s for task in order for s in steps_of(transition.name, task)] == transition.names
    for upstream, downstream in zip(order, order[1:], strict=False):
        first = steps_of(transition.name, downstream)[0]
        mapped_over = {transition[first].per_pack_of} - {None}  # a per-pack step also reads its packs' step
        assert dag.get_task(downstream).upstream_task_ids - mapped_over == {upstream}, (upstream, downstream)
    assert not dag.get_task(order[0]).upstream_task_ids and not dag.get_task(order[-1]).downstream_task_ids
    for step in transition:
        group = dag.get_task(task_of(transition.name, step.name)).task_group
        assert (group.group_id if group and group.group_id else None) == transition.stage_of(step.name).group_id


def test_tasks_in_order_with_docs(dag):
    declared_order_holds(dag, CUTOVER)
    assert dag.doc_md and "dry_run" in dag.doc_md
    from nexus_airflow.declared import steps_of

    for task in dag.tasks:
        assert task.doc_md and len(task.doc_md) > 60, task.task_id
        for step in steps_of(DAG_ID, task.task_id):  # the declaration's, each step's of a fused task
            assert CUTOVER[step].dry_run in task.doc_md.partition("**Dry run**:")[2], (task.task_id, step)
    assert dag.get_task("wait_for_drain").soft_fail is False
    assert dag.get_task("wait_for_drain").deferrable is True
    assert dag.get_task("confirm_writers_stopped").defaults is None
    assert dag.get_task("start_new_host").defaults is None


def test_an_armed_tenants_tasks_outrank_a_new_tenants_first_ones(dag):
    """Issue 36, item 3: every task after arm_fence (the admission pause) outranks resolve_packs, apply_schema and
    arm_fence of any run, whatever its place in the DAG (absolute weights: Airflow's default ranks a run's first tasks
    highest); the rollout's wave questions rank with the armed tasks."""
    from nexus_airflow.declared import PRIORITY_ARMED

    names = CUTOVER.names
    fenced_from = names.index("arm_fence") + 1
    from nexus_airflow.declared import task_of

    weight = {name: dag.get_task(task_of(DAG_ID, name)).priority_weight for name in names}  # absolute: the priority
    assert all(t.weight_rule == "absolute" for t in dag.tasks)
    before, armed = [weight[n] for n in names[:fenced_from]], [weight[n] for n in names[fenced_from:]]
    assert max(before) < min(armed) and set(armed) == {PRIORITY_ARMED}, weight
    rollout = load_dag("tenant_rollout")
    questions = [t for t in rollout.tasks if t.task_id.endswith(".confirm")]
    assert questions and {(t.priority_weight, t.weight_rule) for t in questions} == {(PRIORITY_ARMED, "absolute")}
    others = [t for t in rollout.tasks if not t.task_id.endswith(".confirm")]
    assert all(t.weight_rule != "absolute" or t.priority_weight < PRIORITY_ARMED for t in others)


def test_parse_does_no_database_work_and_imports_no_domain_code():
    """Parse the DAG file in a fresh interpreter with every tenant connection pointing nowhere."""
    code = textwrap.dedent(
        f"""
        import os, sys, time, json
        os.environ["AIRFLOW_CONN_NEXUS_TENANT_ACME"] = "mysql://u:p@192.0.2.1:1/nowhere"
        sys.path[:0] = [{str(PLUGINS_FOLDER)!r}]
        import airflow.sdk
        from airflow.sdk import DAG  # the SDK import itself (~2-4 s) is not the DAG file's cost
        import runpy
        before = set(sys.modules)
        t = time.perf_counter()
        ns = runpy.run_path({str(DAGS_FOLDER / "connector_projection_cutover.py")!r})
        elapsed = time.perf_counter() - t
        print(json.dumps({{"elapsed": elapsed, "tasks": len(ns["dag"].task_ids),
                          "domain": sorted(m for m in sys.modules if m.startswith("nexus_cutover")),
                          "pymysql": "pymysql" in sys.modules,
                          "sqlalchemy_by_dag": sorted(m for m in set(sys.modules) - before if m.startswith("sqlalchemy"))}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"DAG file parse time beyond airflow.sdk: {result['elapsed'] * 1000:.0f} ms")
    assert result["tasks"] == len(ORDER) - sum(len(s) - 1 for s in FUSED.get(DAG_ID, {}).values())
    assert result["domain"] == sorted(DECLARATIONS), "the DAG file may import only the declarations at parse time"
    assert result["pymysql"] is False, "no database driver may be loaded at parse time"
    assert result["sqlalchemy_by_dag"] == [], "the DAG file (its declarations) must not load SQLAlchemy"


def test_the_lever_switch_gives_one_task_per_step():
    """``NEXUS_FUSED_TASKS=0`` (the switch bench-stack measures the fused tasks by) parses the same DAG file into one
    task per declared step, each of its own operator (the readiness wait a sensor, the release the step operator)."""
    code = textwrap.dedent(
        f"""
        import json, runpy, sys
        sys.path[:0] = [{str(PLUGINS_FOLDER)!r}]
        dag = runpy.run_path({str(DAGS_FOLDER / "connector_projection_cutover.py")!r})["dag"]
        print(json.dumps({{t.task_id: type(t).__name__ for t in dag.tasks}}))
        """
    )
    import json
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "NEXUS_FUSED_TASKS": "0"})
    operators = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(operators) == sorted(ORDER)
    assert operators["verify_readiness"] == "TenantWaitSensor" and operators["resume_admission"] == "CutoverStepOperator"


@pytest.mark.parametrize(
    "tenant",
    ["", "Acme", "acme;drop table x", "a" * 65, "-acme", "acme/../x", "acme tenant", 42, None],
)
def test_params_reject_bad_tenants(dag, tenant):
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(dag.params)
    with pytest.raises(Exception) as err:  # noqa: PT011 - ParamValidationError's module moves between versions
        params["tenant"] = tenant
        params.validate()
    assert "ParamValidation" in type(err.value).__name__ or "tenant" in str(err.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("host_controller", "ssh"), ("drain_timeout", 0), ("pack_install_ids", ["bad pack"]), ("conn_id", "x y")],
)
def test_params_reject_bad_values(dag, key, value):
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(dag.params)
    params["tenant"] = "acme"
    with pytest.raises(Exception):  # noqa: B017, PT011
        params[key] = value
        params.validate()


def test_params_accept_a_minimal_form(dag):
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(dag.params)
    params["tenant"] = "acme-eu_1"
    resolved = params.validate()
    assert resolved["host_controller"] == "manual" and resolved["dry_run"] is False and resolved["conn_id"] is None


#: What each trigger form requires; every other field is optional (issue 23: the form submits with only these).
REQUIRED = {"connector_projection_cutover": {"tenant"}, "field_history_eligibility": {"tenant", "stage1_release"},
            "tenant_rollout": {"tenants"}, "connector_projection_back_out": {"tenant"}}


@pytest.mark.parametrize("dag_id", sorted(REQUIRED))
def test_only_the_required_fields_are_required_by_the_trigger_form(airflow_db, dag_id):
    """Airflow's form stars a field and keeps Trigger disabled while it is empty unless its type allows null:
    every optional field's type allows null, every required one's does not."""
    params = load_dag(dag_id).params
    for name in params:
        kinds = params.get_param(name).schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        assert ("null" not in kinds) == (name in REQUIRED[dag_id]), (dag_id, name, kinds)


@pytest.mark.parametrize("dag_id", sorted(REQUIRED))
def test_a_form_with_every_optional_field_emptied_runs_with_the_defaults(airflow_db, dag_id):
    """What the form sends for emptied fields (null) validates, and resolves to each field's default."""
    from airflow.sdk.definitions.param import ParamsDict

    from nexus_airflow.field_history import FH_FIELDS
    from nexus_airflow.params import BACK_OUT_FIELDS, CUTOVER_FIELDS, ROLLOUT_FIELDS, resolve

    fields = {"connector_projection_cutover": CUTOVER_FIELDS, "field_history_eligibility": FH_FIELDS,
              "tenant_rollout": ROLLOUT_FIELDS, "connector_projection_back_out": BACK_OUT_FIELDS}[dag_id]
    given = {"tenant": "acme", "stage1_release": "4.12.0", "tenants": ["acme"]}
    params = ParamsDict(load_dag(dag_id).params)
    for name in params:
        params[name] = given[name] if name in REQUIRED[dag_id] else None
    values = resolve(fields, params.validate())
    for name, field in fields.items():
        if name in REQUIRED[dag_id] or name == "notify_conn_id":
            continue
        expected = "nexus_tenant_acme" if name == "conn_id" else field.cast(field.default)
        if name == "stale_heartbeat":
            expected = values[name]  # the product's window (nexus_cutover.liveness), resolved at run time
            assert isinstance(expected, int) and expected > 0
        assert values[name] == expected, (dag_id, name, values[name])


def test_the_cutover_form_shows_up_front_only_what_one_tenant_needs(dag):
    """tenant, dry run and how the host starts up front; everything else in collapsed sections, and the fields
    tenant_rollout sets in the last one."""
    from nexus_airflow.params import ROLLOUT_ONLY, SECTIONS

    up_front = [n for n in dag.params if "section" not in dag.params.get_param(n).schema]
    assert up_front == ["tenant", "host_controller", "dry_run"]
    sections = [dag.params.get_param(n).schema.get("section") for n in dag.params if n not in up_front]
    assert set(sections) <= set(SECTIONS) and sorted(set(sections), key=SECTIONS.index) == list(dict.fromkeys(sections))
    assert {n for n in dag.params if dag.params.get_param(n).schema.get("section") == ROLLOUT_ONLY} == {"approval", "rollout"}


def test_the_field_history_dag_follows_its_declaration(airflow_db):
    declared_order_holds(load_dag("field_history_eligibility"), FIELD_HISTORY)


def test_the_back_out_dag_follows_its_declaration(airflow_db):
    from nexus_cutover.projection.transition import BACK_OUT

    declared_order_holds(load_dag(BACK_OUT.name), BACK_OUT)


def test_a_step_added_to_the_declaration_becomes_a_task_in_its_place(airflow_db):
    """Issue 35, item 1: the DAG is a loop over the declaration; a step added to a copy of it, in one place
    (tests/declared_copy.py), is a task of the generic step operator between its declared neighbours, its doc the
    declaration's (``plan`` and ``run`` run it too: tests/projection/test_declared_once.py)."""
    from airflow.sdk import DAG

    from nexus_airflow.declared import build, task_of
    from nexus_airflow.operators import CutoverStepOperator
    from tests.declared_copy import ADDED, with_added_step

    copy = with_added_step()
    with DAG("declared_copy", schedule=None):
        tasks = build(copy, {}, default=CutoverStepOperator)
    assert list(tasks) == list(dict.fromkeys(task_of(copy.name, name) for name in copy.names))
    added = tasks[ADDED.name]
    assert isinstance(added, CutoverStepOperator) and ADDED.dry_run in added.doc_md
    assert added.upstream_task_ids == {"history_digest"} and added.downstream_task_ids == {"audit_and_checkpoint"}
    with pytest.raises(ValueError, match="count_history"), DAG("declared_copy_strict", schedule=None):
        build(copy, {})  # without a default operator, a step the DAG file does not name fails the parse


def test_the_form_still_reads_checkpoint_timeout_as_lock_timeout(airflow_db):
    """Issue 35, item 5: checkpoint_timeout bounded the fence and the release too, so it is lock_timeout now; a
    form (or a rollout's cutover_conf) that names the old field is read as the new one, never refused as unknown,
    and one that names both with different values is refused at the run's first task."""
    import types

    from nexus_airflow.params import CUTOVER_FIELDS, RunParams, check_form
    from nexus_airflow.rollout_form import shared_conf
    from nexus_cutover.errors import BadInput

    def context(conf):
        return {"params": {**{k: None for k in CUTOVER_FIELDS}, "tenant": "acme", **conf},
                "dag_run": types.SimpleNamespace(conf=conf)}

    old = context({"tenant": "acme", "checkpoint_timeout": 45})
    check_form(old, CUTOVER_FIELDS)  # not an unknown field
    assert RunParams.from_context(old).lock_timeout == 45
    assert RunParams.from_context(context({"tenant": "acme"})).lock_timeout == 300  # the default
    assert RunParams.from_context(context({"tenant": "acme", "lock_timeout": 12})).lock_timeout == 12
    with pytest.raises(BadInput, match="checkpoint_timeout .* and lock_timeout are both given"):
        check_form(context({"tenant": "acme", "checkpoint_timeout": 45, "lock_timeout": 12}), CUTOVER_FIELDS)
    assert shared_conf({"cutover_conf": {"checkpoint_timeout": 60}}) == {"lock_timeout": 60}


@pytest.mark.parametrize("dag_id", [DAG_ID, FIELD_HISTORY.name])
def test_the_docs_come_from_the_declaration_and_name_only_the_dags_own_tasks(airflow_db, dag_id):
    """Issue 51, item 5: the DAG's overview lists exactly its tasks (a fused task once, with the steps it runs), every
    task's doc is its step's declared doc, and no doc names a declared step as a task the DAG does not have (the
    fused readiness wait has no task of its own; only its fused task's doc names it, as one of its steps)."""
    import re

    from nexus_airflow.declared import steps_of

    dag = load_dag(dag_id)
    transition = {DAG_ID: CUTOVER, FIELD_HISTORY.name: FIELD_HISTORY}[dag_id]
    declared = set(transition.names)
    listed = [n for n in re.findall(r"\*\*([a-z0-9_]+)\*\*", dag.doc_md) if n in declared]
    assert sorted(set(listed)) == sorted(dag.task_ids)
    for task in dag.tasks:
        own = set(steps_of(dag_id, task.task_id))
        named = {n for n in re.findall(r"[*`]+([a-z0-9_]+)[*`]+", task.doc_md or "") if n in declared}
        assert named <= set(dag.task_ids) | own, (task.task_id, named - set(dag.task_ids))
        for step in own:
            assert transition[step].task_doc.split("**")[0][:60] in task.doc_md, (task.task_id, step)
    if dag_id == DAG_ID:  # the controllers, as the form chooses them: a person is asked only with `manual`
        host = CUTOVER.with_role("host")
        assert f"**{host.name}** ({host.kind_text})" in dag.doc_md and "only when it is `manual`" in dag.doc_md
