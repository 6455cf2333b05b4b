"""Benchmark: upload -> done through two real servers side by side, one "before" and one
"after" (another tree, or other settings of this one), uploads alternating between them so
both share the same minutes of a noisy machine.

Each server is a real `inspector serve` (SQLite, embedded worker, zygote, bubblewrap
sandbox) on a free loopback port with its own data dir. After one warm-up upload each (the
zygote gets ready), every case is uploaded `--rounds` times to each, with `rerun` (the same
bytes again would be answered with the first report). Printed: each upload's wall as the
client sees it and the job child's seconds; then per case the medians and after / before.

    .venv/bin/python bench/service_ab.py --before-env INSPECTOR_JOB_THREADS=2
    .venv/bin/python bench/service_ab.py --before /tmp/base53 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from service import free_port, healthy  # noqa: E402

MLP = b"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
"""
MOBILENET = b"""
import torchvision


def model():
    return torchvision.models.mobilenet_v3_small()
"""
# name -> (file name, bytes, entrypoint, input spec)
CASES = {
    "resnet18": (
        "resnet.py", (ROOT / "examples" / "resnet.py").read_bytes(), "resnet.py:resnet18",
        '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 8}}',
    ),
    "mobilenet_v3_small": (
        "mbv3.py", MOBILENET, "mbv3.py:model",
        '{"x": {"shape": ["B", 3, 224, 224]}, "dims": {"B": 2}}',
    ),
    "mlp": ("model.py", MLP, "model.py:Net", '{"x": {"shape": ["B", 784]}, "dims": {"B": 64}}'),
}  # fmt: skip


def start_server(tree: Path, data_dir: Path, extra: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INSPECTOR_")}
    env.update(extra)
    env.update(PYTHONPATH=str(tree), INSPECTOR_DATA_DIR=str(data_dir), INSPECTOR_DEVICE="cpu")
    code = f"from server.cli_commands import serve; raise SystemExit(serve('127.0.0.1', {port}))"
    log = open(data_dir.parent / "serve.log", "wb")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tree, stdout=log, stderr=log)
    return proc, healthy(proc, port, data_dir.parent / "serve.log")


def one_upload(client: httpx.Client, url: str, case: str) -> tuple[float, float]:
    """(upload -> done as the client sees it, the job child's seconds)."""
    name, data, entry, spec = CASES[case]
    start = time.monotonic()
    form = {"entrypoint": entry, "input": spec, "rerun": "true"}
    created = client.post(f"{url}/api/v1/reports", files={"model": (name, data)}, data=form)
    created.raise_for_status()
    slug = created.json()["slug"]
    while (body := client.get(f"{url}/api/v1/reports/{slug}").json())["status"] in (
        "queued",
        "running",
    ):
        time.sleep(0.05)
    wall = time.monotonic() - start
    if body["status"] != "done":
        raise SystemExit(f"{case}: the job ended {body['status']}: {body.get('error')}")
    report = body.get("report") or client.get(f"{url}/api/v1/reports/{slug}").json()["report"]
    return wall, report["meta"]["timings_s"].get("child", 0.0)


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=str(ROOT), help="the tree of the 'before' server")
    parser.add_argument("--before-env", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--after-env", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = {
        "before": (Path(args.before), _env(args.before_env)),
        "after": (ROOT, _env(args.after_env)),
    }
    cases = args.cases.split(",")
    servers = {}
    with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=900) as client:
        try:
            for side, (tree, extra) in sides.items():
                data_dir = Path(tmp, side, "data")
                data_dir.parent.mkdir(parents=True)
                servers[side] = start_server(tree, data_dir, extra)
            for _, url in servers.values():
                one_upload(client, url, "mlp")  # the zygote's warm-up
            walls: dict[tuple[str, str], list[float]] = {}
            for n in range(args.rounds):
                for case in cases:
                    for side, (_, url) in servers.items():
                        wall, child = one_upload(client, url, case)
                        walls.setdefault((case, side), []).append(wall)
                        seconds = f"{wall:6.2f} s (child {child:.2f} s)"
                        print(f"round {n + 1} {case:20s} {side:6s} {seconds}", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait()
    print(f"\nbefore: {args.before} {args.before_env}; after: {ROOT} {args.after_env}")
    print("| case | before s (median) | after s (median) | after / before |")
    print("|---|---:|---:|---:|")
    for case in cases:
        before = statistics.median(walls[(case, "before")])
        after = statistics.median(walls[(case, "after")])
        print(f"| {case} | {before:.2f} | {after:.2f} | **{after / before:.2f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
