"""Every lint rule: a tiny model that triggers it (rule id, severity, location) and one
that does not; the registry itself; no error/warning on healthy standard models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from inspector.context import Options
from inspector.graph.fxcapture import trace_fx
from inspector.health.adhoc import context_for
from inspector.passes import findings, gradients, modes, numerics, probe
from inspector.report import CaptureAttempt, Finding, MemoryAdvice
from inspector.rules import RULES, rule, run_rules

VALUE_PASSES = (gradients, numerics, modes, probe, findings)


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
        elif self.how == "tiny":  # |linear| ~ 1e-6: below float16's normal range
            h = torch.nn.functional.linear(h, self.a.weight * 1e-6) + x
        elif self.how == "tiny-mul":  # tiny, but elementwise: fp16 autocast keeps its dtype
            h = (h * 1e-6).float() * 1e6
        elif self.how == "fdropout":
            h = torch.nn.functional.dropout(h, 0.5)  # training defaults to True, even in eval
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


class MakesLayer(nn.Module):
    """Builds a module (`layer`) or a bare parameter (`param`) inside forward."""

    def __init__(self, how: str = "layer") -> None:
        super().__init__()
        self.lin, self.how = nn.Linear(4, 4), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.how == "layer":
            return nn.Linear(4, 3)(h)  # MADE-LINE
        if self.how == "param":
            return h * nn.Parameter(torch.ones(4))  # PARAM-LINE
        return h


class Positions(nn.Module):
    """Adds positions 0..3 made in forward: without a device, on "cpu", moved with .to."""

    def __init__(self, how: str = "follow") -> None:
        super().__init__()
        self.lin, self.how = nn.Linear(4, 4), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "none":
            pos = torch.arange(4.0)  # NODEVICE-LINE
        elif self.how == "cpu":
            pos = torch.arange(4.0, device="cpu")  # CPU-LINE
        elif self.how == "to":
            pos = torch.arange(4.0, device=x.device).to("cpu")  # TO-LINE
        else:
            pos = torch.arange(4.0, device=x.device) * torch.tensor(2.0)  # 0-dim: fine
        return self.lin(x + pos)


class Attention(nn.Module):
    """Single-head self-attention on [B, S, 16]: scores scaled by 1/sqrt(16) or not, and
    queries `sharp` times larger (a saturated softmax at initialisation)."""

    def __init__(self, scale: bool = True, sharp: float = 1.0) -> None:
        super().__init__()
        self.qkv, self.scale, self.sharp = nn.Linear(16, 48), scale, sharp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q * self.sharp) @ k.transpose(-2, -1)
        if self.scale:
            scores = scores / 4.0  # sqrt(16)
        return torch.softmax(scores, dim=-1) @ v  # SOFTMAX-LINE


class SdpaAttention(Attention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def swin_attention(version: int) -> nn.Module:
    """torchvision's Swin window attention, small: V1 scales q before the matmul
    (q * d**-0.5), V2 is cosine attention (normalised q and k, a per-head logit scale)."""
    from torchvision.models import swin_transformer as swin

    cls = swin.ShiftedWindowAttention if version == 1 else swin.ShiftedWindowAttentionV2
    return cls(dim=16, window_size=[4, 4], shift_size=[0, 0], num_heads=2)


def windows() -> torch.Tensor:
    return torch.randn(2, 8, 8, 16)  # [B, H, W, C]: four 4x4 windows per image


def seq(batch: int = 4, length: int = 8) -> torch.Tensor:
    return torch.randn(batch, length, 16)


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


def _line(tag: str) -> int:
    text = Path(__file__).read_text().splitlines()
    return next(i for i, t in enumerate(text, 1) if f"# {tag}" in t and "_line(" not in t)


def test_param_created_in_forward_names_a_bare_parameter() -> None:
    [found] = hits(inspect(MakesLayer("param"), x4()), "param-created-in-forward")
    assert found.where == f"test_rules.py:{_line('PARAM-LINE')}"
    assert found.message.startswith("nn.Parameter is created inside forward")
    [layer] = hits(inspect(MakesLayer("layer"), x4()), "param-created-in-forward")
    assert "a Linear module is created" in layer.message and "__init__" in layer.fix


def test_hardcoded_device_says_how() -> None:
    for how, tag, text in [
        ("none", "NODEVICE-LINE", "`arange` makes a tensor without a device"),
        ("cpu", "CPU-LINE", "with device='cpu'"),
        ("to", "TO-LINE", "with .to('cpu')"),
    ]:
        [found] = hits(inspect(Positions(how), x4()), "hardcoded-device")
        assert found.where == f"test_rules.py:{_line(tag)}", how
        assert text in found.message and "device=x.device" in found.fix, how


class PackedLengths(nn.Module):
    """A padded batch through an LSTM by its lengths: torch's `pad_packed_sequence` puts
    the lengths on the CPU (`.cpu()`) by contract, inside torch, not on a line of ours."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True)
        return out.mean(1) + x.new_ones(1).cpu()  # OWN-CPU-LINE


