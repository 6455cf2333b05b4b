"""Native libraries' chatter stays off the terminal; everything else written to stderr stays."""

from __future__ import annotations

import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from inspector.nativenoise import native_noise_filtered


def test_noise_lines_are_dropped_and_other_lines_kept_in_order(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with native_noise_filtered():
        os.write(2, b"USDT:2026 profiler_start\nuser line 1\n")
        os.write(2, b"STAGE:2026 warm up\nuser line 2\n")
    assert capfd.readouterr().err == "user line 1\nuser line 2\n"


def test_the_real_profiler_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        torch.randn(4).sum()
    noisy = capfd.readouterr().err
    with native_noise_filtered(), profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        torch.randn(4).sum()
    assert "USDT" not in capfd.readouterr().err
    assert "USDT" in noisy  # the noise this guards against (kineto on torch 2.13); if it
    # stops printing, this test says so and the filter can go


def test_stderr_is_restored_after_an_exception(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), native_noise_filtered():
        raise RuntimeError("boom")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
