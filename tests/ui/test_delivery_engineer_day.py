"""A delivery engineer's day in the Airflow UI, in a real browser, against ``make airflow``'s stack.

One Airflow (``scripts.airflow_up.DemoAirflow``: ``airflow standalone``, the demo
tenant on SQLite, the old runtime draining its work) and one headless Chromium
driven by Selenium (``tests/ui/browser.py``). Every action goes through the page:
the trigger forms, the collapsed sections, the select, *Required actions*. The
REST API is used only to look at what a click did. The tests run in file order,
each from where the previous one left the tenant:

1. a bad tenant name: the form says why in words, and nothing starts;
2. only the tenant filled: the cutover run starts; it drains and waits for its
   confirmation; a second run for the held tenant stops before writing, and the
   tenant view keeps describing the waiting run (the refused one listed under it);
3. Reject in *Required actions*: the run ends failed, the fence stays, and the
   log ends with the reason and how to retry or back out, with no traceback;
3b. clear ``check_old_writers`` (with its downstream, as the UI's Clear does; through the endpoint the UI
   calls): the run asks again, and the question shows the evidence of its own try, taken after the Reject;
   Reject again;
3c. back out (issue 51, item 7): the back-out DAG's form with only the tenant; its question in *Required actions*
   shows the rejected run's fence and the old writers; Back out: the fence is released without a cutover;
4. a run with the host started by command (chosen in the form, a poll interval
   set in a collapsed section): it arms a new fence, Confirm in *Required
   actions*, and it succeeds; the tenant view shows it cut over, its proofs
   verified, and nothing cut off at 1600 px; its first rendering is fresh or says it is stale;
4b. its "open run" link, clicked inside Airflow's sandboxed frame, opens the run's page in Airflow's UI;
5. the Field History and rollout forms start with only their required fields;
   the rollouts page says how to start one when there is none;
6. Field History stops at stage 1 on the demo's old producers, naming how to
   upgrade them; after the person runs that control, the form takes it to stage 3.

Screenshots of every page are kept under ``test-artifacts/ui/``.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
import time

import pytest

from nexus_airflow.params import CONNECTIONS
from scripts.airflow_up import DemoAirflow
from scripts.demo_seed import STAGE1_RELEASE
from tests.ui.browser import WIDTH, Person, wait_until

pytestmark = pytest.mark.airflow

REPO = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
CUTOVER, FIELD_HISTORY, ROLLOUT = "connector_projection_cutover", "field_history_eligibility", "tenant_rollout"
BACK_OUT = "connector_projection_back_out"
TENANT = "demo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    demo = DemoAirflow(tmp_path_factory.mktemp("ui-airflow"), reseed=True,
                       extra_env={"NEXUS_STATUS_REFRESH_S": "3"})
    demo.start(timeout_s=600)  # a loaded 2-core machine: minutes
    try:
        for dag_id in (CUTOVER, FIELD_HISTORY, ROLLOUT, BACK_OUT):
            demo.stack.wait_for_dag(dag_id)
            demo.stack.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        yield demo
    finally:
        demo.stop()


@pytest.fixture(scope="module")
def person(demo):
    person = Person(demo.stack.base_url, ARTIFACTS)
    try:
        person.log_in("admin", demo.stack.admin_password())
        yield person
    finally:
        person.close()


@pytest.fixture(scope="module")
def runs() -> dict[str, str]:
    """The run ids the tests below start, by role (each test reads what the earlier ones left)."""
    return {}


def run_ids(demo, dag_id: str) -> list[str]:
    body = demo.stack.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=-run_after")
    return [r["dag_run_id"] for r in body["dag_runs"]]


def new_run(demo, dag_id: str, before: list[str]) -> str:
    return wait_until(f"a new run of {dag_id}", lambda: next(iter(set(run_ids(demo, dag_id)) - set(before)), None), 60)


def state_of(demo, run_id: str, task_id: str, dag_id: str = CUTOVER) -> str | None:
    return {t["task_id"]: t["state"] for t in demo.stack.task_instances(dag_id, run_id)}.get(task_id)


def run_state(demo, run_id: str, dag_id: str = CUTOVER) -> str:
    return demo.stack.dag_run(dag_id, run_id)["state"]


def wait_for_task(demo, run_id: str, task_id: str, states: tuple[str, ...], timeout_s: float = 600) -> str:
    return wait_until(f"{task_id} of {run_id} in {states}",
                      lambda: (s := state_of(demo, run_id, task_id)) in states and s, timeout_s, every_s=2)


def tenant_view(person: Person, *, must_show: str, timeout_s: float = 90) -> dict:
    """Browse -> Nexus tenants, as embedded by the Airflow UI: the demo tenant's text once it shows ``must_show``,
    and where its What now? and Proofs end against the frame's width."""
    from selenium.webdriver.common.by import By

    person.open("/plugin/nexus-tenants")
    frame = wait_until("the status view's frame", lambda: person.driver.find_element(By.TAG_NAME, "iframe"))
    person.driver.switch_to.frame(frame)
    script = (f"return Array.from(document.querySelectorAll('tr[data-tenant=\"{TENANT}\"]'))"
              ".map(r => r.innerText).join('\\n')")
    seen: list[str] = []
    text = wait_until(f"the tenant view to show {must_show!r}",
                      lambda: (t := person.driver.execute_script(script)) and (seen.append(t) or must_show in t) and t,
                      timeout_s, every_s=1)
    layout = person.driver.execute_script(
        "const r = s => document.querySelector(s).getBoundingClientRect().right;"
        "return {whatNow: r('.what-now'), proofs: r('.proofs'), table: r('table'),"
        " width: document.documentElement.clientWidth, scroll: document.documentElement.scrollWidth};")
    person.driver.switch_to.default_content()
    return {"text": text, "layout": layout, "first": seen[0]}


