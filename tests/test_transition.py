"""The transitions declared once (nexus_cutover.transition): what the declarations promise, without a database.

The DAGs' agreement with the declarations is tests/dags/test_cutover_dag_integrity.py (tasks, order, groups);
``nexus-cutover run`` and ``plan`` going through the declared steps in order on a real tenant is
tests/projection/test_cutover_steps_cli.py. Here: every declared step has its runner in ``run``, ``plan`` and the Field
History stage commands (and nothing else has one), the declaration refuses what would make it ambiguous, and
the one verdict function says what ``plan`` and the DAG's dry run say.
"""

from __future__ import annotations

import argparse

import pytest

from nexus_cutover.cli import cutover_steps as cli
from nexus_cutover.cli import field_history as fh_cli
from nexus_cutover.field_history.transition import FIELD_HISTORY, steps_of_stage
from nexus_cutover.projection.next_actions import NEXT_ACTION
from nexus_cutover.projection.transition import CUTOVER
from nexus_cutover.transition import PROCEED, Kind, Outcome, Stage, Step, Transition, Verdict, Wait, verdict_line


def test_every_declared_step_calls_its_own_body_in_the_steps_module():
    """One body per declared step, named after it: what the DAG's task, ``run`` and ``plan`` run."""
    from nexus_cutover.projection import steps

    for step in CUTOVER:
        assert step.calls == f"nexus_cutover.projection.steps:{step.name}", step.name
        assert step.function() is getattr(steps, step.name)
    assert list(NEXT_ACTION) == CUTOVER.names
    assert not hasattr(cli, "RUN") and not hasattr(cli, "PLAN")  # no second table of the steps


def test_the_field_history_stage_commands_run_the_declared_steps_of_their_stage():
    """One body per declared Field History step, named after it, run by the DAG's gate task and the stage commands."""
    from nexus_cutover.field_history import steps as fh_steps

    args = argparse.Namespace(stage1_release="1", producer_release="1", namespace=None, batch_size=1, timeout=1.0)
    assert fh_cli.field_history_run(args, engine=None).producer_release == "1"
    for step in FIELD_HISTORY:
        assert step.calls == f"nexus_cutover.field_history.steps:{step.name}", step.name
        assert step.function() is getattr(fh_steps, step.name)
    assert not hasattr(fh_cli, "_gate_runners")  # no second table of the steps
    assert [s.name for n in (1, 2, 3) for s in steps_of_stage(n)] == FIELD_HISTORY.names


def test_every_step_names_a_function_that_exists_and_a_kind():
    for step in [*CUTOVER, *FIELD_HISTORY]:
        assert callable(step.function()), step.name
        assert isinstance(step.kind, Kind) and step.dry_run and step.next_action


def _step(name: str, **kwargs) -> Step:
    return Step(name, Kind.READS, "nexus_cutover.clock:utcnow", dry_run="-", next_action="-", **kwargs)


def test_a_step_declared_twice_or_depending_on_a_later_step_is_refused():
    with pytest.raises(ValueError, match="declared twice"):
        Transition("t", (Stage(1, "one", (_step("a"), _step("a"))),))
    with pytest.raises(ValueError, match="not declared before it"):
        Transition("t", (Stage(1, "one", (_step("b", per_pack_of="a"), _step("a"))),))


def test_a_role_declared_twice_a_wait_on_a_step_that_does_not_wait_or_a_fusion_across_stages_is_refused():
    with pytest.raises(ValueError, match="role is declared twice"):
        Transition("t", (Stage(1, "one", (_step("a", role="r"), _step("b", role="r"))),))
    with pytest.raises(ValueError, match="not a waiting step"):
        Transition("t", (Stage(1, "one", (_step("a", wait=Wait("drain", ran_out="-", plan="-")),)),))
    with pytest.raises(ValueError, match="a wait without its watch"):  # every path polls the step's own watch
        Transition("t", (Stage(1, "one", (Step("a", Kind.WAITS, "nexus_cutover.clock:utcnow", dry_run="-", next_action="-",
                                               wait=Wait("drain", ran_out="-", plan="-")),)),))
    with pytest.raises(ValueError, match="not a step of its stage"):
        Transition("t", (Stage(1, "one", (_step("a", fused_into="b"),)), Stage(2, "two", (_step("b", fused_into="b"),))))
    t = Transition("t", (Stage(1, "one", (_step("a", role="r"), _step("b"))),))
    assert t.with_role("r").name == "a"
    with pytest.raises(KeyError, match="no step has the role 'x'"):
        t.with_role("x")


