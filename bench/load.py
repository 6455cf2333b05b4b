"""Load: N jobs submitted at once to a Postgres + Redis deployment with W workers, while R
readers fetch a 1,000-node report (JSON and page).

    .venv/bin/python bench/load.py [--jobs 200] [--workers 3] [--readers 100]
                                   [--blob-store database --own-dirs]

On loopback only: a fresh Postgres database on 127.0.0.1:5432 (dropped afterwards), a
unique queue name on the Redis at 127.0.0.1:6379 (its keys deleted afterwards), a temp
data dir, one `inspector serve` (INSPECTOR_EMBEDDED_WORKER=false) and W `inspector worker`
processes. Checks: every job ends `done`, each claimed once (attempts == 1), and the
workers' JSON logs hold exactly one `sandbox_start` per job (each job ran once); no reader
got an error. With `--own-dirs` each worker has a data dir of its own (workers on other
hosts: only the database and the queue are shared), which needs `--blob-store database`;
the summary then counts the blobs each worker copied into its cache. Prints a JSON summary
(p50/p99 per kind of read). Every loop is bounded by a request count and by `--time-limit`.

Readers act like browsers: each has its own keep-alive connection and sends
`Accept-Encoding: gzip`; a latency is the time to the last byte of the response. The
generator shares the machine's cores with the server it measures, so it spends little:
a lean HTTP/1.1 reader (`Browser`) counts the bytes as sent (compressed), without
decompressing them. One read in three is a revalidation (`If-None-Match` with the ETag the
reader got before), reported apart (`json_304_*`, `page_304_*`); one answered with a new
body (the page's "compare with" list changes as jobs finish) counts as a full read. The
main figures are the full GETs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from deploy_kit import cluster, worker_dir  # noqa: E402
from hostile.kit import TINY_MODEL, fresh_postgres  # noqa: E402
from pages_data import synthetic_report  # noqa: E402
from pages_server import insert_job  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from inspector.schema.statuses import FINAL_STATUSES  # noqa: E402
from server.blobs.cache import BlobCache  # noqa: E402
from server.db import make_engine, make_session_factory  # noqa: E402
from server.models import Blob, Job  # noqa: E402

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"


# One reader's turns: full GETs of the JSON and the page, and revalidations of each.
TURNS = ("json", "page", "json_304", "json", "page", "page_304")
KINDS = ("json", "page", "json_304", "page_304")
READ_TIMEOUT_S = 30
THINK_S = 0.5  # a reader's mean pause between two requests
THINKING = random.Random(8)  # the pauses, the same from run to run
# What a failed read raises: refused or reset, cut short, timed out, not HTTP we read.
READ_ERRORS = (OSError, EOFError, asyncio.LimitOverrunError, TimeoutError, ValueError)


@dataclass
class Reads:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    sizes: dict[str, int] = field(default_factory=dict)  # bytes on the wire, last read
    changed: dict[str, int] = field(default_factory=dict)  # revalidations answered by a body
    errors: list[str] = field(default_factory=list)
    # Reads started once every upload was accepted: the jobs run, the burst is over.
    steady: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    submitted: bool = False

    def count(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)

    def record(self, kind: str, seconds: float, size: int, *, steady: bool) -> None:
        self.latencies[kind].append(seconds)
        if steady:
            self.steady[kind].append(seconds)
        self.sizes[kind] = size


def _model(i: int) -> bytes:
    # Half share one file (concurrent uploads of the same content), half are distinct.
    return TINY_MODEL if i % 2 == 0 else TINY_MODEL + f"\n# job {i}\n".encode()


async def _submit(url: str, n: int) -> list[str]:
    """Upload `n` models at once; every upload must be accepted."""
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int) -> str:
            files = {"model": ("model.py", _model(i))}
            data = {"entrypoint": "model.py:Net", "name": f"load {i}", "tags": "bench=load"}
            r = await client.post(f"{url}/api/v1/reports", files=files, data=data)
            assert r.status_code == 201, f"upload {i}: HTTP {r.status_code} {r.text[:300]}"
            return r.json()["slug"]

        return await asyncio.gather(*(one(i) for i in range(n)))


class Browser:
    """One reader's keep-alive HTTP/1.1 connection, as a browser tab has. Lean on purpose: the
    generator shares the two cores with the server it measures, and httpx spent ~1.5 ms of
    CPU per read (one shared pool of 100 connections: ~3 ms, in httpcore's bookkeeping),
    this ~0.2 ms. It reads what this server sends: a Content-Length, or no body (304)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, str, int]:
        """GET `path` to the last byte, not decompressed: (status, ETag, body bytes)."""
        try:
            return await asyncio.wait_for(self._get(path, headers), READ_TIMEOUT_S)
        except BaseException:
            self.close()  # the connection is in an unknown state: a new one next time
            raise

    async def _get(self, path: str, headers: dict[str, str]) -> tuple[int, str, int]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        fields = {}
        for line in filter(None, head[1:]):
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "content-length" not in fields and "transfer-encoding" in fields:
            raise ValueError(f"unexpected Transfer-Encoding: {fields['transfer-encoding']}")
        size = int(fields.get("content-length", "0"))
        await reader.readexactly(size)
        if fields.get("connection", "").lower() == "close":
            self.close()
        return int(head[0].split()[1]), fields.get("etag", ""), size

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def _reader(browser: Browser, slug: str, reads: Reads, stop, cap: int):  # noqa: ANN001, ANN202
    paths = {"json": f"/api/v1/reports/{slug}", "page": f"/r/{slug}"}
    etags: dict[str, str] = {}
    turn = 0
    await asyncio.sleep(THINKING.uniform(0, THINK_S))  # people do not start in step
    while not stop.is_set() and reads.count() < cap:
        kind = TURNS[turn % len(TURNS)]
        turn += 1
        await _read_once(browser, paths[kind.removesuffix("_304")], kind, etags, reads)
        # A person reading, not a flood: ~2 requests/s each, at their own pace (readers in
        # lockstep would all ask in the same millisecond, a queue of 100 every 0.5 s).
        await asyncio.sleep(THINKING.uniform(0.5 * THINK_S, 1.5 * THINK_S))


