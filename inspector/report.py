"""The report: the contract between the library, the database, the API, the pages and CI.

Every section is always present; a section a pass did not fill keeps its defaults
(`None` for numbers that were not computed). Key names listed as stable in DESIGN.md
keep their names and meanings; new keys may be added, never removed.
Numbers carry their unit in the name (`_bytes`, `_s`, `flops`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

# A dimension is a concrete size or a symbolic expression over the user's named dims,
# e.g. "B", "2*S", "B*S".
Dim = int | str
Shape = list[Dim]
Severity = Literal["error", "warning", "info"]


class _Model(BaseModel):
    # Old reports may carry keys a newer version dropped from display; keep them readable.
    model_config = ConfigDict(extra="allow")


class TensorInfo(_Model):
    """One tensor flowing along an edge: a node's input or output."""

    shape: list[int]
    sym_shape: Shape | None = None  # same rank as `shape`, with named dims where known
    dtype: str
    device: str = "cpu"
    bytes: int = 0  # numel * itemsize


class NumericStats(_Model):
    """Value statistics of a node's (first floating) output."""

    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    zero_fraction: float | None = None
    nan_count: int = 0
    inf_count: int = 0
    dead_fraction: float | None = None  # ReLU-like: share of features zero for the whole batch
    saturated_fraction: float | None = None  # sigmoid/tanh: share within 1e-3 of the bounds
    fp16_overflow_count: int = 0  # |x| > 65504
    # share of the nonzero values below float16's smallest normal (6.1e-5): they lose
    # precision or flush to zero under fp16
    fp16_underflow_fraction: float | None = None
    bf16_error: float | None = None  # rms(x - bf16(x)) / std(x): precision lost in bf16


class Node(_Model):
    """One node of the captured graph (fx, export) or one module call (hooks)."""

    id: int
    name: str
    op: str  # placeholder, call_module, call_function, call_method, get_attr, output, module
    target: str
    module_path: str | None = None  # owning module, "" for the root
    module_type: str | None = None
    inputs: list[int] = Field(default_factory=list)  # ids of input nodes
    input_tensors: list[TensorInfo] = Field(default_factory=list)
    output_tensors: list[TensorInfo] = Field(default_factory=list)  # flattened outputs
    location: str | None = None  # "file.py:LINE" in the user's code, where known
    params: int = 0  # parameters read by this node (call_module: the module's own)
    flops: int = 0  # forward FLOPs, a multiply-add = 2
    output_bytes: int = 0
    saved_bytes: int | None = None  # bytes this node's outputs keep alive for backward
    live_bytes_after: int | None = None  # live activation bytes after this node runs
    stats: NumericStats | None = None
    grad_norm: float | None = None  # norm of the gradient w.r.t. this node's output
    mode_divergence: float | None = None  # max |train - eval| of this node's output


class Module(_Model):
    """One module of the model's tree, with its measures aggregated over its subtree."""

    path: str  # dotted path, "" for the root
    type: str  # class name
    depth: int = 0
    parent: str | None = None
    input_shapes: list[Shape] = Field(default_factory=list)
    output_shapes: list[Shape] = Field(default_factory=list)
    output_dtypes: list[str] = Field(default_factory=list)
    params: int = 0  # owned by the module and its children, tied parameters once
    trainable_params: int = 0
    own_params: int = 0  # directly owned (recurse=False)
    buffers: int = 0
    param_bytes: int = 0
    tied_params: list[str] = Field(default_factory=list)  # names that alias an earlier param
    calls: int = 0  # times forward ran (a module reused in a loop counts each call)
    flops_forward: int = 0
    flops_backward: int = 0
    output_bytes: int = 0
    saved_activation_bytes: int | None = None
    grad_norm: float | None = None
    location: str | None = None


class Totals(_Model):
    params: int = 0  # tied parameters once
    trainable_params: int = 0
    frozen_params: int = 0
    tied_params: int = 0  # parameters that alias another (not counted again in `params`)
    buffers: int = 0
    param_bytes: int = 0
    buffer_bytes: int = 0
    params_by_dtype: dict[str, int] = Field(default_factory=dict)
    param_bytes_by_dtype: dict[str, int] = Field(default_factory=dict)
    flops_forward: int = 0
    flops_backward: int = 0
    output_bytes: int = 0  # sum of node output bytes


