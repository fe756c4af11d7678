"""The history digest as taken: its chunks per table, its summaries, its JSON form and its short hash.

* The short hash: the first 16 hex digits of a SHA-256 over the canonical JSON
  of the version, namespace, tables and their chunks (slices included), fed chunk
  by chunk.
* The JSON form (:meth:`HistoryDigest.as_json`: the XCom, ``nexus-cutover digest
  -out FILE``) is read back whole or not at all (:meth:`HistoryDigest.from_json`,
  :func:`load_digest`: BadInput naming what is wrong, never a partial digest): a
  digest of another version than :data:`~.definition.DIGEST_VERSION` is refused,
  and one whose chunks do not hash to the hash it carries is damaged.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ... import catalog
from ...errors import BadInput
from .definition import DIGEST_VERSION, HISTORY_TABLES, Chunk


@dataclass
class TableDigest:
    table: str
    pk: str
    columns: list[str]
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    def as_json(self) -> dict[str, Any]:
        return {"pk": self.pk, "columns": self.columns, "rows": self.rows, "chunks": [c.as_list() for c in self.chunks]}


@dataclass
class HistoryDigest:
    namespace: str
    chunk_rows: int
    cutoffs: dict[str, int]
    tables: dict[str, TableDigest]
    taken_at: str = ""
    seconds: float = 0.0

    @property
    def rows(self) -> dict[str, int]:
        return {name: t.rows for name, t in self.tables.items()}

    @property
    def chunk_count(self) -> dict[str, int]:
        return {name: len(t.chunks) for name, t in self.tables.items()}

    @functools.cached_property
    def short_hash(self) -> str:
        """SHA-256 of the canonical JSON of the version, namespace, tables and chunks, fed chunk by chunk (no copy of
        the whole digest is built), computed once."""
        h = hashlib.sha256(json.dumps([DIGEST_VERSION, self.namespace], separators=(",", ":")).encode())
        for name, t in sorted(self.tables.items()):
            h.update(json.dumps([name, t.columns], separators=(",", ":")).encode())
            for chunk in t.chunks:
                h.update(json.dumps(chunk.as_list(), separators=(",", ":")).encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        """What the log, the XCom ``return_value``, the Asset event and the status view show."""
        return {"hash": self.short_hash, "rows": self.rows, "chunks": self.chunk_count, "chunk_rows": self.chunk_rows,
                "cutoffs": self.cutoffs, "taken_at": self.taken_at, "seconds": round(self.seconds, 3)}

    def summary_text(self) -> str:
        rows = ", ".join(f"{n} {r} rows / {self.chunk_count[n]} chunks" for n, r in self.rows.items())
        return f"history digest {self.short_hash} of namespace {self.namespace}: {rows}"

    def as_json(self) -> dict[str, Any]:
        return {"version": DIGEST_VERSION, "namespace": self.namespace, "hash": self.short_hash,
                "chunk_rows": self.chunk_rows, "cutoffs": self.cutoffs, "taken_at": self.taken_at,
                "seconds": round(self.seconds, 3), "tables": {n: t.as_json() for n, t in self.tables.items()}}

    @classmethod
    def from_json(cls, raw: Any, *, source: str = "the digest") -> HistoryDigest:
        """Parse a saved digest; BadInput naming what is wrong (never a partial digest)."""
        try:
            if isinstance(raw, dict) and raw.get("version") == 1:
                raise ValueError("it is a version-1 digest, taken by an earlier release whose history included ordinary "
                                 "work: it cannot be verified by this one; take a new digest")
            if not isinstance(raw, dict) or raw.get("version") != DIGEST_VERSION:
                raise ValueError(f"not a version-{DIGEST_VERSION} history digest")
            tables = {}
            for name, t in raw["tables"].items():
                table = catalog.metadata.tables.get(name)
                if table is None or table not in HISTORY_TABLES:
                    raise ValueError(f"unknown table {name!r}")
                unknown = [c for c in t["columns"] if c not in table.c]
                if unknown:
                    raise ValueError(f"{name} has no column(s) {', '.join(unknown)} in the catalog")
                tables[name] = TableDigest(name, str(t["pk"]), list(t["columns"]), [Chunk.from_list(c) for c in t["chunks"]])
            digest = cls(str(raw["namespace"]), int(raw["chunk_rows"]), {str(k): int(v) for k, v in raw["cutoffs"].items()},
                         tables, str(raw.get("taken_at", "")), float(raw.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{source} is not a usable history digest: {exc}") from exc
        if raw.get("hash") not in (None, digest.short_hash):
            raise BadInput(f"{source} is damaged: its chunks hash to {digest.short_hash}, it says {raw['hash']}")
        return digest


def load_digest(path: str) -> HistoryDigest:
    """A digest saved with ``nexus-cutover digest -out FILE``; BadInput naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise BadInput(f"cannot read the digest file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"the digest file {path} is not JSON: {exc}") from exc
    return HistoryDigest.from_json(raw, source=f"the digest file {path}")
