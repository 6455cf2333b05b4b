"""The pipeline: load -> inputs -> capture -> passes -> Report."""

from __future__ import annotations

import datetime as dt
import gc
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from inspector import __version__
from inspector.capture import capture_graph
from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options
from inspector.fakevalues import new_fake_mode
from inspector.fit import check_inputs_fit, fake_train_limit
from inspector.health.exportmatch import eager_copies, float_leaves
from inspector.inputspec import parse_input
from inspector.isolation import isolation_mode, run_passes
from inspector.loaders.compiled import compiled_note, unwrap_compiled
from inspector.loaders.load import load_model
from inspector.memory.inference import InferenceRecording, RecordedInference
from inspector.memory.namedblocks import match_blocks, named_blocks
from inspector.passes import BESIDE, PASSES, runs_model, wanted
from inspector.passes.measure import records_inference
from inspector.passes.modes import EvalRecorder, records_eval
from inspector.progress import StagePlan
from inspector.realcopy import needs_values, real_copy_decision
from inspector.report import Meta, Report
from inspector.schema.presets import PRESETS
from inspector.versions import versions

__all__ = ["inspect_model", "resolve_device", "finish_report"]


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        from inspector.errors import UserError

        raise UserError("--device cuda asked for, but torch sees no CUDA device here.")
    return device


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(timings.get(stage, 0.0) + time.perf_counter() - start, 4)


def inspect_model(
    model: str, input: str | None = None, options: Options | None = None, progress=None
) -> Report:
    """Inspect `model` (file.py:entry, a .pt2, preset:NAME, a config.json) on `input`.

    `input` is an input spec (JSON text) or a tensor file path; None uses the model's own
    example inputs. `progress(stage, percent)` is called as stages start; the percent is
    the expected share of the time before the stage (its `stage_seconds`, if it has them:
    expected seconds by stage, else inspector.progress's table).
    """
    with _earlier_objects_frozen():
        return _inspect(model, input, options or Options(), progress)


def _inspect(model: str, input: str | None, options: Options, progress) -> Report:  # noqa: ANN001
    options.device = resolve_device(options.device)
    if _builds_from_config(model) and not options.fake:
        # A config describes a model of any size: build it without weights, always.
        options.fake = True
    if not options.parallel:
        options.parallel = preset_plans(model)
    report = Report(meta=_meta(model, input, options))
    timings = report.meta.timings_s
    notify = progress or (lambda stage, percent: None)
    ran = [name for name, _ in PASSES if wanted(name, options)]
    plan = StagePlan(["load", "capture", *ran], getattr(progress, "stage_seconds", None))
    torch.manual_seed(options.seed)
    fake_mode = new_fake_mode() if options.fake else None

    notify("load", plan.percent("load"))
    with _timed(timings, "load"):
        loaded, factory, inputs, limit, forward_s, check = _load(
            model, input, options, fake_mode, report
        )
        if limit is not None and fake_mode is not None and needs_values(limit):
            real, note = real_copy_decision(limit, loaded.model)
            report.meta.warnings.append(note)
            if real:
                fake_mode = None
                options.fake = report.meta.fake = False  # meta.options keeps what was asked
                torch.manual_seed(options.seed)  # the same weights as a run without --fake
                loaded, factory, inputs, _, forward_s, check = _load(
                    model, input, options, None, report
                )
    report.meta.source_kind = loaded.source_kind
    report.meta.source_name = loaded.source_name
    report.meta.source_sha256 = loaded.sha256
    report.meta.entrypoint = loaded.entrypoint
    report.meta.input_spec = factory.spec
    report.meta.dims = dict(inputs.dims)
    if options.blocks:  # a pattern that matches nothing is the user's error, before any pass
        match_blocks(loaded.model, tuple(options.blocks))

    ctx = Context(loaded, factory, inputs, options, report, fake_mode=fake_mode)
    ctx.results.real_forward_seconds = forward_s if fake_mode is None else None
    ctx.results.eval_output, ctx.results.modes_eval = check.eval_output, check.modes_eval
    ctx.results.inference_recorded = check.inference
    notify("capture", plan.percent("capture"))
    with _timed(timings, "capture"):
        ctx.capture = capture_graph(ctx)
    report.capture.method = ctx.capture.method
    report.capture.attempts = ctx.capture.attempts
    report.capture.eval_mode = ctx.capture.eval_mode

    with named_blocks(options.blocks):
        _run_passes(ctx, notify, plan)
    notify("done", 100)
    return ctx.report


@dataclass
class _CheckRun:
    """What the load's input check, the seeded eval() forward, leaves for the passes."""

    eval_output: tuple[Inputs, Any] | None = None  # where the export checks compare with it
    modes_eval: EvalRecorder | None = None  # modes' eval() run, recorded
    inference: RecordedInference | None = None  # the measured step's inference forward