class CaptureAttempt(_Model):
    method: Literal["fx", "export", "hooks"]
    ok: bool
    error: str | None = None
    error_type: str | None = None
    location: str | None = None  # "file.py:LINE" in the user's code
    source_line: str | None = None  # that line's text
    seconds: float = 0.0
    eval_mode: bool = False  # tried with the model in eval mode (train mode failed)


class Capture(_Model):
    method: Literal["fx", "export", "hooks"] | None = None
    eval_mode: bool = False  # captured in eval mode: train mode failed
    attempts: list[CaptureAttempt] = Field(default_factory=list)
    node_count: int = 0


class Meta(_Model):
    # torch, python, inspector, cuda (None on CPU), cudnn, transformers (None when not
    # importable), gpu_name and gpu_driver on CUDA: inspector/versions.py
    versions: dict[str, str | None] = Field(default_factory=dict)
    inspector_version: str = ""
    torch_version: str = ""
    python_version: str = ""
    device: str = "cpu"
    device_name: str = ""
    source_kind: str = ""  # python, pt2, torchscript, preset, hf-config
    source_name: str = ""
    source_sha256: str | None = None
    entrypoint: str | None = None
    input_spec: object = None  # the input spec as given (JSON), or a description of a file
    dims: dict[str, int] = Field(default_factory=dict)
    fake: bool = False  # shapes and memory from fake tensors, no real forward
    options: dict[str, object] = Field(default_factory=dict)
    timings_s: dict[str, float] = Field(default_factory=dict)
    created_at: str = ""
    warnings: list[str] = Field(default_factory=list)
    # how the passes ran: "fork per pass" (a native crash costs only that pass) or why not
    isolation: str | None = None
    failed_passes: dict[str, str] = Field(default_factory=dict)  # pass -> the signal, where


class TimelinePoint(_Model):
    step: int
    phase: Literal["forward", "backward", "optimizer"]
    node: str | None = None  # node name, or "<param>.grad" style labels in backward
    live_bytes: int


class BatchPoint(_Model):
    batch: int
    forward_peak_bytes: int
    train_peak_bytes: int
    saved_activation_bytes: int = 0


class MeasuredMemory(_Model):
    method: str  # "torch.profiler", "cuda.max_memory_allocated"
    device: str
    train_peak_bytes: int | None = None
    saved_activation_bytes: int | None = None
    forward_peak_bytes: int | None = None
    train_peak_error: float | None = None  # (estimate - measured) / measured
    saved_activation_error: float | None = None
    forward_peak_error: float | None = None


class MemoryAdvice(_Model):
    kind: str  # "checkpoint", "checkpoint-all", "autocast-bf16"
    where: str | None = None
    saving_bytes: int  # measured on fake tensors when `verified`, else predicted
    message: str
    predicted_saving_bytes: int | None = None  # before the change was run
    verified: bool = False  # the change was run on fake tensors and measured
    train_peak_bytes: int | None = None  # the training-step peak with the change


class SetupEstimate(_Model):
    """One training set-up of the same model: optimizer, activation dtype, checkpointing."""

    optimizer: str
    activation_dtype: str
    checkpointing: bool = False  # every block wrapped in activation checkpointing
    measured: bool = False  # the set-up the step was run with; the others are derived
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    saved_activation_bytes: int = 0
    train_peak_bytes: int = 0


class FitChange(_Model):
    """One change of a fit plan, what it costs and how to make it."""

    kind: str  # autocast-bf16 / checkpoint / accumulate / optimizer / bf16-params / shard
    summary: str  # "Checkpoint 6 of 12 blocks (h.0 ... h.5)"
    cost: str  # what it costs: extra compute, numerical risk, GPUs
    risk: str  # numerical risk: none / low / medium / high
    snippet: str  # the code that makes the change
    where: list[str] = Field(default_factory=list)  # the blocks it touches


class FitTry(_Model):
    """A candidate plan run on fake tensors during the search."""

    summary: str
    predicted_peak_bytes: int | None = None  # None: a sharded run the FSDP line goes by
    verified_peak_bytes: int | None = None  # None: the run failed (see error)
    fits: bool = False
    error: str | None = None


