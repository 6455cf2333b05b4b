"""Train vs eval: the same seeded input in train() and eval(); the modules whose forward
depends on the mode, how far the outputs drift, the first node (module call) where the
two runs diverge, and BatchNorm inputs too small for batch statistics. Modes, BatchNorm
running stats and the RNG state are restored afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.context import Context
from inspector.health.maxdiff import all_close, float32_max_abs_diff
from inspector.health.modecheck import BatchNormInput, batchnorm_probe, mode_dependent
from inspector.health.outputs import flat_tensors, float_outputs
from inspector.health.state import preserved, rng_watched, seeded
from inspector.health.thresholds import resolve
from inspector.health.values import (
    NodeRef,
    call_name,
    module_calls,
    module_node_names,
    module_values,
    run_nodes,
)
from inspector.memory.allocations import leaving_ours_out, ours
from inspector.report import Node
from inspector.tracebacks import INTERNAL_NOTE, inspector_fault, user_location

__all__ = [
    "run",
    "runs_model",
    "FAKE_NOTE",
    "TrainRecorder",
    "EvalRecorder",
    "shares_train_forward",
]

FAKE_NOTE = "not computed: fake tensors carry no values (run without --fake)"
_MAX_KEPT_BYTES = 1 << 30  # node outputs kept from the train run to compare with eval


@dataclass
class _Run:
    values: dict[str, torch.Tensor] = field(default_factory=dict)  # in forward order
    paths: dict[str, str | None] = field(default_factory=dict)
    outputs: list[torch.Tensor] = field(default_factory=list)
    output: Any = None  # the forward's return value, as it returned it
    kept_bytes: int = 0
    drew: bool = False  # drew from the generators `seeded` seeds
    error: str | None = None
    internal: bool = False  # `error` is the inspector's own failure (a graph replay)
    # train values compared with the recorded eval run's as the forward made them, not
    # kept (`_Against`): name -> (max |train - eval|, closeness; None where not needed)
    compared: dict[str, tuple[float, bool | None]] = field(default_factory=dict)


class _Against:
    """The train() run's values compared with the eval() run's as the forward makes them,
    instead of copied for modes to compare later: ResNet-18 at [8, 3, 224, 224] copied
    every module's output (200 MB, 0.1 s of its gradients pass). The same figures as
    `_compare` works out from copies: each node's max |train - eval|, and closeness for
    the nodes before the first apart one in eval order (a node is tested unless one
    earlier in eval order was already found apart, so the first is always tested)."""

    def __init__(self, evaluated: _Run, th: dict) -> None:
        self.evaluated = evaluated.values
        self.order = {name: i for i, name in enumerate(evaluated.values)}
        self.th = th
        self.first_apart: int | None = None  # eval-order index of the earliest found apart

    def compare(self, run: _Run, ref: NodeRef, value: Any) -> None:
        expected = self.evaluated.get(ref.name)
        if expected is None or ref.name in run.compared:  # no eval value, or a later call
            return
        tensor = next((t for _, t in flat_tensors(value) if t.is_floating_point()), None)
        if tensor is None:
            return
        with torch.no_grad():
            tensor = tensor.detach()
            close = None
            index = self.order[ref.name]
            if self.first_apart is None or index < self.first_apart:
                close = _close(tensor, expected, self.th)
                if not close:
                    self.first_apart = index
            run.compared[ref.name] = (_max_diff(tensor, expected), close)


class TrainRecorder:
    """The train() run's values and BatchNorm inputs, recorded on the gradients pass's
    forward when that forward is this run's (`shares_train_forward`): modes then runs
    only its eval() forwards."""

    def __init__(self) -> None:
        self.run = _Run()
        self.batchnorm: dict[str, BatchNormInput] = {}
        self.finished = False  # the forward returned
        self._against: _Against | None = None  # the eval run modes will compare with

    @contextmanager
    def watching(self, ctx: Context) -> Iterator[None]:
        recorded = _recorded_eval(ctx)
        if recorded is not None:
            self._against = _Against(recorded.run(ctx), resolve(ctx.options))
        handles = batchnorm_probe(ctx.model, self.batchnorm)
        try:
            with module_values(ctx, self._keep):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _keep(self, ref: NodeRef, value: Any) -> None:
        # the copies are ours: unseen by the recorder that watches the user's ops, and
        # left out of a recorded step (inspector/memory/merged.py)
        with torch._C.DisableTorchFunction(), ours():
            if self._against is not None:
                self._against.compare(self.run, ref, value)
            else:
                _keep(self.run, ref, value)

    def finish(self, output: Any) -> None:
        # a recorded step's output is freed as its loss is formed: a copy is kept then
        keep = (lambda t: t.detach().clone()) if leaving_ours_out() else torch.Tensor.detach
        with torch._C.DisableTorchFunction(), ours():
            self.run.outputs = [keep(t) for _, t in float_outputs(output)]
        self.finished = True


class EvalRecorder:
    """The eval() run, recorded on the load's input check (inspector/fit.py): that check
    is the seeded eval() forward under no_grad that modes runs first, on the same inputs,
    so modes then runs no eval() forward of its own. The module calls are recorded by
    path and call number, and named as the report's nodes once the graph is captured.
    Values and outputs are copies: a model may update a tensor it returned in place."""

    def __init__(self, inputs: Any) -> None:
        self.inputs = inputs  # the inputs it ran on: the run stands for those only
        self.calls: list[tuple[str, int, torch.Tensor]] = []  # (path, call, value)
        self.kept_bytes = 0
        self.outputs: list[torch.Tensor] = []
        self.drew = False
        self.finished = False  # the forward returned
        self.seconds = 0.0  # spent recording: not the forward's own time

    @contextmanager
    def watching(self, model: torch.nn.Module) -> Iterator[None]:
        """Around the seeded forward, inside its seeding (for `drew`)."""

        def on_call(path: str, k: int, module: torch.nn.Module, output: Any) -> None:
            began = time.perf_counter()
            self._keep(path, k, output)
            self.seconds += time.perf_counter() - began

        with module_calls(model, on_call), rng_watched() as watch:
            yield
        self.drew = watch.drew

    def _keep(self, path: str, k: int, value: Any) -> None:
        # as modes' own run keeps them (`_keep`): a call's first float tensor, in order
        tensor = next((t for _, t in flat_tensors(value) if t.is_floating_point()), None)
        if tensor is None or self.kept_bytes > _MAX_KEPT_BYTES:
            return
        self.calls.append((path, k, tensor.detach().clone()))
        self.kept_bytes += tensor.numel() * tensor.element_size()

    def copies(self) -> list[torch.Tensor]:
        """What it copied during the forward and keeps: no allocation of the model's."""
        return [value for _, _, value in self.calls]

    def finish(self, output: Any) -> None:
        began = time.perf_counter()
        self.outputs = [t.detach().clone() for _, t in float_outputs(output)]
        self.finished = True
        self.seconds += time.perf_counter() - began

    def run(self, ctx: Context) -> _Run:
        """The run as modes' `_forward` would have left it, named after the report's
        nodes."""
        known = module_node_names(ctx)
        result = _Run(outputs=self.outputs, drew=self.drew, kept_bytes=self.kept_bytes)
        for path, k, value in self.calls:
            name = call_name(known, path, k)
            result.values.setdefault(name, value)
            result.paths.setdefault(name, path)
        return result


