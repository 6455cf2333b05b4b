"""Submodules wrapped in `torch.compile`: analysed as the modules they wrap.

A compiled module (`OptimizedModule`) runs dynamo-generated kernels. On fake or meta tensors
those kernels fail (device mismatches) or crash the process, and fx cannot trace into them;
the numbers the report gives (shapes, FLOPs, memory, gradients) are the original module's
anyway. So each one is replaced in its parent by its `_orig_mod`, and the report says so.
"""

from __future__ import annotations

from torch import nn

__all__ = ["unwrap_compiled", "compiled_note"]


def _is_compiled(module: nn.Module) -> bool:
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def unwrap_compiled(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """`model` with every compiled submodule replaced by its original module (in place),
    and the paths of those replaced ("" for the root)."""
    found: list[str] = []
    if _is_compiled(model):
        model, found = model._orig_mod, [""]
    stack = [("", model)]
    while stack:
        prefix, parent = stack.pop()
        for name, child in list(parent._modules.items()):
            path = f"{prefix}{name}"
            while child is not None and _is_compiled(child):
                child = child._orig_mod
                parent._modules[name] = child
                found.append(path)
            if child is not None:
                stack.append((f"{path}.", child))
    return model, sorted(set(found))


def compiled_note(paths: list[str]) -> str:
    """The report's note on what was unwrapped."""
    names = ", ".join(f"`{p}`" if p else "the model" for p in paths)
    return (
        f"{names}: wrapped in torch.compile; analysed as the original module "
        "(compiled kernels do not run on fake or meta tensors; the figures are the same)."
    )