class FitPlan(_Model):
    """`--fit BUDGET`: the cheapest verified changes that bring the training-step peak (per
    rank under sharding) under the budget, or the closest plan tried."""

    budget_bytes: int
    found: bool = False  # a plan within these changes fits, by its fake-tensor run
    batch: int | None = None  # the effective batch per optimizer step (--batch, else the input's)
    micro_batch: int | None = None  # per forward (per rank under sharding)
    accumulation_steps: int = 1
    gpus: int = 1
    baseline_peak_bytes: int | None = None  # no changes, at the effective batch
    predicted_peak_bytes: int | None = None  # the chosen (or closest) plan, by the model
    verified_peak_bytes: int | None = None  # the same plan run on fake tensors
    predicted_extra_compute: float | None = None  # recompute FLOPs / step FLOPs, by module
    extra_compute: float | None = None  # the same, counted in the verified run
    recompute_flops: int | None = None  # per optimizer step, counted in the verified run
    changes: list[FitChange] = Field(default_factory=list)
    tried: list[FitTry] = Field(default_factory=list)
    seconds: float | None = None
    notes: list[str] = Field(default_factory=list)


class Memory(_Model):
    optimizer: str | None = None
    param_dtype: str | None = None
    activation_dtype: str | None = None
    param_bytes: int | None = None
    buffer_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None
    bytes_by_dtype: dict[str, int] = Field(default_factory=dict)
    saved_activation_bytes: int | None = None
    forward_peak_bytes: int | None = None
    forward_peak_node: str | None = None
    train_peak_bytes: int | None = None
    train_peak_node: str | None = None
    train_peak_phase: str | None = None
    # {seed: peak} when the step's peak depends on its random draws (layerdrop; a real
    # copy only): train_peak_bytes is the largest
    train_peak_by_seed: dict[str, int] = Field(default_factory=dict)
    timeline: list[TimelinePoint] = Field(default_factory=list)
    batch_dim: str | None = None
    batch_scaling: list[BatchPoint] = Field(default_factory=list)
    fixed_bytes: int | None = None  # fitted: peak = fixed + per_sample * batch
    per_sample_bytes: int | None = None
    # {str(budget_bytes): largest batch that fits}; 0 when even batch 1 does not fit
    max_batch: dict[str, int] = Field(default_factory=dict)
    measured: MeasuredMemory | None = None
    # ops whose kernels allocate memory of their own that the estimate does not count
    # (cuDNN's run-time workspaces, kernels no formula in inspector/memory/kernels covers)
    unmodelled_kernel_ops: list[str] = Field(default_factory=list)
    # the blocks advice, set-ups, fit plans and FSDP/TP units take: --blocks, else the
    # model's own repeated layers; named_blocks: the --blocks patterns, when given
    blocks: list[str] = Field(default_factory=list)
    named_blocks: list[str] = Field(default_factory=list)
    advice: list[MemoryAdvice] = Field(default_factory=list)
    setups: list[SetupEstimate] = Field(default_factory=list)  # the same model, other set-ups
    fit_plan: FitPlan | None = None  # --fit BUDGET: the verified cheapest changes that fit


class ParamGrad(_Model):
    name: str
    module_path: str = ""
    shape: list[int] = Field(default_factory=list)
    grad_norm: float | None = None  # None when the grad stayed None
    weight_norm: float | None = None
    ratio: float | None = None  # grad_norm / weight_norm
    zero_fraction: float | None = None
    nan_count: int = 0
    inf_count: int = 0
    verdict: str = "ok"  # ok, unused, cut, vanishing, exploding, nan, frozen
    cut_at: str | None = None  # verdict "cut": where in the forward the path is cut


class LayerGrad(_Model):
    module_path: str
    type: str = ""
    depth_index: int = 0  # order in the forward
    grad_norm: float | None = None
    grad_rms: float | None = None  # grad_norm / sqrt(elements): what "vanishing" compares
    ratio: float | None = None
    verdict: str = "ok"


class Gradients(_Model):
    computed: bool = False
    loss: str | None = None  # how the loss was formed
    loss_value: float | None = None
    thresholds: dict[str, float] = Field(default_factory=dict)
    params: list[ParamGrad] = Field(default_factory=list)
    layers: list[LayerGrad] = Field(default_factory=list)
    first_nan_node: str | None = None
    error: str | None = None


