"""The pipeline: load -> inputs -> capture -> passes -> Report."""

from __future__ import annotations

import datetime as dt
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from inspector import __version__
from inspector.capture import capture_graph
from inspector.context import Context, Options
from inspector.fit import check_inputs_fit
from inspector.inputspec import parse_input
from inspector.loaders.compiled import compiled_note, unwrap_compiled
from inspector.loaders.load import load_model
from inspector.passes import PASSES
from inspector.report import Meta, Report

__all__ = ["inspect_model", "resolve_device"]


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


def _new_fake_mode():  # noqa: ANN202 - torch's private type
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Real tensors (weights of a model built for real) become constants of the fake run.
    return FakeTensorMode(allow_non_fake_inputs=True)


def inspect_model(
    model: str, input: str | None = None, options: Options | None = None, progress=None
) -> Report:
    """Inspect `model` (file.py:entry, a .pt2, preset:NAME, a config.json) on `input`.

    `input` is an input spec (JSON text) or a tensor file path; None uses the model's own
    example inputs. `progress(stage, percent)` is called as stages start.
    """
    options = options or Options()
    options.device = resolve_device(options.device)
    if _builds_from_config(model) and not options.fake:
        # A config describes a model of any size: build it without weights, always.
        options.fake = True
    report = Report(meta=_meta(model, input, options))
    timings = report.meta.timings_s
    notify = progress or (lambda stage, percent: None)
    torch.manual_seed(options.seed)
    fake_mode = _new_fake_mode() if options.fake else None

    notify("load", 0)
    with _timed(timings, "load"):
        loaded = load_model(model, fake_mode=fake_mode, device=options.device)
        loaded.model, compiled = unwrap_compiled(loaded.model)
        if compiled:
            report.meta.warnings.append(compiled_note(compiled))
        factory = parse_input(input, loaded)
        with fake_mode or nullcontext():
            inputs = factory.build(device=options.device)
            # Name the layer that rejects the inputs before any pass trips over them.
            check_inputs_fit(loaded.model, inputs, loaded.user_files)
    report.meta.source_kind = loaded.source_kind
    report.meta.source_name = loaded.source_name
    report.meta.source_sha256 = loaded.sha256
    report.meta.entrypoint = loaded.entrypoint
    report.meta.input_spec = factory.spec
    report.meta.dims = dict(inputs.dims)

    ctx = Context(loaded, factory, inputs, options, report, fake_mode=fake_mode)
    notify("capture", 10)
    with _timed(timings, "capture"):
        ctx.capture = capture_graph(ctx)
    report.capture.method = ctx.capture.method
    report.capture.attempts = ctx.capture.attempts

    for i, (name, run) in enumerate(PASSES):
        if not options.wants(name):
            continue
        notify(name, 20 + 75 * i // max(len(PASSES), 1))
        with _timed(timings, name):
            run(ctx)
    report.capture.node_count = len(report.nodes)
    notify("done", 100)
    return report


def _builds_from_config(model: str) -> bool:
    return model.startswith("preset:") or model.lower().endswith(".json")


def _meta(model: str, input: str | None, options: Options) -> Meta:
    device_name = platform.processor() or platform.machine()
    if options.device == "cuda":
        device_name = torch.cuda.get_device_name()
    return Meta(
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
        },
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