def assert_nothing_cut_off(layout: dict) -> None:
    assert layout["scroll"] <= layout["width"], layout  # no horizontal scrolling inside the frame
    for part in ("whatNow", "proofs", "table"):
        assert layout[part] <= layout["width"], (part, layout)


def task_log(demo, run_id: str, task_id: str, dag_id: str = CUTOVER) -> list[dict]:
    return demo.stack.request(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1?full_content=true")["content"]


# ---------------------------------------------------------------------------------------------------------------


def test_a_bad_tenant_name_is_refused_on_the_form_in_words(demo, person):
    before = run_ids(demo, CUTOVER)
    form = person.open_trigger_form(CUTOVER)
    person.type_into(form, "tenant", "Bad Name")
    person.submit(form)
    said = wait_until("the form's error", lambda: "The form was refused" in form.text and form.text)
    person.screenshot("01_bad_tenant_refused_on_the_form")
    assert "Tenant (namespace) (tenant): 'Bad Name' is not allowed here" in said
    assert "Lower-case letters, digits, _ and -" in said
    assert "Failed validating" not in said and "{'title'" not in said  # jsonschema's dump is gone
    assert run_ids(demo, CUTOVER) == before


def test_only_the_tenant_filled_starts_the_cutover_and_a_second_run_stops_before_writing(demo, person, runs):
    before = run_ids(demo, CUTOVER)
    form = person.open_trigger_form(CUTOVER)
    person.screenshot("02_cutover_trigger_form")
    up_front = form.text.split(CONNECTIONS)[0]
    assert "Tenant (namespace)" in up_front and "How the new host is started" in up_front and "Dry run" in up_front
    assert "Approval" not in up_front and "Rollout" not in up_front and "Drain timeout" not in up_front
    # a dropdown's empty choice says what it means (issue 51, item 9: it read "null")
    choices = person.options(form, "host_controller")
    assert "null" not in choices and "(default: command)" in choices, choices
    form = person.open_trigger_form(CUTOVER)
    person.type_into(form, "tenant", TENANT)
    person.submit(form)
    runs["rejected"] = first = new_run(demo, CUTOVER, before)
    conf = demo.stack.dag_run(CUTOVER, first)["conf"]
    assert conf["tenant"] == TENANT and conf["host_controller"] == "command"  # make airflow's default: it works
    wait_for_task(demo, first, "confirm_writers_stopped", ("awaiting_input",))

    before = run_ids(demo, CUTOVER)
    form = person.open_trigger_form(CUTOVER)
    person.type_into(form, "tenant", TENANT)
    person.submit(form)
    runs["refused"] = second = new_run(demo, CUTOVER, before)
    wait_until(f"run {second} to stop", lambda: run_state(demo, second) == "failed", 300, every_s=2)
    stopped_at = [t["task_id"] for t in demo.stack.task_instances(CUTOVER, second) if t["state"] == "failed"]
    written = [t["task_id"] for t in demo.stack.task_instances(CUTOVER, second) if t["state"] == "success"]
    report = demo.stack.xcom(CUTOVER, second, stopped_at[0], key="report") or {}
    assert first in report.get("message", ""), report  # it names the run that holds the tenant
    assert "revoke the overrides" not in report.get("message", "")
    assert "apply_schema" not in written and "arm_fence" not in written, written  # refused before any write

    view = tenant_view(person, must_show=f"later: run {second}")
    person.screenshot("03_tenant_view_while_a_run_waits")
    what_now, proofs = view["text"].split("PROOFS")[0], view["text"].split("PROOFS")[1]
    assert f"open run {first}" in what_now and "awaiting_input" in what_now  # the run that holds the tenant
    assert "Next: confirm only when no old binary can resume" in what_now
    assert f"run {first}" in proofs
    assert_nothing_cut_off(view["layout"])


def test_reject_in_required_actions_ends_the_run_with_a_readable_stop(demo, person, runs):
    run_id = runs["rejected"]
    person.answer_required_action(run_id, "Reject")
    person.screenshot("04_rejected")
    wait_until(f"run {run_id} to fail", lambda: run_state(demo, run_id) == "failed", 180, every_s=2)
    assert state_of(demo, run_id, "confirm_writers_stopped") == "failed"
    assert state_of(demo, run_id, "audit_and_checkpoint") != "success"

    log = task_log(demo, run_id, "confirm_writers_stopped")
    stopped = [e for e in log if "STOPPED:" in str(e.get("event", ""))]
    assert stopped, [e.get("event") for e in log]
    lines = stopped[-1]["event"].splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    text = "\n".join(lines)
    assert "cutover not performed" in text and "rejected" in text
    assert "Next: to try again" in text and "clear check_old_writers" in text and "Rollback stance" in text
    assert not any(e.get("error_detail") for e in log), "an expected stop shows no traceback"
    assert not any("Traceback" in str(e.get("event", "")) for e in log)

    person.open(f"/dags/{CUTOVER}/runs/{run_id}/tasks/confirm_writers_stopped")
    wait_until("the task log", lambda: "STOPPED:" in person.text(), 60)
    person.screenshot("05_rejected_task_log")


def test_a_clear_after_the_reject_asks_again_with_the_evidence_of_its_own_try(demo, person, runs):
    """Issue 34.4: the re-asked question showed the first try's evidence (Airflow kept its body)."""
    from selenium.webdriver.common.by import By

    run_id = runs["rejected"]
    cleared_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    demo.stack.request("POST", f"/api/v2/dags/{CUTOVER}/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["check_old_writers"], "include_downstream": True,
        "only_failed": False})
    wait_for_task(demo, run_id, "confirm_writers_stopped", ("awaiting_input",))
    detail = demo.stack.request(
        "GET", f"/api/v2/dags/{CUTOVER}/dagRuns/{run_id}/taskInstances/confirm_writers_stopped/-1/hitlDetails")
    taken = re.search(r"Evidence taken at (\S+)Z, try (\d+) of this step", detail["body"])
    assert taken and int(taken.group(2)) == 2, detail["body"][:400]
    assert dt.datetime.fromisoformat(taken.group(1)) > cleared_at, (taken.group(1), cleared_at)

    time.sleep(5)  # a person reads before answering (apache/airflow#71172: an answer within ~1 s can be lost)
    person.open("/required_actions")
    row = wait_until(f"the required action of run {run_id}", lambda: next(
        (r for r in person.driver.find_elements(By.CSS_SELECTOR, "tbody tr") if run_id in r.text), None), 120)
    row.find_element(By.CSS_SELECTOR, "a").click()
    wait_until("the question of try 2", lambda: f"Evidence taken at {taken.group(1)}Z, try 2" in person.text(), 60)
    person.screenshot("05b_asked_again_with_its_own_evidence")
    person.click("Reject", timeout_s=60)
    wait_until(f"run {run_id} to fail again", lambda: run_state(demo, run_id) == "failed", 180, every_s=2)


