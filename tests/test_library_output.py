"""What torch.export prints while it fails (its partial graph, 180 KB on Faster R-CNN) stays
off the terminal and reaches the report's attempt message, first and last lines only."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch
from torch import nn

from inspector import capture
from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.graph.exportcapture import export_graph
from inspector.libraryoutput import library_output_captured, printed, printed_summary
from inspector.passes import export
from inspector.report import Report

DUMP = [f"    add_{i}: 'f32[2, 2]' = torch.ops.aten.add.Tensor(x, {i})" for i in range(3000)]


def _noisy_failure(*args: object, **kwargs: object) -> None:
    """Like a failing torch.export: C++-level, logger and Python writes, then an error."""
    os.write(2, b"def forward(self, x):\n" + "\n".join(DUMP).encode() + b"\n")
    handler = logging.StreamHandler(sys.__stderr__)  # a handler holding the terminal
    log = logging.getLogger("test.noisy")
    log.addHandler(handler)
    try:
        log.error("    return (add_2999,)")
    finally:
        log.removeHandler(handler)
    print("Could not guard on data-dependent expression u0 > 4", file=sys.stderr)
    raise RuntimeError("GuardOnDataDependentSymNode: u0 > 4")


def test_summary_keeps_the_first_and_last_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(100))
    summary = printed_summary(text)
    assert summary.startswith(f"it printed {len(text):,} characters on stderr:\nline 0\n")
    # 4 first lines, then 100 - 4 - 12 = 84 left out, then the last 12
    assert "line 3\n... (84 lines left out) ...\nline 88\n" in summary
    assert summary.endswith("line 99")
    assert printed_summary("\x1b[2K progress bar\n\n") == ""


def test_everything_written_to_stderr_is_caught(capfd: pytest.CaptureFixture[str]) -> None:
    with library_output_captured() as out:
        os.write(2, b"from C++\n")
        print("from Python", file=sys.stderr)
    assert out.text == "from C++\nfrom Python\n"
    assert capfd.readouterr().err == ""


def test_a_failing_capture_export_keeps_its_dump_in_the_message(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.export, "export", _noisy_failure)
    with pytest.raises(RuntimeError) as caught:
        export_graph(nn.Linear(2, 2), (torch.randn(2, 2),), {})
    assert capfd.readouterr().err == ""  # nothing reached the terminal
    message = capture._message(caught.value)
    assert message.startswith("GuardOnDataDependentSymNode: u0 > 4\n(it printed ")
    assert "def forward(self, x):" in message and "return (add_2999,)" in message
    assert "Could not guard on data-dependent expression u0 > 4" in message
    assert "lines left out" in message and len(message) < 2500
    assert len(printed(caught.value)) > 100_000  # the whole dump was caught


def test_the_export_pass_keeps_the_dump_off_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.export, "export", _noisy_failure)
    loaded = LoadedModel(nn.Linear(2, 2), "python", "m.py")
    ctx = Context(loaded, InputFactory(), Inputs((torch.randn(2, 2),), {}), Options(), Report())
    lean = lambda ctx, dynamic: export._exported(ctx, strict=False, lean=True)  # noqa: E731
    target = export._try(ctx, "export-nonstrict", lean, [], {})
    assert capfd.readouterr().err == ""
    assert target.ok is False and "return (add_2999,)" in target.error


def test_log_lines_keep_their_level_without_time_and_process() -> None:
    """Two reports of one model carry the same message: torch's log prefix held the
    time and the process id."""
    text = (
        "W1204 18:07:32.634000 15177 torch/fx/experimental/symbolic_shapes.py:8866] "
        "Unable to find user code corresponding to {u0}\n"
        "def forward(self, x):\n"
    )
    summary = printed_summary(text)
    assert summary.splitlines()[1:] == [
        "W torch/fx/experimental/symbolic_shapes.py:8866] Unable to find user code "
        "corresponding to {u0}",
        "def forward(self, x):",
    ]
