"""Passes in forked children: a native crash (SIGSEGV, SIGABRT) in one pass leaves a report
with that pass marked failed and every other section intact, in the library and the CLI."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import inspector.analyze as analyze
from inspector.analyze import inspect_model
from inspector.context import Options
from inspector.errors import InputMismatchError
from inspector.forkmap import _workers
from inspector.isolation import isolation_mode
from inspector.passes import PASSES

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "examples" / "mlp.py") + ":Net"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork on Linux")


def _segfault(ctx: object) -> None:
    ctypes.string_at(0)  # reads address 0: a real native segfault


def _abort(ctx: object) -> None:
    os.abort()


def _replace(monkeypatch: pytest.MonkeyPatch, name: str, run: object) -> None:
    passes = [(n, run if n == name else r) for n, r in PASSES]
    monkeypatch.setattr(analyze, "PASSES", passes)


@pytest.mark.parametrize(("crash", "signal_name"), [(_segfault, "SIGSEGV"), (_abort, "SIGABRT")])
def test_a_crashing_pass_costs_only_that_pass(
    monkeypatch: pytest.MonkeyPatch, crash: object, signal_name: str
) -> None:
    _replace(monkeypatch, "memory", crash)
    options = Options(passes={"graph", "memory", "gradients", "findings"}, isolate=True)
    report = inspect_model(MLP, None, options)
    assert report.meta.isolation == "fork per pass"
    assert list(report.meta.failed_passes) == ["memory"]
    assert report.meta.failed_passes["memory"].startswith(f"killed by {signal_name}")
    assert f"{crash.__name__} (test_isolation.py:" in report.meta.failed_passes["memory"]
    assert any("the memory pass crashed its process" in w for w in report.meta.warnings)
    # the sections before and after the crash are all there
    # 2 * 32 * (784*512 + 512*256 + 256*10) = 64 * 535,040 = 34,242,560
    assert report.totals.flops_forward == 34_242_560
    assert report.memory.train_peak_bytes is None
    assert report.gradients.computed and len(report.gradients.params) == 6
    assert report.capture.node_count == len(report.nodes) > 0


def test_a_pass_killed_from_outside_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(ctx: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does

    _replace(monkeypatch, "gradients", killed)
    report = inspect_model(MLP, None, Options(passes={"graph", "gradients"}, isolate=True))
    assert report.meta.failed_passes == {"gradients": "killed by SIGKILL (Killed)"}
    assert any("most often the kernel, out of memory" in w for w in report.meta.warnings)
    assert report.totals.flops_forward == 34_242_560


def test_isolated_and_in_process_reports_agree() -> None:
    # A forked pass runs on one thread (inspector/isolation.py); so does the in-process run
    # here, else float sums in another order differ in the last digits (run alone on 2
    # cores this compared 0.76904206737 with 0.76904206743).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _reports_agree()
    finally:
        torch.set_num_threads(threads)


def _reports_agree() -> None:
    passes = {"graph", "memory", "gradients", "findings"}
    one = inspect_model(MLP, None, Options(passes=passes, isolate=False, measure=False))
    forked = inspect_model(MLP, None, Options(passes=passes, isolate=True, measure=False))
    assert one.meta.isolation.startswith("off") and forked.meta.isolation == "fork per pass"
    assert _comparable(forked) == _comparable(one)


def _comparable(report: object) -> dict:
    """The report without its clocks and the isolation it ran under."""
    data = json.loads(report.to_json())
    for key in ("timings_s", "isolation", "created_at"):
        data["meta"].pop(key)
    for attempt in data["capture"]["attempts"]:
        attempt.pop("seconds")
    if data.get("compile"):
        data["compile"].pop("seconds")
    for target in data["export"]["targets"]:
        target.pop("seconds")
    return data


def test_an_exception_in_a_pass_reaches_the_caller_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def bad_input(ctx: object) -> None:
        raise InputMismatchError("the inputs do not fit `fc`", hint="check --input")

    _replace(monkeypatch, "gradients", bad_input)
    with pytest.raises(InputMismatchError) as caught:
        inspect_model(MLP, None, Options(passes={"graph", "gradients"}, isolate=True))
    assert caught.value.hint == "check --input"
    assert "bad_input" in str(caught.value.__cause__)  # the child's traceback, as the cause


def test_isolation_is_chosen_by_cost() -> None:
    assert isolation_mode(None, fake=True, device="cpu") == (True, "fork per pass")
    assert isolation_mode(None, fake=True, device="cuda")[0] is False  # CUDA cannot fork
    assert isolation_mode(False, fake=True, device="cpu")[0] is False


SEGV_MODEL = """
import ctypes

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        if isinstance(x, FakeTensor) and torch.is_grad_enabled():
            ctypes.string_at(0)  # crashes the memory pass's fake training step
        return self.fc(x)


