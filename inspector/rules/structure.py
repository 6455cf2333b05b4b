"""Structural rules: they read the model and the captured graph, never values, so they
run in fake mode too."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from inspector.context import Context
from inspector.report import Finding, Report
from inspector.rules.registry import finding, rule

_BIASED = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)


def _graph(ctx: Context) -> torch.fx.GraphModule | None:
    return ctx.capture.graph_module if ctx.capture is not None else None


def _module_pairs(ctx: Context) -> Iterator[tuple[str, nn.Module, str, nn.Module]]:
    """(path, module, next path, next module): direct data flow in the fx graph, else
    neighbours inside nn.Sequential."""
    gm = _graph(ctx)
    if gm is not None:
        for node in gm.graph.nodes:
            users = list(node.users)
            if node.op == "call_module" and len(users) == 1 and users[0].op == "call_module":
                a, b = node.target, users[0].target
                yield a, gm.get_submodule(a), b, gm.get_submodule(b)
        return
    for path, module in ctx.model.named_modules():
        if isinstance(module, nn.Sequential):
            items = list(module.named_children())
            prefix = f"{path}." if path else ""
            for (na, a), (nb, b) in zip(items, items[1:], strict=False):
                yield prefix + na, a, prefix + nb, b


@rule("bias-before-batchnorm", "info")
def bias_before_batchnorm(ctx: Context, report: Report) -> Iterator[Finding]:
    """A conv/linear bias right before BatchNorm: the BatchNorm subtracts it again. Waste,
    not harm (issue #16: info), and standard models have it (torchvision's VGG-BN: 8)."""
    for path, module, next_path, following in _module_pairs(ctx):
        if (
            isinstance(module, _BIASED)
            and module.bias is not None
            and isinstance(following, _BatchNorm)
        ):
            yield finding(
                "bias-before-batchnorm",
                path,
                f"{type(module).__name__} '{path}' has a bias and feeds {type(following).__name__}"
                f" '{next_path}', which subtracts the batch mean: the bias "
                f"({module.bias.numel()} parameters) is redundant.",
                f"Build '{path}' with bias=False.",
            )


@rule("tensor-attribute", "warning")
def tensor_attribute(ctx: Context, report: Report) -> Iterator[Finding]:
    """Tensors kept as plain attributes: `.to()`, `.cuda()` and `state_dict` miss them."""
    for path, module in ctx.model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                where = f"{path}.{name}" if path else name
                yield finding(
                    "tensor-attribute",
                    where,
                    f"'{where}' is a plain tensor attribute of {type(module).__name__} "
                    f"(shape {list(value.shape)}): `.to(device)` and `state_dict()` skip it.",
                    f"Use self.register_buffer('{name}', tensor) (persistent=False if it "
                    "should stay out of checkpoints), or nn.Parameter if it should train.",
                )


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


@rule("mixed-devices", "error")
def mixed_devices(ctx: Context, report: Report) -> Iterator[Finding]:
    """Parameters and buffers on more than one device."""
    first: dict[str, str] = {}
    for name, tensor in _tensors(ctx.model):
        first.setdefault(str(tensor.device), name)
    if len(first) > 1:
        listed = ", ".join(f"{dev} (e.g. {name})" for dev, name in first.items())
        yield finding(
            "mixed-devices",
            list(first.values())[1].rpartition(".")[0],
            f"parameters/buffers live on {len(first)} devices: {listed}.",
            "Move the whole model with model.to(device) after building it; register "
            "tensors as buffers so they move with it.",
        )


@rule("mixed-dtypes", "warning")
def mixed_dtypes(ctx: Context, report: Report) -> Iterator[Finding]:
    """Floating parameters in more than one dtype, or floating buffers narrower than them.

    A buffer wider than the weights is deliberate (Llama's rotary `inv_freq` stays float32
    beside bf16 weights for precision; so do normalisation statistics), so it is not flagged.
    """
    first: dict[torch.dtype, str] = {}
    for name, tensor in ctx.model.named_parameters():
        if tensor.is_floating_point():
            first.setdefault(tensor.dtype, name)
    narrowest = min((d.itemsize for d in first), default=None)
    for name, tensor in ctx.model.named_buffers():
        if tensor.is_floating_point() and narrowest and tensor.dtype.itemsize < narrowest:
            first.setdefault(tensor.dtype, name)
    if len(first) > 1:
        listed = ", ".join(f"{_dtype_name(d)} (e.g. {name})" for d, name in first.items())
        yield finding(
            "mixed-dtypes",
            list(first.values())[1].rpartition(".")[0],
            f"floating parameters/buffers use {len(first)} dtypes: {listed}.",
            "Cast the model once with model.to(dtype), and use torch.autocast for mixed "
            "precision instead of per-layer dtypes.",
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _mutated_arg(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node | None:
    """The input node that an in-place node overwrites, or None."""
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if node.op == "call_module":
        return node.args[0] if getattr(gm.get_submodule(node.target), "inplace", False) else None
    if node.op == "call_function" and node.kwargs.get("inplace") is True:
        return node.args[0]
    explicit = node.op in ("call_method", "call_function") and name.endswith("_")
    # `x.add_(1)` then reading `x` is the usual way to mutate; it is a hazard when the
    # result is also used under another name (`y = x.add_(1)`), so both names alias.
    if explicit and not name.startswith("_") and node.users:
        return node.args[0]
    return None


@rule("inplace-read-later", "warning")
def inplace_read_later(ctx: Context, report: Report) -> Iterator[Finding]:
    """An in-place op overwrites a tensor that later nodes still read."""
    gm = _graph(ctx)
    if gm is None:
        return
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        target = _mutated_arg(gm, node)
        later = [u for u in target.users if order[u] > order[node]] if target is not None else []
        if later:
            yield finding(
                "inplace-read-later",
                node.name,
                f"'{node.name}' overwrites '{target.name}' in place, but "
                f"{', '.join(repr(u.name) for u in later[:3])} read(s) it afterwards and "
                "see the modified value.",
                "Use the out-of-place op (or inplace=False), or clone the tensor first.",
            )


@rule("param-created-in-forward", "error")
def param_created_in_forward(ctx: Context, report: Report) -> Iterator[Finding]:
    """A parameter or module built inside forward is new on every call: its weights are
    random each step, never reach the optimizer and are not saved."""
    for made in ctx.results.created_in_forward:
        what = "nn.Parameter" if made.what == "Parameter" else f"a {made.what} module"
        at = f" at {made.location}" if made.location else ""
        code = f" (`{made.source_line}`)" if made.source_line else ""
        yield finding(
            "param-created-in-forward",
            made.location or "",
            f"{what} is created inside forward{at}{code}: it is new on every call, so it "
            "is never trained, never in model.parameters() for the optimizer, and not saved.",
            "Create it once in __init__ (self.layer = ...) and only call it in forward; for a "
            "constant tensor, register_buffer.",
        )


@rule("hardcoded-device", "warning")
def hardcoded_device(ctx: Context, report: Report) -> Iterator[Finding]:
    """Forward puts a tensor on a fixed device (or on the default one by omission): it
    breaks, or copies every step, once the model moves to another device."""
    for fixed in ctx.results.fixed_devices:
        code = f" (`{fixed.source_line}`)" if fixed.source_line else ""
        what = (
            f"`{fixed.op}` makes a tensor without a device"
            if fixed.how == "no device"
            else f"a tensor is put on a fixed device with {fixed.how}"
        )
        yield finding(
            "hardcoded-device",
            fixed.location,
            f"{what} in forward at {fixed.location}{code}: on another device than this "
            "run's it mixes devices ('Expected all tensors to be on the same device').",
            "Follow the inputs: device=x.device (or torch.zeros_like / new_zeros), "
            "register constant tensors as buffers, and move the model, not tensors, with .to().",
        )


@rule("data-parallel", "info")
def data_parallel(ctx: Context, report: Report) -> Iterator[Finding]:
    """nn.DataParallel: one process, a replica per GPU every step, the GIL between them."""
    for path, module in ctx.model.named_modules():
        if isinstance(module, nn.DataParallel):
            yield finding(
                "data-parallel",
                path,
                f"'{path or '(root)'}' is an nn.DataParallel: it copies the model to every GPU "
                "on each step from one Python process, and PyTorch recommends against it.",
                "Use DistributedDataParallel (torchrun, one process per GPU) or FSDP; "
                "inspect the bare module (model.module).",
            )
