"""`exploding` means a gradient that grew on its way back (or a norm orders of magnitude off),
not a large grad/weight ratio alone: healthy standard designs at initialisation have
ratios above 10 (issue #16: ConvNeXt's layer scale, ALBERT's token types, FCN-ResNet50's
first conv), and a model whose backward really amplifies is still flagged."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models import resnet18
from torchvision.models.convnext import CNBlock

from inspector.health.adhoc import context_for
from inspector.health.gates import gate_rows
from inspector.passes import findings, gradients


def run(model: nn.Module, *args: torch.Tensor, **kw):
    ctx = context_for(model, args, user_files=[__file__], **kw)
    gradients.run(ctx)
    findings.run(ctx)
    return ctx


def layers(ctx) -> dict:
    return {x.module_path: x for x in ctx.report.gradients.layers}


def loud(ctx) -> list[str]:
    return [f.rule for f in ctx.report.findings if f.severity in ("error", "warning")]


class ConvNeXtBlocks(nn.Module):
    """torchvision's own CNBlock: its layer scale is a (C, 1, 1) parameter at 1e-6."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 16, 4, stride=4)
        self.blocks = nn.Sequential(CNBlock(16, 1e-6, 0.0), CNBlock(16, 1e-6, 0.0))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def test_convnext_layer_scale_is_a_vector_gate_not_a_kernel() -> None:
    ctx = run(ConvNeXtBlocks(), torch.randn(2, 3, 32, 32))
    scale = next(r for r in ctx.report.gradients.params if r.name == "blocks.0.layer_scale")
    assert scale.shape == [16, 1, 1]
    # counted as a kernel, its grad/weight (against 1e-6 x 4 = 4e-6) made the block
    # "exploding": torchvision convnext_tiny had 18 such blocks
    assert scale.ratio > 10
    assert scale in gate_rows(ctx.report.gradients.params)
    by_path = layers(ctx)
    assert by_path["blocks.0"].ratio is None and by_path["blocks.0"].verdict == "ok"
    assert by_path["blocks.0.block.3"].verdict == "gated"  # silenced by the closed scale
    assert loud(ctx) == []


