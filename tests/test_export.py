"""Export readiness: torch.export strict/non-strict, TorchScript script/trace, ONNX."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import export_models
import pytest
import torch

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.passes import export
from inspector.report import Report

USER_FILE = str(Path(export_models.__file__))
BRANCH_LINE = next(
    i for i, line in enumerate(Path(USER_FILE).read_text().splitlines(), 1) if "BRANCH_LINE" in line
)
HAS_ONNX = all(importlib.util.find_spec(m) for m in export.ONNX_MODULES)
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="onnx, onnxscript or onnxruntime missing")


def _run(model: torch.nn.Module, fake: bool = False) -> dict[str, object]:
    loaded = LoadedModel(model, "python", "export_models.py", user_files=[USER_FILE])
    inputs = Inputs((torch.randn(2, 8),), {})
    ctx = Context(loaded, InputFactory(), inputs, Options(fake=fake, export="all"), Report())
    export.run(ctx)
    return {t.target: t for t in ctx.report.export.targets}


def test_clean_model_exports_everywhere() -> None:
    targets = _run(export_models.Clean())
    for name in ("export-nonstrict", "export-strict", "torchscript-script", "torchscript-trace"):
        assert targets[name].ok is True, targets[name].error
    assert targets["onnx"].ok is (True if HAS_ONNX else None)


def test_data_dependent_branch_fails_strict_export_at_the_users_line() -> None:
    targets = _run(export_models.Branchy())
    strict = targets["export-strict"]
    assert strict.ok is False
    assert strict.location == f"export_models.py:{BRANCH_LINE}"
    # Tracing follows one branch silently: it "works", which is why script exists.
    assert targets["torchscript-trace"].ok is True


def test_a_failing_export_shows_the_users_line_in_the_graph_torch_printed() -> None:
    """The export is made first without each node's line; where it fails it is made again
    with them: the graph torch prints as it fails, in the error, names the user's line."""
    nonstrict = _run(export_models.Branchy())["export-nonstrict"]
    assert nonstrict.ok is False and nonstrict.location == f"export_models.py:{BRANCH_LINE}"
    assert f"export_models.py:{BRANCH_LINE} in forward" in nonstrict.error
    assert "No stacktrace found" not in nonstrict.error  # nothing of the lean attempt's