def test_hardcoded_device_is_the_users_line_not_torchs_own() -> None:
    """Only the `.cpu()` the forward writes itself; `pad_packed_sequence`'s own was
    reported at the line calling it."""
    lengths = torch.tensor([5, 3, 2])
    found = hits(inspect(PackedLengths(), torch.randn(3, 5, 4), lengths), "hardcoded-device")
    assert [f.where for f in found] == [f"test_rules.py:{_line('OWN-CPU-LINE')}"]
    assert "with .cpu()" in found[0].message


class PrescaledQuery(Attention):
    """The scale on the query before the matmul (torchvision's Swin): `factor` 0.25 is
    1/sqrt(16); 1.0 scales nothing and 100 sharpens."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q * self.factor
        return torch.softmax(q.matmul(k.transpose(-2, -1)), dim=-1) @ v


def test_a_scale_on_the_query_counts_only_when_it_shrinks() -> None:
    assert hits(inspect(PrescaledQuery(0.25), seq()), "softmax-saturated") == []
    for factor in (1.0, 100.0):
        [found] = hits(inspect(PrescaledQuery(factor), seq()), "softmax-saturated")
        assert "no 1/sqrt(d) scale" in found.message, factor


class AlibiAttention(Attention):
    """BLOOM's attention: `baddbmm(bias, q, k^T, alpha=1/sqrt(d))`, the scale inside the
    matmul; alpha 1.0 scales nothing."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        bias = torch.zeros(x.shape[0], x.shape[1], x.shape[1])
        scores = torch.baddbmm(bias, q, k.transpose(-2, -1), beta=1.0, alpha=self.alpha)
        return torch.softmax(scores, dim=-1) @ v


def test_a_scale_in_baddbmm_alpha_counts() -> None:
    assert hits(inspect(AlibiAttention(0.25), seq()), "softmax-saturated") == []
    [found] = hits(inspect(AlibiAttention(1.0), seq()), "softmax-saturated")
    assert "no 1/sqrt(d) scale" in found.message


def test_softmax_saturated_without_scale_or_one_hot() -> None:
    where = f"test_rules.py:{_line('SOFTMAX-LINE')}"
    [unscaled] = hits(inspect(Attention(scale=False), seq()), "softmax-saturated")
    assert (unscaled.severity, unscaled.where) == ("warning", where)
    assert "no 1/sqrt(d) scale" in unscaled.message and "saturated" not in unscaled.message
    # queries 100x larger: scores of std ~100, almost every row one-hot
    [sharp] = hits(inspect(Attention(sharp=100.0), seq()), "softmax-saturated")
    assert "rows put more than 0.99 of their weight on one position" in sharp.message
    share = int(sharp.message.split("% of its")[0].rsplit(" ", 1)[1])
    assert share > 50 and "of its 32 rows" in sharp.message  # 4 batches * 8 query rows


def conv_bn(bias: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=bias), nn.BatchNorm2d(8), nn.ReLU())


def bn1d() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))


def x4(batch: int = 16) -> torch.Tensor:
    return torch.randn(batch, 4)


