"""Classic nets of the zoo: LSTM and GRU models, a custom autograd.Function, activation
checkpointing inside forward, weight/spectral-norm parametrizations, a compiled submodule."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrizations
from torch.utils.checkpoint import checkpoint


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM -> per-token classifier (the classic tagger)."""

    def __init__(self, rnn: type[nn.Module] = nn.LSTM) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.rnn = rnn(32, 48, num_layers=2, batch_first=True)
        self.head = nn.Linear(48, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def _tokens() -> tuple[tuple, dict]:
    return (torch.randint(0, 100, (4, 12)),), {}


class ScaledTanh(torch.autograd.Function):
    """tanh(2x) with a hand-written backward (saves its output)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(2 * x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad * 2 * (1 - y * y)


class CustomFnNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ScaledTanh.apply(self.fc1(x)))


def _block(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width * 2), nn.GELU(), nn.Linear(width * 2, width))


class CheckpointNet(nn.Module):
    """Residual MLP blocks, each run under torch.utils.checkpoint (non-reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.blocks = nn.ModuleList(_block(64) for _ in range(3))
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + checkpoint(block, h, use_reentrant=False)
        return self.out(h)


class ParametrizedNet(nn.Module):
    """A conv with weight norm and a linear with spectral norm (torch.nn.utils.parametrizations)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = parametrizations.weight_norm(nn.Conv2d(3, 16, 3, padding=1))
        self.fc = parametrizations.spectral_norm(nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(h)


class CompiledSubmoduleNet(nn.Module):
    """An MLP whose middle block is wrapped in torch.compile (eager backend: no compiler)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.mid = torch.compile(_block(64), backend="eager")
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(torch.relu(self.inp(x))))


def _vec(n: int) -> Any:
    return lambda: ((torch.randn(8, n),), {})


def _image() -> tuple[tuple, dict]:
    return (torch.randn(4, 3, 16, 16),), {}


SMALL_MODELS: list[dict[str, Any]] = [
    {"name": "lstm", "kind": "classic", "build": LSTMTagger, "inputs": _tokens},
    {"name": "gru", "kind": "classic", "build": lambda: LSTMTagger(nn.GRU), "inputs": _tokens},
    {"name": "custom-fn", "kind": "classic", "build": CustomFnNet, "inputs": _vec(64)},
    {"name": "checkpoint", "kind": "classic", "build": CheckpointNet, "inputs": _vec(32)},
    {"name": "parametrized", "kind": "classic", "build": ParametrizedNet, "inputs": _image},
    {
        "name": "compiled-sub",
        "kind": "classic",
        "build": CompiledSubmoduleNet,
        "inputs": _vec(32),
    },
]
