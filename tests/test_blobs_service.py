"""The blob store through the service: uploads into the database backend, deleting a report
deletes the blobs nothing else uses (both backends), the quota, `inspector gc` with orphan
blobs and this host's worker cache. SQLite and Postgres."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading

import pytest
from api_support import MLP_SOURCE, api_env, finish, upload
from sqlalchemy import func, select, update

from server.blobs.cache import KEEP_RECENT_S, BlobCache
from server.gc import run_gc
from server.models import Blob, BlobChunk, Job, Upload, utcnow

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
TENSORS = b"\x80\x02 not really tensors, checked in the sandbox"  # .pt: only non-empty here
OTHER_SOURCE = MLP_SOURCE + b"\n# another model\n"


def _counts(env) -> tuple[int, int, int]:  # noqa: ANN001
    """(uploads rows, blobs rows, blob_chunks rows)."""
    with env.factory() as session:
        return tuple(
            session.scalar(select(func.count()).select_from(m)) for m in (Upload, Blob, BlobChunk)
        )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("backend", BACKENDS)
def test_uploads_go_to_the_database_and_deleting_reports_frees_them(backend, tmp_path, monkeypatch):
    with api_env(backend, tmp_path, monkeypatch, blob_store="database") as env:
        with_input = upload(env, data={"input": ""}, input_file=("x.pt", TENSORS))
        same_model = upload(env)
        assert with_input.status_code == same_model.status_code == 201, with_input.text
        assert _counts(env) == (2, 2, 2)  # the model once, the tensors; one chunk each
        store = env.client.app.state.store
        assert store.exists(_sha(MLP_SOURCE)) and store.exists(_sha(TENSORS))
        assert not (env.settings.data_dir / "uploads").exists()  # nothing on the server's disk
        assert env.client.delete(f"/api/v1/reports/{with_input.json()['slug']}").status_code == 204
        assert _counts(env) == (1, 1, 1)  # the tensors went; the model is still used
        assert not store.exists(_sha(TENSORS)) and store.exists(_sha(MLP_SOURCE))
        assert env.client.delete(f"/api/v1/reports/{same_model.json()['slug']}").status_code == 204
        assert _counts(env) == (0, 0, 0)


def test_deleting_a_report_frees_its_file_in_the_local_backend_too(tmp_path, monkeypatch):
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        slugs = [upload(env, source).json()["slug"] for source in (MLP_SOURCE, OTHER_SOURCE)]
        files = env.settings.data_dir / "uploads"
        assert len([p for p in files.rglob("*") if p.is_file()]) == 2
        assert env.client.delete(f"/api/v1/reports/{slugs[0]}").status_code == 204
        left = [p for p in files.rglob("*") if p.is_file()]
        assert [p.parent.name + p.name for p in left] == [_sha(OTHER_SOURCE)]
        assert _counts(env) == (1, 0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_quota_counts_database_blobs(backend, tmp_path, monkeypatch):
    quota = len(MLP_SOURCE) + len(OTHER_SOURCE) - 1  # room for one of the two models
    options = {"blob_store": "database", "max_data_bytes": quota}
    with api_env(backend, tmp_path, monkeypatch, **options) as env:
        assert upload(env).status_code == 201
        assert upload(env).status_code == 201  # stored already: costs nothing
        refused = upload(env, OTHER_SOURCE)
        assert refused.status_code == 507, refused.text
        assert f"{len(MLP_SOURCE)} of {quota} bytes used" in refused.json()["error"]["message"]
        assert _counts(env) == (1, 1, 1)  # nothing of the refused upload was kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rerun_of_a_deleted_blob_is_gone(backend, tmp_path, monkeypatch):
    with api_env(backend, tmp_path, monkeypatch, blob_store="database") as env:
        slug = upload(env).json()["slug"]
        finish(env, slug, status="failed")
        env.client.app.state.store.database.delete(_sha(MLP_SOURCE))
        r = env.client.post(f"/api/v1/reports/{slug}/rerun")
        assert r.status_code == 410 and r.json()["error"]["code"] == "gone"


def _orphan(env, data: bytes, age: dt.timedelta) -> str:  # noqa: ANN001
    """A blob with no row naming it (what a crash between blob and rows leaves)."""
    sha = env.client.app.state.store.put_bytes(data)
    with env.factory() as session:
        session.execute(update(Blob).where(Blob.sha256 == sha).values(touched_at=utcnow() - age))
        session.commit()
    return sha


@pytest.mark.parametrize("backend", BACKENDS)
def test_gc_covers_database_blobs_orphans_and_the_cache(backend, tmp_path, monkeypatch):
    with api_env(backend, tmp_path, monkeypatch, blob_store="database") as env:
        old, kept = (upload(env, s).json()["slug"] for s in (OTHER_SOURCE, MLP_SOURCE))
        for slug in (old, kept):
            finish(env, slug)
        long_ago = utcnow() - dt.timedelta(days=100)
        with env.factory() as session:
            session.execute(update(Job).where(Job.slug == old).values(created_at=long_ago))
            session.commit()
        stale = _orphan(env, b"orphan from a crash", dt.timedelta(days=2))
        fresh = _orphan(env, b"still getting its rows", dt.timedelta(hours=1))
        store = env.client.app.state.store
        cache = BlobCache(env.settings.data_dir)  # this host is a worker too
        for sha in (_sha(OTHER_SOURCE), _sha(MLP_SOURCE)):
            path = cache.fetch(sha, lambda sha=sha: store.database.read_chunks(sha))
            t = path.stat().st_mtime - KEEP_RECENT_S - 1
            os.utime(path, (t, t))
        dry = run_gc(env.settings, older_than=dt.timedelta(days=90), dry_run=True)
        assert dry.uploads == [_sha(OTHER_SOURCE)] and dry.orphan_blobs == [stale]
        assert _counts(env) == (2, 4, 4)  # a dry run deletes nothing
        done = run_gc(env.settings, older_than=dt.timedelta(days=90))
        assert (done.uploads, done.orphan_blobs, done.cache_files) == (dry.uploads, [stale], 1)
        assert done.bytes_freed == len(OTHER_SOURCE)
        with env.factory() as session:
            assert set(session.scalars(select(Blob.sha256))) == {_sha(MLP_SOURCE), fresh}
        assert [s for s, _, _ in cache.entries()] == [_sha(MLP_SOURCE)]
        assert "1 orphan blob(s)" in done.summary(dry_run=False)


def test_blob_settings(monkeypatch, tmp_path):
    from pydantic import ValidationError

    from server.settings import Settings

    assert (Settings().blob_store, Settings().blob_cache_bytes) == ("local", 20 * 1024**3)
    monkeypatch.setenv("INSPECTOR_BLOB_STORE", "database")
    monkeypatch.setenv("INSPECTOR_BLOB_CACHE_BYTES", "512MiB")
    assert (Settings().blob_store, Settings().blob_cache_bytes) == ("database", 512 * 1024**2)
    with pytest.raises(ValidationError, match="'local' or 'database'"):
        Settings(blob_store="s3")
    with pytest.raises(ValidationError, match="INSPECTOR_BLOB_CACHE_BYTES must be 0"):
        Settings(blob_cache_bytes=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_prunes_its_copies_of_deleted_blobs(backend, tmp_path, monkeypatch):
    from server.worker import prune_blob_cache

    with api_env(backend, tmp_path, monkeypatch, blob_store="database") as env:
        slugs = [upload(env, source).json()["slug"] for source in (MLP_SOURCE, OTHER_SOURCE)]
        store, cache = env.client.app.state.store, BlobCache(env.settings.data_dir)
        for sha in (_sha(MLP_SOURCE), _sha(OTHER_SOURCE)):
            path = cache.fetch(sha, lambda sha=sha: store.database.read_chunks(sha))
            t = path.stat().st_mtime - KEEP_RECENT_S - 1  # not in use by a job any more
            os.utime(path, (t, t))
        assert env.client.delete(f"/api/v1/reports/{slugs[1]}").status_code == 204
        prune_blob_cache(env.settings)
        assert [s for s, _, _ in cache.entries()] == [_sha(MLP_SOURCE)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_upload_racing_with_the_delete_of_its_file_keeps_the_blob(
    backend, tmp_path, monkeypatch
):
    from server.api import queries

    with api_env(backend, tmp_path, monkeypatch, blob_store="database") as env:
        old = upload(env).json()["slug"]
        store, sha = env.client.app.state.store, _sha(MLP_SOURCE)
        racing = env.factory()  # the same file uploaded again: blob touched, job not committed
        with store.staging([MLP_SOURCE]) as staged:
            store.commit(staged, session=racing)
        columns = {"upload_filename": "model.py", "upload_kind": "py", "options": {}}
        queries.add_job(racing, tags={}, name="again", upload_sha256=sha,
                        entrypoint="model.py:Net", **columns)  # fmt: skip
        statuses: list[int] = []
        delete = f"/api/v1/reports/{old}"
        deleting = threading.Thread(
            target=lambda: statuses.append(env.client.delete(delete).status_code)
        )
        deleting.start()
        deleting.join(1.5)
        assert deleting.is_alive()  # waiting for the racing upload's lock
        racing.commit()
        racing.close()
        deleting.join(60)
        assert statuses == [204]
        assert store.exists(sha) and _counts(env)[1:] == (1, 1)  # the new job's blob is whole
        assert b"".join(store.database.read_chunks(sha)) == MLP_SOURCE
