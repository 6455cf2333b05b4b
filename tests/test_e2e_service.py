"""Through HTTP with the real server, worker and sandbox: upload, poll, get the report.

SQLite (database and queue) by default; the same on Postgres, and with the Redis queue.
"""

from __future__ import annotations

import io
import secrets
import zipfile

import httpx
import pytest
from hostile.kit import TINY_MODEL, fresh_postgres
from hostile.server import running_server, upload, wait_final

from server.sandbox import sandbox_available

pytestmark = pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])


def _upload_and_check(url: str) -> None:
    response = upload(url, TINY_MODEL, name="tiny", tags="branch=main")
    assert response.status_code == 201, response.text
    slug = response.json()["slug"]
    body = wait_final(url, slug)
    assert body["status"] == "done", body.get("error")
    assert body["params"] == 8 * 4 + 4  # Linear(8, 4)
    assert body["flops_forward"] == 2 * 2 * 8 * 4  # 2 * B * in * out, B = 2 from example_inputs
    report = body["report"]
    assert report["status"] == "done" and report["capture"]["method"] is not None
    assert report["totals"]["params"] == 36
    # Dynamo runs inside the sandbox (seccomp, no network, rlimits): one graph, no break
    compiled = report["compile"]
    assert compiled["computed"] and compiled["error"] is None, compiled
    assert (compiled["graph_count"], compiled["graph_break_count"]) == (1, 0)
    assert report["meta"]["versions"]["torch"] == report["meta"]["torch_version"]
    assert "zygote_wait" in report["meta"]["timings_s"]  # forked by the worker's zygote
    # The report is reachable by its slug, immutable JSON, also as Markdown.
    again = httpx.get(f"{url}/api/v1/reports/{slug}", timeout=30).json()
    assert again["report"] == report
    markdown = httpx.get(f"{url}/api/v1/reports/{slug}/markdown", timeout=30)
    assert markdown.status_code == 200 and "36" in markdown.text


def test_upload_to_report_sqlite(tmp_path):
    with running_server(tmp_path / "data", INSPECTOR_DEVICE="cpu") as url:
        _upload_and_check(url)


# A package as it lives in a repository, named like a common module: absolute and relative
# imports, a nested package, example inputs from the model file.
PACKAGE = {
    "models/__init__.py": "",
    "models/layers.py": "from torch import nn\n\nWIDTH = 8\n\n\ndef block():\n"
    "    return nn.Linear(WIDTH, 4)\n",
    "models/heads/__init__.py": "",
    "models/heads/head.py": "from torch import nn\n\n\ndef head():\n    return nn.Linear(4, 2)\n",
    "models/model.py": """\
import torch
from torch import nn

from models.heads.head import head
from .layers import WIDTH, block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(block(), nn.ReLU(), head())

    def forward(self, x):
        return self.body(x)


def example_inputs():
    return (torch.randn(2, WIDTH),)
""",
    "models/missing.py": "import torch\nfrom torch import nn\nimport no_such_lib\n\n"
    "Net = nn.Identity\n",
}


def zipped(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


@pytest.mark.slow
def test_zipped_package_loads_as_a_package_in_the_sandbox(tmp_path):
    data = zipped(PACKAGE)
    with running_server(tmp_path / "data", INSPECTOR_DEVICE="cpu") as url:
        ok = upload(url, data, filename="models.zip", entrypoint="models/model.py:Net")
        missing = upload(url, data, filename="models.zip", entrypoint="models/missing.py:Net")
        assert ok.status_code == 201 and missing.status_code == 201, ok.text + missing.text
        done = wait_final(url, ok.json()["slug"])
        failed = wait_final(url, missing.json()["slug"])
    assert done["status"] == "done", done.get("error")
    assert done["params"] == (8 * 4 + 4) + (4 * 2 + 2)  # Linear(8, 4) + Linear(4, 2) = 46
    assert failed["status"] == "failed"
    message = failed["error"]["message"]
    assert message.startswith("missing.py:3: No module named 'no_such_lib': the worker has torch ")
    assert message.endswith(
        "not no_such_lib.\n    import no_such_lib\n"
        "Vendor it into your upload or ask the operator to install it."
    )


@pytest.mark.slow
@pytest.mark.postgres
def test_upload_to_report_postgres(tmp_path, postgres_url):
    with fresh_postgres(postgres_url) as db_url:
        env = {"INSPECTOR_DATABASE_URL": db_url, "INSPECTOR_DEVICE": "cpu"}
        with running_server(tmp_path / "data", **env) as url:
            _upload_and_check(url)


@pytest.mark.slow
@pytest.mark.redis
def test_upload_to_report_with_the_redis_queue(tmp_path, redis_url):
    import redis

    queue = f"inspector-test-{secrets.token_hex(4)}"
    env = {"INSPECTOR_REDIS_URL": redis_url, "INSPECTOR_QUEUE_NAME": queue}
    try:
        with running_server(tmp_path / "data", INSPECTOR_DEVICE="cpu", **env) as url:
            _upload_and_check(url)
        assert not (tmp_path / "data" / "queue.db").exists()  # the queue lived in Redis
    finally:
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(f"*{queue}*"):
            client.delete(key)
