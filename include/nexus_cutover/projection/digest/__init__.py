"""The history digest: proof, per tenant and inside the run, that the cutover changed no historical row.

Taken after the writer-stop confirmation (old writers stopped, the fence armed:
history can no longer change) and verified again at the end of the run, after
the new host has worked and admission resumed. Read only, always.

One module per seam, each importing only modules listed before it:

* :mod:`.definition`: what is digested: which rows are history, their columns,
  the row hash and the figures of a chunk and of its slices (in SQL for the
  server, in Python for SQLite);
* :mod:`.reads`: one key range's figures read on one connection, and the
  progress log of a walk;
* :mod:`.model`: the digest as taken (:class:`HistoryDigest`), its summaries,
  its JSON form and short hash, :func:`load_digest`;
* :mod:`.compute`: taking a digest (:func:`compute_digest`): the keyset walk of
  the chunks, on one connection or several;
* :mod:`.verify`: comparing the rows now with a digest (:func:`verify_digest`)
  and naming the rows that differ.

This package re-exports the names its importers outside it use.
"""

from .compute import compute_digest, key_ranges
from .definition import (
    DEFAULT_CHUNK_ROWS,
    HISTORY_TABLES,
    SLICES,
    Chunk,
    history_rows,
    pack_cutoffs,
    row_hash,
    slice_of,
)
from .definition import _Shape as _Shape
from .model import HistoryDigest, TableDigest, load_digest
from .verify import MAX_NAMED_ROWS, Difference, DigestVerification, verify_digest

__all__ = ["HistoryDigest", "DigestVerification", "Difference", "compute_digest", "verify_digest", "load_digest",
           "history_rows", "pack_cutoffs", "DEFAULT_CHUNK_ROWS", "HISTORY_TABLES", "SLICES", "MAX_NAMED_ROWS", "Chunk",
           "TableDigest", "key_ranges", "row_hash", "slice_of"]
