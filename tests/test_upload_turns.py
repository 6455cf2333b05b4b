"""A burst of uploads is handled UPLOADS_AT_ONCE at a time (the rest wait on the event loop),
and every one of them is still accepted."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from api_support import MLP_SOURCE, SPEC, api_env

import server.api.create as create


def test_a_burst_of_uploads_is_handled_a_few_at_a_time(tmp_path, monkeypatch):
    inside, most, lock = 0, 0, threading.Lock()
    stage = create._stage_model

    def counted_stage(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the real one, counted
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)  # long enough for the others to pile up
        try:
            return stage(*args, **kwargs)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(create, "_stage_model", counted_stage)
    with api_env("sqlite", tmp_path, monkeypatch) as env:
        transport = httpx.ASGITransport(app=env.client.app)

        async def burst() -> list[int]:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

                async def one(i: int) -> int:
                    files = {"model": ("model.py", MLP_SOURCE + f"# {i}\n".encode())}
                    data = {"entrypoint": "model.py:Net", "input": SPEC}
                    return (
                        await client.post("/api/v1/reports", files=files, data=data)
                    ).status_code

                return await asyncio.gather(*(one(i) for i in range(12)))

        statuses = asyncio.run(burst())
    assert statuses == [201] * 12 and len(env.enqueued) == 12
    assert most == create.UPLOADS_AT_ONCE  # 12 at once, never more than 4 inside