def example_inputs():
    return torch.randn(2, 8)
"""


@pytest.mark.slow
def test_the_cli_survives_a_native_crash_and_names_the_line(tmp_path: Path) -> None:
    model = tmp_path / "segv.py"
    model.write_text(SEGV_MODEL)
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "inspector.cli", "inspect", f"{model}:Net"]
    argv += ["--passes", "graph,memory,findings", "--json", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["meta"]["failed_passes"]["memory"].startswith("killed by SIGSEGV")
    # 2 * 2 * 8 * 4 = 128
    assert report["totals"]["flops_forward"] == 128
    warnings = " ".join(report["meta"]["warnings"])
    assert "It happened under the model's code at segv.py:16." in warnings
    assert "the memory pass crashed its process" in done.stdout


@pytest.mark.slow
def test_a_sandboxed_job_survives_a_native_crash_in_a_pass(tmp_path: Path) -> None:
    """The service's job child (bwrap, seccomp, limits) forks its passes too: the job is
    done, its report marks the crashed pass."""
    from hostile.kit import add_job, get_job, make_settings

    from server.jobs import run_job
    from server.sandbox import sandbox_available

    available, why = sandbox_available()
    if not available:
        pytest.skip(why)
    settings = make_settings(tmp_path)
    options = {"optimizer": "adamw", "device": "cpu", "fake": True, "passes": ["graph", "memory"]}
    job_id = add_job(settings, SEGV_MODEL.encode(), options=options)
    assert run_job(job_id, settings) == "done"
    report = get_job(settings, job_id).report_json
    assert report["meta"]["isolation"] == "fork per pass"
    assert report["meta"]["failed_passes"]["memory"].startswith("killed by SIGSEGV")
    assert report["totals"]["flops_forward"] == 128  # 2 * 2 * 8 * 4


def _started_beside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A file each start of a lane of passes beside the others writes a line to: its
    passes in order (the start happens in a forked process of the chain, so a counter
    here would not see it)."""
    import inspector.beside as beside

    marks, start = tmp_path / "beside", beside._start

    def marked(ctx, lane, prefix, number):  # noqa: ANN001, ANN202
        with open(marks, "a") as f:
            f.write(" ".join(q.name for q in lane) + "\n")
        return start(ctx, lane, prefix, number)

    monkeypatch.setattr(beside, "_start", marked)
    return marks


def _replace_beside(monkeypatch: pytest.MonkeyPatch, name: str, compute: object) -> None:
    """Pass `name` computes with `compute`, in order and beside the others alike."""
    from dataclasses import replace

    _replace(monkeypatch, name, compute)
    besides = {**analyze.BESIDE, name: replace(analyze.BESIDE[name], compute=compute)}
    monkeypatch.setattr(analyze, "BESIDE", besides)


def _two_cores() -> bool:
    return _workers(2) >= 2