def bn_stats(running_var: float | None) -> nn.Module:
    """bn1d with running stats set by hand (stale: tiny variance), or learned from
    data like x4 by 30 train-mode forwards (None)."""
    model = bn1d()
    norm = model[1]
    if running_var is None:
        with torch.no_grad():
            for _ in range(30):
                model(x4(64))
    else:
        norm.running_var.fill_(running_var)
        norm.num_batches_tracked += 100
    return model


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
    ("dead-relu", "warning", "relu", lambda: Two("dead"), (x4(32),), None),  # dead_min_samples
    ("saturated-activation", "warning", "sigmoid", lambda: Two("saturate"), (x4(),), None),
    ("fp16-overflow", "warning", "add", lambda: Two("big"), (x4(),), Options(dtype="fp16")),
    ("fp16-underflow", "warning", "linear", lambda: Two("tiny"), (x4(),), Options(dtype="fp16")),
    ("batchnorm-stats", "warning", "1", lambda: bn_stats(0.001), (x4(),), None),
    ("data-parallel", "info", "", lambda: nn.DataParallel(Two()), (x4(),), None),
    (
        "attention-materialized",
        "info",
        f"test_rules.py:{_line('SOFTMAX-LINE')}",
        Attention,
        (seq(),),
        None,
    ),
    ("bf16-precision", "warning", "add", lambda: Two("offset"), (x4(),), Options(dtype="bf16")),
    ("batchnorm-single-value", "error", "1", bn1d, (x4(1),), None),
    ("batchnorm-few-values", "warning", "1", bn1d, (x4(4),), None),
    ("mode-divergence", "info", "", Training, (x4(),), None),
    (
        "bias-before-batchnorm",
        "info",  # waste, not harm
        "0",
        lambda: conv_bn(True),
        (torch.randn(2, 3, 8, 8),),
        None,
    ),
    ("tensor-attribute", "warning", "mask", WithMask, (x4(),), None),
    ("inplace-read-later", "warning", "act", Residual, (x4(),), None),
    ("values-not-computed", "info", "", lambda: Two(), (x4(),), Options(fake=True)),
    ("ddp-unused-parameters", "warning", "", Unused, (x4(),), None),
    ("eval-nondeterministic", "warning", "dropout", lambda: Two("fdropout"), (x4(),), None),
    (
        "param-created-in-forward",
        "error",
        f"test_rules.py:{_line('MADE-LINE')}",
        MakesLayer,
        (x4(),),
        None,
    ),
    (
        "hardcoded-device",
        "warning",
        f"test_rules.py:{_line('NODEVICE-LINE')}",
        lambda: Positions("none"),
        (x4(),),
        None,
    ),
    (
        "softmax-saturated",
        "warning",
        f"test_rules.py:{_line('SOFTMAX-LINE')}",
        lambda: Attention(scale=False),
        (seq(),),
        None,
    ),
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
    ("dead-relu", lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU()), (x4(32),)),
    ("saturated-activation", lambda: nn.Sequential(nn.Linear(4, 8), nn.Sigmoid()), (x4(),)),
    ("fp16-overflow", lambda: Two(), (x4(),)),
    ("fp16-underflow", lambda: Two(), (x4(),)),
    ("fp16-underflow", lambda: Two("tiny-mul"), (x4(),)),
    ("batchnorm-stats", lambda: bn_stats(None), (x4(),)),  # stats learned on such data
    ("data-parallel", lambda: Two(), (x4(),)),
    ("attention-materialized", SdpaAttention, (seq(),)),
    ("bf16-precision", lambda: Two(), (x4(),)),
    ("batchnorm-single-value", bn1d, (x4(16),)),
    ("batchnorm-few-values", bn1d, (x4(16),)),
    ("mode-divergence", lambda: Two(), (x4(),)),
    ("bias-before-batchnorm", lambda: conv_bn(False), (torch.randn(2, 3, 8, 8),)),
    ("tensor-attribute", lambda: WithMask(registered=True), (x4(),)),
    ("tensor-attribute", WithConstant, (x4(),)),  # fx's own constants are not the model's
    ("inplace-read-later", lambda: Residual(inplace=False), (x4(),)),
    ("values-not-computed", lambda: Two(), (x4(),)),
    # nn.Dropout is off in eval; Training only scales by mode
    ("eval-nondeterministic", lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), (x4(),)),
    ("eval-nondeterministic", Training, (x4(),)),
    ("param-created-in-forward", lambda: MakesLayer("none"), (x4(),)),
    ("softmax-saturated", Attention, (seq(),)),
    (
        "softmax-saturated",
        lambda: nn.MultiheadAttention(16, 2, batch_first=True),
        (seq(), seq(), seq()),
    ),  # torch's own attention scales: its softmax is not the user's
    ("hardcoded-device", lambda: Positions("follow"), (x4(),)),
    ("softmax-saturated", lambda: swin_attention(1), (windows(),)),  # q scaled first
    ("softmax-saturated", lambda: swin_attention(2), (windows(),)),  # cosine attention
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
        "export-mismatch",  # tests/test_export.py
        "compile-graph-break",  # tests/test_compile.py
        "softmax-before-cross-entropy",  # needs a loss_fn: its own tests below
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


