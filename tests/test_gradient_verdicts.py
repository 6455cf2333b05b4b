"""Gradient verdicts on healthy standard designs at initialisation: no false alarms, and the
table (per-parameter verdicts) never disagrees with the findings."""

from __future__ import annotations

import pytest
import torch
from test_rules import Two
from torch import nn

from inspector.health.adhoc import context_for
from inspector.passes import findings, gradients
from inspector.schema.findings import PROBLEM_VERDICTS


def run(model: nn.Module, *args: torch.Tensor):
    ctx = context_for(model, args, user_files=[__file__])
    gradients.run(ctx)
    findings.run(ctx)
    return ctx


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
    )  # fmt: skip


class UNet(nn.Module):
    """Sequential encoder/decoder blocks with BatchNorm, skip concats and a 1x1 conv head
    whose bias starts near zero (issue #16: its bias was called "exploding")."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc1, self.enc2 = conv_block(3, 8), conv_block(8, 16)
        self.pool = nn.MaxPool2d(2)
        self.mid = conv_block(16, 16)
        self.up = nn.Upsample(scale_factor=2)
        self.dec2, self.dec1 = conv_block(32, 8), conv_block(16, 8)
        self.head = nn.Conv2d(8, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up(d2), e1], 1))
        return self.head(d1)


class LayerScaleBlock(nn.Module):
    """ConvNeXt/CaiT style: the branch is scaled by gamma = 1e-6 at initialisation."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = (
            nn.LayerNorm(dim),
            nn.Linear(dim, 4 * dim),
            nn.Linear(4 * dim, dim),
        )
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.fc2(torch.relu(self.fc1(self.norm(x))))


class LayerScaleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(8, 16)
        self.blocks = nn.Sequential(LayerScaleBlock(), LayerScaleBlock())
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class ZeroInitBlock(nn.Module):
    """torchvision's zero_init_residual: the last BatchNorm of the branch starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        nn.init.zeros_(self.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(h)))


class ZeroInitResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.block, self.head = nn.Conv2d(4, 4, 1), ZeroInitBlock(), nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)))


def verdicts(ctx) -> dict[str, str]:
    return {r.name: r.verdict for r in ctx.report.gradients.params}


def loud(ctx) -> list[str]:
    return [f.rule for f in ctx.report.findings if f.severity in ("error", "warning")]


def test_unet_head_bias_is_not_exploding() -> None:
    model = UNet()
    nn.init.constant_(model.head.bias, 1e-4)  # a near-zero bias, as the UNet had
    ctx = run(model, torch.randn(2, 3, 16, 16))
    head_bias = next(r for r in ctx.report.gradients.params if r.name == "head.bias")
    # its grad is far larger than its near-zero value, and that means nothing for a bias
    assert head_bias.ratio > 10 and head_bias.verdict == "ok"
    assert set(verdicts(ctx).values()) == {"ok"} and loud(ctx) == []


def test_layer_scale_blocks_are_gated_not_vanishing_or_exploding() -> None:
    ctx = run(LayerScaleNet(), torch.randn(4, 8))
    v = verdicts(ctx)
    assert v["blocks.0.fc1.weight"] == v["blocks.1.fc2.weight"] == "gated"
    assert v["blocks.0.gamma"] == "ok" and v["stem.weight"] == v["head.weight"] == "ok"
    assert loud(ctx) == []


def test_zero_init_residual_branch_is_gated() -> None:
    ctx = run(ZeroInitResidual(), torch.randn(2, 4, 8, 8))
    v = verdicts(ctx)
    # bn2's gain is 0: nothing reaches conv1/conv2/bn1 until it trains (its own grad is not 0)
    assert v["block.conv1.weight"] == v["block.conv2.weight"] == "gated"
    assert v["block.bn2.weight"] == v["stem.weight"] == "ok" and loud(ctx) == []


@pytest.mark.parametrize("how", ["ok", "vanish", "explode", "nan", "detach"])
def test_table_and_findings_agree(how: str) -> None:
    ctx = run(Two(how), torch.randn(3, 4))
    shown = {r.verdict for r in ctx.report.gradients.params} & set(PROBLEM_VERDICTS)
    reported = {f.rule for f in ctx.report.findings}
    assert {PROBLEM_VERDICTS[v] for v in shown} <= reported
    gradient_rules = set(PROBLEM_VERDICTS.values()) & reported
    assert gradient_rules == {PROBLEM_VERDICTS[v] for v in shown}
    assert bool(shown) == (how != "ok")


class ZeroProjAttention(nn.Module):
    """LeViT's residual attention: `proj` ends in a BatchNorm whose gain starts at 0
    (timm's bn_weight_init=0), which silences its sibling `qkv`, not only what is under
    `proj`: qkv's gradient is exactly 0 at initialisation."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, dim)
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.BatchNorm1d(dim))
        nn.init.zeros_(self.proj[1].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.qkv(x)))


