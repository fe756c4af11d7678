"""The StatsD exporter's mapping (``deploy/statsd/nexus-mapping.yml``) applied in Python, as
github.com/prometheus/statsd_exporter applies it, for the features the shipped entries use: glob ``match`` (a ``*``
is one whole dot-separated component; every other character literal; the whole name must match), ``$n`` in
``name`` and ``labels``, and the series each StatsD type makes (a counter ``c`` and a gauge ``g`` the name itself;
a timer ``ms``, observed in seconds, ``_bucket``/``_sum``/``_count`` as a histogram, ``name``/``_sum``/``_count`` as
the default summary). ``ttl`` only ages series out in the exporter and changes no name: :func:`ttl_s` says after how
long a series of an entry goes, as the exporter decides it (the entry's own ``ttl``; else the top-level
``defaults: ttl:``, which an entry's ``ttl: 0`` does not override; else never)."""

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
    ttl_s: float | None = None  # seconds without a line before the exporter forgets the series; None: never

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


def defaults(path: pathlib.Path = MAPPING_FILE) -> dict:
    """The file's top-level ``defaults`` ({} when it has none)."""
    return yaml.safe_load(path.read_text(encoding="utf-8")).get("defaults") or {}


#: A Go duration's units (time.ParseDuration), in seconds.
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def duration_s(text: str | int | float) -> float:
    """A Go duration (``24h``, ``1h30m``, ``90s``; ``0`` alone) in seconds, as the exporter's YAML reads a ``ttl``;
    ValueError for anything else (the exporter would refuse the file)."""
    text = str(text).strip()
    if text == "0":
        return 0.0
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def ttl_s(entry: dict, default: dict | None = None) -> float | None:
    """After how many seconds without a line the exporter forgets a series of ``entry`` (None: never): the entry's
    own ``ttl`` when it is above 0, else the ``defaults`` ttl when that is above 0 (the exporter's rule: an entry's
    ``ttl: 0`` does not opt out of a default)."""
    own = duration_s(entry["ttl"]) if "ttl" in entry else 0.0
    if own == 0 and (default or {}).get("ttl") is not None:
        own = duration_s(default["ttl"])
    return own or None


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


def apply(mappings: list[dict], line: str, default: dict | None = None) -> Sample | None:
    """The exported sample of one StatsD line ``name:value|type[|@rate]`` (``default``: the file's
    :func:`defaults`); None when no entry matches (the exporter would then export it under its escaped StatsD name,
    which nothing of ours queries)."""
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
    return Sample(_template(entry["name"], captures), labels, statsd_type, number, ttl_s(entry, default))