class ModeDiff(_Model):
    computed: bool = False
    mode_dependent_modules: list[str] = Field(default_factory=list)
    output_max_abs_diff: float | None = None
    first_divergent_node: str | None = None
    # two eval() forwards with different seeds: randomness left on in eval (F.dropout
    # without training=self.training)
    eval_max_abs_diff: float | None = None
    eval_first_differing_node: str | None = None
    error: str | None = None


class Finding(_Model):
    rule: str
    severity: Severity
    where: str = ""  # node name or module path ("" = the whole model)
    message: str
    fix: str = ""


class ExportTarget(_Model):
    target: str  # export-strict, export-nonstrict, torchscript-script, torchscript-trace, onnx
    ok: bool | None = None  # None = not attempted (dependency missing)
    error: str | None = None
    location: str | None = None
    seconds: float = 0.0
    # run beside eager: "sample" and "B=4"-style changed dims; the largest difference and
    # the first thing that did not match (a failure, or a difference past the tolerance)
    checked: list[str] = Field(default_factory=list)
    max_abs_diff: float | None = None
    mismatch: str | None = None


class Export(_Model):
    targets: list[ExportTarget] = Field(default_factory=list)


class GraphBreak(_Model):
    """One place where torch.compile (Dynamo) stops its graph and falls back to Python."""

    reason: str  # torch's text: its first line ("Unsupported Tensor.item() call ...")
    explanation: str | None = None  # torch's "Explanation:" line
    hints: list[str] = Field(default_factory=list)  # torch's "Hint:" lines
    op: str | None = None  # what Dynamo could not trace: "Tensor.item()", "print"
    where: str | None = None  # "file.py:LINE", the user's innermost frame where known
    code: str | None = None  # that line's text
    frames: list[str] = Field(default_factory=list)  # "file.py:LINE in fn", innermost last
    count: int = 1  # breaks at this site with this reason (a block called in a loop)
    in_user_code: bool = True  # False: no frame of the user's files on the stack (a library)
    url: str | None = None  # torch's page on this kind of break


class Recompile(_Model):
    """What changing one named dim does to the compiled model."""

    dim: str
    value: int  # the dim's default value
    changed_to: int
    recompiles: int  # frames compiled again; with counted False, 1 means "at least one"
    counted: bool = False  # every recompile counted (--compile all), else the first found
    guards: list[str] = Field(default_factory=list)  # the guards that failed, torch's text
    error: str | None = None  # the run at the changed dim failed


class Compile(_Model):
    """torch.compile readiness: Dynamo's graphs and breaks on the sample (eager backend)."""

    computed: bool = False
    backend: str = "eager"  # graphs are captured and run eagerly: no Inductor compile
    mode: str | None = None  # "train" / "eval": the mode the model was compiled in
    error: str | None = None  # Dynamo itself failed on the model
    skipped: str | None = None  # why it was not attempted
    graph_count: int | None = None
    graph_break_count: int | None = None
    op_count: int | None = None
    breaks: list[GraphBreak] = Field(default_factory=list)  # one per site and reason
    recompiles: list[Recompile] = Field(default_factory=list)  # one per named dim
    # Dynamo's own warnings while tracing, torch's text without its stack: "Dynamo
    # detected a call to a `functools.lru_cache`-wrapped function at 'x.py:245' ..."
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0


class ServingLayer(_Model):
    index: int
    kind: str  # the cache layer's class: DynamicLayer, DynamicSlidingWindowLayer, ...
    bytes_per_token: int  # per sequence, while the layer's cache grows
    fixed_bytes: int = 0  # per sequence, whatever the context (SSM and conv states)
    capped_at_tokens: int | None = None  # a sliding window: stops growing here


class ServingRow(_Model):
    context: int
    cache_bytes_per_sequence: int
    prefill_peak_bytes: int  # one sequence of this context
    max_concurrent_sequences: dict[str, int] = Field(default_factory=dict)


