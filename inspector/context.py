"""What the pipeline stages hand each other: options, the loaded model, inputs, the capture.

load (inspector.loaders.load) -> LoadedModel
inputs (inspector.inputspec) -> InputFactory -> Inputs
capture (inspector.capture) -> CaptureResult
passes (inspector.passes) read a Context and fill `ctx.report`; what one pass leaves for
the later ones and for the rules is typed, on `ctx.results` (inspector.results).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from inspector.report import CaptureAttempt, Report
from inspector.results import PassResults
from inspector.schema.options import (
    DEFAULT_COMPILE,
    DEFAULT_DTYPE,
    DEFAULT_EXPORT,
    DEFAULT_OPTIMIZER,
)

if TYPE_CHECKING:  # the graph modules import this one
    from inspector.graph.guidedfx import Decision
    from inspector.graph.records import NodeRecord

__all__ = ["Options", "Inputs", "InputFactory", "LoadedModel", "CaptureResult", "Context"]


@dataclass
class Options:
    device: str = "cpu"  # resolved: "cpu" or "cuda" ("auto" is resolved by the caller)
    fake: bool = False  # fake tensors: no weights or activations allocated
    optimizer: str = DEFAULT_OPTIMIZER  # inspector.schema.options.OPTIMIZERS
    dtype: str = DEFAULT_DTYPE  # activation dtype under autocast: AUTOCAST_DTYPES
    budgets_bytes: list[int] = field(default_factory=list)  # besides the accelerator sizes
    depth: int | None = None  # display only
    seed: int = 0
    passes: set[str] | None = None  # None: every pass
    measure: bool = True  # measure real memory when not fake (costs one real step)
    export: str = DEFAULT_EXPORT  # export readiness: EXPORT_LEVELS
    compile: str = DEFAULT_COMPILE  # torch.compile readiness: COMPILE_LEVELS
    serving: bool | None = None  # serving memory; None: on for presets/configs of decoder LMs
    parallel: list[str] = field(default_factory=list)  # --parallel plans (schema/parallel.py)
    fit_bytes: int | None = None  # --fit BUDGET: search the cheapest changes that fit it
    fit_batch: int | None = None  # --batch B: effective batch the plan keeps (None: the input's)
    blocks: list[str] = field(default_factory=list)  # --blocks: classes or path globs (none: found)
    # overrides of the health thresholds (inspector.health.thresholds.DEFAULTS)
    thresholds: dict[str, float] = field(default_factory=dict)
    # passes in forked children (a native crash costs one pass); None: where it is cheap
    isolate: bool | None = None

    def wants(self, name: str) -> bool:
        return self.passes is None or name in self.passes


@dataclass
class Inputs:
    """Positional and keyword inputs for `model(*args, **kwargs)`."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)  # values of the named dims used

    def call(self, model: Callable[..., Any]) -> Any:
        return model(*self.args, **self.kwargs)

    def tensors(self) -> list[torch.Tensor]:
        flat, _ = torch.utils._pytree.tree_flatten((self.args, self.kwargs))
        return [t for t in flat if isinstance(t, torch.Tensor)]


class InputFactory:
    """Builds inputs for given values of the named dims, real or under a fake mode.

    Shape propagation rebuilds inputs with perturbed dims to learn which output dims
    are symbolic; memory analysis rebuilds them at several batch sizes.
    """

    def __init__(self, dims: dict[str, int] | None = None, spec: object = None) -> None:
        self.dims = dict(dims or {})  # the default values
        self.spec = spec  # the raw spec (JSON-able), for the report

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        """Inputs at `dims` (defaults for the ones not given). Under an active
        FakeTensorMode the tensors are created fake."""
        raise NotImplementedError

    @property
    def batch_dim(self) -> str | None:
        """The named dim that is the batch ("B" by convention, else the first dim of the
        first tensor when it is named), or None."""
        return None


@dataclass
class LoadedModel:
    model: nn.Module
    source_kind: str  # python, pt2, torchscript, preset, hf-config
    source_name: str
    sha256: str | None = None
    entrypoint: str | None = None
    inputs: InputFactory | None = None  # from example_inputs(), the archive, or a preset
    loss_fn: Callable[[Any, Inputs], torch.Tensor] | None = None  # loss_fn(output, inputs)
    # generate_step(model, tokens, cache) -> (logits, cache): one generation step of a model
    # whose forward takes no cache argument (cache None: the prefill)
    generate_step: Callable[[Any, torch.Tensor, Any], tuple[Any, Any]] | None = None
    user_files: list[str] = field(default_factory=list)  # files whose frames are "the user's"
    exported: Any = None  # torch.export.ExportedProgram when the source was a .pt2
    fake_mode: Any = None  # FakeTensorMode the model was built under, when fake


@dataclass
class CaptureResult:
    method: str | None  # fx, export, hooks
    attempts: list[CaptureAttempt]
    graph_module: torch.fx.GraphModule | None = None  # fx or export graph
    exported: Any = None  # ExportedProgram when method == "export"
    # What capture decided about running this graph again, each set by the attempt named
    # first (inspector/capture.py). The graph pass (passes/graph.py) turns `reexport` on
    # and `export_dynamic` off when an export proves static, and takes `records` and
    # `export_probe` once.
    fx_leaves: list[str] = field(default_factory=list)  # fx: submodules kept whole
    decisions: list[Decision] = field(default_factory=list)  # guided fx: branches it took
    stack_traces: bool = True  # guided fx, export: nodes carry stacks (runs_user_code)
    strip: str | None = None  # export: module path prefix of our wrapper (WRAPPED); .pt2: None
    export_dynamic: bool = False  # export: the named dims are symbols in the graph
    reexport: bool = True  # export: runs at other dims export again (its shapes are static)
    export_probe: bool = False  # export: a named dim of 1 was exported at 2 (may not run at 1)
    # export: per input tensor, {axis: the one named dim that moves it}
    axis_dims: list[dict[int, str]] = field(default_factory=list)
    records: list[NodeRecord] | None = None  # hooks: its recorded run, for the graph pass
    allocated_bytes: int | None = None  # hooks: every byte its run allocated (memory/rough.py)
    eval_mode: bool = False  # captured in eval mode: train mode failed (capture.py)


@dataclass
class Context:
    loaded: LoadedModel
    factory: InputFactory
    inputs: Inputs
    options: Options
    report: Report
    capture: CaptureResult | None = None
    fake_mode: Any = None  # the FakeTensorMode every fake run uses, when options.fake
    # A real model's fake side runs (other dims, backward FLOPs): made once, on first use,
    # by graph.runner.perturb_fake_mode. Not `fake_mode`, which says the main runs are fake.
    extra_fake_mode: Any = None
    results: PassResults = field(default_factory=PassResults)  # what passes hand on

    @property
    def model(self) -> nn.Module:
        return self.loaded.model