def test_passes_beside_give_the_report_in_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The measured step, the export checks, the probe and the compile pass start once
    the graph pass is done and run beside memory, gradients and modes
    (inspector/beside.py): the report equals the in-process one, in which each ran in its
    place (and the export checks compared with modes' eval run instead of their own).
    Real runs are taken as the dear ones (not this MLP's), so they share a lane per spare
    core."""
    import inspector.beside as beside

    marks = _started_beside(monkeypatch, tmp_path)
    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    passes = {"graph", "memory", "gradients", "modes", "export", "probe", "compile", "findings"}
    try:
        one = inspect_model(MLP, None, Options(passes=passes, isolate=False))
        forked = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    finally:
        torch.set_num_threads(threads)
    if _two_cores():  # the dearest first, in a lane for each spare core
        # (real runs the dear ones, as the rule is told here)
        assert marks.read_text().split() == ["compile", "export", "probe", "measure"]
        assert len(marks.read_text().splitlines()) == min(4, _workers(8) - 1)
    assert forked.memory.measured is not None
    assert forked.export.targets[0].ok and forked.export.targets[0].checked
    # measured by torch's profiler beside the passes, as the estimate's tracker says
    assert forked.memory.measured.saved_activation_bytes == forked.memory.saved_activation_bytes
    assert forked.compile.computed and forked.compile.graph_count == 1
    assert _comparable(forked) == _comparable(one)
    # each in its place
    stages = ["gradients", "modes", "export", "measure", "probe", "compile", "findings"]
    assert list(forked.meta.timings_s)[-7:] == stages


_PROBED = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        scale = nn.Parameter(torch.ones(8))  # made in forward
        position = torch.arange(8)  # no device
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return (scores @ x) * scale + position
"""


@pytest.mark.parametrize("fake_cheaper", [True, False])
def test_the_probe_beside_finds_what_it_finds_in_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_cheaper: bool
) -> None:
    """The probe's findings (a parameter made in forward, a tensor made without a device,
    an attention softmax and its saturation) are the same from its lane as in order, on
    a fake copy first or on the model itself."""
    import inspector.beside as beside
    from inspector.passes import probe

    model = tmp_path / "probed.py"
    model.write_text(_PROBED)
    marks = _started_beside(monkeypatch, tmp_path)
    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: True)
    monkeypatch.setattr(probe, "_fake_is_cheaper", lambda ctx: fake_cheaper)
    spec = '{"x": {"shape": [2, 5, 8]}}'
    passes = {"graph", "memory", "probe", "findings"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = inspect_model(f"{model}:Net", spec, Options(passes=passes, isolate=False))
        forked = inspect_model(f"{model}:Net", spec, Options(passes=passes, isolate=True))
    finally:
        torch.set_num_threads(threads)
    if _two_cores():
        assert "probe" in marks.read_text().split()
    rules = sorted(f.rule for f in forked.findings)
    for rule in ("param-created-in-forward", "hardcoded-device", "softmax-saturated"):
        assert rule in rules, rule
    assert _comparable(forked) == _comparable(one)


def test_the_lanes_start_once_the_graph_is_known(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The passes beside start after the graph pass, before the memory pass has run
    (sized by the graph's bounds): where real runs are the dear ones in one lane per
    spare core, else in a lane each (the work is Python, the memory pass's too); where
    the bounds leave no room, after the memory pass, as its estimate sizes them."""
    import inspector.beside as beside
    import inspector.memory.rough as rough

    if not _two_cores():
        pytest.skip("no spare core: nothing runs beside the line")
    starts, start = tmp_path / "starts", beside._start

    def marked(ctx, lane, prefix, number):  # noqa: ANN001, ANN202
        when = "before-memory" if ctx.results.memory is None else "after-memory"
        with open(starts, "a") as f:
            f.write(" ".join(q.name for q in lane) + f" {when}\n")
        return start(ctx, lane, prefix, number)

    monkeypatch.setattr(beside, "_start", marked)
    monkeypatch.setattr(beside, "_spare_cores", lambda: 1)
    passes = {"graph", "memory", "gradients", "compile", "findings"}
    reports = {}
    for dear in (True, False):
        monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx, dear=dear: dear)
        reports[dear] = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    # no bounds before the estimate, as for a layer kept whole that the graph cannot see into
    monkeypatch.setattr(rough, "_inside_bytes", lambda capture, nodes: None)
    reports["no bounds"] = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    assert starts.read_text().splitlines() == [
        "compile measure before-memory",  # one lane per spare core, the dearer first
        "compile before-memory",  # a lane per pass: the work is Python
        "measure before-memory",
        "compile after-memory",  # sized by the estimate
        "measure after-memory",
    ]
    for report in reports.values():
        assert report.memory.measured is not None and report.compile.computed
        assert not report.meta.failed_passes
    assert _comparable(reports[True]) == _comparable(reports[False])
    assert _comparable(reports["no bounds"]) == _comparable(reports[False])


@pytest.mark.parametrize("lane_late", [False, True])
def test_the_line_takes_over_the_passes_no_lane_has_begun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lane_late: bool
) -> None:
    """One lane (real runs the dear ones, as the rule is told here) runs the compile
    check, slowed by 2 s, then the export checks and the measured step. The line reaches
    the export checks long before the lane is done with the compile check, and runs them
    and the measured step queued behind in its own slot instead of waiting: each pass
    once, the report as in one process. `lane_late`: the lane comes to the measured step's
    claim 0.5 s after the export checks', when the line has collected what it ran, and is
    still alive (its findings take 1.5 s): on a busy machine, it ran the export checks and
    the measured step again."""
    import inspector.analyze as analyze
    import inspector.beside as beside
    import inspector.passes.dynamo as dynamo
    import inspector.passes.findings as findings

    if not _two_cores():
        pytest.skip("no spare core: nothing runs beside the line")
    runs, run_lane, run_claimed = tmp_path / "runs", beside._run_lane, beside._run_claimed
    claim, in_lane = beside._claim, []

    def lane(ctx, queued, write_fds, paths):  # noqa: ANN001, ANN202
        in_lane.append(True)  # in the lane's process only
        with open(runs, "a") as f:
            f.write(f"lane {os.getpid()}\n")
        return run_lane(ctx, queued, write_fds, paths)

    def late_claim(path: str) -> bool:
        if lane_late and in_lane and path.endswith(".measure"):
            time.sleep(0.5)
        return claim(path)

    def slow_findings(ctx) -> None:  # noqa: ANN001
        time.sleep(1.5)
        findings.run(ctx)

    def claimed(ctx, compute, path, lane_fds):  # noqa: ANN001, ANN202
        with open(runs, "a") as f:
            f.write(f"{path.rpartition('.')[2]} {os.getpid()}\n")
        return run_claimed(ctx, compute, path, lane_fds)

    def slow_compile(ctx):  # noqa: ANN001, ANN202
        time.sleep(2.0)
        return dynamo.compute(ctx)

    monkeypatch.setattr(beside, "_run_lane", lane)
    monkeypatch.setattr(beside, "_run_claimed", claimed)
    monkeypatch.setattr(beside, "_claim", late_claim)
    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: True)
    monkeypatch.setattr(beside, "_spare_cores", lambda: 1)
    passes = {"graph", "memory", "gradients", "modes", "export", "compile", "findings"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the forked passes run: the same sums, bit for bit
    try:
        one = inspect_model(MLP, None, Options(passes=passes, isolate=False))
        _replace_beside(monkeypatch, "compile", slow_compile)
        if lane_late:
            slowed = [(n, slow_findings if n == "findings" else r) for n, r in analyze.PASSES]
            monkeypatch.setattr(analyze, "PASSES", slowed)
        forked = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    finally:
        torch.set_num_threads(threads)
    by = dict(line.split() for line in runs.read_text().splitlines())
    assert sorted(by) == ["compile", "export", "lane", "measure"]  # each run once
    assert len(runs.read_text().splitlines()) == 4
    assert by["compile"] == by["lane"]  # its lane began it
    assert by["export"] != by["lane"] and by["measure"] != by["lane"]  # the line's
    assert forked.memory.measured is not None and forked.compile.computed
    assert _comparable(forked) == _comparable(one)
    stages = ["gradients", "modes", "export", "measure", "compile", "findings"]
    assert list(forked.meta.timings_s)[-6:] == stages  # each in its place
    assert forked.meta.timings_s["export"] > 1.0  # the line's wait for the slow lane


def test_a_pass_the_line_took_over_crashes_only_its_own_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The line takes over the export checks and the measured step while their lane is
    busy with a slow compile check; the measured step crashes natively in its own
    process: its section is missing and said so, the line and the other passes go on."""
    import inspector.beside as beside
    import inspector.passes.dynamo as dynamo

    if not _two_cores():
        pytest.skip("no spare core: nothing runs beside the line")

    def slow_compile(ctx):  # noqa: ANN001, ANN202
        time.sleep(2.0)
        return dynamo.compute(ctx)

    taken, take_over = tmp_path / "taken", beside.take_over

    def watched(ctx, name, waiting, started, besides):  # noqa: ANN001, ANN202
        take_over(ctx, name, waiting, started, besides)  # in a process of the chain: a file
        with open(taken, "a") as f:
            done = {name: waiting, **started}
            f.writelines(f"{each}\n" for each, s in done.items() if s.taken_over)

    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: True)
    monkeypatch.setattr(beside, "_spare_cores", lambda: 1)
    monkeypatch.setattr(beside, "take_over", watched)
    _replace_beside(monkeypatch, "compile", slow_compile)
    _replace_beside(monkeypatch, "measure", _segfault)
    passes = {"graph", "memory", "gradients", "export", "compile", "findings"}
    report = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    assert {"export", "measure"} <= set(taken.read_text().split())
    assert list(report.meta.failed_passes) == ["measure"]
    assert report.meta.failed_passes["measure"].startswith("killed by SIGSEGV")
    assert report.export.targets[0].ok and report.memory.measured is None
    assert report.compile.computed and report.compile.graph_count == 1
    assert any("the measure pass crashed its process" in w for w in report.meta.warnings)


def _kills_its_lane(ctx: object) -> None:
    """A pass that takes its lane down with it, as the kernel's OOM killer would."""
    os.kill(os.getppid(), signal.SIGKILL)  # the lane; this process dies with it
    time.sleep(10)


def test_a_killed_lane_costs_only_the_pass_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane dies while it runs the compile check, its first: it is reported killed,
    and the export checks and measured step queued behind it, which it never began, run
    in the line, in their place."""
    import inspector.beside as beside

    if not _two_cores():
        pytest.skip("no spare core: nothing runs beside the line")
    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: True)
    monkeypatch.setattr(beside, "_spare_cores", lambda: 1)
    _replace_beside(monkeypatch, "compile", _kills_its_lane)
    passes = {"graph", "memory", "gradients", "modes", "export", "compile", "findings"}
    report = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    assert list(report.meta.failed_passes) == ["compile"]
    assert report.meta.failed_passes["compile"].startswith("killed by SIGKILL")
    assert report.memory.measured is not None  # run in the line
    assert report.export.targets[0].ok and report.export.targets[0].checked


def test_a_crash_beside_costs_only_that_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import inspector.beside as beside

    marks = _started_beside(monkeypatch, tmp_path)
    monkeypatch.setattr(beside, "fake_step_is_cheaper", lambda ctx: False)
    _replace_beside(monkeypatch, "compile", _segfault)
    options = Options(passes={"graph", "memory", "gradients", "compile", "findings"}, isolate=True)
    report = inspect_model(MLP, None, options)
    if _two_cores():  # where real runs are the cheap ones, the work is Python: a lane each
        assert marks.read_text().splitlines() == ["compile", "measure"]
    assert list(report.meta.failed_passes) == ["compile"]
    assert report.meta.failed_passes["compile"].startswith("killed by SIGSEGV")
    assert "_segfault (test_isolation.py:" in report.meta.failed_passes["compile"]
    assert any("the compile pass crashed its process" in w for w in report.meta.warnings)
    assert report.totals.flops_forward == 34_242_560
    assert report.memory.train_peak_bytes > 0
    assert report.gradients.computed and len(report.gradients.params) == 6


def test_an_exception_beside_reaches_the_caller_as_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marks = _started_beside(monkeypatch, tmp_path)

    def bad_input(ctx: object) -> None:
        raise InputMismatchError("the inputs do not fit `fc`", hint="check --input")

    _replace_beside(monkeypatch, "compile", bad_input)
    options = Options(passes={"graph", "memory", "gradients", "compile"}, isolate=True)
    with pytest.raises(InputMismatchError) as caught:
        inspect_model(MLP, None, options)
    if _two_cores():
        assert marks.read_text().split() == ["compile", "measure"]
    assert caught.value.hint == "check --input"
    assert "bad_input" in str(caught.value.__cause__)


def test_without_room_in_the_budget_the_passes_run_in_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Beside the others a pass takes its memory at the same time as they do: a job
    budget (the service's MGI_JOB_MEMORY_BYTES) without room for the measured step and
    this process's own training step keeps every pass in its place, the same report."""
    from inspector.beside import MEMORY_ENV

    marks = _started_beside(monkeypatch, tmp_path)
    passes = {"graph", "memory", "gradients", "compile", "findings"}
    monkeypatch.setenv(MEMORY_ENV, "1")  # one byte: no room for anything beside
    report = inspect_model(MLP, None, Options(passes=passes, isolate=True))
    assert not marks.exists()
    assert report.memory.measured is not None and report.compile.computed
    # room for a step here and one beside (these are MiB; the process holds more)
    monkeypatch.setenv(MEMORY_ENV, str(64 << 30))
    inspect_model(MLP, None, Options(passes=passes, isolate=True))
    if _two_cores():
        assert marks.read_text().split() == ["compile", "measure"]


def test_the_export_checks_ask_room_for_three_inference_peaks() -> None:
    """Room for eager's kept outputs and the exported program's run (three inference
    peaks), whichever runs are the dear ones: where fake ones are, the export's tracing
    goes beside the memory pass's."""
    from types import SimpleNamespace

    from inspector.passes import export

    def ctx(rerun: float, forward: float) -> SimpleNamespace:
        return SimpleNamespace(
            fake_mode=None,
            report=SimpleNamespace(
                memory=SimpleNamespace(
                    forward_peak_bytes=1000, saved_activation_bytes=2000, train_peak_bytes=5000
                )
            ),
            results=SimpleNamespace(
                real_forward_seconds=forward,
                memory=SimpleNamespace(rerun_cost=rerun, on_fake=True),
            ),
        )

    assert export.needs(ctx(rerun=0.07, forward=0.2)) == 3000  # ResNet-18-like
    assert export.needs(ctx(rerun=1.0, forward=0.02)) == 3000  # a deep, narrow stack


_LATER_FORWARDS = """
import resource, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    from inspector.isolation import _keep_freed_memory
    _keep_freed_memory()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kept = [torch.ones(n << 20) for n in (16, 8, 12, 16, 4)]
    del kept
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


def _later_forward_faults(keep: bool) -> int:
    """Minor page faults of the last five of six "forwards" (tensors of 64, 32, 48, 64 and
    16 MB, all freed at each one's end), in a fresh interpreter (one whose heap is
    pytest's, inherited by a fork, may already hold a hole that fits a block). Where a
    kept heap places a forward's blocks varies from run to run (small objects torch makes
    during the first stay between them): a later forward faults 0, 4,096 or 12,288 pages
    here, 28,672 once on CI's machine, so the five are summed."""
    run = subprocess.run(
        [sys.executable, "-c", _LATER_FORWARDS, "keep" if keep else "free"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr
    return sum(int(count) for count in run.stdout.split()[1:])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_pass_process_keeps_what_it_frees_for_its_next_forward() -> None:
    """glibc gives each block of 32 MB or more back to the kernel when it is freed, so each
    later forward faults its pages in again (57,344 a forward here: 224 MB; at least the
    two 64 MB blocks, above any threshold glibc raises to); a pass's process keeps them
    (4,096 to 32,768 faults over the five here, against 286,720)."""
    pages_of_64_mb = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    again = _later_forward_faults(keep=False)
    assert again >= 5 * 2 * pages_of_64_mb
    assert _later_forward_faults(keep=True) < again // 3


def test_the_report_is_taken_without_waiting_for_the_processes_to_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process that finishes the run writes the report and says so through the pipe:
    the caller takes it at once, while the chain of pass processes exits, each after its
    child (each freeing the pages it touched: 87 ms of ResNet-18's report). Here every
    pass process takes 1.5 s to exit: the two-deep chain (graph, then gradients) would
    hold the caller 3 s; it is held less than one, and reaps its child later."""
    from inspector import isolation

    options = Options(passes={"graph", "gradients"}, isolate=True)
    inspect_model(MLP, None, options)  # warm: the timing below is the run's alone
    began = time.perf_counter()
    inspect_model(MLP, None, options)
    quick = time.perf_counter() - began
    exit_now = os._exit

    def slow_exit(code: int) -> None:
        time.sleep(1.5)
        exit_now(code)

    monkeypatch.setattr(os, "_exit", slow_exit)  # the forked children inherit it
    began = time.perf_counter()
    report = inspect_model(MLP, None, options)
    held = time.perf_counter() - began
    monkeypatch.undo()
    assert report.gradients.computed and report.totals.flops_forward == 34_242_560
    assert held < quick + 1.0, (held, quick)
    child = isolation._exiting[-1]  # not yet exited: reaped by a later run
    time.sleep(3.5)
    isolation._reap_exited()
    assert child not in isolation._exiting
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped: no zombie left


def test_passes_whose_forward_the_gradients_pass_ran_take_no_fork(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """numerics and modes run the model only where the gradients pass's forward did not
    record their runs: asked when the line reaches them, they then run in the process
    that ran the gradients pass (a fork cost the line 16-39 ms each). Without the
    gradients pass, numerics runs its own forward, in a process of its own."""

    def in_process(name: str, run: object) -> object:
        def recorded(ctx: object) -> None:
            (tmp_path / name).write_text(str(os.getpid()))
            run(ctx)

        return recorded

    passes = [(n, in_process(n, r)) for n, r in PASSES]
    monkeypatch.setattr(analyze, "PASSES", passes)
    wanted = {"graph", "gradients", "numerics", "modes"}
    report = inspect_model(MLP, None, Options(passes=wanted, isolate=True))
    pid = {name: (tmp_path / name).read_text() for name in wanted}
    assert pid["numerics"] == pid["modes"] == pid["gradients"] != pid["graph"]
    computed = [n.name for n in report.nodes if n.stats is not None]
    assert report.modes.computed and len(computed) == len(report.nodes) - 1  # not `output`

    alone = inspect_model(MLP, None, Options(passes={"graph", "numerics"}, isolate=True))
    assert (tmp_path / "numerics").read_text() != (tmp_path / "graph").read_text()
    assert [n.name for n in alone.nodes if n.stats is not None] == computed