def test_back_out_after_the_reject_releases_the_fence_without_a_cutover(demo, person, runs):
    """Issue 51, item 7: the runbook's back-out, walked in the UI: the rejected run's fence released, recorded."""
    rejected = runs["rejected"]
    fence_id = demo.stack.xcom(CUTOVER, rejected, "arm_fence")["fence_id"]
    before = run_ids(demo, BACK_OUT)
    form = person.open_trigger_form(BACK_OUT)
    person.type_into(form, "tenant", TENANT)
    person.screenshot("05c_back_out_trigger_form")
    person.submit(form)
    run_id = new_run(demo, BACK_OUT, before)
    wait_until(f"the back-out's question of {run_id}", lambda: state_of(demo, run_id, "confirm_back_out", BACK_OUT)
               == "awaiting_input", 300, every_s=2)
    detail = demo.stack.request(
        "GET", f"/api/v2/dags/{BACK_OUT}/dagRuns/{run_id}/taskInstances/confirm_back_out/-1/hitlDetails")
    assert f"Cutover fence {fence_id} of tenant {TENANT}" in detail["body"] and rejected in detail["body"], detail["body"]
    assert "Old-protocol writers of namespace" in detail["body"] and TENANT in detail["subject"]
    time.sleep(5)  # a person reads before answering (apache/airflow#71172)
    person.answer_required_action(run_id, "Back out: release the fence without a cutover")
    person.screenshot("05d_backed_out")
    wait_until(f"run {run_id} to end", lambda: run_state(demo, run_id, BACK_OUT) in ("success", "failed"), 300,
               every_s=2)
    assert run_state(demo, run_id, BACK_OUT) == "success", demo.stack.task_instances(BACK_OUT, run_id)
    done = demo.stack.xcom(BACK_OUT, run_id, "back_out")
    assert (done["outcome"], done["fence_id"]) == ("backed_out", fence_id) and rejected in done["previous_holder"]
    log = "\n".join(str(e.get("event", "")) for e in task_log(demo, run_id, "back_out", BACK_OUT))
    assert "released without a cutover" in log and "restart the old writers" in log, log[-2000:]
    # the demo's channel (issue 51, item 10): the question waiting, then the back-out, where a person reads them
    def told() -> str | None:
        text = demo.notices.path.read_text() if demo.notices.path.exists() else ""
        return text if f"BACKED OUT: tenant {TENANT}" in text else None

    notices = wait_until("the BACKED OUT notice in notices.log", told, 60)
    # the tenant view's What now? for the rejected run: backed out, by whom, what is left (not "retry, or back out")
    view = tenant_view(person, must_show="was released without a cutover")
    what_now = view["text"].split("PROOFS")[0]
    assert f"fence {fence_id}) was released without a cutover" in what_now and run_id in what_now, what_now
    person.screenshot("05g_tenant_view_after_the_back_out")
    assert f"NEEDS CONFIRMATION: tenant {TENANT}, {BACK_OUT}.confirm_back_out" in notices
    assert f"cutover fence {fence_id}" in notices.split(f"BACKED OUT: tenant {TENANT}")[1]