async def _read_once(
    browser: Browser, path: str, kind: str, etags: dict[str, str], reads: Reads
) -> None:
    """One full GET, or one revalidation of the copy got before; recorded in `reads`."""
    what, revalidate = kind.removesuffix("_304"), kind.endswith("_304")
    if revalidate and not etags.get(what):  # no copy yet (its GET failed): a full GET
        kind, revalidate = what, False
    headers = {"Accept-Encoding": "gzip"}
    if revalidate:  # the copy this reader got before: a browser's reload
        headers["If-None-Match"] = etags[what]
    start, steady = time.monotonic(), reads.submitted
    try:
        status, etag, size = await browser.get(path, headers)
    except READ_ERRORS as exc:
        reads.errors.append(f"{kind} {type(exc).__name__}")
        return
    if status not in ((200, 304) if revalidate else (200,)):
        reads.errors.append(f"{kind} HTTP {status}")
        return
    if revalidate and status == 200:  # changed (the page's "compare with" list)
        reads.changed[what] = reads.changed.get(what, 0) + 1
        kind = what  # a full read
    reads.record(kind, time.monotonic() - start, size, steady=steady)
    etags[what] = etag


def _progress(factory) -> dict[str, int]:  # noqa: ANN001
    with factory() as session:
        rows = session.execute(
            select(Job.status, func.count()).where(Job.name.like("load %")).group_by(Job.status)
        ).all()
    return dict(rows)


async def _wait_done(factory, n: int, limit_s: float) -> dict[str, int]:  # noqa: ANN001
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        counts = await asyncio.to_thread(_progress, factory)
        if sum(counts.get(s, 0) for s in FINAL_STATUSES) >= n:
            return counts
        await asyncio.sleep(2)
    return await asyncio.to_thread(_progress, factory)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


async def _load(url: str, factory, slug: str, args: argparse.Namespace) -> dict[str, Any]:  # noqa: ANN001
    reads, stop = Reads(), asyncio.Event()
    browsers = [Browser(url) for _ in range(args.readers)]
    try:
        readers = [
            asyncio.create_task(_reader(browser, slug, reads, stop, args.max_reads))
            for browser in browsers
        ]
        start = time.monotonic()
        try:
            slugs = await _submit(url, args.jobs)
        except BaseException:
            stop.set()
            await asyncio.gather(*readers)
            raise
        submitted_s = time.monotonic() - start
        reads.submitted = True
        counts = await _wait_done(factory, args.jobs, args.time_limit)
        total_s = time.monotonic() - start
        stop.set()
        await asyncio.gather(*readers)
    finally:
        for browser in browsers:
            browser.close()
    return {"slugs": slugs, "counts": counts, "submit_s": submitted_s, "total_s": total_s,
            "reads": reads}  # fmt: skip


