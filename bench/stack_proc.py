"""Figures of one process tree of the bench's stack, read from /proc: memory, CPU, tenant database files held open.

* A process tree is the process and every descendant (:func:`scripts.stack_processes.descendants`), read again at each
  sample: a task process or trigger runner started since is counted.
* Memory is RSS and PSS summed over the tree (PSS counts a page shared by its processes once); CPU is
  utime+stime plus the reaped children's cutime+cstime, in seconds (``SC_CLK_TCK``).
* An open tenant database is a file descriptor of the tree on a file under the tenants' folder (a ``.db``, its
  ``-wal``, its ``-shm``); :func:`held_across` counts only what stays open over consecutive samples, so a poll in
  flight (milliseconds) does not count as a held connection.

Of the stack bench's modules it imports none; ``bench/stack_waiting.py`` imports it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from scripts.stack_processes import descendants

CLK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def _status_kb(pid: int, field: str, name: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and PSS of the process tree (PSS counts a page shared by the tree's processes once)."""
    pids = tree(pid)
    return {"rss_mb": sum(_status_kb(p, "VmRSS") for p in pids) / 1024,
            "pss_mb": sum(_status_kb(p, "Pss", "smaps_rollup") for p in pids) / 1024, "processes": len(pids)}


def cpu_s(pid: int) -> float:
    """utime+stime of the tree, plus what its reaped children used (cutime+cstime)."""
    total = 0
    for p in tree(pid):
        try:
            st = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in st[11:15])
    return total / CLK


def open_tenant_files(pid: int, tenants_dir: Path) -> tuple[int, frozenset[str]]:
    """File descriptors of the tree on tenant database files (a .db, its -wal, its -shm), and the tenants."""
    prefix, n, tenants = str(tenants_dir) + "/", 0, set()
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                    if target.startswith(prefix):
                        n += 1
                        tenants.add(target[len(prefix):].split(".db", 1)[0])
    return n, frozenset(tenants)


def held_across(samples: list[frozenset[str]], k: int = 3) -> int:
    """Most tenants whose database stayed open in ``k`` consecutive samples (>= (k-1) x the period): a
    connection kept between polls shows here; a poll in flight (milliseconds) does not."""
    return max((len(frozenset.intersection(*samples[i:i + k])) for i in range(len(samples) - k + 1)), default=0)


class Sampler:
    """Samples memory and open tenant files of one process tree every ``every_s`` in a thread."""

    def __init__(self, pid: int, tenants_dir: Path, every_s: float = 0.5):
        self.pid, self.dir, self.every = pid, tenants_dir, every_s
        self.fds: list[int] = []
        self.tenants: list[frozenset[str]] = []
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            fds, tenants = open_tenant_files(self.pid, self.dir)
            self.fds.append(fds)
            self.tenants.append(tenants)
            self.rss.append(memory_mb(self.pid)["rss_mb"])
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def idle(pid: int, seconds: float) -> dict[str, float]:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    cpu = cpu_s(pid) - c0
    return {**memory_mb(pid), "cpu_core_fraction": cpu / (time.monotonic() - t0)}
