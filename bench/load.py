"""Load: N jobs submitted at once to a Postgres + Redis deployment with W workers, while R
readers fetch a 1,000-node report (JSON and page).

    .venv/bin/python bench/load.py [--jobs 200] [--workers 3] [--readers 100]

On loopback only: a fresh Postgres database on 127.0.0.1:5432 (dropped afterwards), a
unique queue name on the Redis at 127.0.0.1:6379 (its keys deleted afterwards), a temp
data dir, one `inspector serve` (INSPECTOR_EMBEDDED_WORKER=false) and W `inspector worker`
processes. Checks: every job ends `done`, each claimed once (attempts == 1), and the
workers' JSON logs hold exactly one `sandbox_start` per job (each job ran once); no reader
got an error. Prints a JSON summary (p50/p99 per kind of read). Every loop is bounded by
a request count and by `--time-limit`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from deploy_kit import cluster  # noqa: E402
from hostile.kit import TINY_MODEL, fresh_postgres  # noqa: E402
from pages_data import synthetic_report  # noqa: E402
from pages_server import insert_job  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from server.db import make_engine, make_session_factory  # noqa: E402
from server.models import FINAL_STATUSES, Job  # noqa: E402

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class Reads:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"json": [], "page": []})
    errors: list[str] = field(default_factory=list)

    def count(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)


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


async def _reader(client: httpx.AsyncClient, url: str, slug: str, reads: Reads, stop, cap: int):  # noqa: ANN001, ANN202
    paths = {"json": f"/api/v1/reports/{slug}", "page": f"/r/{slug}"}
    turn = 0
    while not stop.is_set() and reads.count() < cap:
        kind = "json" if turn % 2 == 0 else "page"
        turn += 1
        start = time.monotonic()
        try:
            r = await client.get(url + paths[kind])
            if r.status_code != 200:
                reads.errors.append(f"{kind} HTTP {r.status_code}")
            else:
                reads.latencies[kind].append(time.monotonic() - start)
        except httpx.HTTPError as exc:
            reads.errors.append(f"{kind} {type(exc).__name__}")
        await asyncio.sleep(0.5)  # a person reading, not a flood: ~2 requests/s each


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
    limits = httpx.Limits(max_connections=args.readers)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        readers = [
            asyncio.create_task(_reader(client, url, slug, reads, stop, args.max_reads))
            for _ in range(args.readers)
        ]
        start = time.monotonic()
        try:
            slugs = await _submit(url, args.jobs)
        except BaseException:
            stop.set()
            await asyncio.gather(*readers)
            raise
        submitted_s = time.monotonic() - start
        counts = await _wait_done(factory, args.jobs, args.time_limit)
        total_s = time.monotonic() - start
        stop.set()
        await asyncio.gather(*readers)
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
        "json_p50_ms": _pct(lat["json"], 0.5),
        "json_p99_ms": _pct(lat["json"], 0.99),
        "page_p50_ms": _pct(lat["page"], 0.5),
        "page_p99_ms": _pct(lat["page"], 0.99),
        "json_mean_ms": round(1000 * statistics.mean(lat["json"]), 1) if lat["json"] else None,
    }


def run_load(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The whole experiment; returns the summary (see `_summary`)."""
    queue = f"inspector-load-{secrets.token_hex(4)}"
    with fresh_postgres(args.postgres) as db_url:
        env = {"INSPECTOR_DATABASE_URL": db_url, "INSPECTOR_REDIS_URL": args.redis}
        env["INSPECTOR_QUEUE_NAME"] = queue
        try:
            with cluster(tmp / "data", workers=args.workers, **env) as c:
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
                engine.dispose()
        finally:
            _drop_queue(args.redis, queue)
    return _summary(result, starts, attempts)


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
    p.add_argument("--postgres", default=POSTGRES)
    p.add_argument("--redis", default=REDIS)
    return p


def main() -> int:
    args = parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="inspector-load-") as tmp:
        summary = run_load(args, Path(tmp))
    print(json.dumps(summary, indent=2))
    ok = summary["all_done"] and summary["read_errors"] == 0
    ok = ok and summary["sandbox_starts"] == summary["jobs"] == summary["distinct_jobs_started"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
