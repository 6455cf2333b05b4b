"""What the passes leave for the later passes, the rules, tests and benchmarks: one typed
field per result on `ctx.results`, written by one pass. The report holds what users see;
these hold the working data behind it (a pass that did not run leaves its default)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # these modules import inspector.context, which imports this one
    from inspector.health.attention import AttentionSoftmax
    from inspector.health.backprop import BackwardRun
    from inspector.health.created import Created
    from inspector.health.devices import FixedDevice
    from inspector.health.lossops import LossCall
    from inspector.health.modecheck import BatchNormInput
    from inspector.health.normeps import LostEps
    from inspector.memory.advice import Checked
    from inspector.memory.analysis import Analysis
    from inspector.memory.inference import RecordedInference
    from inspector.memory.measure import Measurement
    from inspector.memory.merged import StepFigures
    from inspector.passes.modes import EvalRecorder, TrainRecorder
    from inspector.passes.numerics import NumericsResult

__all__ = ["PassResults", "GraphRun", "AutocastStep"]


@dataclass
class GraphRun:
    """How the graph pass's main run went; the pass's later steps follow it."""

    on_meta: bool = False  # it ran on meta tensors: the runs at other dims try meta too
    backward_counted: bool = False  # it counted every node's backward FLOPs: no fake backward


@dataclass
class AutocastStep:
    """The training step again under bf16 autocast (memory advice; the set-ups reuse it)."""

    saved_bytes: int  # activations saved for backward
    fb_peak_bytes: int  # peak over forward and backward (see memory.analysis.fb_peak)


@dataclass
class PassResults:
    graph: GraphRun = field(default_factory=GraphRun)  # passes/graph.py
    memory: Analysis | None = None  # passes/memory.py: the estimate's full analysis
    memory_bf16: AutocastStep | None = None  # passes/memory.py, fake float32 models only
    # passes/memory.py: the step with every block checkpointed (fake runs with 2+ blocks)
    memory_checkpointed: Checked | None = None
    memory_measured: Measurement | None = None  # passes/measure.py, real runs only
    # passes/gradients.py: its forward and backward recorded as the measured step's
    # (inspector/memory/merged.py), or the separate step it ran (or why it could not)
    step_recorded: StepFigures | Measurement | str | None = None
    # analyze.py: seconds of the inputs-fit check's forward (real runs: eval, no grad)
    real_forward_seconds: float | None = None
    # analyze.py: the measured step's inference forward, recorded on the same check
    inference_recorded: RecordedInference | None = None
    gradients: BackwardRun | None = None  # passes/gradients.py: the forward + backward
    numerics: NumericsResult | None = None  # passes/numerics.py
    # passes/gradients.py: the value statistics of its per-node replay, the forward the
    # numerics pass would run (same seed, mode and inputs), so numerics runs none
    numerics_observed: NumericsResult | None = None
    # passes/numerics.py: norm layers whose eps the low-precision run rounds to zero
    lost_norm_eps: list[LostEps] = field(default_factory=list)
    loss_calls: list[LossCall] = field(default_factory=list)  # passes/probe.py
    created_in_forward: list[Created] = field(default_factory=list)  # passes/probe.py
    fixed_devices: list[FixedDevice] = field(default_factory=list)  # passes/probe.py
    attention_softmaxes: list[AttentionSoftmax] = field(default_factory=list)  # passes/probe.py
    # passes/gradients.py: modes' train() run, recorded on its forward (the same run)
    modes_train: TrainRecorder | None = None
    # analyze.py: modes' eval() run, recorded on the load's input check (the same run)
    modes_eval: EvalRecorder | None = None
    # passes/modes.py: BatchNorm inputs of the train() forward, by module path
    batchnorm_inputs: dict[str, BatchNormInput] = field(default_factory=dict)
    modes_internal: bool = False  # passes/modes.py: its error is the inspector's own
    # (inputs, output) of an eval() run at the report's seed, no grad: the eager output
    # the export checks compare with on the sample. The load's input check (small outputs
    # only: inspector/analyze.py), then passes/modes.py's eval() run.
    eval_output: tuple[Any, Any] | None = None
