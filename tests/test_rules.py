"""Every lint rule: a tiny model that triggers it (rule id, severity, location) and one
that does not; the registry itself; no error/warning on healthy standard models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector.context import Options
from inspector.graph.fxcapture import trace_fx
from inspector.health.adhoc import context_for
from inspector.passes import findings, gradients, modes, numerics
from inspector.report import CaptureAttempt, Finding, MemoryAdvice
from inspector.rules import RULES, rule, run_rules

VALUE_PASSES = (gradients, numerics, modes, findings)


def inspect(model: nn.Module, *args, options: Options | None = None, capture: str = "fx", **kw):
    """Run the value passes and the findings on a hand-built context."""
    ctx = context_for(model, args, kw, options=options, capture=capture, user_files=[__file__])
    for stage in VALUE_PASSES:
        stage.run(ctx)
    return ctx


def hits(ctx, rule_id: str) -> list[Finding]:
    return [f for f in ctx.report.findings if f.rule == rule_id]


# --- tiny models, one per hazard -------------------------------------------------------


class Two(nn.Module):
    """Two linears; `how` picks the hazard placed between them."""

    def __init__(self, how: str = "ok") -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Linear(4, 4), nn.Linear(4, 3), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.how == "detach":
            h = h.detach()
        elif self.how == "data":
            h = h.data
        elif self.how == "numpy":
            h = torch.from_numpy(h.detach().numpy())
        elif self.how == "int":
            h = h.long().float()
        elif self.how == "nograd":
            with torch.no_grad():
                h = self.a(x)
        elif self.how == "vanish":
            h = h * 1e-8 + x
        elif self.how == "explode":
            return self.b(h) * 1e5
        elif self.how == "nan":
            h = torch.sqrt(h * 0.0) + h
        elif self.how == "inplace":
            h = torch.sigmoid(h)
            h.add_(1)
        elif self.how == "nan-forward":
            h = torch.log(h - h - 1.0)
        elif self.how == "masked-inf":  # T5's relative buckets: log(0) = -inf, then discarded
            h = torch.where(h > 1e9, torch.log(h * 0.0), h)
        elif self.how == "inf-out":
            return self.b(h) / 0.0
        elif self.how == "dead":
            h = torch.relu(h - 100.0)
        elif self.how == "saturate":
            h = torch.sigmoid(h * 1e4)
        elif self.how == "big":
            h = h + 1e6
        elif self.how == "offset":
            h = h + 1e4
        return self.b(h)


class Unused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.spare = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


class OutputCut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).detach()


class Residual(nn.Module):
    """ReLU(inplace=True) on a tensor the residual branch reads later: the classic bug."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.act, self.lin = nn.ReLU(inplace=inplace), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * 1.0
        return self.lin(self.act(h)) + h


