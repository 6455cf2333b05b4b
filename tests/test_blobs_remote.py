"""Workers on other hosts, on the real PostgreSQL and Redis: a server and workers that share
no directory (each its own INSPECTOR_DATA_DIR) run every kind of upload from the database's
blob store; a download killed half-way leaves nothing under a blob's name; two processes
fetching one blob at once both succeed; a big blob goes in and out in chunks."""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from deploy_kit import ROOT, cluster, wait_until, worker_dir
from hostile.kit import TINY_MODEL, fresh_postgres
from sqlalchemy import select

from server.blobs.cache import PARTIAL_MAX_AGE_S, BlobCache
from server.blobs.database import DatabaseBlobs
from server.db import make_engine, upgrade_database
from server.models import Blob
from server.sandbox import sandbox_available
from server.storage import UploadStore

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
needs_sandbox = pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])

PACKAGE = {  # a zip of a folder of modules: model.py imports its sibling
    "net/layers.py": b"from torch import nn\n\n\nclass Block(nn.Linear):\n    pass\n",
    "net/model.py": b"""import torch
from torch import nn

from layers import Block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block(8, 2)

    def forward(self, x):
        return self.block(x)


def example_inputs():
    return (torch.randn(2, 8),)
""",
}
GPT2 = {  # tests/test_presets.py: a two-block GPT-2, built from the config on fake tensors
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64,
    "n_head": 4, "vocab_size": 1000, "n_positions": 128,
}  # fmt: skip
CONFIG_SPEC = '{"dims": {"B": 1, "S": 16}}'


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tensor_file() -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(torch.ones(3, 8), buffer)  # one positional input: x of shape (3, 8)
    return buffer.getvalue()


