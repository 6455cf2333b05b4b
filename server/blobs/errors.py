"""What a blob store says when a blob is not there, or not what its name promises."""

from __future__ import annotations

import re

__all__ = ["BlobMissing", "BlobCorrupt", "check_sha256"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BlobMissing(LookupError):
    """No blob with this sha256 in the store (never stored, or deleted)."""


class BlobCorrupt(ValueError):
    """The bytes read back do not hash to the blob's name: nothing was kept."""


def check_sha256(sha256: str) -> str:
    """`sha256` itself, or ValueError: a blob name is never a path or anything else."""
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise ValueError(f"not a sha256: {sha256!r}")
    return sha256