def test_a_lean_export_is_torchs_program_made_with_less(monkeypatch) -> None:
    """No node keeps its stack and the graph's code is made fewer times, the program the
    same node by node and in what it computes."""
    made = []
    python_code = torch.fx.Graph.python_code

    def counted(graph, *args, **kwargs):  # noqa: ANN001, ANN202 - torch's
        made.append(graph)
        return python_code(graph, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    model, x = export_models.Clean().eval(), torch.randn(2, 8)
    ctx = Context(LoadedModel(model, "python", "m.py"), InputFactory(), Inputs((x,), {}),
                  Options(), Report())  # fmt: skip
    lean = export._exported(ctx, strict=False, lean=True)
    lean_made, made[:] = len(made), []
    plain = torch.export.export(model, (x,), strict=False)
    assert lean_made < len(made)
    if hasattr(getattr(torch.fx, "config", None), "do_not_emit_stack_traces"):  # torch >= 2.6
        assert not any(n.meta.get("stack_trace") for n in lean.graph.nodes)
        assert any(n.meta.get("stack_trace") for n in plain.graph.nodes)
    nodes = [[(n.op, str(n.target), str(n.args), str(n.meta.get("val"))) for n in p.graph.nodes]
             for p in (lean, plain)]  # fmt: skip
    assert nodes[0] == nodes[1]
    torch.testing.assert_close(lean.module()(x), plain.module()(x), rtol=0, atol=0)


def test_try_except_fails_scripting() -> None:
    targets = _run(export_models.Unscriptable())
    script = targets["torchscript-script"]
    assert script.ok is False
    assert "try" in script.error.lower()
    assert targets["export-strict"].ok is True


def test_fake_mode_skips_with_a_reason() -> None:
    targets = _run(export_models.Clean(), fake=True)
    assert all(t.ok is None and "fake" in t.error for t in targets.values())


@needs_onnx
def test_onnx_failure_names_the_cause() -> None:
    onnx = _run(export_models.Branchy())["onnx"]
    assert onnx.ok is False
    assert "caused by" in onnx.error


def test_failed_targets_become_info_findings() -> None:
    from inspector.rules.export import export_failed

    model = export_models.Branchy()
    loaded = LoadedModel(model, "python", "export_models.py", user_files=[USER_FILE])
    options = Options(export="all")
    ctx = Context(loaded, InputFactory(), Inputs((torch.randn(2, 8),), {}), options, Report())
    export.run(ctx)
    found = list(export_failed(ctx, ctx.report))
    failed = [t.target for t in ctx.report.export.targets if t.ok is False]
    assert [f.message.split(" ")[0] for f in found] == failed and "export-strict" in failed
    assert all(f.severity == "info" and f.rule == "export-failed" for f in found)
    assert any(f.where == f"export_models.py:{BRANCH_LINE}" for f in found)


def test_clean_model_gives_no_export_findings() -> None:
    from inspector.rules.export import export_failed

    loaded = LoadedModel(export_models.Clean(), "python", "m.py", user_files=[USER_FILE])
    ctx = Context(loaded, InputFactory(), Inputs((torch.randn(2, 8),), {}), Options(), Report())
    ctx.options.passes = None
    export.run(ctx)
    assert list(export_failed(ctx, ctx.report)) == []


def test_export_levels_choose_the_targets() -> None:
    loaded = LoadedModel(export_models.Clean(), "python", "m.py", user_files=[USER_FILE])
    chosen = {}
    for level in ("none", "fast", "all"):
        ctx = Context(
            loaded, InputFactory(), Inputs((torch.randn(2, 8),), {}), Options(export=level),
            Report(),
        )  # fmt: skip
        export.run(ctx)
        chosen[level] = [t.target for t in ctx.report.export.targets]
    assert chosen["none"] == []
    # fast: what torch recommends; TorchScript (deprecated) and the slow exporters at all
    assert chosen["fast"] == ["export-nonstrict"]
    assert chosen["all"] == [
        "export-nonstrict", "export-strict", "torchscript-script", "torchscript-trace", "onnx",
    ]  # fmt: skip


class BatchFactory(InputFactory):
    """x = [B, 8] with the named dim B."""

    def __init__(self, batch: int) -> None:
        super().__init__({"B": batch})

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", self.dims["B"])
        return Inputs((torch.randn(b, 8),), {}, dims={"B": b})


def _checked(model: torch.nn.Module, batch: int = 8, level: str = "fast") -> tuple[dict, list]:
    from inspector.rules.export import export_mismatch

    loaded = LoadedModel(model, "python", "export_models.py", user_files=[USER_FILE])
    factory = BatchFactory(batch)
    ctx = Context(loaded, factory, factory.build(), Options(export=level), Report())
    export.run(ctx)
    return {t.target: t for t in ctx.report.export.targets}, list(export_mismatch(ctx, ctx.report))


def test_exports_are_run_beside_eager_at_the_sample_and_a_changed_dim() -> None:
    targets, found = _checked(export_models.Clean(), level="all")
    for name in ("export-nonstrict", "torchscript-script", "torchscript-trace"):
        # B: 8 -> 4 (perturbed_value halves an even dim); float32 both ways, same kernels
        assert targets[name].checked == ["sample", "B=4"], name
        assert targets[name].mismatch is None and targets[name].max_abs_diff < 1e-5, name
    assert found == []


def test_a_trace_that_baked_in_a_size_branch_is_caught() -> None:
    targets, found = _checked(export_models.SizeBranch(), level="all")
    trace = targets["torchscript-trace"]
    # traced at B=8 (the `> 4` side); at B=4 eager negates, the trace does not: the
    # difference is twice the largest output
    assert trace.ok and trace.mismatch.startswith("B=4: differs from eager by up to")
    assert targets["torchscript-script"].mismatch is None  # scripting keeps the branch
    assert "fails" in targets["export-nonstrict"].mismatch  # export guards B > 4
    by_target = {f.where: f for f in found}
    assert by_target["torchscript-trace"].severity == "warning"
    assert "torch.jit.script or torch.export" in by_target["torchscript-trace"].fix
    # strict export guards B > 4 as non-strict does; ONNX, exported from torch.export at
    # B=8, baked the branch as the trace did (its own test: below)
    assert set(by_target) == {"torchscript-trace", "export-nonstrict", "export-strict", "onnx"}


@needs_onnx
def test_onnx_runs_in_onnxruntime_beside_eager_with_the_batch_dynamic() -> None:
    targets, found = _checked(export_models.Clean(), level="all")
    onnx = targets["onnx"]
    # B: 8 -> 4 runs on the same program: its batch axis was exported dynamic
    assert onnx.ok and onnx.checked == ["sample", "B=4"] and onnx.mismatch is None
    assert onnx.max_abs_diff < 1e-5  # float32 in onnxruntime and eager
    assert found == []


@needs_onnx
def test_onnx_that_baked_in_a_branch_is_caught() -> None:
    targets, found = _checked(export_models.SizeBranch(), level="all")
    onnx = targets["onnx"]
    assert onnx.ok and onnx.mismatch.startswith("B=4: differs from eager by up to")
    # exported at B=8 (`> 4`: fc(x)); at B=4 eager gives -fc(x): |fc - (-fc)| = 2 |fc|
    largest = float(onnx.mismatch.split("largest eager value ")[1].rstrip(")"))
    # the message rounds to 3 significant digits: 1.1 stands for 1.095..1.105
    assert onnx.max_abs_diff == pytest.approx(2 * largest, rel=5e-3)
    [finding] = [f for f in found if f.where == "onnx"]
    assert finding.severity == "warning" and "dynamic_shapes" in finding.fix


@needs_onnx
def test_onnx_that_baked_in_the_batch_size_is_caught() -> None:
    targets, _ = _checked(export_models.BakedBatch(), level="all")
    onnx = targets["onnx"]
    # int(x.shape[0]) specialises B to 8: onnxruntime refuses a batch of 4
    assert onnx.ok and onnx.mismatch.startswith("B=4: fails:")
    assert onnx.checked == ["sample", "B=4"] and onnx.max_abs_diff < 1e-5  # the sample


def test_onnx_without_onnxruntime_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxruntime" else real(name, *a),
    )
    onnx = _run(export_models.Clean())["onnx"]
    assert onnx.ok is None and onnx.error.startswith("not attempted: onnxruntime not installed")
    assert "[export]" in onnx.error


def test_an_export_the_capture_saw_fail_is_made_once(monkeypatch) -> None:
    """Where the capture stage's own export failed (the detectors'), the target is made as
    it always was at once, not lean and then again."""
    from inspector.context import CaptureResult
    from inspector.report import CaptureAttempt

    calls = []
    real = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = export_models.Branchy()
    loaded = LoadedModel(model, "python", "export_models.py", user_files=[USER_FILE])
    ctx = Context(loaded, InputFactory(), Inputs((torch.randn(2, 8),), {}), Options(), Report())
    assert _targets(ctx)["export-nonstrict"].ok is False and len(calls) == 2  # lean, then as ever
    calls.clear()
    ctx.capture = CaptureResult(
        method="hooks", attempts=[CaptureAttempt(method="export", ok=False)]
    )
    nonstrict = _targets(ctx)["export-nonstrict"]
    assert nonstrict.ok is False and len(calls) == 1
    assert f"export_models.py:{BRANCH_LINE} in forward" in nonstrict.error


def _targets(ctx: Context) -> dict[str, object]:
    export.run(ctx)
    return {t.target: t for t in ctx.report.export.targets}