def test_ddp_names_the_parameters_without_gradient() -> None:
    [found] = hits(inspect(Unused(), x4()), "ddp-unused-parameters")
    # Unused: used = Linear(4, 2), spare = Linear(4, 2) never called: 2 of 4 tensors
    assert "2 of 4 trainable parameters get no gradient" in found.message
    assert "(spare.weight, spare.bias)" in found.message
    assert "find_unused_parameters=True" in found.fix and "static_graph=True" in found.fix
    cut = hits(inspect(Two("detach"), x4()), "ddp-unused-parameters")  # a cut path: no grad
    assert [f.severity for f in cut] == ["warning"] and "a.weight, a.bias" in cut[0].message


def test_ddp_defaults_are_safe_when_every_parameter_gets_a_gradient() -> None:
    [found] = hits(inspect(Two(), x4()), "ddp-unused-parameters")
    assert found.severity == "info"
    assert "All 4 trainable parameters get a gradient" in found.message
    assert "find_unused_parameters=False is safe for this input" in found.message
    assert "static_graph=True applies" in found.message  # one fx graph, no value branch
    frozen = Unused()
    frozen.spare.requires_grad_(False)  # frozen on purpose: DDP skips it
    [found] = hits(inspect(frozen, x4()), "ddp-unused-parameters")
    assert found.severity == "info" and "All 2 trainable parameters" in found.message
    ctx = context_for(Two(), (x4(),))
    findings.run(ctx)  # no backward ran: nothing to say about DDP
    assert not hits(ctx, "ddp-unused-parameters")


class Head(nn.Module):
    """Linear logits, then `last` (none, softmax, log_softmax, sigmoid) in forward."""

    def __init__(self, last: str = "none") -> None:
        super().__init__()
        self.lin, self.last = nn.Linear(4, 3), last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.last == "none":
            return y
        return getattr(torch, self.last)(y, dim=-1) if "softmax" in self.last else y.sigmoid()


def _labels(output: torch.Tensor) -> torch.Tensor:
    return torch.arange(output.shape[0]) % 3


def _ce(output, inputs):  # noqa: ANN001, ANN202
    return torch.nn.functional.cross_entropy(output.view(-1, 3), _labels(output))  # CE-LINE


def _nll(output, inputs):  # noqa: ANN001, ANN202
    return torch.nn.functional.nll_loss(output, _labels(output))


def _bce(output, inputs):  # noqa: ANN001, ANN202
    return nn.BCELoss()(output.clamp(0, 1), torch.ones_like(output))


def _loss_hits(model: nn.Module, loss_fn) -> list[Finding]:  # noqa: ANN001
    ctx = context_for(model, (x4(),), loss_fn=loss_fn, user_files=[__file__])
    for stage in VALUE_PASSES:
        stage.run(ctx)
    return hits(ctx, "softmax-before-cross-entropy")