class WithMask(nn.Module):
    def __init__(self, registered: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        if registered:
            self.register_buffer("mask", torch.ones(4))
        else:
            self.mask = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.mask


class Training(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2.0 if self.training else 1.0)


class WithConstant(nn.Module):
    """A tensor made in forward: fx stores it as `_tensor_constant0` while tracing."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])


def conv_bn(bias: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=bias), nn.BatchNorm2d(8), nn.ReLU())


def bn1d() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))


def x4(batch: int = 16) -> torch.Tensor:
    return torch.randn(batch, 4)


# (rule id, severity, where, model factory, args, options)
TRIGGERS = [
    ("grad-path-cut", "error", "a", lambda: Two("detach"), (x4(),), None),
    ("unused-parameter", "warning", "spare", Unused, (x4(),), None),
    ("output-without-grad", "error", "output", OutputCut, (x4(),), None),
    ("vanishing-gradient", "warning", "a", lambda: Two("vanish"), (x4(),), None),
    ("exploding-gradient", "warning", "a", lambda: Two("explode"), (x4(),), None),
    ("nan-gradient", "error", "mul", lambda: Two("nan"), (x4(),), None),
    ("inplace-autograd", "error", "add_", lambda: Two("inplace"), (x4(),), None),
    ("nan-activation", "error", "log", lambda: Two("nan-forward"), (x4(),), None),
    ("nan-activation", "error", "truediv", lambda: Two("inf-out"), (x4(),), None),
    ("dead-relu", "warning", "relu", lambda: Two("dead"), (x4(),), None),
    ("saturated-activation", "warning", "sigmoid", lambda: Two("saturate"), (x4(),), None),
    ("fp16-overflow", "warning", "add", lambda: Two("big"), (x4(),), Options(dtype="fp16")),
    ("bf16-precision", "warning", "add", lambda: Two("offset"), (x4(),), Options(dtype="bf16")),
    ("batchnorm-single-value", "error", "1", bn1d, (x4(1),), None),
    ("batchnorm-few-values", "warning", "1", bn1d, (x4(4),), None),
    ("mode-divergence", "info", "", Training, (x4(),), None),
    (
        "bias-before-batchnorm",
        "warning",
        "0",
        lambda: conv_bn(True),
        (torch.randn(2, 3, 8, 8),),
        None,
    ),
    ("tensor-attribute", "warning", "mask", WithMask, (x4(),), None),
    ("inplace-read-later", "warning", "act", Residual, (x4(),), None),
    ("values-not-computed", "info", "", lambda: Two(), (x4(),), Options(fake=True)),
]


@pytest.mark.parametrize(
    "rule_id,severity,where,make,args,options", TRIGGERS, ids=[t[0] for t in TRIGGERS]
)
def test_rule_triggers(rule_id, severity, where, make, args, options) -> None:
    found = hits(inspect(make(), *args, options=options), rule_id)
    assert found, f"{rule_id} did not fire"
    assert (found[0].severity, found[0].where) == (severity, where)
    assert found[0].message and found[0].fix


# The same models without the hazard: no finding of that rule.
HEALTHY = [
    ("grad-path-cut", lambda: Two(), (x4(),)),
    ("unused-parameter", lambda: Two(), (x4(),)),
    ("output-without-grad", lambda: Two(), (x4(),)),
    ("vanishing-gradient", lambda: Two(), (x4(),)),
    ("exploding-gradient", lambda: Two(), (x4(),)),
    ("nan-gradient", lambda: Two(), (x4(),)),
    ("inplace-autograd", lambda: Two(), (x4(),)),
    ("nan-activation", lambda: Two(), (x4(),)),
    ("nan-activation", lambda: Two("masked-inf"), (x4(),)),  # -inf that never reaches the output
    ("dead-relu", lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU()), (x4(),)),
    ("saturated-activation", lambda: nn.Sequential(nn.Linear(4, 8), nn.Sigmoid()), (x4(),)),
    ("fp16-overflow", lambda: Two(), (x4(),)),
    ("bf16-precision", lambda: Two(), (x4(),)),
    ("batchnorm-single-value", bn1d, (x4(16),)),
    ("batchnorm-few-values", bn1d, (x4(16),)),
    ("mode-divergence", lambda: Two(), (x4(),)),
    ("bias-before-batchnorm", lambda: conv_bn(False), (torch.randn(2, 3, 8, 8),)),
    ("tensor-attribute", lambda: WithMask(registered=True), (x4(),)),
    ("tensor-attribute", WithConstant, (x4(),)),  # fx's own constants are not the model's
    ("inplace-read-later", lambda: Residual(inplace=False), (x4(),)),
    ("values-not-computed", lambda: Two(), (x4(),)),
]


@pytest.mark.parametrize("rule_id,make,args", HEALTHY, ids=[h[0] for h in HEALTHY])
def test_rule_quiet_on_healthy_model(rule_id, make, args) -> None:
    assert hits(inspect(make(), *args), rule_id) == []


def test_fx_capture_leaves_no_constants_on_the_model() -> None:
    model = WithConstant()
    capture = trace_fx(model, (x4(),), {})
    assert not [n for n in vars(model) if n.startswith("_tensor_constant")]
    assert capture.graph_module._tensor_constant0.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_every_rule_has_a_trigger_test() -> None:
    tested = {t[0] for t in TRIGGERS} | {
        "mixed-devices",
        "mixed-dtypes",
        "capture-failed",
        "checkpoint-candidate",
        "gradients-failed",
        "train-mode-failure",
        "export-failed",  # tests/test_export.py
        "kernel-memory-unmodelled",  # tests/test_kernel_memory.py
        "memory-estimate-gap",  # tests/test_kernel_memory.py
    }
    assert set(RULES) == tested


def test_cut_variants_name_the_op_and_line() -> None:
    for how, op in [
        ("detach", "detach"),
        ("data", "data"),
        ("numpy", "detach"),
        ("int", "long"),
        ("nograd", "linear"),
    ]:
        ctx = inspect(Two(how), x4())
        found = hits(ctx, "grad-path-cut")
        assert [f.where for f in found] == ["a"], how
        assert f"`{op}`" in found[0].message and "test_rules.py:" in found[0].message, how
    assert "no_grad" in hits(inspect(Two("nograd"), x4()), "grad-path-cut")[0].message


def test_unused_says_whether_module_ran() -> None:
    message = hits(inspect(Unused(), x4()), "unused-parameter")[0].message
    assert "weight, bias" in message and "never called" in message


def test_fp16_and_bf16_hazards_are_info_for_other_dtypes() -> None:
    assert hits(inspect(Two("big"), x4()), "fp16-overflow")[0].severity == "info"
    assert hits(inspect(Two("offset"), x4()), "bf16-precision")[0].severity == "info"


def test_bias_before_batchnorm_without_graph() -> None:
    ctx = inspect(conv_bn(True), torch.randn(2, 3, 8, 8), capture="hooks")
    assert [f.where for f in hits(ctx, "bias-before-batchnorm")] == ["0"]


def test_mixed_devices_and_dtypes() -> None:
    model = Two()
    model.b.half()
    ctx = context_for(model, (x4(),))
    findings.run(ctx)
    assert [(f.severity, f.where) for f in hits(ctx, "mixed-dtypes")] == [("warning", "b")]
    model = Two()
    model.b.to("meta")
    ctx = context_for(model, (x4(),))
    findings.run(ctx)
    assert [(f.severity, f.where) for f in hits(ctx, "mixed-devices")] == [("error", "b")]
    ctx = context_for(Two(), (x4(),))
    findings.run(ctx)
    assert not hits(ctx, "mixed-devices") and not hits(ctx, "mixed-dtypes")


def test_a_wider_buffer_beside_narrow_weights_is_not_mixed() -> None:
    """Llama keeps its rotary inv_freq in float32 beside bf16 weights, on purpose."""
    model = Two().to(torch.bfloat16)
    model.b.register_buffer("inv_freq", torch.ones(4, dtype=torch.float32))
    ctx = context_for(model, (x4().bfloat16(),))
    findings.run(ctx)
    assert not hits(ctx, "mixed-dtypes")
    model = Two()  # float32 weights beside a float16 buffer: narrower, flagged
    model.b.register_buffer("scale", torch.ones(4, dtype=torch.float16))
    ctx = context_for(model, (x4(),))
    findings.run(ctx)
    assert [f.where for f in hits(ctx, "mixed-dtypes")] == ["b"]


def test_capture_failures_are_info_when_a_later_method_worked() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    ctx = inspect(Branchy(), x4())
    assert [(f.severity, f.rule) for f in ctx.report.findings] == [("info", "capture-failed")]
    ctx.report.capture.attempts = [CaptureAttempt(method="fx", ok=False, error="boom")]
    assert hits_of(run_rules(ctx), "capture-failed")[0].severity == "warning"
    assert not hits(inspect(Two(), x4()), "capture-failed")


def hits_of(found: list[Finding], rule_id: str) -> list[Finding]:
    return [f for f in found if f.rule == rule_id]


def test_checkpoint_candidates_from_memory_section() -> None:
    ctx = context_for(Two(), (x4(),))
    findings.run(ctx)
    assert not hits(ctx, "checkpoint-candidate")  # no memory pass: silent
    mib = 1 << 20
    memory = ctx.report.memory
    memory.saved_activation_bytes = 100 * mib
    memory.advice = [
        MemoryAdvice(kind="checkpoint", where="a", saving_bytes=76 * mib, verified=True,
                     message="Checkpointing a ..."),
        MemoryAdvice(kind="checkpoint", where="b", saving_bytes=5 * mib, message="b"),
    ]  # fmt: skip
    found = hits_of(run_rules(ctx), "checkpoint-candidate")
    assert [(f.severity, f.where) for f in found] == [("info", "a")]
    # the advice's own number: 76 of 100 MiB saved
    assert "frees 76.00 MiB (76% of the saved activations, measured on fake tensors)" in (
        found[0].message
    )
    memory.advice.append(
        MemoryAdvice(kind="checkpoint-all", saving_bytes=81 * mib, verified=True, message="all")
    )
    found = hits_of(run_rules(ctx), "checkpoint-candidate")
    assert [f.where for f in found] == ["a"]
    assert "every block frees 81.00 MiB (81%" in found[0].message
    assert "the largest single block, 'a', frees 76.00 MiB" in found[0].message
    memory.advice = [MemoryAdvice(kind="checkpoint", where="b", saving_bytes=5 * mib, message="")]
    assert not hits_of(run_rules(ctx), "checkpoint-candidate")  # 5% is under the 30% share


def test_gradients_failed_and_train_mode_failure() -> None:
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                raise RuntimeError("train mode is not supported")
            return self.lin(x)

    ctx = inspect(Fails().eval(), x4(), capture="hooks")
    assert [(f.severity, f.where) for f in hits(ctx, "train-mode-failure")] == [("warning", "")]
    assert "train mode is not supported" in hits(ctx, "train-mode-failure")[0].message
    assert not hits(inspect(Two(), x4()), "train-mode-failure")

    class BadBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # noqa: ANN001, ANN205
            return x.clone()

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            raise RuntimeError("no backward here")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return BadBackward.apply(self.lin(x))

    found = hits(inspect(Net(), x4(), capture="hooks"), "gradients-failed")
    assert [f.severity for f in found] == ["warning"] and "no backward here" in found[0].message
    assert not hits(inspect(Two(), x4()), "gradients-failed")


def test_registry_refuses_duplicates_and_bad_severity() -> None:
    with pytest.raises(ValueError, match="already registered"):
        rule("dead-relu", "warning")(lambda ctx, report: [])
    with pytest.raises(ValueError, match="severity"):
        rule("dead-relu", "fatal")
    with pytest.raises(ValueError, match="not listed in inspector/schema/findings.py"):
        rule("new-rule", "warning")


def test_a_crashing_rule_becomes_an_info_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx, report):  # noqa: ANN001, ANN202
        raise KeyError("oops")

    monkeypatch.setitem(
        RULES, "broken", RULES["dead-relu"].__class__("broken", "error", broken, "")
    )
    found = run_rules(context_for(Two(), (x4(),)))
    assert [(f.rule, f.severity) for f in found] == [("rule-crashed", "info")]


def test_findings_sorted_errors_first() -> None:
    ctx = inspect(Unused(), x4())
    ctx.report.capture.attempts = [CaptureAttempt(method="fx", ok=False, error="x")]
    order = [f.severity for f in run_rules(ctx)]
    assert order == sorted(order, key=["error", "warning", "info"].index)


# --- healthy standard models: no error or warning ----------------------------------------


def _loud(ctx) -> list[tuple[str, str, str]]:
    return [(f.rule, f.where, f.message) for f in ctx.report.findings if f.severity != "info"]


@pytest.mark.parametrize(
    "make,config",
    [
        ("make_mlp", {}),
        ("make_resnet18", {}),
        ("make_gpt2", {"n_layer": 2}),
        ("make_bert", {"num_hidden_layers": 2}),
    ],
)
def test_standard_models_have_no_errors_or_warnings(make: str, config: dict) -> None:
    import models

    model, (args, kwargs) = getattr(models, make)(**config)
    ctx = inspect(model, *args, **kwargs)
    assert ctx.report.gradients.computed and ctx.report.modes.computed
    assert _loud(ctx) == []


@pytest.mark.slow
@pytest.mark.parametrize("make", ["make_gpt2", "make_bert"])
def test_full_size_transformers_have_no_errors_or_warnings(make: str) -> None:
    import models

    model, (args, kwargs) = getattr(models, make)()
    ctx = inspect(model, *args, **kwargs)
    assert ctx.report.gradients.computed
    assert _loud(ctx) == []
