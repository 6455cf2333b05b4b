"""Layers whose output goes straight into a normalisation that uses the batch's own
statistics (train-mode BatchNorm, GroupNorm, LayerNorm, RMSNorm, InstanceNorm): the loss
does not depend on their scale, so their gradient's size says nothing about the backward.

Scaling such a layer's parameters by c leaves the forward unchanged and divides their
gradient by c; a conv at a small norm before a BatchNorm gets a large gradient and SGD is
self-correcting there (the step grows the weight, which shrinks the next gradient).
torchvision Mask R-CNN's first conv on raw pixels, before its BatchNorm, had a gradient
norm of 1,152 to 3,390 at initialisation, above `exploding_norm`, in a model that trains."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["FeedsNormalisation", "feeding_normalisation", "normalises_with_batch_stats"]

_TORCH_NORMS: tuple[type[nn.Module], ...] = (nn.GroupNorm, nn.LayerNorm) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()
)


def _is_norm(module: nn.Module) -> bool:
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return True
    if isinstance(module, _TORCH_NORMS):
        return True
    # Hugging Face's own (LlamaRMSNorm, T5LayerNorm) compute their input's statistics; a
    # frozen BatchNorm (torchvision's FrozenBatchNorm2d) does not, nor is it matched here.
    return type(module).__name__.endswith(("RMSNorm", "LayerNorm"))


def normalises_with_batch_stats(module: nn.Module) -> bool:
    """True for a module whose output, called now, is invariant to its input's scale."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return module.training or module.running_var is None
    if isinstance(module, nn.modules.instancenorm._InstanceNorm):
        return module.training or not module.track_running_stats
    return _is_norm(module)


class FeedsNormalisation:
    """Records, over one forward, each parameter-owning module whose every output went
    directly into a normalising module (tracked by the output's autograd node)."""

    def __init__(self) -> None:
        self._producer: dict[int, str] = {}  # id(grad_fn) -> module path
        self._nodes: list[Any] = []  # keeps those grad_fns alive, so ids stay unique
        self._calls: dict[str, int] = {}
        self._normalised: dict[str, int] = {}

    def output(self, path: str, out: Any) -> None:
        self._calls[path] = self._calls.get(path, 0) + 1
        node = out.grad_fn if isinstance(out, torch.Tensor) else None
        if node is not None:
            self._producer[id(node)] = path
            self._nodes.append(node)

    def normalised(self, x: Any) -> None:
        node = x.grad_fn if isinstance(x, torch.Tensor) else None
        path = self._producer.pop(id(node), None) if node is not None else None
        if path is not None:
            self._normalised[path] = self._normalised.get(path, 0) + 1

    def layers(self) -> set[str]:
        return {p for p, n in self._normalised.items() if n == self._calls.get(p)}


@contextmanager
def feeding_normalisation(model: nn.Module) -> Iterator[FeedsNormalisation]:
    """Hooks over the block; `.layers()` afterwards names the scale-free layers."""
    seen = FeedsNormalisation()
    handles = []
    for path, module in model.named_modules():
        if _is_norm(module):
            handles.append(module.register_forward_pre_hook(_on_input(seen)))
        elif any(True for _ in module.parameters(recurse=False)):
            handles.append(module.register_forward_hook(_on_output(seen, path)))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
        seen._nodes.clear()


def _on_input(seen: FeedsNormalisation):  # noqa: ANN202
    def hook(module: nn.Module, args: Any) -> None:
        if args and normalises_with_batch_stats(module):
            seen.normalised(args[0])

    return hook


def _on_output(seen: FeedsNormalisation, path: str):  # noqa: ANN202
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        seen.output(path, output)

    return hook
