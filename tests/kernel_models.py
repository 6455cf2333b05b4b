"""Small equivalents of the nets whose CPU kernels allocate memory of their own (issue #16):
recurrent layers (oneDNN's LSTM), a 3D-conv video net like torchvision's r3d_18, a
dilated-conv head like DeepLabV3's ASPP and a ConvNeXt block (depthwise 7x7). Each
`make_*` returns (model, (args, kwargs)), as in `tests/models.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class RNNNet(nn.Module):
    """An nn.LSTM / nn.GRU and a linear head over every step's output."""

    def __init__(
        self, cell: str = "lstm", layers: int = 2, size: int = 64, hidden: int = 128,
        batch_first: bool = False, bidirectional: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(size, hidden, layers, batch_first=batch_first, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y)


def make_rnn(
    cell: str = "lstm", batch: int = 16, steps: int = 50, batch_first: bool = False, **kw
) -> tuple[nn.Module, tuple[tuple, dict]]:
    model = RNNNet(cell, batch_first=batch_first, **kw)
    shape = (batch, steps, 64) if batch_first else (steps, batch, 64)
    return model, ((torch.randn(shape),), {})


class Block3d(nn.Module):
    """r3d_18's BasicBlock: two 3x3x3 convs with batch norm and a residual."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm3d(cout)
        self.conv2 = nn.Conv3d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm3d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class R3D(nn.Module):
    """r3d_18 in small: the (3, 7, 7) stem, two stages, pooling and a classifier."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3d(3, width, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False),
            nn.BatchNorm3d(width),
            nn.ReLU(inplace=True),
        )
        self.layer1 = Block3d(width, width)
        self.layer2 = Block3d(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(self.pool(x).flatten(1))


def make_r3d(batch: int = 2, frames: int = 8, size: int = 56) -> tuple[nn.Module, tuple]:
    return R3D(), ((torch.randn(batch, 3, frames, size, size),), {})


class ASPP(nn.Module):
    """DeepLabV3's head: a 1x1 branch, three dilated 3x3 branches (rates 12, 24, 36) and
    image pooling, concatenated and projected."""

    def __init__(self, cin: int, cout: int, rates: tuple[int, ...] = (12, 24, 36)) -> None:
        super().__init__()

        def branch(k: int, d: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, k, padding=d if k > 1 else 0, dilation=d, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
            )

        self.branches = nn.ModuleList([branch(1, 1), *(branch(3, r) for r in rates)])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1), nn.ReLU())
        self.project = nn.Sequential(
            nn.Conv2d(cout * (len(rates) + 2), cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(x).expand(-1, -1, *x.shape[2:])
        return self.project(torch.cat([*(b(x) for b in self.branches), pooled], 1))


class DeepLabHead(nn.Module):
    """A strided stem, a dilated backbone conv (output stride 8, as DeepLabV3 dilates
    its last stages), ASPP and a per-pixel classifier."""

    def __init__(self, width: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, 2, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, 1, 2, dilation=2, bias=False),
            nn.BatchNorm2d(2 * width), nn.ReLU(),
        )  # fmt: skip
        self.aspp = ASPP(2 * width, width)
        self.classifier = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.aspp(self.stem(x)))


def make_deeplab(batch: int = 2, size: int = 256) -> tuple[nn.Module, tuple]:
    return DeepLabHead(), ((torch.randn(batch, 3, size, size),), {})


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise 7x7, LayerNorm over channels, a 4x MLP, layer scale."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor, as ConvNeXt's stem and downsamples."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt in small: the patchify stem, two stages of two blocks with a 2x2 strided
    downsample between them, pooled into a classifier."""

    def __init__(self, dims: tuple[int, int] = (32, 192), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        self.stage1 = nn.Sequential(ConvNeXtBlock(dims[0]), ConvNeXtBlock(dims[0]))
        self.down = nn.Sequential(LayerNorm2d(dims[0], eps=1e-6), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = nn.Sequential(ConvNeXtBlock(dims[1]), ConvNeXtBlock(dims[1]))
        self.head = nn.Linear(dims[1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean((2, 3)))


def make_convnext(batch: int = 4, size: int = 128) -> tuple[nn.Module, tuple]:
    return ConvNeXt(), ((torch.randn(batch, 3, size, size),), {})


def op_excess(fn: Callable[[], object], name: str) -> int:
    """Bytes the first `name` call allocates on top of what it leaves allocated: the
    profiler's allocation events inside it, nested ops included, peak minus end (the truth
    the kernel-memory formulas are checked against, in tests and bench/memory.py)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.name != name:
            stack.extend(event.children)
            continue
        allocs, inner = [], list(event.children)
        while inner:
            child = inner.pop()
            if child.tag == _EventType.Allocation:
                allocs.append((child.start_time_ns, child.extra_fields.alloc_size))
            else:
                inner.extend(child.children)
        live = peak = 0
        for _, size in sorted(allocs):
            live += size
            peak = max(peak, live)
        return peak - live
    raise ValueError(f"{name} did not run")


def formulas_of(step: Callable[[], object]) -> dict[Any, Any]:
    """What each op's kernel-memory formula says when `step` runs, asked as the memory
    tracker asks it (the other side of `op_excess`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from inspector.memory.kernels import registry

    found: dict[Any, Any] = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            found[func] = registry.kernel_memory(func, args, kwargs or {}, out)
            return out

    with Record():
        step()
    return found
