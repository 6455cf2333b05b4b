"""The load bench (bench/load.py) at a size CI affords: 12 jobs at once to Postgres + Redis
with 3 workers while 20 readers fetch a 1,000-node report; again with workers that share no
directory with the server (uploads from the database's blob store). The full 200 jobs and 100
readers run as `.venv/bin/python bench/load.py` (bench/RESULTS.md): ~9 s of CPU per job
makes 200 jobs take ~20 min on 2 cores."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT

from server.sandbox import sandbox_available


def _bench():  # noqa: ANN202 - the bench script, imported by path
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "bench" / "load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.skipif(not sandbox_available()[0], reason=sandbox_available()[1])
@pytest.mark.parametrize("where", [[], ["--blob-store", "database", "--own-dirs"]],
                         ids=["shared-dir", "own-dirs"])  # fmt: skip
def test_concurrent_jobs_each_run_once_while_readers_read(tmp_path, postgres_url, redis_url, where):
    bench = _bench()
    args = bench.parser().parse_args(
        ["--jobs", "12", "--workers", "3", "--readers", "20", "--max-reads", "5000",
         "--time-limit", "480", "--postgres", postgres_url, "--redis", redis_url, *where]
    )  # fmt: skip
    summary = bench.run_load(args, tmp_path)
    if where:  # workers that share no directory: every upload came from the database
        assert summary["database_blobs"] == 7  # 6 jobs share one model, 6 have their own
        assert summary["server_upload_files"] == 0
        # Each worker cached what it ran: the 7 blobs, the shared one on up to 3 workers.
        assert 7 <= sum(summary["worker_cache_blobs"]) <= 7 + 2, summary["worker_cache_blobs"]
    assert summary["statuses"] == {"done": 12}, summary
    assert summary["attempts_max"] == 1  # each job claimed once
    assert summary["sandbox_starts"] == 12 == summary["distinct_jobs_started"]  # ran once
    assert summary["reads"] > 20 and summary["read_errors"] == 0, summary["read_error_samples"]
    assert summary["json_p99_ms"] is not None and summary["page_p99_ms"] is not None
    # Full GETs came gzipped (the 1,000-node JSON is ~1.2 MB as is), revalidations as 304s.
    assert 0 < summary["bytes_by_kind"]["json"] < 300_000, summary["bytes_by_kind"]
    assert summary["reads_by_kind"]["json_304"] > 0 and summary["bytes_by_kind"]["json_304"] == 0
    assert "json" not in summary["revalidations_changed"]  # a done report's JSON never changes