def runs_model(ctx: Context) -> bool:
    """Whether `run` will run the model: not where the load recorded the eval() run
    without a random draw and the gradients pass recorded the train() one (`run` then
    compares their copies)."""
    loaded = _recorded_eval(ctx)
    return loaded is None or loaded.drew or ctx.results.modes_train is None


def records_eval(options: Any) -> bool:
    """Whether the load's input check records modes' eval() run (`EvalRecorder`)."""
    return not options.fake and options.wants("modes")


def _recorded_eval(ctx: Context) -> EvalRecorder | None:
    """The load check's recording, where it is modes' eval() run on these inputs."""
    loaded = ctx.results.modes_eval
    if loaded is not None and loaded.finished and loaded.inputs is ctx.inputs:
        return loaded
    return None


def shares_train_forward(ctx: Context) -> bool:
    """Whether the model's own forward, as another pass runs it now (seeded with the
    report's seed, on the sample inputs), is modes' train() run: every module in train
    mode already, and modes asked for."""
    if ctx.options.fake or not ctx.options.wants("modes"):
        return False
    return all(m.training for m in ctx.model.modules())


def run(ctx: Context) -> None:
    section = ctx.report.modes
    section.mode_dependent_modules = mode_dependent(ctx.model)
    batchnorm: dict[str, BatchNormInput] = {}
    ctx.results.batchnorm_inputs = batchnorm  # filled by the train() run below
    if ctx.options.fake:
        section.error = FAKE_NOTE
        return
    recorded = ctx.results.modes_train
    loaded = _recorded_eval(ctx)
    with preserved(ctx.model):
        if loaded is not None:
            evaluated = loaded.run(ctx)  # the load's check was this eval() run
            ctx.results.modes_eval = None  # spent: its copies go
        else:
            # eval first: the train run updates BatchNorm running stats eval would read
            evaluated = _forward(ctx, training=False)
            if evaluated.error is None:  # the export checks' eager run on the sample
                ctx.results.eval_output = (ctx.inputs, evaluated.output)
        # the reseeded run can only differ through the generators `seeded` seeds
        reseeded = (
            _forward(ctx, training=False, seed=ctx.options.seed + 1) if evaluated.drew else None
        )
        # the gradients pass's forward was this train() run; one compared with the load's
        # eval() run as it ran holds no values, so it stands only where that run is this one
        if recorded is not None and (loaded is not None or not recorded.run.compared):
            train = recorded.run
            batchnorm.update(recorded.batchnorm)
        else:
            train = _train_forward(ctx, batchnorm)
    section.error = train.error or evaluated.error
    section.computed = section.error is None
    ctx.results.modes_internal = (train if train.error else evaluated).internal
    if ctx.results.modes_internal:  # said as the inspector's failure, not as a finding
        ctx.report.meta.warnings.append(f"modes: {section.error}")
    if section.computed:
        _compare(ctx, train, evaluated)
        if reseeded is None:
            ctx.report.modes.eval_max_abs_diff = 0.0  # no random draw in eval: the same run
        elif reseeded.error is None:
            _compare_eval(ctx, evaluated, reseeded)


