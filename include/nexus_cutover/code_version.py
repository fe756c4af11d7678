"""The product version of the code a process loaded, and the rule that a run's steps all run on the version it started with.

A cutover or Field History run parks for hours (at the drain, at the
confirmation) while the tenant's admission is fenced; a release deployed in
that window must not run the rest of the run: a step written for one version
does not resume on another.

Invariants:

* :data:`RUNNING` is the installed distribution's version as it was when this
  process first imported :mod:`nexus_cutover` (``nexus_cutover.__version__``,
  read once from ``importlib.metadata``): a process keeps the version of the
  code it loaded whatever is installed on disk later (a Celery worker that
  preloaded the modules before it forked runs the old code, and says so).
* A run's steps each record the version they ran on (the first step's record
  is the run's pin: the version it started with); the cutover's fence records
  it too, in its ``Reason`` (:func:`fence_reason`), the one free-text column of
  the seed's ``_System_AdmissionFence``: no column or table is added to a tenant.
* A step runs only when every version recorded before it (:func:`check`: the
  run's first step and the step just before it, whose own check saw the ones
  before it) is the one it runs on; else :class:`VersionChanged`, raised
  before the step reads or writes the tenant, naming both versions and the two
  ways on: finish on the old version (redeploy it), or go on with the new one
  through a new run, which takes over what the stopped run left exactly as any
  failed run's leftovers are taken over (the cutover: its fence is adopted). No
  switch, field or flag lets a run go on across versions.
* A holder reuses its cutover fence only on the version that armed it (:func:`check_reuse`, inside the locked
  transaction that would reuse it): a run cleared from its first step on a new release, or a command given
  ``-holder`` after an upgrade, stops there, writing nothing, and goes on through adoption by a new holder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from . import __version__
from .errors import Refused

#: The distribution whose installed version is the product version.
DISTRIBUTION = "nexus-cutover"
#: The version of the code this process loaded (see the module invariants).
RUNNING: str = __version__


def fence_reason(reason: str, version: str = RUNNING) -> str:
    """A cutover fence's ``Reason``: what it is for, and the product version that armed (or adopted) it."""
    return f"{reason} (nexus-cutover {version})"


_IN_REASON = re.compile(r"\(nexus-cutover ([^)\s]+)\)")


def version_in_reason(reason: str | None) -> str | None:
    """The product version a fence's ``Reason`` records (:func:`fence_reason`); None for a fence armed before
    versions were recorded, by hand, or by anything else."""
    found = _IN_REASON.search(reason or "")
    return found.group(1) if found else None


class VersionChanged(Refused):
    """A step of a run that started on one product version would run on another: stopped before it touched
    the tenant (nothing read, nothing written)."""

    def __init__(self, step: str, started: str, running: str, *, recorded_by: str, where: str, go_on: str,
                 what: str = "this run's steps ran on", touched: str = "nothing was read or written"):
        self.started, self.running = started, running
        self.report = {"version_changed": True, "started_on": started, "running": running, "recorded_by": recorded_by,
                       "step": step}
        super().__init__(
            f"{step} stopped before touching the tenant: {what} nexus-cutover {started} (recorded by {recorded_by}) "
            f"and {where} runs nexus-cutover {running}; a step written for one version does not resume on another, "
            f"and {touched}. Next: either finish this run on {started}: redeploy "
            f"nexus-cutover {started} on the workers and triggerers (runbook, \"Upgrading while cutovers are in "
            f"flight\"), then clear {step}; or go on with {running}: leave this run failed and {go_on}."
        )


def check(step: str, recorded: Iterable[tuple[str, str | None]], *, where: str = "this step", go_on: str,
          running: str = RUNNING) -> None:
    """Raise :class:`VersionChanged` unless every version in ``recorded`` (``(step that recorded it, version)``,
    the run's first step first; None: that step recorded none, e.g. it was skipped) is ``running``.

    ``where``: what runs ``running`` (this step's worker, the triggerer), as the message says it; ``go_on``:
    how the tenant goes on with the new version (a new run that takes over what this one left)."""
    for by, version in recorded:
        if version is not None and str(version) != running:
            raise VersionChanged(step, str(version), running, recorded_by=by, where=where, go_on=go_on)


def check_reuse(step: str, fence: dict, reason: str, *, go_on: str) -> None:
    """Raise :class:`VersionChanged` when the cutover fence ``fence`` (its row) was armed (or adopted) by the
    caller on another product version than the one ``reason`` (what it would record now) says; a fence whose
    ``Reason`` records none (armed before versions were recorded, or by hand) is not checked."""
    armed_on, now_on = version_in_reason(fence.get("Reason")), version_in_reason(reason)
    if armed_on is not None and now_on is not None and armed_on != now_on:
        raise VersionChanged(step, armed_on, now_on, recorded_by=f"the Reason of cutover fence {fence['FenceId']}",
                             where="this step", go_on=go_on, what="this holder armed the fence on",
                             touched="nothing was written")
