"""The StatsD exporter's mapping (``deploy/statsd/nexus-mapping.yml``) applied in Python, as
github.com/prometheus/statsd_exporter applies it, for the features the shipped entries use: glob ``match`` (a ``*``
is one whole dot-separated component; every other character literal; the whole name must match), ``$n`` in
``name`` and ``labels``, and the series each StatsD type makes (a counter ``c`` and a gauge ``g`` the name itself;
a timer ``ms``, observed in seconds, ``_bucket``/``_sum``/``_count`` as a histogram, ``name``/``_sum``/``_count`` as
the default summary). ``ttl`` only ages series out in the exporter and changes no name."""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import yaml

MAPPING_FILE = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "statsd" / "nexus-mapping.yml"
_TYPES = {"c": "counter", "g": "gauge", "ms": "timer", "h": "timer", "d": "timer"}


@dataclass(frozen=True)
class Sample:
    """One StatsD line as the exporter exports it: the Prometheus metric, its labels, kind, value and series."""

    name: str
    labels: dict[str, str]
    kind: str  # counter, gauge, histogram or summary
    value: float

    @property
    def series(self) -> tuple[str, ...]:
        """The series names this metric has in Prometheus."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.kind == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def load(path: pathlib.Path = MAPPING_FILE) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["mappings"]


def _pattern(glob: str) -> re.Pattern[str]:
    return re.compile(r"\.".join("([^.]+)" if part == "*" else re.escape(part) for part in glob.split(".")))


def _template(text: str, captures: tuple[str, ...]) -> str:
    return re.sub(r"\$\{?(\d+)\}?", lambda m: captures[int(m.group(1)) - 1], text)


def matching(mappings: list[dict], name: str) -> list[tuple[dict, tuple[str, ...]]]:
    """Every entry whose ``match`` matches ``name``, with its captures."""
    out = []
    for entry in mappings:
        m = _pattern(entry["match"]).fullmatch(name)
        if m:
            out.append((entry, m.groups()))
    return out


def apply(mappings: list[dict], line: str) -> Sample | None:
    """The exported sample of one StatsD line ``name:value|type[|@rate]``; None when no entry matches (the
    exporter would then export it under its escaped StatsD name, which nothing of ours queries)."""
    name, _, rest = line.partition(":")
    value, _, kind = rest.partition("|")
    found = matching(mappings, name)
    if not found:
        return None
    entry, captures = found[0]
    statsd_type = _TYPES[kind.split("|")[0]]
    number = float(value)
    if statsd_type == "timer":
        number /= 1000.0  # the exporter observes timers in seconds
        statsd_type = entry.get("observer_type") or "summary"
    labels = {k: _template(str(v), captures) for k, v in (entry.get("labels") or {}).items()}
    return Sample(_template(entry["name"], captures), labels, statsd_type, number)