def test_the_products_connections_and_variables_are_in_admin_with_what_they_are_for(demo, person):
    """Issue 51, item 6: what the product reads from Airflow is where a person looks, each saying what it is for."""
    person.open("/connections")
    wait_until("the ledger's connection in Admin", lambda: "nexus_ledger" in person.text(), 60)
    assert "the delivery ledger" in person.text() and "nexus_notify_demo" in person.text()
    person.screenshot("05e_admin_connections")
    person.open("/variables")
    wait_until("the product's Variables in Admin", lambda: "nexus_host_command" in person.text(), 60)
    text = person.text()
    assert "nexus_notify_conn_id" in text and "nexus_writers_stop_command" in text
    assert "host_controller=command" in text and "where every run's notices go" in text
    person.screenshot("05f_admin_variables")
    # the status view's settings page lists them too, with their values, below the [nexus] settings
    person.open("/nexus-status/settings")
    wait_until("the Variables on the settings page", lambda: "Airflow Variables" in person.text(), 60)
    settings = person.text().split("Airflow Variables")[1]
    assert "nexus_notify_conn_id" in settings and "nexus_notify_demo" in settings, settings
    assert "nexus_rollout_control__<run>" in settings


def test_confirm_in_required_actions_and_the_cutover_succeeds(demo, person, runs):
    before = run_ids(demo, CUTOVER)
    form = person.open_trigger_form(CUTOVER)
    person.type_into(form, "tenant", TENANT)  # host_controller left at make airflow's default (command)
    person.open_section(form, "Timeouts and polling")
    person.type_into(form, "poll_interval", "10")
    person.screenshot("06_cutover_form_with_a_section_open")
    person.submit(form)
    runs["confirmed"] = run_id = new_run(demo, CUTOVER, before)
    conf = demo.stack.dag_run(CUTOVER, run_id)["conf"]
    assert conf["host_controller"] == "command" and conf["poll_interval"] == 10

    wait_for_task(demo, run_id, "confirm_writers_stopped", ("awaiting_input",))
    assert demo.stack.xcom(CUTOVER, run_id, "arm_fence")["outcome"] == "armed"  # the rejected run's was backed out
    # A person reads the evidence before answering; an answer within ~1 s of the task parking can get the resumed
    # task killed by Airflow itself (apache/airflow#71172; a CI-loaded run met it: "Server indicated the task
    # shouldn't be running anymore").
    time.sleep(5)
    person.answer_required_action(run_id, "Confirm: all old writers stopped")
    wait_until(f"run {run_id} to succeed", lambda: run_state(demo, run_id) in ("success", "failed"), 600, every_s=3)
    assert run_state(demo, run_id) == "success", demo.stack.task_instances(CUTOVER, run_id)

    view = tenant_view(person, must_show="cut over")
    person.screenshot("07_tenant_view_after_the_cutover")
    # the first rendering after the run ended: fresh, or it says it is stale and since when (issue 34.5)
    assert "cut over" in view["first"] or "stale: this row was read at" in view["first"], view["first"]
    assert "Next: trigger field_history_eligibility" in view["text"].split("PROOFS")[0]
    what_now, proofs = view["text"].split("PROOFS")[0], view["text"].split("PROOFS")[1]
    assert f"open run {run_id}" in what_now and "success" in what_now
    assert "later:" not in what_now  # the refused and rejected runs are older than the one that cut over
    assert "verified: no history row changed" in proofs and f"run {run_id}" in proofs
    assert "BadInput" not in view["text"] and "no history digest yet" not in view["text"]
    assert_nothing_cut_off(view["layout"])
    assert view["layout"]["width"] <= WIDTH