def test_what_the_adapters_ask_a_step_for_is_declared_on_it():
    """The waits, the roles the adapters ask for, the heavy reads, the fused task and the cancel point are fields of
    the declared steps (issue 48, item 3), not tables of the Airflow adapter."""
    assert [s.name for s in CUTOVER.waits] == [s.name for s in CUTOVER if s.kind is Kind.WAITS]
    assert all(s.wait.ran_out and s.wait.plan and s.bound and s.wait_action for s in CUTOVER.waits)
    confirm = CUTOVER.with_role("confirmation")
    assert confirm.kind is Kind.ASKS
    # a wait before the person's confirmation can last (a backlog, a person): its tenant is late for its wave
    assert [s.name for s in CUTOVER.waits if s.wait.late] == [
        s.name for s in CUTOVER.waits if CUTOVER.names.index(s.name) < CUTOVER.names.index(confirm.name)]
    for role in ("packs", "fence", "drain", "writers", "confirmation", "digest", "checkpoints", "release", "final"):
        assert CUTOVER.with_role(role).name in CUTOVER.names
    assert CUTOVER.with_role("checkpoints").per_pack_of == CUTOVER.with_role("packs").name
    assert {s.name for s in CUTOVER if s.heavy_read} == {CUTOVER.with_role("digest").name, CUTOVER.with_role("final").name}
    assert [s.name for s in FIELD_HISTORY if s.heavy_read] == [FIELD_HISTORY.with_role("decisions").name]
    assert [s.name for s in CUTOVER if s.cancel_point] == [CUTOVER.with_role("digest").name]
    fused = [s for s in CUTOVER if s.fused_into]
    assert [s.name for s in fused] == [CUTOVER.with_role("readiness").name, CUTOVER.with_role("release").name]
    assert {s.fused_into for s in fused} == {CUTOVER.with_role("release").name}


def test_overall_stops_waits_or_proceeds_in_declared_order():
    t = Transition("t", (Stage(1, "one", (_step("a"), _step("b", provisional_while=("a",)), _step("c"))),))
    wait, stop = Verdict(Outcome.WAIT, "a waits"), Verdict(Outcome.STOP, "b stops")
    assert t.overall({"a": PROCEED, "b": PROCEED, "c": PROCEED}) == "proceed"
    assert t.overall([("c", Verdict(Outcome.WAIT, "c waits")), ("a", wait)]) == "wait: a waits; c waits"
    assert t.overall({"a": wait, "b": stop}) == "wait: a waits"  # b's stop looked at what a still changes
    assert t.overall({"a": PROCEED, "b": stop, "c": Verdict(Outcome.STOP, "c stops")}) == "stop: b stops; c stops"
    done = Verdict(Outcome.DONE, "already cut over")
    assert t.overall({"a": done}) == "done: already cut over"  # one verdict, everywhere (issue 34, item 6)
    assert t.overall({"a": done, "c": Verdict(Outcome.WAIT, "c waits")}) == "done: already cut over"  # nothing runs
    assert t.overall({"a": done, "c": Verdict(Outcome.STOP, "c stops")}) == "stop: c stops"
    assert verdict_line("done: already cut over") == "done: already cut over"
    assert verdict_line("wait: a waits") == "the run would wait: a waits"


def test_the_cutover_verdicts_on_the_results_the_dag_and_the_command_line_carry():
    drain = {"state": "draining", "remaining": 3, "blocker_totals": {}, "timed_out": False}
    assert CUTOVER["wait_for_drain"].verdict(drain) == Verdict(Outcome.WAIT, "the drain (3 old projection "
                                                               "WorkItems remaining)")
    stuck = CUTOVER["wait_for_drain"].verdict({**drain, "state": "stuck", "blocker_totals": {"expired_lease": 2},
                                                "timed_out": True})
    assert stuck.outcome is Outcome.STOP and stuck.timed_out
    assert "2 processing items whose lease expired (their worker is gone)" in stuck.reason  # in words, counted
    assert CUTOVER["check_old_writers"].verdict({"live": ["w-1"]}).outcome is Outcome.WAIT
    assert CUTOVER["confirm_writers_stopped"].verdict({"came_back": ["w-1"]}).outcome is Outcome.STOP
    assert CUTOVER["arm_fence"].verdict({"outcome": "not_needed"}).outcome is Outcome.DONE
    refused = {"outcome": "refused", "pack_install_id": "pk-1", "findings": [{"finding": "live_work"}]}
    assert CUTOVER["audit_and_checkpoint"].verdict(refused).reason == "pack pk-1 is refused by the audit: live_work"
    # readiness before the run started the host is not part of a dry run's verdict
    not_ready = CUTOVER["verify_readiness"].verdict({"ready": False, "reasons": ["no host"]})
    assert not_ready.outcome is Outcome.WAIT and CUTOVER.overall({"verify_readiness": not_ready}) == "proceed"
