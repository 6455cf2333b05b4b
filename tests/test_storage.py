"""The content-addressed upload store."""

from __future__ import annotations

import hashlib
import stat

import pytest

from server.storage import TooLarge, UploadStore


def test_put_bytes_is_content_addressed(tmp_path):
    store = UploadStore(tmp_path)
    sha = store.put_bytes(b"hello")
    assert sha == hashlib.sha256(b"hello").hexdigest()
    path = store.path(sha)
    assert path == tmp_path / "uploads" / sha[:2] / sha[2:]
    assert path.read_bytes() == b"hello" and store.exists(sha)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by the sandbox uid
    assert store.put_bytes(b"hello") == sha  # same content, same single file
    assert len(list((tmp_path / "uploads").rglob("*"))) == 2  # the ab/ dir and the file
    assert not any((tmp_path / "tmp").iterdir())


def test_staging_counts_and_cleans_up(tmp_path):
    store = UploadStore(tmp_path)
    with pytest.raises(TooLarge), store.staging([b"a" * 6, b"b" * 6], limit=10):
        pass
    with store.staging([b"a" * 6, b"b" * 4], limit=10) as staged:
        assert staged.size_bytes == 10 and staged.path.read_bytes() == b"aaaaaabbbb"
    assert not staged.path.exists() and not store.exists(staged.sha256)  # never committed
    assert not any((tmp_path / "tmp").iterdir())


def test_path_refuses_what_is_not_a_sha256(tmp_path):
    store = UploadStore(tmp_path)
    for bad in ("../../etc/passwd", "ab", "A" * 64):
        with pytest.raises(ValueError):
            store.path(bad)
    assert not store.exists("0" * 64)
