"""The blob store: uploads (models, tensor input files) by sha256, in one of two backends.

- `local.LocalBlobs`: files in `<data_dir>/uploads` (the default; one machine, or a shared
  volume);
- `database.DatabaseBlobs`: 1 MiB chunks in the database (`INSPECTOR_BLOB_STORE=database`),
  for workers on other hosts that share only the database and the queue;
- `cache.BlobCache`: a worker's verified local copies of database blobs;
- `fetch`: how a worker finds a blob, and how it prunes its copies.

`server.storage.UploadStore` stages uploads and commits them to the configured backend.
"""

from __future__ import annotations

from server.blobs.errors import BlobCorrupt, BlobMissing, check_sha256
from server.blobs.streams import CHUNK_BYTES, Staged, TooLarge, copy_hashing, iter_file

__all__ = [
    "BlobCorrupt", "BlobMissing", "check_sha256",
    "CHUNK_BYTES", "Staged", "TooLarge", "copy_hashing", "iter_file",
]  # fmt: skip