def test_open_run_in_the_embedded_tenant_view_opens_the_run_in_airflows_ui(demo, person, runs):
    """Issue 51, item 1: the status view's "open run" link, clicked inside Airflow's sandboxed iframe (no top
    navigation), takes the person to the run's page in Airflow's UI, not nowhere."""
    from selenium.webdriver.common.by import By

    run_id = runs["confirmed"]
    person.open("/plugin/nexus-tenants")
    frame = wait_until("the status view's frame", lambda: person.driver.find_element(By.TAG_NAME, "iframe"))
    assert "allow-top-navigation" not in (frame.get_attribute("sandbox") or ""), "Airflow's frame allows it now"
    person.driver.switch_to.frame(frame)
    link = wait_until("the open-run link of the cut-over run", lambda: next(
        (a for a in person.driver.find_elements(By.CSS_SELECTOR, f'tr[data-tenant="{TENANT}"] a.run-link')
         if a.text == f"open run {run_id}"), None), 90)
    link.click()
    person.driver.switch_to.default_content()
    path = f"/dags/{CUTOVER}/runs/{run_id}"
    wait_until("the run's page in Airflow's UI", lambda: path in person.driver.current_url.replace("%3A", ":")
               .replace("%2B", "+"), 30)
    assert not person.driver.find_elements(By.TAG_NAME, "iframe") or "/plugin/" not in person.driver.current_url
    wait_until("the run's page to render its tasks", lambda: "confirm_writers_stopped" in person.text()
               or "resume_admission" in person.text(), 60)
    person.screenshot("07b_open_run_from_the_tenant_view")


