"""`SeenOps`: a dispatch mode that notes the ops reaching the kernels below it (entered
before a mode that skips ops, it sees what that mode let through)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class SeenOps(TorchDispatchMode):
    """The ops that reach the kernels below it, by name (`mul_`, `sqrt`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
