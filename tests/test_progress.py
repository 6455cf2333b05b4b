"""Progress that tells the truth: each stage starts at the expected share of the time of
the stages before it, from recent reports' stage timings or the documented table."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hostile.kit import add_job, make_settings
from hostile.server import running_server, upload, wait_final

from inspector.job import Progress
from inspector.passes import PASSES
from inspector.progress import DEFAULT_STAGE_SECONDS, StagePlan
from server.db import session_scope
from server.jobs import session_factory_for
from server.models import Job, utcnow
from server.sandbox import sandbox_available
from server.stagetimes import recent_stage_seconds

PIPELINE = ["start", "imported", "load", "capture", *(name for name, _ in PASSES), "done"]


def test_a_stage_starts_at_the_share_of_the_stages_before_it():
    plan = StagePlan(["load", "capture", "memory", "export"], {"load": 1, "capture": 1,
                     "memory": 6, "export": 2})  # fmt: skip
    # 10 s in all: capture starts after load's 1 s (10%), memory after 2 s, export after 8 s.
    assert [plan.percent(s) for s in ("load", "capture", "memory", "export", "done")] == [
        0, 10, 20, 80, 100,
    ]  # fmt: skip
    table = StagePlan(["load", "capture", "graph"])  # the documented table: 0.5, 0.5, 0.2 s
    assert table.percent("capture") == round(100 * 0.5 / (0.5 + 0.5 + 0.2))  # 42
    odd = StagePlan(["load", "capture"], {"load": -5, "capture": "x", "other": 3})
    assert odd.percent("capture") == 50  # bad values: the table's, 0.5 s each


def test_the_job_gives_the_import_its_share_first(tmp_path):
    stages = {k: 0.0 for k in DEFAULT_STAGE_SECONDS}
    progress = Progress(tmp_path / "p.jsonl", {**stages, "import": 3.0, "load": 1.0})
    for stage, percent in [("start", 0), ("imported", 0), ("load", 0), ("capture", 100)]:
        progress(stage, percent)
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    # 3 s of import before 1 s of analysis: the analysis' 0-100% is the bar's 75-100%.
    assert [(x["stage"], x["percent"]) for x in lines] == [
        ("start", 0), ("imported", 75), ("load", 75), ("capture", 100),
    ]  # fmt: skip
    warm = Progress(tmp_path / "w.jsonl", {"import": 0.0})  # forked by a zygote
    assert warm.import_share == 0


def test_recent_stage_seconds_are_medians_of_done_reports(tmp_path):
    settings = make_settings(tmp_path)
    factory = session_factory_for(str(settings.database_url))
    times = [{"load": 1.0, "memory": 4.0, "queue_wait": 9.0}, {"load": 3.0}, {"load": 2.0}]
    for i, timings in enumerate([*times, {"load": 50.0}]):
        job_id = add_job(settings)
        status = "failed" if i == 3 else "done"  # a failed job's timings do not count
        with session_scope(factory) as session:
            job = session.get(Job, job_id)
            job.status, job.finished_at = status, utcnow()
            job.report_json = {"meta": {"timings_s": timings}}
    with session_scope(factory) as session:
        seconds = recent_stage_seconds(session)
    assert seconds == {"load": 2.0, "memory": 4.0}  # median of 1, 3, 2; not queue_wait


SLOW_MODEL = b"""
import time

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        time.sleep(0.3)  # every real forward takes a while: each stage is seen running
        return self.fc(x).relu()


def example_inputs():
    return (torch.randn(2, 8),)
"""


def _watch(url: str, slug: str, timeout_s: float = 300) -> list[tuple[str, int]]:
    """(stage, percent) as the API shows them, each change once, until the job ends."""
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{url}/api/v1/reports/{slug}", timeout=30).json()
        if body["stage"] and (not seen or seen[-1] != (body["stage"], body["progress"])):
            seen.append((body["stage"], body["progress"]))
        if body["status"] not in ("queued", "running"):
            return seen
        time.sleep(0.03)
    raise AssertionError(f"not done in {timeout_s} s: {seen}")


@pytest.mark.slow
@pytest.mark.skipif(not sandbox_available()[0], reason="needs the sandbox")
def test_progress_moves_through_the_stages_in_order_with_their_shares(tmp_path):
    with running_server(tmp_path / "data", INSPECTOR_DEVICE="cpu") as url:
        runs = []
        for i in range(2):  # the second job's shares are learned from the first's timings
            # the same bytes again would reuse the first report: run it again
            slug = upload(url, SLOW_MODEL, **({"rerun": "true"} if i else {})).json()["slug"]
            runs.append((_watch(url, slug), wait_final(url, slug)))
    for seen, body in runs:
        assert body["status"] == "done", body.get("error")
        assert {stage for stage, _ in seen} - set(PIPELINE) <= {"starting"}  # the claim's
        stages = [stage for stage, _ in seen if stage in PIPELINE]
        assert stages == sorted(stages, key=PIPELINE.index)  # in pipeline order
        assert len(stages) == len(set(stages))  # each once
        # The stages that run the model many times are seen running (a quick one may pass
        # between two polls of the worker on a busy machine).
        assert {"memory", "done"} <= set(stages) and len(stages) >= 5, seen
        percents = [p for _, p in seen]
        assert percents == sorted(percents) and percents[-1] == 100
    first_timings = runs[0][1]["report"]["meta"]["timings_s"]
    ran = [n for n, _ in PASSES if n in first_timings]  # the passes the job's options asked for
    plan = StagePlan(["load", "capture", *ran], first_timings)
    # The zygote imported already: the analysis' shares are the whole bar.
    second = dict(runs[1][0])
    checked = [stage for stage in ("memory", "gradients", "numerics", "modes") if stage in second]
    expected = {s: plan.percent(s) for s in checked}
    assert checked and {s: second[s] for s in checked} == expected, (second, first_timings, ran)
    default = StagePlan(["load", "capture", *ran])
    assert dict(runs[0][0])["memory"] == default.percent("memory")  # no report yet: the table


def test_every_stage_has_an_expected_share():
    """The worker learns only the stages of this table: a pass missing from it would be
    sized by a default instead of its recent timings."""
    from inspector.progress import DEFAULT_STAGE_SECONDS

    assert set(DEFAULT_STAGE_SECONDS) == {"import", "load", "capture", *(n for n, _ in PASSES)}
