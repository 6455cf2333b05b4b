"""Service benchmark: upload -> done for a small model against a cold `import torch`, with
fresh job children and with the zygote; and GET latency under load.

    .venv/bin/python bench/service.py [--jobs 5] [--launch both|fresh|zygote]
                                      [--clients 50] [--requests 2000]

For each launch mode (INSPECTOR_JOB_LAUNCH) it starts a real `inspector serve` (SQLite,
embedded worker, bubblewrap sandbox) on a free loopback port in a temporary data dir, then:
1. uploads a small .py model (a 3-layer MLP) `--jobs` times, one after another, after one
   warm-up job (for the zygote: its start, while the worker idles), each one right after a
   cold `python -c "import torch"` (so the two are timed interleaved, in the same minutes),
   and times upload -> done as a client sees it, with the breakdown the worker records:
   queue wait, zygote wait, sandbox start (spawn or fork -> the child's first line), import
   (torch and the pipeline), each analysis stage, store (child exit -> row written);
2. (the last mode) runs `--clients` concurrent clients doing `GET /api/v1/reports/<slug>`
   until `--requests` are done or `--time-limit` seconds pass; p50/p99 and throughput.
Medians are compared as ratios: upload -> done / cold import, per mode.
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
PIPELINE_STAGES = ("import", "queue_wait", "sandbox_start", "child", "zygote_wait")
ANALYSIS_STAGES = ("load", "capture", "graph", "memory", "gradients", "numerics", "modes",
                   "export", "serving", "findings")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: Path, launch: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INSPECTOR_DATA_DIR": str(data_dir)}
    env["INSPECTOR_DEVICE"] = "cpu"
    env["INSPECTOR_JOB_LAUNCH"] = launch
    code = f"from server.cli_commands import serve; raise SystemExit(serve('127.0.0.1', {port}))"
    log = open(data_dir.parent / "serve.log", "wb")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=log)
    return proc, healthy(proc, port, data_dir.parent / "serve.log")


def healthy(proc: subprocess.Popen, port: int, log: Path) -> str:
    """The server's URL once `/healthz` answers (90 s at most; else it is killed)."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start; see {log}")


def one_job(client: httpx.Client, url: str) -> dict[str, float]:
    """Upload, poll every 20 ms until done; the seconds of each part."""
    start = time.monotonic()
    files = {"model": ("model.py", MODEL)}
    # rerun: the same bytes again would be answered with the first job's report (result_key)
    data = {"entrypoint": "model.py:Net", "rerun": "true"}
    created = client.post(f"{url}/api/v1/reports", files=files, data=data)
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


def cold_import() -> float:
    """Seconds of `python -c "import torch"` in a new interpreter."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.monotonic() - start


def _breakdown(body: dict, total: float) -> dict[str, float]:
    timings = body["report"]["meta"]["timings_s"]
    analysis = sum(v for k, v in timings.items() if k not in PIPELINE_STAGES)
    started = dt.datetime.fromisoformat(body["started_at"])
    finished = dt.datetime.fromisoformat(body["finished_at"])
    store = (finished - started).total_seconds() - timings["child"]
    row = {
        "upload->done": total,
        "queue wait": timings["queue_wait"],
        "zygote wait": timings.get("zygote_wait", 0.0),
        "sandbox start": timings.get("sandbox_start", 0.0),
        "import": timings["import"],
        "analysis": analysis,
    }
    row.update({f"  {stage}": timings.get(stage, 0.0) for stage in ANALYSIS_STAGES})
    row.update({"child exit+store": store, "child total": timings["child"]})
    return row


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


def _table(rows: dict[str, list[dict[str, float]]]) -> str:
    """One column of medians (min-max) per launch mode."""
    modes = list(rows)
    lines = ["| part | " + " | ".join(f"{m} median s (min-max)" for m in modes) + " |"]
    lines.append("|---|" + "---:|" * len(modes))
    for key in rows[modes[0]][0]:
        cells = []
        for mode in modes:
            values = [r[key] for r in rows[mode]]
            med = statistics.median(values)
            cells.append(f"{med:.2f} ({min(values):.2f}-{max(values):.2f})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


class _Server:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def run_mode(launch: str, jobs: int, tmp: Path) -> tuple[list[dict], list[float], str, _Server]:
    """`jobs` timed uploads on a server in `launch` mode, each after a cold import."""
    data_dir = tmp / launch / "data"
    data_dir.mkdir(parents=True)
    proc, url = start_server(data_dir, launch)
    rows, imports = [], []
    try:
        with httpx.Client(timeout=300) as client:
            one_job(client, url)  # warm-up: page cache, first imports, the zygote's start
            for _ in range(jobs):
                imports.append(cold_import())
                rows.append(one_job(client, url))
            slug = client.get(f"{url}/api/v1/reports?limit=1").json()["items"][0]["slug"]
    except BaseException:
        proc.terminate()
        raise
    return rows, imports, slug, _Server(proc, url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--launch", choices=("both", "fresh", "zygote"), default="both")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    modes = ["fresh", "zygote"] if args.launch == "both" else [args.launch]
    rows, imports, load = {}, {}, None
    with tempfile.TemporaryDirectory(prefix="inspector-bench-") as tmp:
        for i, mode in enumerate(modes):
            rows[mode], imports[mode], slug, server = run_mode(mode, args.jobs, Path(tmp))
            try:
                if i == len(modes) - 1 and args.requests > 0:
                    limit = args.time_limit
                    load = asyncio.run(
                        get_load(server.url, slug, args.clients, args.requests, limit)
                    )
            finally:
                server.stop()
    print(f"upload -> done, 3-layer MLP .py model, {args.jobs} jobs after a warm-up "
          "(SQLite, bwrap), each after a cold `python -c 'import torch'`:")  # fmt: skip
    print(_table(rows))
    for mode in modes:
        done = statistics.median(r["upload->done"] for r in rows[mode])
        cold = statistics.median(imports[mode])
        print(f"\n{mode}: upload -> done {done:.2f} s / cold import torch {cold:.2f} s "
              f"= {done / cold:.2f} (medians of {args.jobs}, interleaved)")  # fmt: skip
    if load is not None:
        print(
            f"\nGET /api/v1/reports/<slug> (done report), {args.clients} concurrent clients: "
            f"{load['requests']} requests in {load['elapsed_s']:.1f} s, {load['errors']} errors, "
            f"p50 {load['p50_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms, {load['rps']:.0f} req/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