class GatedAndVanishing(nn.Module):
    """A zero-gated residual block after a first layer whose gradient really vanishes (its
    output is scaled by 1e-8): nothing before it gets a healthy gradient either."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weak, self.stem = nn.Linear(8, 8), nn.Linear(8, 8)
        self.attn, self.head = ZeroProjAttention(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x + 1e-8 * self.weak(x))
        return self.head(self.attn(h))


def test_zero_gain_gates_its_sibling_layers_and_true_vanishing_stays() -> None:
    ctx = run(GatedAndVanishing(), torch.randn(16, 8))
    qkv = next(r for r in ctx.report.gradients.params if r.name == "attn.qkv.weight")
    assert qkv.grad_norm == 0.0  # the closed gate, not the model: it is "gated"
    v = verdicts(ctx)
    assert v["attn.qkv.weight"] == v["attn.proj.0.weight"] == "gated"
    assert v["weak.weight"] == "vanishing" and v["attn.proj.1.weight"] == "ok"
    found = [f for f in ctx.report.findings if f.rule == "vanishing-gradient"]
    assert len(found) == 1 and found[0].where == "weak" and "1 layer(s)" in found[0].message


class SmallBeside(nn.Module):
    """A 2x2 layer beside a 1000x1000 one (CaiT's talking heads beside its MLPs)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.big = nn.Linear(1000, 1000, bias=False)
        self.small = nn.Linear(2, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.big(x), self.small(0.01 * x[:, :2])], 1)


def test_vanishing_compares_gradients_per_element_not_total_norms() -> None:
    ctx = run(SmallBeside(), torch.randn(4, 1000))
    rows = {r.name: r for r in ctx.report.gradients.params}
    big, small = rows["big.weight"].grad_norm, rows["small.weight"].grad_norm
    # total norms: 2x2 = 4 entries against 10^6, below the 1e-5 line by size alone
    assert small / big < 1e-5
    # per element (norm / sqrt(entries)) it is far above the line
    assert (small / 2) / (big / 1000) > 1e-4
    assert rows["small.weight"].verdict == "ok" and loud(ctx) == []
    layer = next(x for x in ctx.report.gradients.layers if x.module_path == "small")
    assert layer.grad_rms == pytest.approx(small / 2)


class QKAttention(nn.Module):
    """Single-head self-attention with BERT's initialisation (std 0.02): the logits start
    near 0, so the query/key gradients are tiny while value and output are not."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(dim, dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        for layer in (self.v, self.o):
            nn.init.normal_(layer.weight, std=0.02)
        for layer in (self.q, self.k):  # smaller: far below the line even for a random loss
            nn.init.normal_(layer.weight, std=0.001)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 32**0.5, -1)
        return self.norm(h + self.o(att @ self.v(h)))


def test_query_key_at_init_are_not_vanishing() -> None:
    ctx = run(QKAttention(), torch.randn(2, 16, 32))
    layers = {x.module_path: x for x in ctx.report.gradients.layers}
    # far below the 1e-5 line of the largest layer, but the embedding before them learns
    largest = max(x.grad_rms for x in layers.values())
    assert layers["q"].grad_rms < 1e-5 * largest < layers["embed"].grad_rms
    assert layers["q"].verdict == layers["k"].verdict == "ok" and loud(ctx) == []


class ZeroHead(nn.Module):
    """torchvision's ViT: the classifier head's weight starts at exactly 0."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.mid, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        nn.init.zeros_(self.head.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mid(torch.relu(self.stem(x)))))


def test_zero_initialised_head_gates_what_is_before_it() -> None:
    ctx = run(ZeroHead(), torch.randn(4, 8))
    rows = {r.name: r for r in ctx.report.gradients.params}
    assert rows["stem.weight"].grad_norm == 0.0  # nothing passes a zero matrix
    assert rows["stem.weight"].verdict == rows["mid.weight"].verdict == "gated"
    assert rows["head.weight"].verdict == "ok" and loud(ctx) == []


class ScaledBackbone(nn.Module):
    """torchvision SSD's VGG backbone: it owns the L2 scale of a feature map itself, and
    reads it after its first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.full((16,), 20.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.relu(self.c1(x))
        return self.scale * nn.functional.normalize(a), torch.relu(self.c2(a))


class MaskedHeads(nn.Module):
    """Two heads; the loss reads only the second one's output on this sample (SSD's loss
    picked no anchor of its first feature map): the first head and the scale get a
    gradient of exactly 0 while every layer before them gets a healthy one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = ScaledBackbone()
        self.head0, self.head1 = nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled, features = self.backbone(x)
        return self.head1(features) + 0 * self.head0(scaled)


def test_a_containers_own_parameter_is_as_deep_as_where_it_is_read() -> None:
    ctx = run(MaskedHeads(), torch.randn(8, 16))
    rows = {r.name: r for r in ctx.report.gradients.params}
    assert rows["backbone.scale"].grad_norm == rows["head0.weight"].grad_norm == 0.0
    assert rows["backbone.c1.weight"].grad_norm > 0
    layers = sorted(ctx.report.gradients.layers, key=lambda x: x.depth_index)
    order = [x.module_path for x in layers]
    # the container is called first, but its scale is read after c1 (and before c2)
    assert order == ["backbone.c1", "backbone", "backbone.c2", "head1", "head0"]
    assert rows["backbone.scale"].verdict == "ok" and loud(ctx) == []