def _summary(result: dict[str, Any], sandbox_starts: list[dict], attempts: list[int]) -> dict:
    reads: Reads = result["reads"]
    lat = reads.latencies
    return {
        "jobs": len(result["slugs"]),
        "statuses": result["counts"],
        "all_done": result["counts"].get("done", 0) == len(result["slugs"]),
        "attempts_max": max(attempts, default=0),
        "sandbox_starts": len(sandbox_starts),
        "distinct_jobs_started": len({r["job_id"] for r in sandbox_starts}),
        "submit_all_s": round(result["submit_s"], 1),
        "all_final_s": round(result["total_s"], 1),
        "jobs_per_min": round(60 * len(result["slugs"]) / result["total_s"], 1),
        "reads": reads.count(),
        "read_errors": len(reads.errors),
        "read_error_samples": reads.errors[:5],
        "reads_by_kind": {k: len(v) for k, v in lat.items()},
        "bytes_by_kind": reads.sizes,  # as sent: gzip for full GETs, nothing for a 304
        "revalidations_changed": reads.changed,  # a new body instead of a 304
        **{f"{k}_{q}_ms": _pct(lat[k], p) for k in KINDS for q, p in (("p50", 0.5), ("p99", 0.99))},
        "json_mean_ms": round(1000 * statistics.mean(lat["json"]), 1) if lat["json"] else None,
        # The same once all uploads are in (the jobs still running): without the burst of
        # 200 uploads at the start, which the generator itself also spends CPU on.
        "steady_reads": sum(len(v) for v in reads.steady.values()),
        **{
            f"steady_{k}_{q}_ms": _pct(reads.steady[k], p)
            for k in ("json", "page")
            for q, p in (("p50", 0.5), ("p99", 0.99))
        },
    }


def _blob_counts(data_dir: Path, workers: int, factory) -> dict[str, Any]:  # noqa: ANN001
    """Where the uploads ended up: database blobs, server files, each worker's cache."""
    with factory() as session:
        blobs = session.scalar(select(func.count()).select_from(Blob))
    server_files = [p for p in (data_dir / "uploads").rglob("*") if p.is_file()]
    caches = [len(BlobCache(worker_dir(data_dir, i)).entries()) for i in range(workers)]
    return {"database_blobs": blobs, "server_upload_files": len(server_files),
            "worker_cache_blobs": caches}  # fmt: skip


def run_load(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The whole experiment; returns the summary (see `_summary`)."""
    queue = f"inspector-load-{secrets.token_hex(4)}"
    where: dict[str, Any] = {"blob_store": args.blob_store, "own_dirs": args.own_dirs}
    with fresh_postgres(args.postgres) as db_url:
        env = {"INSPECTOR_DATABASE_URL": db_url, "INSPECTOR_REDIS_URL": args.redis}
        env["INSPECTOR_QUEUE_NAME"] = queue
        server_env = {"INSPECTOR_BLOB_STORE": args.blob_store}
        try:
            with cluster(tmp / "data", workers=args.workers, own_dirs=args.own_dirs,
                         server_env=server_env, **env) as c:  # fmt: skip
                engine = make_engine(db_url)
                factory = make_session_factory(engine)
                slug = insert_job(factory, synthetic_report(1000), name="reader target")
                try:
                    result = asyncio.run(_load(c.url, factory, slug, args))
                except BaseException:
                    print(c.tail("server", 6000), file=sys.stderr)  # why, before it is deleted
                    raise
                if result["reads"].errors:  # the server's side of the failed reads
                    print(c.tail("server", 4000), file=sys.stderr)
                with factory() as session:
                    attempts = list(session.scalars(select(Job.attempts).where(Job.id > 1)))
                starts = c.events("sandbox_start")
                if args.own_dirs:
                    where |= _blob_counts(c.data_dir, args.workers, factory)
                engine.dispose()
        finally:
            _drop_queue(args.redis, queue)
    return where | _summary(result, starts, attempts)


def _drop_queue(url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"*{queue}*"):
        client.delete(key)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--readers", type=int, default=100)
    p.add_argument("--max-reads", type=int, default=200_000, help="stop reading after this many")
    p.add_argument("--time-limit", type=float, default=3600, help="seconds for all jobs to end")
    p.add_argument("--blob-store", choices=("local", "database"), default="local")
    p.add_argument("--own-dirs", action="store_true", help="no data dir shared with workers")
    p.add_argument("--postgres", default=POSTGRES)
    p.add_argument("--redis", default=REDIS)
    return p


def main() -> int:
    args = parser().parse_args()
    if args.own_dirs and args.blob_store != "database":
        parser().error("--own-dirs needs --blob-store database: workers share no upload dir")
    with tempfile.TemporaryDirectory(prefix="inspector-load-") as tmp:
        summary = run_load(args, Path(tmp))
    print(json.dumps(summary, indent=2))
    ok = summary["all_done"] and summary["read_errors"] == 0
    ok = ok and summary["sandbox_starts"] == summary["jobs"] == summary["distinct_jobs_started"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