def _train_forward(ctx: Context, batchnorm: dict[str, BatchNormInput]) -> _Run:
    handles = batchnorm_probe(ctx.model, batchnorm)
    try:
        return _forward(ctx, training=True)
    finally:
        for handle in handles:
            handle.remove()


def _forward(ctx: Context, training: bool, seed: int | None = None) -> _Run:
    result = _Run()
    ctx.model.train(training)
    seeded(ctx.options.seed if seed is None else seed)
    try:
        with torch.no_grad(), rng_watched() as watch:
            output, _ = run_nodes(ctx, lambda ref, v: _keep(result, ref, v), graph=False)
        result.drew = watch.drew
    except Exception as exc:  # noqa: BLE001 - the user's forward; reported, not raised
        where = user_location(exc, ctx.loaded.user_files)
        at = f" at {where[0]}" if where else ""
        mode = "train()" if training else "eval()"
        result.internal = inspector_fault(exc)
        note = f" ({INTERNAL_NOTE})" if result.internal else ""
        result.error = f"forward in {mode} mode failed{at}: {type(exc).__name__}: {exc}{note}"
        return result
    result.output, result.outputs = output, [t for _, t in float_outputs(output)]
    return result


def _keep(result: _Run, ref: NodeRef, value: Any) -> None:
    tensor = next((t for _, t in flat_tensors(value) if t.is_floating_point()), None)
    if tensor is None or ref.name in result.values or result.kept_bytes > _MAX_KEPT_BYTES:
        return
    result.values[ref.name] = tensor.detach().clone()
    result.paths[ref.name] = ref.module_path
    result.kept_bytes += tensor.numel() * tensor.element_size()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64, NaN as 0 and Inf as float64's largest value."""
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    if a.dtype == b.dtype == torch.float32:
        found = float32_max_abs_diff(a, b)
        if found is not None:
            return found
    # b is widened inside the subtraction (exactly, as .double() would) and the rest runs
    # in place: one float64 buffer instead of four
    return (a.double() - b).abs_().nan_to_num_(0.0).max().item()


def _close(a: torch.Tensor, b: torch.Tensor, th: dict) -> bool:
    """allclose with the modes thresholds; equal tensors (the common case for two eval
    runs) are answered by a plain comparison."""
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype and torch.equal(a, b):
        return True
    return all_close(a, b, rtol=th["mode_rtol"], atol=th["mode_atol"])


def _compare(ctx: Context, train: _Run, evaluated: _Run) -> None:
    th = resolve(ctx.options)
    section = ctx.report.modes
    diffs = [_max_diff(a, b) for a, b in zip(train.outputs, evaluated.outputs, strict=False)]
    section.output_max_abs_diff = max(diffs, default=0.0)
    by_name = {node.name: node for node in ctx.report.nodes}
    last = _last_node_of_module(ctx)
    for name, value in evaluated.values.items():
        if name in train.compared:  # compared as the train run made it (`_Against`)
            diff, close = train.compared[name]
        elif (other := train.values.get(name)) is not None:
            diff, close = _max_diff(other, value), None
        else:
            continue
        node = by_name.get(name) or last.get(evaluated.paths.get(name))
        if node is not None:
            node.mode_divergence = diff
        # only the first divergent node is named: later ones need no closeness test (a
        # compared node was tested unless an earlier one was apart: named by then)
        if section.first_divergent_node is not None:
            continue
        if close is None:
            close = _close(train.values[name], value, th)
        if not close:
            section.first_divergent_node = node.name if node is not None else name


def _compare_eval(ctx: Context, first: _Run, second: _Run) -> None:
    """Two eval() runs with different seeds must agree: the first node that does not is
    where randomness stays on in eval."""
    th = resolve(ctx.options)
    section = ctx.report.modes
    diffs = [_max_diff(a, b) for a, b in zip(first.outputs, second.outputs, strict=False)]
    section.eval_max_abs_diff = max(diffs, default=0.0)
    by_name = {node.name: node for node in ctx.report.nodes}
    last = _last_node_of_module(ctx)
    for name, value in first.values.items():
        other = second.values.get(name)
        if other is None:
            continue
        if _close(other, value, th):
            continue
        node = by_name.get(name) or last.get(first.paths.get(name))
        section.eval_first_differing_node = node.name if node is not None else name
        return


def _last_node_of_module(ctx: Context) -> dict[str | None, Node]:
    """Op-level graphs (export) have no node per module call: a module's output is the
    last node inside it."""
    last: dict[str | None, Node] = {}
    for node in ctx.report.nodes:
        path = node.module_path
        while path and node.op not in ("placeholder", "get_attr", "output"):
            last[path] = node
            path = path.rpartition(".")[0]
    return last
