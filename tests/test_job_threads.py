"""A job child's intra-op threads: one on a small CPU machine, so the job forks its passes
and runs the independent ones beside the line on the other cores (server/sandbox/threads.py);
the cores on a large one; an operator's INSPECTOR_JOB_THREADS over both."""

from __future__ import annotations

import pytest

from server.sandbox.limits import Limits
from server.sandbox.threads import FEW_CORES, job_threads
from server.settings import Settings


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 1), (6, 6), (8, 8), (64, 8)])
def test_one_thread_on_a_small_machine_the_cores_on_a_large_one(cores, threads):
    assert FEW_CORES == 4
    assert job_threads(None, cores) == threads


def test_a_gpu_worker_keeps_its_cores():
    assert job_threads(None, 2, gpu=True) == 2 and job_threads(None, 16, gpu=True) == 8


def test_the_operator_chooses(monkeypatch, tmp_path):
    monkeypatch.setenv("INSPECTOR_JOB_THREADS", "3")
    limits = Limits.from_settings(Settings(data_dir=tmp_path))
    assert limits.threads == 3
    assert job_threads(limits.threads, 2) == 3 and job_threads(limits.threads, 64) == 3
    monkeypatch.delenv("INSPECTOR_JOB_THREADS")
    assert Limits.from_settings(Settings(data_dir=tmp_path)).threads is None


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_wrong_choice_stops_the_service_at_start(monkeypatch, tmp_path, value):
    monkeypatch.setenv("INSPECTOR_JOB_THREADS", value)
    with pytest.raises(ValueError, match="INSPECTOR_JOB_THREADS must be 1 or more"):
        Settings(data_dir=tmp_path)


def test_one_thread_forks_the_passes_as_the_bench_measures_them():
    """The job child's one thread is what turns per-pass isolation (and the lanes) on."""
    import torch

    from inspector.isolation import isolation_mode

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert isolation_mode(None, False, "cpu") == (True, "fork per pass")
        torch.set_num_threads(2)
        assert isolation_mode(None, False, "cpu")[0] is False
    finally:
        torch.set_num_threads(before)