class Serving(_Model):
    computed: bool = False
    reason: str | None = None  # why there is no serving section, when one was asked for
    batch: int | None = None
    context: int | None = None  # the spec's sequence length S
    weights_bytes: int | None = None
    weights_bytes_by_dtype: dict[str, int] = Field(default_factory=dict)
    weights_int8_bytes: int | None = None  # weight-only quantised Linear weights
    weights_int4_bytes: int | None = None
    kv_bytes_per_token: int | None = None  # per sequence, all layers, while they grow
    cache_fixed_bytes: int | None = None  # per sequence, states that do not grow
    cache_bytes_per_sequence: int | None = None  # at `context`
    layers: list[ServingLayer] = Field(default_factory=list)
    prefill_peak_bytes: int | None = None  # at [batch, context]
    decode_peak_bytes: int | None = None  # one step of `batch` sequences at `context`
    decode_fixed_bytes: int | None = None  # decode peak = fixed + n * per_sequence
    decode_per_sequence_bytes: int | None = None
    decode_check_error: float | None = None  # the line vs a measured step at 4 sequences
    # {str(budget_bytes): sequences of `context` tokens that fit}
    max_concurrent_sequences: dict[str, int] = Field(default_factory=dict)
    table: list[ServingRow] = Field(default_factory=list)  # other contexts
    notes: list[str] = Field(default_factory=list)


class ParallelPlan(_Model):
    """One `--parallel` plan: the heaviest rank's memory in a training step."""

    strategy: str  # ddp / zero1 / fsdp / tp / fsdp+tp
    spec: str  # the plan's normal form: "fsdp:8,reshard=false", "fsdp:8+tp:8,sp"
    world_size: int
    per_rank_peak_bytes: int | None = None  # the heaviest rank's training-step peak (GPU)
    heaviest_rank: int = 0
    peak_phase: str | None = None  # forward / backward / optimizer
    peak_where: str | None = None  # the module or autograd node running at the peak
    param_bytes: int | None = None  # this rank's parameters (its shards under FSDP)
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None
    input_bytes: int | None = None
    saved_activation_bytes: int | None = None
    # DDP buckets; FSDP: largest unit's all-gather + reduce-scatter; TP: largest collective
    comm_bytes: int | None = None
    units: int | None = None  # FSDP: fully_shard units; DDP: gradient buckets; TP: split layers
    # offload=true: host memory per rank (sharded params + grads + optimizer state)
    host_bytes: int | None = None
    fits: dict[str, bool] = Field(default_factory=dict)  # {str(budget_bytes): fits}
    error: str | None = None  # why this plan has no figures
    notes: list[str] = Field(default_factory=list)  # e.g. what TP left replicated


class GpusNeeded(_Model):
    """The fewest ranks whose heaviest rank fits `budget_bytes`, run to check."""

    strategy: str  # the plan without its world size: "fsdp", "fsdp,param_dtype=bf16"
    budget_bytes: int
    gpus: int | None = None  # None: no world size fits
    per_rank_peak_bytes: int | None = None  # measured at `gpus`


class Distributed(_Model):
    plans: list[ParallelPlan] = Field(default_factory=list)
    gpus_needed: list[GpusNeeded] = Field(default_factory=list)
    batch_per_rank: int | None = None  # the input's batch: one rank's micro-batch
    seconds: float | None = None
    notes: list[str] = Field(default_factory=list)


class ErrorInfo(_Model):
    kind: str  # user_error, timed_out, out_of_memory, killed, internal
    message: str
    stage: str | None = None
    traceback: str | None = None  # the user's frames only


class Report(_Model):
    schema_version: int = SCHEMA_VERSION
    status: Literal["done", "failed"] = "done"
    error: ErrorInfo | None = None
    meta: Meta = Field(default_factory=Meta)
    capture: Capture = Field(default_factory=Capture)
    totals: Totals = Field(default_factory=Totals)
    nodes: list[Node] = Field(default_factory=list)
    modules: list[Module] = Field(default_factory=list)
    memory: Memory = Field(default_factory=Memory)
    gradients: Gradients = Field(default_factory=Gradients)
    modes: ModeDiff = Field(default_factory=ModeDiff)
    findings: list[Finding] = Field(default_factory=list)
    export: Export = Field(default_factory=Export)
    serving: Serving = Field(default_factory=Serving)
    compile: Compile = Field(default_factory=Compile)
    distributed: Distributed = Field(default_factory=Distributed)

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Report:
        return cls.model_validate_json(text)

    def module(self, path: str) -> Module | None:
        return next((m for m in self.modules if m.path == path), None)


def failed_report(kind: str, message: str, stage: str | None = None, **extra: object) -> Report:
    """A report for a job that did not finish; `extra` goes into `error`."""
    return Report(
        status="failed", error=ErrorInfo(kind=kind, message=message, stage=stage, **extra)
    )