def test_field_history_and_rollout_forms_start_with_only_their_required_fields(demo, person):
    before = run_ids(demo, FIELD_HISTORY)
    form = person.open_trigger_form(FIELD_HISTORY)
    person.type_into(form, "tenant", TENANT)
    person.type_into(form, "stage1_release", STAGE1_RELEASE)
    person.screenshot("08_field_history_form")
    person.submit(form)
    fh_run = new_run(demo, FIELD_HISTORY, before)
    assert demo.stack.dag_run(FIELD_HISTORY, fh_run)["conf"]["tenant"] == TENANT

    person.open("/plugin/nexus-rollouts")
    from selenium.webdriver.common.by import By

    person.driver.switch_to.frame(wait_until("the rollouts frame", lambda: person.driver.find_element(By.TAG_NAME, "iframe")))
    empty = wait_until("the rollouts page, loaded", lambda: (t := person.text()) and "tenant_rollout" in t
                       and "loading…" not in t and t)
    person.driver.switch_to.default_content()
    person.screenshot("09_no_rollout_yet")
    assert "To start one" in empty and "Trigger" in empty

    before = run_ids(demo, ROLLOUT)
    form = person.open_trigger_form(ROLLOUT)
    person.type_into(form, "tenants", TENANT)
    person.submit(form)
    rollout = new_run(demo, ROLLOUT, before)
    wait_until(f"rollout {rollout} to finish", lambda: run_state(demo, rollout, ROLLOUT) in ("success", "failed"),
               300, every_s=3)
    plan = demo.stack.xcom(ROLLOUT, rollout, "plan", key="rollout") or {}
    assert plan.get("skipped", {}).get(TENANT, "").startswith("already cut over"), json.dumps(plan)[:500]
    rows = demo.stack.xcom(ROLLOUT, rollout, "preflight", key="preflight") or []  # one verdict, everywhere (issue 34)
    assert [(r["tenant"], r["verdict"]) for r in rows] == [(TENANT, "done")], rows
    assert rows[0]["reason"].startswith("already cut over"), rows


