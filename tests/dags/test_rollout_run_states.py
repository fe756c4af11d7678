"""The rollout reads its tenants' run states with as few Task SDK calls as it takes (:func:`rollout.run_states`,
:func:`rollout.runs_matching`).

Pure logic over a table of runs (the calls are plain functions over it, counted); the Airflow path is exercised
by every rollout test (tests/rollout, tests/dags/test_rollout_*), whose waves end with failed and succeeded
tenants."""

from __future__ import annotations

import math
import random

import pytest

from nexus_airflow.rollout import run_states, runs_matching


class Runs:
    """Runs by id with their states (absent: never created), and the reads made of them."""

    def __init__(self, states: dict[str, str]):
        self.states, self.reads = states, 0

    def succeeded(self, ids: list[str]) -> int:
        self.reads += 1
        return sum(self.states.get(i) == "success" for i in ids)

    def exists(self, rid: str) -> bool:
        self.reads += 1
        return rid in self.states

    def state_of(self, rid: str) -> str:
        self.reads += 1
        return f"DagRunState.{self.states[rid].upper()}"  # as the SDK may return it: an enum's repr

    def read(self, ids: list[str]) -> dict[str, str]:
        return run_states(ids, succeeded=self.succeeded, exists=self.exists, state_of=self.state_of)


def test_a_wave_that_succeeded_is_read_in_one_call():
    runs = Runs({f"r{i}": "success" for i in range(50)})
    assert runs.read(list(runs.states)) == runs.states and runs.reads == 1


def test_every_state_is_found_exactly_and_a_run_never_created_is_not_started():
    states = {"a": "success", "b": "failed", "c": "running", "d": "success", "e": "queued"}
    runs = Runs(states)
    assert runs.read([*states, "never"]) == {**states, "never": "not started"}


@pytest.mark.parametrize("n, bad", [(20, 1), (64, 1), (64, 3), (300, 2)])
def test_reads_grow_with_the_runs_that_did_not_succeed_not_with_the_wave(n, bad):
    rng = random.Random(n * 31 + bad)
    states = {f"run-{i}": "success" for i in range(n)}
    for rid in rng.sample(sorted(states), bad):
        states[rid] = rng.choice(["failed", "running"])
    runs = Runs(states)
    assert runs.read(list(states)) == states
    assert runs.reads <= bad * (2 * math.ceil(math.log2(n)) + 2) + 1, runs.reads
    assert runs.reads < 2 * n  # the old way: a count and a state read per run


def test_no_runs_no_reads():
    runs = Runs({})
    assert runs.read([]) == {} and runs.reads == 0


def _ended(states: dict[str, str]):
    reads = []

    def count(ids: list[str]) -> int:
        reads.append(len(ids))
        return sum(states.get(i) in ("success", "failed") for i in ids)
    return count, reads


def test_a_wave_on_its_way_to_the_question_costs_one_count():
    states = {f"run-{i}": random.Random(i).choice(["running", "queued"]) for i in range(200)}
    count, reads = _ended(states)
    assert runs_matching([*states, "never-created"], count=count) == set() and len(reads) == 1


@pytest.mark.parametrize("n, ended", [(1, 1), (7, 7), (64, 1), (300, 3)])
def test_exactly_the_ended_runs_are_named_in_about_two_log_n_reads_each(n, ended):
    rng = random.Random(n + ended)
    states = {f"run-{i}": "running" for i in range(n)}
    for rid in rng.sample(sorted(states), ended):
        states[rid] = rng.choice(["success", "failed"])
    count, reads = _ended(states)
    found = runs_matching(list(states), count=count)
    assert found == {r for r, s in states.items() if s != "running"}
    assert len(reads) <= 1 + ended * 2 * max(1, math.ceil(math.log2(n))), len(reads)
