"""A general deferrable polling trigger: poll a domain status on the triggerer until it settles.

Invariants:

* The trigger serializes only the import path of a *poller* class and its
  keyword arguments (connection ids, namespaces, deadlines, windows), never a
  DSN or password.
* A poller is any class ``P(**poller_kwargs)`` with ``poll() -> dict`` and
  ``close()``; ``poll()`` returns at least ``{"state": "waiting" | <final>,
  "message": str}``. Every blocking call (constructing, polling, closing) runs in
  a worker thread (``asyncio.to_thread``), so the triggerer's event loop --
  shared by thousands of waiting tenants -- never blocks on the database.
* Each poll's ``message`` is logged (the task log shows the progress); the first
  non-``waiting`` result is fired as the single event, whose payload is the
  poller's result unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

WAITING = "waiting"


def import_poller(path: str):
    from airflow.sdk.module_loading import import_string

    return import_string(path)


class StatusPollTrigger(BaseTrigger):
    """Poll ``poller(**poller_kwargs).poll()`` every ``poll_interval`` s until its state is not ``waiting``."""

    def __init__(self, poller: str, poller_kwargs: dict[str, Any], poll_interval: float = 30.0):
        super().__init__()
        self.poller = poller
        self.poller_kwargs = dict(poller_kwargs)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"poller": self.poller, "poller_kwargs": self.poller_kwargs, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        cls = import_poller(self.poller)
        instance = await asyncio.to_thread(cls, **self.poller_kwargs)
        try:
            while True:
                try:
                    result = await asyncio.to_thread(instance.poll)
                except Exception as exc:  # noqa: BLE001 - a poll error ends the wait with a reportable event
                    yield TriggerEvent({"state": "error", "message": f"{type(exc).__name__}: {exc}"})
                    return
                self.log.info("%s", result.get("message", ""))
                if result.get("state") != WAITING:
                    yield TriggerEvent(result)
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await asyncio.to_thread(instance.close)
