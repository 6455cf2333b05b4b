"""The renderers on hand-built reports: numbers formatted right, depth folding,
optional sections, Markdown deltas and escaping."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from inspector.render.format import format_flops, format_shape, percent_change
from inspector.render.markdown import escape_markdown, render_markdown
from inspector.render.terminal import AUTO_DEPTH, BIG_TREE, render_terminal, visible_modules
from inspector.report import (
    Capture,
    CaptureAttempt,
    ErrorInfo,
    Export,
    ExportTarget,
    Finding,
    Memory,
    MemoryAdvice,
    Meta,
    Module,
    Report,
    Totals,
)

GIB = 1024**3
RESNET18_PARAMS = 11_689_512  # torchvision's published count
# conv1 output at B=32: 32 * 64 * 112 * 112 floats * 4 bytes = 102,760,448 = 98.00 MiB
CONV1_OUT_BYTES = 32 * 64 * 112 * 112 * 4
# conv1 FLOPs at B=1: 2 * 64 * 112 * 112 outputs * (3 * 7 * 7) MACs each = 236,027,904
CONV1_FLOPS = 2 * 64 * 112 * 112 * 3 * 7 * 7


def make_report(**memory: object) -> Report:
    """A ResNet-like report with a 3-level tree, findings and export results."""
    modules = [
        Module(path="", type="ResNet18", params=RESNET18_PARAMS, output_shapes=[["B", 1000]]),
        Module(path="conv1", type="Conv2d", depth=1, params=9_408, flops_forward=CONV1_FLOPS,
               output_shapes=[["B", 64, 112, 112]], output_bytes=CONV1_OUT_BYTES),
        Module(path="layer1", type="Sequential", depth=1, params=147_968),
        Module(path="layer1.0", type="BasicBlock", depth=2, params=73_984),
        Module(path="layer1.0.conv1", type="Conv2d", depth=3, params=36_864),
        Module(path="layer1.0.bn1", type="BatchNorm2d", depth=3, params=128),
        Module(path="fc", type="Linear", depth=1, params=513_000),
    ]  # fmt: skip
    for m in modules:
        m.trainable_params = m.params
    return Report(
        meta=Meta(inspector_version="0.1.0", device="cpu", source_kind="python",
                  source_name="resnet.py:resnet18", entrypoint="resnet.py:resnet18",
                  input_spec={"x": {"shape": ["B", 3, 224, 224]}}, dims={"B": 32}),
        capture=Capture(method="export", node_count=7, attempts=[
            CaptureAttempt(method="fx", ok=False, error_type="TraceError",
                           error="control flow on a traced value", location="model.py:12"),
            CaptureAttempt(method="export", ok=True),
        ]),
        totals=Totals(params=RESNET18_PARAMS, trainable_params=RESNET18_PARAMS,
                      param_bytes=RESNET18_PARAMS * 4,
                      param_bytes_by_dtype={"float32": RESNET18_PARAMS * 4},
                      flops_forward=3_627_000_000, output_bytes=5 * 2**20),
        modules=modules,
        memory=Memory(**memory),
        findings=[
            Finding(rule="dead-relu", severity="warning", where="layer1.0.relu",
                    message="40% of features never fire", fix="check the init"),
            Finding(rule="unused-param", severity="error", where="fc",
                    message="fc.bias gets no gradient", fix="remove it"),
            Finding(rule="note", severity="info", message="just so you know"),
        ],
        export=Export(targets=[
            ExportTarget(target="export-strict", ok=True),
            ExportTarget(target="torchscript-script", ok=False, location="model.py:30",
                         error="Python builtin <zip> is not supported\nmore lines"),
        ]),
    )  # fmt: skip


FULL_MEMORY = dict(
    optimizer="adamw",
    param_bytes=RESNET18_PARAMS * 4,
    grad_bytes=RESNET18_PARAMS * 4,
    optimizer_bytes=2 * RESNET18_PARAMS * 4,  # adamw: exp_avg + exp_avg_sq
    saved_activation_bytes=3 * GIB,
    forward_peak_bytes=GIB // 2,
    forward_peak_node="conv1",
    train_peak_bytes=4 * GIB,
    train_peak_node="layer1.0.conv1",
    train_peak_phase="backward",
    batch_dim="B",
    max_batch={str(24 * GIB): 190, str(80 * GIB): 640},
    advice=[
        MemoryAdvice(kind="checkpoint", saving_bytes=2 * 2**20, message="checkpoint layer1"),
        MemoryAdvice(kind="checkpoint-all", saving_bytes=8 * 2**20, message="checkpoint all"),
    ],
)


def render(report: Report, **kwargs: object) -> str:
    buffer = io.StringIO()
    render_terminal(report, console=Console(file=buffer, width=200), **kwargs)
    return buffer.getvalue()


# -- helpers ------------------------------------------------------------------------------


def test_format_helpers() -> None:
    assert format_flops(CONV1_FLOPS) == "236.03 MFLOPs"
    assert format_flops(4_110_000_000) == "4.11 GFLOPs"
    assert format_flops(512) == "512 FLOPs"
    assert format_shape(["B", 64, 112, 112]) == "[B, 64, 112, 112]"
    assert percent_change(150, 100) == 50.0
    assert percent_change(5, 0) is None


# -- terminal -----------------------------------------------------------------------------


def test_terminal_formats_the_key_numbers() -> None:
    out = render(make_report(**FULL_MEMORY))
    assert "11.69M" in out  # 11,689,512 params
    assert "11,689,512" in out
    assert "98.00 MiB" in out  # CONV1_OUT_BYTES / 2**20 = 98.0
    assert "236.03 MFLOPs" in out
    assert "[B, 64, 112, 112]" in out
    assert "resnet.py:resnet18" in out
    assert "failed fx: TraceError at model.py:12" in out


def test_totals_row_is_report_totals_not_a_sum_of_rows() -> None:
    report = make_report()
    total_line = next(line for line in render(report).splitlines() if line.startswith("Total"))
    assert "11.69M" in total_line
    assert "3.63 GFLOPs" in total_line  # totals.flops_forward, not conv1's 236 MFLOPs
    assert "5.00 MiB" in total_line  # totals.output_bytes = 5 * 2**20, not the rows' sum


def test_depth_folds_deeper_rows_into_their_ancestor() -> None:
    report = make_report()
    full = render(report)
    assert "BatchNorm2d" in full and "BasicBlock" in full
    folded = render(report, depth=1)
    assert "BasicBlock" not in folded and "BatchNorm2d" not in folded
    assert re.search(r"layer1 \(\+3\)\s+Sequential", folded)  # layer1.0, .conv1, .bn1
    assert "showing 4 of 7 modules" in folded and "--depth" in folded


def test_visible_modules_counts_hidden_descendants() -> None:
    rows = visible_modules(make_report().modules, depth=2)
    assert [r.module.path for r in rows] == ["", "conv1", "layer1", "layer1.0", "fc"]
    assert {r.module.path: r.hidden for r in rows}["layer1.0"] == 2


def big_report() -> Report:
    # 20 blocks x 5 stages x 1 seq x 48 leaves: 1 + 20 + 100 + 100 + 4,800 = 5,021 modules.
    modules = [Module(path="", type="Big", params=4_800)]
    for b in range(20):
        modules.append(Module(path=f"b{b}", type="Block", params=240))
        for s in range(5):
            modules.append(Module(path=f"b{b}.s{s}", type="Stage", params=48))
            modules.append(Module(path=f"b{b}.s{s}.m", type="Seq", params=48))
            modules += [
                Module(path=f"b{b}.s{s}.m.l{i}", type="Linear", params=1) for i in range(48)
            ]
    return Report(modules=modules, totals=Totals(params=4_800, trainable_params=4_800))


def test_big_tree_is_folded_by_default_and_stays_fast() -> None:
    report = big_report()
    assert len(report.modules) == 5_021 > BIG_TREE
    start = time.process_time()  # CPU time: the bound holds on a busy machine too
    out = render(report)
    assert time.process_time() - start < 3.0
    assert f"showing 221 of 5,021 modules (depth <= {AUTO_DEPTH})" in out
    assert "Linear" not in out and re.search(r"m \(\+48\)\s+Seq", out)


@pytest.mark.slow
def test_big_tree_unfolded() -> None:
    start = time.process_time()
    everything = render(big_report(), depth=10**6)
    assert time.process_time() - start < 10.0
    assert everything.count("Linear") == 4_800 and "showing" not in everything


def test_optional_columns_and_sections_only_with_data() -> None:
    bare = render(make_report())
    header = next(line for line in bare.splitlines() if line.startswith("Module"))
    for absent in ("Saved for bwd", "Grad norm", "Trainable"):
        assert absent not in header
    assert "Memory" not in bare and "Largest batch" not in bare and "Frozen" not in bare
    report = make_report(**FULL_MEMORY)
    report.modules[1].saved_activation_bytes = 1024
    report.modules[1].grad_norm = 0.00123
    report.totals.frozen_params = 10
    full = render(report)
    for present in ("Saved for bwd", "Grad norm", "0.00123", "Trainable", "Frozen"):
        assert present in full


def test_memory_block() -> None:
    out = render(make_report(**FULL_MEMORY))
    assert "Optimizer state" in out and "89.18 MiB" in out  # 2 * 11,689,512 * 4 / 2**20
    assert "Training-step peak" in out and "4.00 GiB at layer1.0.conv1 (backward)" in out
    assert "Forward peak" in out and "512.00 MiB at conv1" in out
    assert "24 GiB: 190 · 80 GiB: 640 (batch = B)" in out
    # advice, biggest saving first
    assert out.index("-8.00 MiB  checkpoint all") < out.index("-2.00 MiB  checkpoint layer1")


def test_findings_by_severity_then_export() -> None:
    out = render(make_report())
    assert out.index("unused-param") < out.index("dead-relu") < out.index("just so you know")
    assert "fix: remove it" in out
    assert "torchscript-script" in out and "fails at model.py:30: Python builtin <zip>" in out
    assert "more lines" not in out  # first line of the error only


def test_user_names_are_not_rich_markup() -> None:
    report = make_report()
    report.modules[2].path = "[bold]evil"
    report.modules[2].output_shapes = [["batch", 64]]
    out = render(report)
    assert "[bold]evil" in out
    assert "[batch, 64]" in out


def test_failed_report() -> None:
    report = Report(status="failed", error=ErrorInfo(kind="user_error", message="no entry x"))
    out = render(report)
    assert "failed (user_error): no entry x" in out


# -- markdown -----------------------------------------------------------------------------


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|")]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


def test_markdown_key_figures() -> None:
    md = render_markdown(make_report(**FULL_MEMORY))
    rows = {_cells(r)[0]: _cells(r)[1] for r in _table_rows(md)[2:]}
    assert rows["Parameters"] == "11.69M"
    assert rows["Training-step peak"] == "4.00 GiB"
    assert rows["Largest batch @ 24 GiB"] == "190"
    assert rows["Largest batch @ 80 GiB"] == "640"
    assert "**Capture:** export (failed: fx: TraceError at model.py:12" in md


def test_markdown_skips_figures_not_computed() -> None:
    md = render_markdown(make_report())  # no memory section
    assert "Training-step peak" not in md and "Parameters" in md


def test_markdown_deltas_against_baseline() -> None:
    report = make_report(**FULL_MEMORY)
    base_memory = dict(FULL_MEMORY, train_peak_bytes=8 * GIB)
    base_memory["max_batch"] = {str(24 * GIB): 95, str(80 * GIB): 640}
    baseline = make_report(**base_memory)
    baseline.totals.params = 10_000_000
    baseline.totals.flops_forward = 0
    md = render_markdown(report, baseline=baseline)
    deltas = {_cells(r)[0]: _cells(r)[3] for r in _table_rows(md)[2:]}
    # (11,689,512 - 10,000,000) / 10,000,000 = +16.9%; the difference 1,689,512 = 1.69M
    assert deltas["Parameters"] == "▲ +1.69M (+16.9%)"
    # (4 - 8) / 8 = -50.0%
    assert deltas["Training-step peak"] == "▼ −4.00 GiB (−50.0%)"
    # (190 - 95) / 95 = +100.0%
    assert deltas["Largest batch @ 24 GiB"] == "▲ +95 (+100.0%)"
    assert deltas["Largest batch @ 80 GiB"] == "no change"
    assert deltas["Forward FLOPs"] == "▲ +3.63 GFLOPs (new)"  # the baseline had 0


def test_markdown_escapes_user_names() -> None:
    report = make_report()
    report.meta.source_name = "model.py:<script>alert(1)</script>"
    report.findings = [
        Finding(rule="r", severity="error", where="a|b", message="*bold* [x](javascript:1)")
    ]
    md = render_markdown(report, link="javascript:alert(1)")
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "a\\|b" in md and "\\*bold\\*" in md and "\\[x\\]" in md
    assert not re.search(r"(?<!\\)\]\(javascript", md)  # no live link anywhere
    for row in _table_rows(md):  # every row keeps its 2 columns
        assert len(_cells(row)) == 2
    assert escape_markdown("two\nlines") == "two lines"


def test_markdown_findings_limit_and_link() -> None:
    report = make_report()
    report.findings = [Finding(rule=f"w{i}", severity="warning", message="m") for i in range(12)]
    report.findings.append(Finding(rule="i", severity="info", message="hidden"))
    md = render_markdown(report, link="https://inspector.example/r/abc def")
    assert "**Findings:** 12 warnings, 1 info" in md
    assert md.count("- **warning**") == 10 and "- and 2 more" in md
    assert "hidden" not in md
    assert "[Full report](https://inspector.example/r/abc%20def)" in md


def test_markdown_failed_report() -> None:
    report = Report(status="failed", error=ErrorInfo(kind="timed_out", message="ran 600 s"))
    md = render_markdown(report, link="/r/x")
    assert "**Failed** (timed\\_out): ran 600 s" in md and "[Full report](/r/x)" in md


def test_markdown_imports_neither_torch_nor_rich() -> None:
    code = (
        "import sys, inspector.render.markdown; "
        "bad = [m for m in ('torch', 'rich') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _with_breaks(count: int) -> Report:
    from inspector.report import Compile, GraphBreak, Recompile

    report = make_report()
    breaks = [GraphBreak(reason=f"reason {i}", where=f"model.py:{10 + i}", code=f"line {i}")
              for i in range(count)]  # fmt: skip
    report.compile = Compile(
        computed=True, mode="train", graph_count=count + 1, graph_break_count=count,
        breaks=breaks, recompiles=[Recompile(dim="B", value=8, changed_to=4, recompiles=1,
                                             guards=["forward in model.py:5: size mismatch"])],
    )  # fmt: skip
    return report


def test_terminal_compile_section() -> None:
    out = render(_with_breaks(2))
    assert "torch.compile" in out and "3 graph(s), 2 graph break(s) (eager backend, train" in out
    assert "model.py:10" in out and "reason 0  line 0" in out and "model.py:11" in out
    assert "B 8 → 4" in out and "1 recompile(s): forward in model.py:5: size mismatch" in out
    assert "torch.compile" not in render(make_report())  # not checked: no section


def test_markdown_graph_breaks_and_their_delta() -> None:
    md = render_markdown(_with_breaks(3), baseline=_with_breaks(1))
    deltas = {_cells(r)[0]: _cells(r)[1:] for r in _table_rows(md)[2:]}
    # 3 breaks against 1: +2, +200.0%
    assert deltas["Graph breaks (torch.compile)"] == ["3", "1", "▲ +2 (+200.0%)"]
    assert "Graph breaks" not in render_markdown(make_report())  # not checked: no row


def test_export_at_the_default_level_says_where_the_other_targets_are() -> None:
    report = make_report()
    assert "with --export all" not in render(report)  # strict ran: the level was all
    report.export = Export(targets=[ExportTarget(target="export-nonstrict", ok=True)])
    out = render(report)
    assert "export-nonstrict" in out and "ok" in out
    assert "strict export, TorchScript and ONNX: with --export all" in out
