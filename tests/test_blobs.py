"""The blob store's backends (server.blobs): the upload directory and the database (SQLite and
Postgres), a worker's verified cache, and how a worker finds a blob."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading

import pytest
from api_support import database
from sqlalchemy import func, select, update

from server.blobs import CHUNK_BYTES, BlobCorrupt, BlobMissing
from server.blobs.cache import KEEP_RECENT_S, PARTIAL_MAX_AGE_S, BlobCache
from server.blobs.database import DatabaseBlobs
from server.blobs.fetch import stored_file
from server.db import make_engine, make_session_factory
from server.models import Blob, BlobChunk, utcnow
from server.storage import UploadStore

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# The chunking boundaries: no chunk, exactly one, one and a byte.
SIZES = [0, CHUNK_BYTES, CHUNK_BYTES + 1]


@pytest.fixture(params=BACKENDS)
def engine(request, tmp_path):
    with database(request.param, tmp_path) as url:
        engine = make_engine(url)
        yield engine
        engine.dispose()


def _data(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))  # not all one byte: a chunk mix-up shows


def _db_store(tmp_path, engine) -> UploadStore:
    return UploadStore(tmp_path / "data", database=DatabaseBlobs(engine), write_to="database")


def _chunks(engine, sha: str) -> list[int]:
    with engine.connect() as conn:
        query = select(func.length(BlobChunk.data)).where(BlobChunk.sha256 == sha)
        return list(conn.scalars(query.order_by(BlobChunk.seq)))


def _count(engine, model) -> int:  # noqa: ANN001
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(model))


@pytest.mark.parametrize("size", SIZES)
def test_database_backend_chunks_and_reads_back(engine, tmp_path, size):
    store, data = _db_store(tmp_path, engine), _data(size)
    sha = store.put_bytes(data)
    assert sha == hashlib.sha256(data).hexdigest() and store.exists(sha)
    expected = {0: [], CHUNK_BYTES: [CHUNK_BYTES], CHUNK_BYTES + 1: [CHUNK_BYTES, 1]}[size]
    assert _chunks(engine, sha) == expected
    with engine.connect() as conn:
        row = conn.execute(select(Blob.size_bytes, Blob.chunk_count)).one()
    assert tuple(row) == (size, len(expected))
    assert b"".join(DatabaseBlobs(engine).read_chunks(sha)) == data
    assert not store.dir.exists()  # nothing written to the upload directory
    assert not any(store.tmp.iterdir())  # nor left in staging
    cached = BlobCache(tmp_path / "worker").fetch(sha, lambda: store.database.read_chunks(sha))
    assert cached.read_bytes() == data and cached.stat().st_size == size


@pytest.mark.parametrize("size", SIZES)
def test_local_backend_keeps_one_file(tmp_path, size):
    store, data = UploadStore(tmp_path), _data(size)
    sha = store.put_bytes(data)
    assert store.path(sha).read_bytes() == data and store.exists(sha)
    assert [p.stat().st_size for p in store.dir.rglob("*") if p.is_file()] == [size]


def test_the_same_content_twice_is_one_blob_touched_again(engine, tmp_path):
    store = _db_store(tmp_path, engine)
    sha = store.put_bytes(b"abc")
    before = utcnow()
    assert store.put_bytes(b"abc") == sha
    assert (_count(engine, Blob), _count(engine, BlobChunk)) == (1, 1)
    # Put again after `before`: a deletion that started then spares it; a later one not.
    assert store.delete(sha, unless_put_since=before) is False and store.exists(sha)
    assert store.delete(sha, unless_put_since=utcnow() + dt.timedelta(seconds=1)) is True
    assert (_count(engine, Blob), _count(engine, BlobChunk)) == (0, 0)
    assert store.delete(sha) is False  # already gone


def test_a_put_in_a_rolled_back_session_stores_nothing(engine, tmp_path):
    store = _db_store(tmp_path, engine)
    with make_session_factory(engine)() as session:
        with store.staging([_data(CHUNK_BYTES + 1)]) as staged:
            store.commit(staged, session=session)
        assert session.scalar(select(func.count()).select_from(BlobChunk)) == 2  # inside it
        session.rollback()
    assert (_count(engine, Blob), _count(engine, BlobChunk)) == (0, 0)
    assert not store.exists(staged.sha256)


def test_a_write_that_fails_half_way_leaves_no_blob(engine, tmp_path):
    store = _db_store(tmp_path, engine)
    with store.staging([_data(CHUNK_BYTES + 1)]) as staged:
        staged.size_bytes += 1  # the file is one byte short of what was staged
        with pytest.raises(ValueError, match="1048577 bytes, 1048578 staged"):
            store.commit(staged)
    assert (_count(engine, Blob), _count(engine, BlobChunk)) == (0, 0)


def test_a_corrupt_blob_is_refused_and_not_cached(engine, tmp_path):
    store = _db_store(tmp_path, engine)
    data = _data(CHUNK_BYTES + 1)
    sha = store.put_bytes(data)
    with engine.begin() as conn:  # one byte changed in the second chunk
        conn.execute(update(BlobChunk).where(BlobChunk.seq == 1).values(data=b"\xff"))
    cache = BlobCache(tmp_path / "worker")
    with pytest.raises(BlobCorrupt, match=f"blob {sha} read back as {len(data)} bytes"):
        cache.fetch(sha, lambda: store.database.read_chunks(sha))
    assert not cache.path(sha).exists() and list(cache.partial.iterdir()) == []


def test_a_missing_blob_or_chunk_says_so(engine, tmp_path):
    store, blobs = _db_store(tmp_path, engine), DatabaseBlobs(engine)
    absent = "0" * 64
    with pytest.raises(BlobMissing, match=f"blob {absent} is not in the database"):
        list(blobs.read_chunks(absent))
    with pytest.raises(BlobMissing) as caught:
        stored_file(tmp_path / "worker", engine, sha256=absent, what="model")
    message = str(caught.value)
    assert "stored model file 000000000000..." in message
    assert "INSPECTOR_BLOB_STORE=database" in message and "Upload the file again" in message
    sha = store.put_bytes(_data(CHUNK_BYTES + 1))
    with engine.begin() as conn:
        conn.execute(BlobChunk.__table__.delete().where(BlobChunk.seq == 1))
    with pytest.raises(BlobMissing, match="chunk 1 of 2 is gone"):
        list(blobs.read_chunks(sha))
    assert list(BlobCache(tmp_path / "worker").dir.rglob("*")) == [
        BlobCache(tmp_path / "worker").partial
    ]  # only the empty temp folder: nothing under a blob's name


def test_a_worker_finds_the_local_file_first_then_the_database(engine, tmp_path):
    worker = tmp_path / "worker"
    in_db = _db_store(tmp_path, engine).put_bytes(b"from the database")
    on_disk = UploadStore(worker).put_bytes(b"in the worker's own upload dir")
    local = stored_file(worker, engine, sha256=on_disk, what="model")
    assert local == worker / "uploads" / on_disk[:2] / on_disk[2:]
    fetched = stored_file(worker, engine, sha256=in_db, what="input")
    assert fetched == worker / "blob-cache" / in_db[:2] / in_db[2:]
    assert fetched.read_bytes() == b"from the database"
    with engine.begin() as conn:  # a cached copy is used without asking the database
        conn.execute(BlobChunk.__table__.delete())
    assert stored_file(worker, engine, sha256=in_db, what="input") == fetched


@pytest.mark.postgres
def test_two_uploads_of_one_file_at_once_store_one_blob(tmp_path):
    with database("postgres", tmp_path) as url:
        engine = make_engine(url)
        store, factory = _db_store(tmp_path, engine), make_session_factory(engine)
        data, errors, barrier = _data(3 * CHUNK_BYTES), [], threading.Barrier(2)

        def upload() -> None:
            try:
                with store.staging([data]) as staged, factory() as session:
                    barrier.wait(10)
                    store.commit(staged, session=session)  # the second waits for the first
                    session.commit()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=upload) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert (_count(engine, Blob), _count(engine, BlobChunk)) == (1, 3)
        assert b"".join(store.database.read_chunks(hashlib.sha256(data).hexdigest())) == data
        engine.dispose()


def _age(path, seconds: float) -> None:  # noqa: ANN001
    old = path.stat().st_mtime - seconds
    os.utime(path, (old, old))


def test_cache_prune_drops_deleted_blobs_the_least_recent_and_dead_downloads(tmp_path):
    cache = BlobCache(tmp_path)
    blobs = {name: _data(size) for name, size in (("a", 100), ("b", 200), ("c", 300), ("d", 50))}
    sha = {n: hashlib.sha256(d).hexdigest() for n, d in blobs.items()}
    for i, name in enumerate(blobs):  # a least recently used ... d most
        _age(cache.fetch(sha[name], lambda d=blobs[name]: [d]), KEEP_RECENT_S + 100 - i)
    cache.partial.mkdir(exist_ok=True)
    dead, live = cache.partial / "dead", cache.partial / "live"
    dead.write_bytes(b"x"), live.write_bytes(b"y")
    _age(dead, PARTIAL_MAX_AGE_S + 1)
    still = {sha["a"], sha["c"], sha["d"]}  # b was deleted from the store
    # 100 + 300 + 50 = 450 left after b; a limit of 400 drops a (least recently used) too
    result = cache.prune(stored=lambda names: still & set(names), max_bytes=400)
    assert result.removed == [sha["a"], sha["b"]] and result.bytes_freed == 100 + 200
    assert result.partials == 1 and not dead.exists() and live.exists()
    assert sorted(s for s, _, _ in cache.entries()) == sorted([sha["c"], sha["d"]])
    recent = cache.fetch(sha["b"], lambda: [blobs["b"]])  # used just now: kept regardless
    assert cache.prune(stored=lambda names: set(), max_bytes=1).removed == [sha["c"], sha["d"]]
    assert recent.exists()
