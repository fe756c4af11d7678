"""The processes of the production stack (``scripts/stack.py``): found, signalled and waited for through /proc.

* Every process of one stack carries ``NEXUS_STACK_ID=<its stack id>`` (:data:`STACK_ID_ENV`) in its environment,
  inherited by whatever it starts (task processes, a cutover run's new hosts): :func:`pids_with_env` finds them
  all, :func:`sweep` ends them (SIGTERM, then SIGKILL), so a stop leaves no process of the stack behind.
* :class:`Component` is one ``airflow <args>`` process in a session of its own (a signal to this process's group
  never reaches it; SIGINT restored to the default), its output appended to its own log file, each start marked
  there by a ``start #<n>:`` line (what :func:`_ready_lines` reads the latest start from). Its stop is SIGTERM,
  then SIGKILL to whatever is left of its process tree; its kill is SIGKILL to the whole tree at once.
* Every wait here is bounded (:func:`wait_gone`, :func:`wait_for` raise or return at their timeout).

Of the stack's modules this one imports none: ``scripts/stack_services.py``, ``scripts/stack_topology.py`` and
``scripts/stack.py`` import it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import pathlib
import signal
import subprocess
import time

from scripts.demo_airflow import BIN, _restore_sigint

STACK_ID_ENV = "NEXUS_STACK_ID"


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def parent_of(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[1]) if st else None


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                children.setdefault(int(st[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pids_with_env(key: str, value: str) -> list[int]:
    """Live processes whose environment holds ``key=value`` (the stack's marker)."""
    marker = f"{key}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = pathlib.Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and alive(int(entry)):
            found.append(int(entry))
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to ``pid`` and every descendant (the task processes are in process groups of their own)."""
    hit: list[int] = []
    for _ in range(5):  # a process may fork while we walk: walk again until nothing new
        tree = [p for p in [pid, *descendants(pid)] if p not in hit and alive(p)]
        if not tree:
            break
        signal_all(tree, sig)
        hit += tree
        if sig != signal.SIGKILL:
            break
    return hit


class Component:
    """One Airflow process (``airflow <args>``) in its own session, its output in ``log``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: pathlib.Path):
        self.name, self.args, self.env, self.log = name, args, env, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n===== {dt.datetime.now().isoformat()} start #{self.starts}: airflow {' '.join(self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen([str(BIN / "airflow"), *self.args], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_restore_sigint)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (each component shuts down cleanly on it), then SIGKILL to whatever is left of its tree."""
        if self.proc is None:
            return
        tree = [self.proc.pid, *descendants(self.proc.pid)]
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        left = wait_gone(tree, 3.0)
        if self.running():
            left += kill_tree(self.proc.pid)
        signal_all(left, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        wait_gone(left, 10.0)

    def kill(self) -> list[int]:
        """SIGKILL the component and every process under it at once, as when its machine dies; returns the pids."""
        assert self.proc is not None
        hit = kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        wait_gone(hit, 10.0)
        return hit

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"


def sweep(stack_id: str, timeout_s: float = 15.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process carrying the stack's marker; returns what it found."""
    found = pids_with_env(STACK_ID_ENV, stack_id)
    if found:
        signal_all(found, signal.SIGTERM)
        signal_all(wait_gone(found, timeout_s), signal.SIGKILL)
        wait_gone(found, 5.0)
    return found


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _ready_lines(log: pathlib.Path, start_no: int) -> str:
    """The Celery 'ready.' lines logged since the component's latest start."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    text = text.split(f"start #{start_no}:", 1)[-1]
    return "\n".join(line for line in text.splitlines() if " ready." in line)


def wait_for(what: str, cond, timeout_s: float, every_s: float = 2.0):
    """``cond()`` until it is truthy (returned), at most ``timeout_s`` (then TimeoutError naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} within {timeout_s:.0f}s")
        time.sleep(every_s)