class TokenTypes(nn.Module):
    """BERT/ALBERT embeddings (std 0.02): every position reads token type 0, so that row
    sums every position's gradient; a pooled head as ALBERT's pooler."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.words, self.types = nn.Embedding(100, 16), nn.Embedding(2, 16)
        for table in (self.words, self.types):
            nn.init.normal_(table.weight, std=0.02)
        self.norm, self.head = nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.words(ids) + self.types(torch.zeros_like(ids)))
        return self.head(h.mean(1))


def test_lookup_table_read_by_every_position_is_not_exploding() -> None:
    ctx = run(TokenTypes(), torch.randint(0, 100, (2, 16)))
    by_path = layers(ctx)
    types, later = by_path["types"], max(by_path["norm"].grad_rms, by_path["head"].grad_rms)
    assert types.ratio > 10  # the old criterion's alarm (ALBERT: 14.5)
    assert types.grad_rms < 100 * later  # per element it grew < 100x: nothing amplified
    assert types.verdict == "ok" and loud(ctx) == []


class FCN18(nn.Module):
    """torchvision's ResNet-18 body with a 1x1 per-pixel classifier, trained with a
    per-pixel cross-entropy: its first conv on raw pixels, before a BatchNorm, gets the
    largest gradient (FCN-ResNet50: grad/weight 59)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(*list(resnet18().children())[:-2])
        self.head = nn.Conv2d(512, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.interpolate(self.head(self.body(x)), size=x.shape[2:])


def pixel_ce(out: torch.Tensor, inputs) -> torch.Tensor:  # noqa: ANN001 - Inputs
    labels = torch.zeros(out.shape[0], *out.shape[2:], dtype=torch.long)
    return nn.functional.cross_entropy(out, labels)


def test_first_conv_on_raw_pixels_is_not_exploding() -> None:
    ctx = run(FCN18(), torch.randn(2, 3, 64, 64), loss_fn=pixel_ce)
    conv1 = layers(ctx)["body.0"]
    assert conv1.ratio > 10  # the old criterion's alarm
    assert conv1.verdict == "ok" and loud(ctx) == []


class Amplify(torch.autograd.Function):
    """Identity forward, backward x `gain`: a custom backward with a wrong scale."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gain: float) -> torch.Tensor:  # noqa: ANN001
        ctx.gain = gain
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad * ctx.gain, None


class AmplifiedBackward(nn.Module):
    def __init__(self, gain: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gain = gain
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(Amplify.apply(torch.relu(self.a(x)), self.gain))))


def test_a_gradient_amplified_on_its_way_back_is_exploding() -> None:
    ctx = run(AmplifiedBackward(3e3), torch.randn(4, 8))
    by_path = layers(ctx)
    a, b = by_path["a"], by_path["b"]
    # not by the absolute norm: by growth (3e3 x the later layers, per element) and ratio
    assert a.grad_norm < ctx.report.gradients.thresholds["exploding_norm"]
    assert a.grad_rms > 1e3 * max(b.grad_rms, by_path["c"].grad_rms) and a.ratio > 10
    assert a.verdict == "exploding" and b.verdict == by_path["c"].verdict == "ok"
    found = [f for f in ctx.report.findings if f.rule == "exploding-gradient"]
    assert len(found) == 1 and found[0].where == "a" and "1 layer(s)" in found[0].message


@pytest.mark.parametrize("gain", [1.0, 100.0])
def test_growth_below_the_line_is_not_exploding(gain: float) -> None:
    by_path = layers(run(AmplifiedBackward(gain), torch.randn(4, 8)))
    assert {x.verdict for x in by_path.values()} == {"ok"}


class ConvBN(nn.Module):
    """A conv at a small norm before a train-mode BatchNorm, as Mask R-CNN's first conv on
    raw pixels (grad norm 1,152..3,390 at init): BatchNorm divides out the conv's scale, so
    its gradient is 1 / its norm; `loss_scale` multiplies the whole loss."""

    def __init__(self, weight_scale: float, loss_scale: float = 1.0, norm: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.loss_scale = loss_scale
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        with torch.no_grad():
            self.conv.weight.mul_(weight_scale)
        # eps far below the conv's variance at 1e-4 (~3e-9), so the scale divides out
        self.bn = nn.BatchNorm2d(8, eps=1e-14) if norm else nn.Identity()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.head(h) * self.loss_scale


def targets(out: torch.Tensor, inputs) -> torch.Tensor:  # noqa: ANN001 - Inputs
    return nn.functional.cross_entropy(out, torch.arange(out.shape[0]) % out.shape[1])


def test_a_conv_before_batchnorm_is_not_exploding_for_its_norm() -> None:
    x = torch.randn(4, 3, 16, 16)
    small, unit = run(ConvBN(1e-4), x, loss_fn=targets), run(ConvBN(1.0), x, loss_fn=targets)
    conv, conv_unit = layers(small)["conv"], layers(unit)["conv"]
    # BatchNorm divides out the 1e-4: the same forward, a gradient 1e4 x larger
    assert small.report.gradients.params[0].grad_norm == pytest.approx(
        1e4 * unit.report.gradients.params[0].grad_norm, rel=1e-3
    )
    assert conv.grad_norm > small.report.gradients.thresholds["exploding_norm"]
    assert conv.verdict == conv_unit.verdict == "ok" and loud(small) == []


def test_a_loss_off_by_orders_of_magnitude_is_still_exploding_past_a_batchnorm() -> None:
    ctx = run(ConvBN(1.0, loss_scale=1e6), torch.randn(4, 3, 16, 16), loss_fn=targets)
    by_path = layers(ctx)
    assert by_path["conv"].verdict == "ok"  # scale-free: its norm says nothing
    assert by_path["bn"].verdict == by_path["head"].verdict == "exploding"
    assert "exploding-gradient" in loud(ctx)


def test_the_same_conv_without_a_normalisation_is_judged_by_its_norm() -> None:
    ctx = run(ConvBN(1.0, loss_scale=1e6, norm=False), torch.randn(4, 3, 16, 16), loss_fn=targets)
    assert layers(ctx)["conv"].verdict == "exploding"


def test_scale_free_layers_are_those_whose_every_output_is_normalised() -> None:
    from inspector.health.scalefree import feeding_normalisation

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.norm, self.frozen = nn.LayerNorm(4), nn.BatchNorm1d(4).eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # a: normalised once, added once; b: into a BatchNorm on running stats
            return self.norm(self.a(x)) + self.a(x) + self.frozen(self.b(x))

    model = Shared()
    with feeding_normalisation(model) as fed:
        model(torch.randn(3, 4))
    assert fed.layers() == set()
    model.frozen.train()
    with feeding_normalisation(model) as fed:
        model(torch.randn(3, 4))
    assert fed.layers() == {"b"}
