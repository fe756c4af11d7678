"""A stand-in for a StatsD server on this machine: the ``nexus.*`` lines Airflow's metrics client sends, appended to a
file a person can ``tail -f`` (``make airflow``: ``.run/airflow/metrics.log``; ``make stack``: its ``logs/metrics.log``).
A deployment points ``[metrics] statsd_host`` at its StatsD or exporter instead (runbook, "Watching a fleet")."""

from __future__ import annotations

import pathlib
import socket
import threading
import time


class MetricsLog(threading.Thread):
    """A UDP socket on 127.0.0.1 whose ``nexus.*`` lines (the product's metrics, as Airflow's own client sends them)
    are appended to ``path``; Airflow's own metrics arrive too and are dropped."""

    def __init__(self, path: pathlib.Path) -> None:
        super().__init__(daemon=True, name="metrics-log")
        self.path = path
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self._halt = threading.Event()

    def run(self) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            while not self._halt.is_set():
                try:
                    data = self.sock.recv(65535)
                except TimeoutError:
                    continue
                kept = [line for line in data.decode(errors="replace").splitlines() if ".nexus." in f".{line}"]
                if kept:
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    out.writelines(f"{stamp} {line}\n" for line in kept)
                    out.flush()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sock.close()