def _load(
    model: str, input: str | None, options: Options, fake_mode: Any, report: Report
) -> tuple[LoadedModel, InputFactory, Inputs, BaseException | None, float, _CheckRun]:
    """The model, its input factory and inputs, checked against each other; what a fake
    forward could not do (an op that needs values), if anything; the check's seconds; what
    the check's forward leaves for the passes."""
    loaded = load_model(model, fake_mode=fake_mode, device=options.device)
    loaded.model, compiled = unwrap_compiled(loaded.model)
    if compiled and compiled_note(compiled) not in report.meta.warnings:  # once, if reloaded
        report.meta.warnings.append(compiled_note(compiled))
    factory = parse_input(input, loaded)
    kept: list[Any] = []
    with fake_mode or nullcontext():
        inputs = factory.build(device=options.device)
        # Name the layer that rejects the inputs before any pass trips over them. It is
        # the seeded eval() forward the export checks compare with (kept, where small)
        # and modes' eval() run (recorded).
        keeper = _keeper(kept, loaded.model) if _keeps(options) else None
        recorder = EvalRecorder(inputs) if records_eval(options) else None
        # and the measured step's inference forward (inspector/memory/inference.py)
        recording = InferenceRecording(inputs) if records_inference(options) else None
        output: list[Any] = []  # the check's, where the recording reads it
        takers = (
            recorder.finish if recorder else None,
            keeper,
            output.append if recording else None,
        )
        start = time.perf_counter()
        with _collector_paused():
            limit = check_inputs_fit(
                loaded.model,
                inputs,
                loaded.user_files,
                seed=options.seed if keeper or recorder else None,
                keep=_keeping(*takers),
                watch=recorder.watching(loaded.model) if recorder else None,
                around_forward=recording.recorded() if recording else None,
            )
        # the model's forward, without the recording's copies: what a real run costs
        seconds = time.perf_counter() - start - (recorder.seconds if recorder else 0.0)
        if limit is None and fake_mode is not None:  # training may branch on values too
            limit = fake_train_limit(loaded.model, inputs)
    check = _CheckRun((inputs, kept[0]) if kept else None, recorder)
    if recording is not None and output:
        check.inference = recording.finish(output[0], recorder.copies() if recorder else ())
    return loaded, factory, inputs, limit, seconds, check


@contextmanager
def _earlier_objects_frozen() -> Iterator[None]:
    """What exists before the analysis (the imports: 336 K objects in a job forked from the
    warmed zygote) outlives it: out of the cycle collector's sight until it is done. Two
    full collections fell into ResNet-18's load, each scanning every imported object:
    0.4 s on the line before any pass could start. Unfrozen after, so a process that runs
    analyses one after another still collects what they leave; one that froze objects of
    its own is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cycle collector off while the check's forward is timed: a collection of what
    came before (a training step's objects, in the bench) fell into it and made it seven
    times as long (a 1,000-layer stack: 0.28 s against 0.039 s), and that time decides
    what runs beside what (inspector/realcost.py). The fake rerun it is compared with
    runs with the collector off too (inspector/memory/tracker.py)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _keeping(*takers: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """What hands the check's output to each of `takers`, in order."""

    def keep(output: Any) -> None:
        for take in takers:
            if take is not None:
                take(output)

    return keep


# The check's output is kept for the export checks through every pass: held where it is
# no larger than the weights, or small. A forward's activations, which every pass that
# runs the model holds, are several times the weights (GPT-2 small at [4, 512]: logits
# 411 MB, weights 498 MB; its eager forward in the export checks: 12 s of a 129 s report).
_KEPT_OUTPUT_BYTES = 64 << 20


def _keeps(options: Options) -> bool:
    return not options.fake and options.export != "none" and options.wants("export")


def _keeper(kept: list[Any], model: torch.nn.Module) -> Callable[[Any], None]:
    """What takes the check's output: its float tensors, copied into `kept` where they
    take no more than the weights (or _KEPT_OUTPUT_BYTES). Copies, as a model may update
    a tensor it returned in place on its next call (a static KV cache)."""
    weights = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    limit = max(_KEPT_OUTPUT_BYTES, sum(weights.values()))

    def keep(output: Any) -> None:
        floats = float_leaves(output)
        if sum(t.numel() * t.element_size() for t in floats) <= limit:
            kept.append(eager_copies(floats))

    return keep


def _run_passes(ctx: Context, notify, plan: StagePlan) -> None:  # noqa: ANN001 - progress
    """Every pass asked for, each in a forked child where that is cheap (a native crash
    then costs only its pass: inspector/isolation.py), else in this process."""
    selected = [
        (name, run, plan.percent(name), runs_model(name, ctx))
        for name, run in PASSES
        if wanted(name, ctx.options)
    ]
    isolate, why = isolation_mode(ctx.options.isolate, ctx.options.fake, ctx.options.device)
    ctx.report.meta.isolation = why

    def timed(stage: str):  # noqa: ANN202 - a context manager
        return _timed(ctx.report.meta.timings_s, stage)

    if isolate:
        run_passes(ctx, selected, notify, timed, finish_report, BESIDE)
        return
    for name, run, percent, _ in selected:
        notify(name, percent)
        with timed(name):
            run(ctx)
    finish_report(ctx)


def finish_report(ctx: Context) -> None:
    """What the report needs once every pass has run."""
    ctx.report.capture.node_count = len(ctx.report.nodes)


def preset_plans(model: str) -> list[str]:
    """The `--parallel` plans a preset's report has by default (none for most)."""
    preset = PRESETS.get(model.removeprefix("preset:")) if model.startswith("preset:") else None
    return list(preset.parallel) if preset else []


def _builds_from_config(model: str) -> bool:
    return model.startswith("preset:") or model.lower().endswith(".json")


def _meta(model: str, input: str | None, options: Options) -> Meta:
    device_name = platform.processor() or platform.machine()
    if options.device == "cuda":
        device_name = torch.cuda.get_device_name()
    return Meta(
        versions=versions(options.device),
        inspector_version=__version__,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        device=options.device,
        device_name=device_name,
        source_name=model,
        fake=options.fake,
        options={
            "optimizer": options.optimizer,
            "dtype": options.dtype,
            "fake": options.fake,
            "device": options.device,
            "budgets_bytes": options.budgets_bytes,
            "seed": options.seed,
            "compile": options.compile,
            **({"blocks": list(options.blocks)} if options.blocks else {}),
        },
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