def test_field_history_stops_at_stage_1_names_the_producer_upgrade_and_reaches_stage_3_after_it(demo, person):
    """Issue 34, item 1: the stage-1 stop says how to upgrade the demo's producers (the deployment's step, here the
    demo's control); the person runs it in a terminal and the same DAG, triggered from the form, reaches stage 3."""
    import subprocess

    from scripts.demo_seed import NEW_PRODUCER_VERSION

    fh_runs = run_ids(demo, FIELD_HISTORY)
    stopped = fh_runs[0]  # the previous test's run: stage 1 only, producers still at 4.11
    wait_until(f"run {stopped} to stop", lambda: run_state(demo, stopped, FIELD_HISTORY) in ("success", "failed"),
               300, every_s=2)
    assert state_of(demo, stopped, "stage_1", FIELD_HISTORY) == "failed"
    message = (demo.stack.xcom(FIELD_HISTORY, stopped, "stage_1", key="report") or {}).get("message", "")
    command = demo.stack.env["NEXUS_PRODUCER_UPGRADE_COMMAND"]
    assert "Next: upgrade the lagging producers" in message and command in message, message
    # the status view shows the same command whole, to be pasted (issue 51, item 2: it said [DSN hidden])
    assert command in tenant_view(person, must_show=command)["text"]

    env_part, _, argv = command.partition(" ")  # NEXUS_TENANT_DSN=... python -m nexus_sim.upgrade ...
    upgraded = subprocess.run(argv.split(), env={**demo.stack.env, env_part.split("=", 1)[0]: env_part.split("=", 1)[1]},
                              capture_output=True, text=True, timeout=120)
    assert upgraded.returncode == 0 and f"at {NEW_PRODUCER_VERSION}" in upgraded.stdout, upgraded.stdout + upgraded.stderr

    before = run_ids(demo, FIELD_HISTORY)
    form = person.open_trigger_form(FIELD_HISTORY)
    person.type_into(form, "tenant", TENANT)
    person.type_into(form, "stage1_release", STAGE1_RELEASE)
    person.type_into(form, "producer_release", NEW_PRODUCER_VERSION)
    # target_stage left empty (issue 51, item 2): with both releases given the run goes to stage 3
    person.screenshot("10_field_history_to_stage_3")
    person.submit(form)
    fh_run = new_run(demo, FIELD_HISTORY, before)
    wait_until(f"run {fh_run} to end", lambda: run_state(demo, fh_run, FIELD_HISTORY) in ("success", "failed"),
               600, every_s=3)
    assert run_state(demo, fh_run, FIELD_HISTORY) == "success", demo.stack.task_instances(FIELD_HISTORY, fh_run)
    assert demo.stack.xcom(FIELD_HISTORY, fh_run, "stage_3")["passed"] is True
    view = tenant_view(person, must_show="stage 3 done")
    person.screenshot("11_tenant_view_after_field_history")
    assert "BadInput" not in view["text"]
    # make airflow's metrics: the nexus.* lines the runs sent, in the file the banner names (runbook)
    metrics = demo.metrics.path.read_text()
    assert "nexus.step.duration.stage_3.success" in metrics, metrics[-2000:]  # fleet-wide: by step, no tenant
    assert f"nexus.admission.pause.{TENANT}" in metrics, metrics[-2000:]


#: What a Python value looks like when a log line prints it whole: a dict, a list, a datetime (issue 51, item 9).
PYTHON_REPR = re.compile(r"\{'|\['|\[\{|datetime\.datetime\(|Decimal\(")


def test_no_task_log_line_of_the_day_prints_a_python_value(demo):
    """Issue 51, item 9: every task log of the day's runs (cutover, reject and retry, back-out, Field History, the
    rollout), as the log pane shows them: one fact per line, never a Python dict, list or datetime printed whole
    (a stop's report is ``key: value`` lines; Airflow's "Returned value was" is off for the rollout's tasks)."""
    found = {}
    logs = sorted((demo.stack.home / "logs").rglob("attempt=*.log"))
    assert len(logs) > 30, logs  # the day ran: its flows' tasks each left a log
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = str(json.loads(line).get("event", ""))
            except ValueError:
                event = line
            if PYTHON_REPR.search(event):
                found.setdefault(str(path.relative_to(demo.stack.home)), event[:300])
    assert not found, found
