"""Service benchmark: upload -> done for a small model, and GET latency under load.

    .venv/bin/python bench/service.py [--jobs 5] [--clients 50] [--requests 2000]

Starts a real `inspector serve` (SQLite, embedded worker, bubblewrap sandbox) on a free
loopback port in a temporary data dir, then:
1. uploads a small .py model `--jobs` times, one after another (after one warm-up job),
   and times upload -> done as a client sees it, with the breakdown the worker records:
   queue wait, sandbox start (spawn -> the child's first line), import (torch and the
   pipeline), analysis (load + capture + passes), store (child exit -> row written),
   and the client's polling lag;
2. runs `--clients` concurrent clients doing `GET /api/v1/reports/<slug>` until
   `--requests` are done or `--time-limit` seconds pass; reports p50/p99 and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL = b"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x)


def example_inputs():
    return (torch.randn(4, 32),)
"""
PIPELINE_STAGES = ("import", "queue_wait", "sandbox_start", "child")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INSPECTOR_DATA_DIR": str(data_dir)}
    env["INSPECTOR_DEVICE"] = "cpu"
    code = f"from server.cli_commands import serve; raise SystemExit(serve('127.0.0.1', {port}))"
    log = open(data_dir.parent / "serve.log", "wb")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start; see {data_dir.parent / 'serve.log'}")


def one_job(client: httpx.Client, url: str) -> dict[str, float]:
    """Upload, poll every 20 ms until done; the seconds of each part."""
    start = time.monotonic()
    files = {"model": ("model.py", MODEL)}
    created = client.post(f"{url}/api/v1/reports", files=files, data={"entrypoint": "model.py:Net"})
    created.raise_for_status()
    slug = created.json()["slug"]
    while True:
        body = client.get(f"{url}/api/v1/reports/{slug}").json()
        if body["status"] not in ("queued", "running"):
            break
        time.sleep(0.02)
    total = time.monotonic() - start
    if body["status"] != "done":
        raise SystemExit(f"job ended {body['status']}: {body.get('error')}")
    return _breakdown(body, total)


def _breakdown(body: dict, total: float) -> dict[str, float]:
    timings = body["report"]["meta"]["timings_s"]
    analysis = sum(v for k, v in timings.items() if k not in PIPELINE_STAGES)
    started = dt.datetime.fromisoformat(body["started_at"])
    finished = dt.datetime.fromisoformat(body["finished_at"])
    store = (finished - started).total_seconds() - timings["child"]
    return {
        "upload->done": total,
        "queue wait": timings["queue_wait"],
        "sandbox start": timings.get("sandbox_start", 0.0),
        "import": timings["import"],
        "analysis": analysis,
        "child exit+store": store,
        "child total": timings["child"],
    }


async def get_load(url: str, slug: str, clients: int, requests: int, limit_s: float) -> dict:
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + limit_s
    todo = iter(range(requests))

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for _ in todo:  # the shared iterator bounds the total count
            if time.monotonic() > deadline:
                return
            start = time.perf_counter()
            response = await client.get(f"{url}/api/v1/reports/{slug}")
            latencies.append(time.perf_counter() - start)
            errors += response.status_code != 200

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        start = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        elapsed = time.monotonic() - start
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "rps": len(latencies) / elapsed,
        "elapsed_s": elapsed,
    }


def _table(rows: list[dict[str, float]]) -> str:
    lines = ["| part | median s | min s | max s |", "|---|---|---|---|"]
    for key in rows[0]:
        values = [r[key] for r in rows]
        med = statistics.median(values)
        lines.append(f"| {key} | {med:.2f} | {min(values):.2f} | {max(values):.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inspector-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        proc, url = start_server(data_dir)
        try:
            with httpx.Client(timeout=60) as client:
                one_job(client, url)  # warm-up: page cache, first imports
                rows = [one_job(client, url) for _ in range(args.jobs)]
                slug = client.get(f"{url}/api/v1/reports?limit=1").json()["items"][0]["slug"]
            load = asyncio.run(get_load(url, slug, args.clients, args.requests, args.time_limit))
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"upload -> done, small .py model, {args.jobs} jobs after a warm-up (SQLite, bwrap):")
    print(_table(rows))
    print(
        f"\nGET /api/v1/reports/<slug> (done report), {args.clients} concurrent clients: "
        f"{load['requests']} requests in {load['elapsed_s']:.1f} s, {load['errors']} errors, "
        f"p50 {load['p50_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms, {load['rps']:.0f} req/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