def test_softmax_before_cross_entropy_names_the_loss_line() -> None:
    line = _line("CE-LINE")
    [found] = _loss_hits(Head("softmax"), _ce)  # softmax, then .view: still softmax
    assert (found.severity, found.where) == ("warning", f"test_rules.py:{line}")
    assert "its input comes from softmax" in found.message and "logits" in found.fix
    assert [f.severity for f in _loss_hits(Head("log_softmax"), _ce)] == ["warning"]
    nll = _loss_hits(Head("softmax"), _nll)
    assert [f.message.split(":")[0] for f in nll] == ["nll_loss at test_rules.py"]
    bce = _loss_hits(Head("none"), _bce)  # nn.BCELoss on clamped logits, no sigmoid
    assert len(bce) == 1 and "BCEWithLogitsLoss" in bce[0].fix
    assert "is not a sigmoid output" in bce[0].message


def test_losses_on_the_right_inputs_are_quiet() -> None:
    assert _loss_hits(Head("none"), _ce) == []  # logits into cross_entropy
    assert _loss_hits(Head("log_softmax"), _nll) == []  # log-probabilities into nll_loss
    sigmoid_bce = _loss_hits(Head("sigmoid"), lambda o, i: nn.BCELoss()(o, torch.ones_like(o)))
    assert sigmoid_bce == []
    assert _loss_hits(Head("softmax"), None) == []  # the default loss (means) has no loss fn


class TwoHeads(nn.Module):
    """A shared trunk and two heads; the loss functions below cut one head inside the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.value, self.policy = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return self.value(h), self.policy(h)


def _detach_in_loss(output, inputs):  # noqa: ANN001, ANN202
    value, policy = output
    return (value.detach() - 1.0).pow(2).mean() + policy.pow(2).mean()  # LOSS-DETACH


def _nograd_in_loss(output, inputs):  # noqa: ANN001, ANN202
    value, policy = output
    with torch.no_grad():
        target = value * 0.5 + 1.0  # LOSS-NOGRAD
    return target.mean() + policy.pow(2).mean()


def _all_detached(output, inputs):  # noqa: ANN001, ANN202
    return output[0].detach().mean() + output[1].detach().mean()  # LOSS-ALL


def _cut_hits(loss_fn, rule_id: str = "grad-path-cut") -> list[Finding]:  # noqa: ANN001
    ctx = context_for(TwoHeads(), (x4(),), loss_fn=loss_fn, user_files=[__file__])
    for stage in VALUE_PASSES:
        stage.run(ctx)
    return hits(ctx, rule_id)


def test_a_cut_inside_loss_fn_names_its_line() -> None:
    [found] = _cut_hits(_detach_in_loss)
    line = _line("LOSS-DETACH")
    assert (found.severity, found.where) == ("error", f"test_rules.py:{line}")
    # only the value head feeds the detached term; the trunk reaches the loss via policy
    assert found.message.startswith("the parameters of 'value' get no gradient")
    assert f"`detach` in loss_fn at test_rules.py:{line}" in found.message
    assert "(`return (value.detach() - 1.0).pow(2).mean()" in found.message
    assert "Remove `.detach()`" in found.fix
    [nograd] = _cut_hits(_nograd_in_loss)
    assert nograd.where == f"test_rules.py:{_line('LOSS-NOGRAD')}"
    assert "`mul` under torch.no_grad() in loss_fn" in nograd.message
    assert "torch.no_grad()" in nograd.fix


def test_a_loss_cut_from_every_parameter_names_its_line() -> None:
    ctx = context_for(TwoHeads(), (x4(),), loss_fn=_all_detached, user_files=[__file__])
    for stage in VALUE_PASSES:
        stage.run(ctx)
    line = _line("LOSS-ALL")
    [found] = hits(ctx, "grad-path-cut")  # two detaches on one line: one site
    assert found.where == f"test_rules.py:{line}"
    assert "the parameters of 'trunk', 'value', 'policy' get no gradient" in found.message
    assert ctx.report.gradients.error.startswith("the loss does not require grad")
    assert f"cut by `detach` in loss_fn at test_rules.py:{line}" in ctx.report.gradients.error


def test_a_cut_in_a_model_files_loss_fn_through_the_pipeline() -> None:
    from inspector.analyze import inspect_model

    path = Path(__file__).with_name("loss_cut_model.py")
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "CUT-LINE" in t)
    options = Options(passes={"graph", "gradients", "findings"}, isolate=False)
    report = inspect_model(f"{path}:Net", options=options)
    [found] = [f for f in report.findings if f.rule == "grad-path-cut"]
    assert found.where == f"loss_cut_model.py:{line}"
    assert "the parameters of 'body' get no gradient" in found.message
    assert "(`loss = (out.detach() - target).pow(2).mean()  # CUT-LINE" in found.message
    cut = {p.name: p.cut_at for p in report.gradients.params if p.verdict == "cut"}
    assert list(cut) == ["body.weight", "body.bias"]
    assert cut["body.weight"].startswith(f"`detach` in loss_fn at loss_cut_model.py:{line}")


def test_a_loss_fn_that_keeps_the_graph_has_no_cut() -> None:
    def whole(output, inputs):  # noqa: ANN001, ANN202
        scale = output[1].detach().abs().max().item()  # a Python normaliser: harmless
        return output[0].pow(2).mean() + output[1].pow(2).mean() / (1.0 + scale)

    assert _cut_hits(whole) == [] and _cut_hits(whole, "unused-parameter") == []
    assert _cut_hits(whole, "gradients-failed") == []


def test_unused_says_whether_module_ran() -> None:
    message = hits(inspect(Unused(), x4()), "unused-parameter")[0].message
    assert "weight, bias" in message and "never called" in message


def test_batchnorm_stats_at_their_defaults_are_info() -> None:
    [found] = hits(inspect(bn1d(), x4()), "batchnorm-stats")
    assert (found.severity, found.where) == ("info", "1")
    assert "1 BatchNorm layer(s) still have their default running stats" in found.message
    [stale] = hits(inspect(bn_stats(0.001), x4()), "batchnorm-stats")
    # a Linear(4, 8) of x4 has a batch variance of order 0.1-1 per channel, against 0.001
    ratio = float(stale.message.split("up to ")[1].split("x its")[0])
    assert ratio > 10 and "update_bn" in stale.fix


class BatchNormAct(nn.BatchNorm1d):
    """timm's BatchNormAct2d in small: a BatchNorm subclass with a forward of its own, so
    fx traces through it, and its train-mode forward counts the batch in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        x = nn.functional.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
            self.momentum, self.eps,
        )  # fmt: skip
        return torch.relu(x)


