"""A real StatsD listener for tests: a UDP socket bound on 127.0.0.1 that collects what Airflow's client sends."""

from __future__ import annotations

import socket
import threading
from collections import defaultdict


class StatsdListener(threading.Thread):
    """A UDP socket bound on 127.0.0.1 collecting StatsD lines ``name:value|type`` as they arrive."""

    def __init__(self):
        super().__init__(daemon=True, name="statsd-listener")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(line for line in data.decode().splitlines() if line)

    def __enter__(self) -> StatsdListener:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.sock.close()

    def values(self, prefix: str) -> dict[tuple[str, str], list[float]]:
        """(name without ``prefix.``, type) -> every value received under ``prefix``, in order of arrival."""
        out: dict[tuple[str, str], list[float]] = defaultdict(list)
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if name.startswith(prefix + "."):
                out[(name[len(prefix) + 1:], kind.split("|")[0])].append(float(value))
        return out