def _post(url: str, model: tuple[str, bytes], **form) -> str:  # noqa: ANN003
    files = {"model": model}
    if "input_file" in form:
        files["input_file"] = form.pop("input_file")
    r = httpx.post(f"{url}/api/v1/reports", files=files, data=form, timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["slug"]


def _final(url: str, slug: str) -> dict:
    def ended() -> dict | None:
        body = httpx.get(f"{url}/api/v1/reports/{slug}", timeout=30).json()
        return body if body["status"] not in ("queued", "running") else None

    return wait_until(ended, 300, f"report {slug} to end", every_s=1)


def _drop_queue(url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"*{queue}*"):
        client.delete(key)


def _upload_each_kind(url: str, package: bytes, config: bytes, tensors: bytes) -> dict[str, str]:
    """A .py, a .zip, a config.json and a .py with a tensor input file: {kind: slug}."""
    entry = {"entrypoint": "model.py:Net"}
    return {
        "py": _post(url, ("model.py", TINY_MODEL), **entry),
        "zip": _post(url, ("net.zip", package), entrypoint="net/model.py:Net"),
        "config": _post(url, ("config.json", config), fake="true", input=CONFIG_SPEC),
        "input": _post(url, ("model.py", TINY_MODEL), input_file=("x.pt", tensors), **entry),
    }


@needs_sandbox
@pytest.mark.redis
def test_a_worker_with_its_own_data_dir_runs_every_kind_of_upload(
    tmp_path, postgres_url, redis_url
):
    config, tensors, package = json.dumps(GPT2).encode(), _tensor_file(), _zip(PACKAGE)
    queue = f"inspector-blobs-{secrets.token_hex(4)}"
    with fresh_postgres(postgres_url) as db_url:
        # The worker gets the two URLs only; INSPECTOR_BLOB_STORE is the server's business.
        env = {"INSPECTOR_DATABASE_URL": db_url, "INSPECTOR_REDIS_URL": redis_url}
        server_env = {"INSPECTOR_BLOB_STORE": "database"}
        try:
            with cluster(tmp_path / "server", 1, own_dirs=True, server_env=server_env,
                         INSPECTOR_QUEUE_NAME=queue, **env) as c:  # fmt: skip
                slugs = _upload_each_kind(c.url, package, config, tensors)
                bodies = {kind: _final(c.url, slug) for kind, slug in slugs.items()}
                statuses = {k: b["status"] for k, b in bodies.items()}
                errors = {k: b.get("error") for k, b in bodies.items()}
                assert statuses == dict.fromkeys(slugs, "done"), (errors, c.tail("worker"))
        finally:
            _drop_queue(redis_url, queue)
        engine = make_engine(db_url)
        with engine.connect() as conn:
            blobs = conn.execute(select(Blob.sha256, Blob.size_bytes)).all()
        engine.dispose()
    assert bodies["py"]["params"] == 8 * 4 + 4  # Linear(8, 4)
    assert bodies["zip"]["params"] == 8 * 2 + 2  # Block = Linear(8, 2), from net/layers.py
    # tied head: wte 1000*64 + wpe 128*64 + 2 blocks * (12*64*64 + 13*64) + ln_f 2*64
    assert bodies["config"]["params"] == 1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 128
    assert bodies["input"]["flops_forward"] == 2 * 3 * 8 * 4  # 2 * B * in * out, B = 3 from x.pt
    files = {hashlib.sha256(d).hexdigest(): len(d) for d in (TINY_MODEL, package, config, tensors)}
    assert dict(blobs) == files  # four blobs: the .py once, the zip, the config, the tensors
    assert not (tmp_path / "server" / "uploads").exists()  # nothing on the server's disk
    worker = BlobCache(worker_dir(tmp_path / "server", 0))
    cached = {sha: size for sha, size, _ in worker.entries()}
    assert cached == files  # the worker's verified copies, by hash
    assert all(hashlib.sha256(worker.path(s).read_bytes()).hexdigest() == s for s in cached)
    assert list(worker.partial.iterdir()) == []  # no download left half-way


# --- downloads in processes of their own -------------------------------------------------------

CHUNKS = 8  # an 8 MiB blob, read a chunk every DELAY_S: long enough to be caught half-way
FETCH = """
import sys, time
from pathlib import Path
from server.blobs.cache import BlobCache
from server.blobs.database import DatabaseBlobs
from server.db import make_engine

url, data_dir, sha, delay = sys.argv[1:]
blobs = DatabaseBlobs(make_engine(url))


def slowly():
    for chunk in blobs.read_chunks(sha):
        time.sleep(float(delay))
        yield chunk


started = time.time()
path = BlobCache(Path(data_dir)).fetch(sha, slowly)
print(started, time.time(), path, flush=True)
"""


def _blob(tmp_path: Path, url: str) -> tuple[str, bytes]:
    upgrade_database(url)
    engine = make_engine(url)
    data = os.urandom(CHUNKS * 1024 * 1024)
    store = UploadStore(tmp_path / "server", database=DatabaseBlobs(engine), write_to="database")
    sha = store.put_bytes(data)
    engine.dispose()
    return sha, data


def _fetcher(url: str, data_dir: Path, sha: str, delay_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", FETCH, url, str(data_dir), sha, str(delay_s)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_download_killed_half_way_leaves_nothing_half_written(tmp_path, postgres_url):
    with fresh_postgres(postgres_url) as url:
        sha, data = _blob(tmp_path, url)
        cache = BlobCache(tmp_path / "worker")
        proc = _fetcher(url, cache.dir.parent, sha, delay_s=0.5)

        def half_way() -> bool:
            sizes = (
                [p.stat().st_size for p in cache.partial.glob("*")]
                if cache.partial.exists()
                else []
            )
            return bool(sizes) and 2 * 1024 * 1024 <= sizes[0] < len(data)

        try:
            wait_until(half_way, 60, "the download to be half-way", every_s=0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        assert not cache.path(sha).exists() and cache.entries() == []  # nothing published
        (dead,) = cache.partial.iterdir()
        assert dead.name.startswith(sha[:12]) and dead.stat().st_size < len(data)
        again = _fetcher(url, cache.dir.parent, sha, delay_s=0)  # the next job's fetch
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err.decode()
    assert Path(out.split()[2].decode()) == cache.path(sha)
    assert cache.path(sha).read_bytes() == data
    old = time.time() - PARTIAL_MAX_AGE_S - 1
    os.utime(dead, (old, old))  # the dead download's temp file, an hour later
    pruned = cache.prune(stored=lambda names: set(names), max_bytes=0)
    assert (pruned.removed, pruned.partials) == ([], 1) and list(cache.partial.iterdir()) == []


def test_two_processes_fetching_one_blob_at_once_both_succeed(tmp_path, postgres_url):
    with fresh_postgres(postgres_url) as url:
        sha, data = _blob(tmp_path, url)
        cache = BlobCache(tmp_path / "worker")  # one host's cache, two workers on it
        procs = [_fetcher(url, cache.dir.parent, sha, delay_s=0.25) for _ in range(2)]
        results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err.decode() for _, err in results]
    spans = [tuple(float(x) for x in out.split()[:2]) for out, _ in results]
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # the downloads overlapped
    assert {out.split()[2].decode() for out, _ in results} == {str(cache.path(sha))}
    assert cache.path(sha).read_bytes() == data
    assert [s for s, _, _ in cache.entries()] == [sha] and list(cache.partial.iterdir()) == []


ROUND_TRIP = """
import hashlib, os, resource, sys
from pathlib import Path
from server.blobs.cache import BlobCache
from server.blobs.database import DatabaseBlobs
from server.blobs.streams import Staged
from server.db import make_engine

url, work, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
digest, source = hashlib.sha256(), work / "big.pt2"
with open(source, "wb") as f:  # written a MiB at a time: the file never is in memory
    for _ in range(size // 2**20):
        chunk = os.urandom(2**20)
        digest.update(chunk)
        f.write(chunk)
blobs, sha = DatabaseBlobs(make_engine(url)), digest.hexdigest()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
blobs.put(Staged(source, sha, size))
copy = BlobCache(work / "worker").fetch(sha, lambda: blobs.read_chunks(sha))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown * 1024, copy.stat().st_size, flush=True)
"""


def test_a_big_blob_is_streamed_in_and_out_in_chunks(tmp_path, postgres_url):
    size = 128 * 2**20
    with fresh_postgres(postgres_url) as url:
        upgrade_database(url)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", ROUND_TRIP, url, str(tmp_path), str(size)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    grown, copied = (int(x) for x in done.stdout.split())
    assert copied == size
    # Stored and read back 1 MiB at a time: the peak grows by the drivers' buffers at most
    # (measured: +0 here, +28 MiB for 512 MiB); as one 128 MiB chunk it grew by 874 MiB.
    assert grown < size // 2, f"peak RSS grew by {grown} bytes for a {size}-byte blob"