def test_a_fresh_batchnorm_fx_traces_through_keeps_its_defaults() -> None:
    """fx's trace ran BatchNormAct's `num_batches_tracked.add_(1)` on the real buffer, so a
    fresh model's stats no longer looked like defaults and its batch variance (about
    1e4 here, a Linear(4, 8) scaled by 100) was judged against them: timm's MobileOne-S0
    had 138 batchnorm-stats warnings. The trace leaves the buffers as they were."""
    model = nn.Sequential(nn.Linear(4, 8), BatchNormAct(8))
    with torch.no_grad():
        model[0].weight.mul_(100)
    trace_fx(model, (x4(),), {})
    assert int(model[1].num_batches_tracked) == 0
    [found] = hits(inspect(model, x4()), "batchnorm-stats")
    assert (found.severity, found.where) == ("info", "1")
    assert int(model[1].num_batches_tracked) == 0


def test_attention_materialized_sums_the_probabilities() -> None:
    [found] = hits(inspect(Attention(), seq(4, 8)), "attention-materialized")
    # probabilities [4, 8, 8] float32: 4 * 8 * 8 * 4 = 1,024 bytes = 1.00 KiB
    assert "first [4x8x8]" in found.message and "at least 1.00 KiB" in found.message
    assert "scaled_dot_product_attention" in found.fix and "saving about 1.00 KiB" in found.fix


def test_fp16_underflow_quotes_the_share() -> None:
    [found] = hits(inspect(Two("tiny"), x4()), "fp16-underflow")
    # every value of linear(h, 1e-6 * W) is below 6.1e-5 (|h| < 61 for a Linear(4, 4) of x4)
    assert found.severity == "info" and "'linear' 100% of the nonzero values" in found.message


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
