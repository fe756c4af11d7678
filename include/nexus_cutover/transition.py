"""How a transition is declared: ordered stages of steps, each with its kind, its call, its verdict and its dry run.

A :class:`Transition` is the one ordered list that the DAG's tasks, the
command line's ``run`` and ``plan`` all follow (the cutover's is
:data:`nexus_cutover.projection.transition.CUTOVER`, Field History's
:data:`nexus_cutover.field_history.transition.FIELD_HISTORY`). Reordering two
steps here changes all of them together; a test fails when one disagrees.

Invariants:

* A step's ``name`` is also its Airflow task id, unless it is declared to run with its stage's neighbours in one
  fused task (:attr:`Step.fused_into`; its XCom value keeps its name); names are unique in a transition.
* What a step *is* is declared here, never in a table of an adapter keyed by its name: its kind, its wait
  (:class:`Wait`), whether its reads are heavy, the task it is fused into, the role by which an adapter asks for
  its result (:attr:`Step.role`, :meth:`Transition.with_role`). The Airflow adapter reads these fields and never
  spells a step name (tests/test_architecture.py).
* A step's :attr:`Step.verdict` is the only place that maps its result (the JSON
  form every caller sees: an XCom value, a ``-json`` field) to proceed / wait /
  stop / done; :func:`overall` is the only place that turns a run's verdicts into
  one sentence.
* Light to import (standard library only): the DAG files read it at parse time;
  :meth:`Step.function` imports the domain function when called, never before.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class Kind(enum.StrEnum):
    """What a step does to the tenant database (and to the person running it)."""

    WRITES = "writes"
    WAITS = "waits"
    ASKS = "asks a person"
    READS = "reads"


class Outcome(enum.StrEnum):
    PROCEED = "proceed"  # the next step may run
    WAIT = "wait"  # not yet: a later look may proceed
    STOP = "stop"  # the run stops here and reports why; nothing later runs
    DONE = "done"  # nothing is left to do: the later steps have nothing to change


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str = ""
    #: A stop at a deadline rather than on a finding (the command line's exit 4, not 3).
    timed_out: bool = False

    @property
    def proceeds(self) -> bool:
        return self.outcome is Outcome.PROCEED


PROCEED = Verdict(Outcome.PROCEED)


def always_proceed(_result: Any) -> Verdict:
    """A step whose result never stops the run by itself (its refusals are raised as domain errors)."""
    return PROCEED


def verdict_line(verdict: str, run: str = "the run") -> str:
    """A combined verdict as its last line says it: ``done: ...`` as it is (nothing would run), else ``<run> would
    proceed / wait: ... / stop: ...``."""
    return verdict if verdict.startswith(f"{Outcome.DONE}:") else f"{run} would {verdict}"


@dataclass
class StepResult:
    """What one run of a step's body gives every caller (the DAG's task, ``run``, ``plan``): the same for all three.

    ``value`` is the step's result in its JSON form (the task's XCom ``return_value``, the ``-json`` field the
    step's :attr:`Step.key` names) and ``verdict`` the declared verdict on it. ``planned`` is the ``PLAN:`` of
    the writes a dry run would make (None outside a dry run). ``keyed`` are further results by XCom key (the
    full digest, the evidence shown, a refusal's findings); ``fields`` what ``run -json`` carries at its top
    level besides the value. A stop says ``message`` (default: the verdict's reason) and reports ``report``
    (default: the value).
    """

    value: Any
    verdict: Verdict = PROCEED
    planned: list[str] | None = None
    keyed: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    report: Any = None
    #: The domain object behind ``value`` (the evidence, the digest), for a caller in the same process; never
    #: serialized.
    domain: Any = None

    @property
    def stop_message(self) -> str:
        return self.message or self.verdict.reason

    @property
    def stop_report(self) -> Any:
        return self.value if self.report is None else self.report


@dataclass(frozen=True)
class Wait:
    """How a waiting step is waited on where a poller looks at it again and again (the DAG's sensor and trigger):
    the kind of look, and the texts a person reads about the wait."""

    #: The kind of look: ``drain``, ``pre_arm``, ``old_writers``, ``readiness`` (a name for the look, in texts and
    #: a trigger's kwargs from earlier releases).
    poller: str
    #: The stop when the wait cannot end within its bound (the step's :attr:`Step.bound`).
    ran_out: str
    #: A dry run's ``PLAN:`` line when the real run would wait here (it looks once and does not wait).
    plan: str
    #: A wait that can last (a backlog, a person): what a tenant parked in it is doing, as a rollout's wave question
    #: names it (late: not waited for by its wave-mates). None: a wait that does not make a tenant late.
    late: str | None = None
    #: The step's :class:`~nexus_cutover.watch.Watch`, dotted (``module:Class``, in the step's own module): what one
    #: look is, on every path that repeats it (the command line, the trigger, a sensor).
    watch: str = ""

    def watch_class(self):
        """The declared watch class (imported when asked: the DAG files read the declaration at parse time)."""
        module, _, name = self.watch.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Step:
    """One step: its name (= its Airflow task id), what it does, its body, how its result is judged, its dry run."""

    name: str
    kind: Kind
    #: Its body, dotted (``module:function``), ``(run context) -> StepResult``: what the DAG's task, ``run`` and
    #: ``plan`` run for it. Imported only by :meth:`function`.
    calls: str
    #: What the dry run of this step does instead of writing (shown in the task's doc; plan and the DAG's
    #: ``dry_run`` run the same body, dry).
    dry_run: str
    #: The runbook's next action when this step stops (docs/runbook.md shows the same text).
    next_action: str
    verdict: Callable[[Any], Verdict] = always_proceed
    #: One task per pack: mapped over the result of the step named here.
    per_pack_of: str | None = None
    #: Steps whose wait makes this step's stop provisional (it looks at what they are still changing).
    provisional_while: tuple[str, ...] = ()
    #: False when a dry run's look at this step says how far the tenant is, not what the run would do (the run
    #: acts before it, e.g. starts the host): its verdict does not count in :meth:`Transition.overall`.
    dry_run_judged: bool = True
    #: A waiting step: what a person does while it waits (its verdict's reason says for what), shown with it.
    wait_action: str | None = None
    #: The field of ``run``'s and ``plan``'s JSON that holds this step's value (default: its name).
    key: str | None = None
    #: A waiting step: the run's param that bounds its wait (the sensor's timeout, ``run``'s flag of that name).
    bound: str | None = None
    #: False when ``plan`` does not run this step (it asks a person, or acts on what the earlier steps did):
    #: ``plan`` is the fleet preflight's look at many tenants, the DAG's dry run runs every step.
    planned: bool = True
    #: What the step's result means as events (``module:function``, ``(step name, result) -> [Event]``, next to its
    #: body): what every path's :class:`~nexus_cutover.recording.Recorder` hands the ledger and the metrics. None:
    #: the step's passing and stopping are its only events.
    records: str | None = None
    #: The command line's single-step commands that run this step alone (``nexus-cutover <command>``): each records
    #: what it did as this step (its events, its stop).
    commands: tuple[str, ...] = ()
    #: A waiting step polled again and again (the DAG's sensor): how (:class:`Wait`).
    wait: Wait | None = None
    #: Its reads weigh on the tenant's database cluster (the full history digest and its verification, the
    #: materialization's batches): the DAG runs its task in the run's ``read_pool``.
    heavy_read: bool = False
    #: Runs in one task with the neighbours of its stage that name the same step here, the task named after that
    #: step (one of them): consecutive steps of one stage that no person and no wait separate (a wait may lead them),
    #: none per pack, each still its own record (ADR 0011). None: its own task.
    fused_into: str | None = None
    #: How an adapter asks for this step when it needs one specific step's result (``packs``, ``fence``, ``drain``,
    #: ``confirmation``, ``digest``, ...): :meth:`Transition.with_role`. Unique in a transition.
    role: str | None = None
    #: A cancelled caller (a rollout) stops the run before this step, the last safe point before what cannot be
    #: undone: how the stop names that point. None: no cancel is looked at here.
    cancel_point: str | None = None
    #: What the task doc of this step tells a person in Airflow's UI (what it does to the tenant, when it stops and
    #: what to do then): the DAG's task docs and its overview are generated from these (``nexus_airflow.declared``).
    task_doc: str = ""
    #: How the DAG overview says what this step does when its kind alone would mislead (a step that asks a person
    #: only with one controller): default its kind.
    kind_text: str | None = None

    @property
    def out_key(self) -> str:
        return self.key or self.name

    def function(self) -> Callable[..., Any]:
        return _imported(self.calls)

    def records_function(self) -> Callable[[str, Any], list[Any]]:
        return _imported(self.records) if self.records else (lambda _step, _value: [])


def _imported(dotted: str) -> Callable[..., Any]:
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Stage:
    """Steps shown together (an Airflow TaskGroup when ``group_id`` is set); ``number`` is the spec's stage."""

    number: int
    title: str
    steps: tuple[Step, ...]
    group_id: str | None = None


@dataclass(frozen=True)
class Transition:
    name: str
    stages: tuple[Stage, ...]
    _by_name: dict[str, Step] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for step in self.steps:
            if step.name in self._by_name:
                raise ValueError(f"{self.name}: step {step.name!r} declared twice")
            self._by_name[step.name] = step
        roles = [step.role for step in self.steps if step.role is not None]
        if len(roles) != len(set(roles)):
            raise ValueError(f"{self.name}: a role is declared twice: {sorted(r for r in roles if roles.count(r) > 1)}")
        for step in self.steps:
            if step.wait is not None and step.kind is not Kind.WAITS:
                raise ValueError(f"{self.name}: {step.name!r} declares a wait but is not a waiting step")
            if step.wait is not None and ":" not in step.wait.watch:
                raise ValueError(f"{self.name}: {step.name!r} declares a wait without its watch (module:Class)")
            if step.fused_into is not None and step.fused_into not in [s.name for s in self.stage_of(step.name).steps]:
                raise ValueError(f"{self.name}: {step.name!r} is fused into {step.fused_into!r}, not a step of its stage")
        for step in self.steps:
            for other in (step.per_pack_of, *step.provisional_while):
                if other is not None and self.names.index(other) >= self.names.index(step.name):
                    raise ValueError(f"{self.name}: {step.name!r} depends on {other!r}, which is not declared before it")

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for stage in self.stages for step in stage.steps)

    @property
    def names(self) -> list[str]:
        return [step.name for step in self.steps]

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getitem__(self, name: str) -> Step:
        return self._by_name[name]

    def stage_of(self, name: str) -> Stage:
        return next(stage for stage in self.stages if any(s.name == name for s in stage.steps))

    def next_actions(self) -> dict[str, str]:
        return {step.name: step.next_action for step in self.steps}

    def get(self, name: str) -> Step | None:
        return self._by_name.get(name)

    def with_role(self, role: str) -> Step:
        """The step declared with the role ``role`` (:attr:`Step.role`); KeyError when none is."""
        found = next((step for step in self.steps if step.role == role), None)
        if found is None:
            raise KeyError(f"{self.name}: no step has the role {role!r}")
        return found

    @property
    def waits(self) -> tuple[Step, ...]:
        """The steps polled by a wait (:attr:`Step.wait` declared), in order."""
        return tuple(step for step in self.steps if step.wait is not None)

    def for_command(self, command: str) -> Step | None:
        """The step the single-step command ``command`` runs (None: the command is no step's)."""
        return next((step for step in self.steps if command in step.commands), None)

    def overall(self, verdicts: Mapping[str, Verdict] | Iterable[tuple[str, Verdict]]) -> str:
        """What a real run would do, from a dry run's verdicts (``{step: verdict}`` or ``(step, verdict)`` pairs,
        several per step allowed): ``stop: ...`` when a step stops (a provisional stop excepted: see
        :attr:`Step.provisional_while`), else ``done: ...`` when a step finds nothing left to do (the real run
        ends there: no later step waits or writes), else ``wait: ...`` for every step that waits, else
        ``proceed``. Steps not :attr:`Step.dry_run_judged` do not count."""
        pairs = list(verdicts.items()) if isinstance(verdicts, Mapping) else list(verdicts)
        pairs = [(name, v) for name, v in pairs if self[name].dry_run_judged]
        order = {name: i for i, name in enumerate(self.names)}
        waiting = {name for name, v in pairs if v.outcome is Outcome.WAIT}
        stops, done, waits = [], [], []
        for name, verdict in sorted(pairs, key=lambda pair: order[pair[0]]):
            if verdict.outcome is Outcome.STOP:
                if waiting.intersection(self[name].provisional_while):
                    continue  # it looked at what an earlier wait is still changing: judged again after that wait
                if verdict.reason not in stops:  # two steps that find the same refusal say it once
                    stops.append(verdict.reason)
            elif verdict.outcome is Outcome.DONE:
                done.append(verdict.reason)
            elif verdict.outcome is Outcome.WAIT:
                waits.append(verdict.reason)
        if stops:
            return "stop: " + "; ".join(stops)
        if done:
            return "done: " + done[0]
        return ("wait: " + "; ".join(waits)) if waits else "proceed"
