"""The optimizer's warm-up step on fake tensors, without its arithmetic.

`warm_up` runs one `step()` only so that the optimizer allocates its state (Adam's
moments and step counters, SGD's momentum buffers) the way a first step does. On fake
tensors the values of that step do not exist, and an in-place update (`mul_`, `lerp_`,
`addcdiv_`...) changes no shape, dtype or stride: its fake kernel only returns its
first argument. Skipping those kernels leaves the state as the full step leaves it,
while the full step over many parameters costs seconds of fake dispatch (the 1,000-node
bench model has 1,200 parameters, about ten ops each for AdamW).

Only the arithmetic below is skipped, and only when its target is a plain fake floating
tensor that carries no value: FakeTensorMode keeps the value of a small constant
(`FakeTensor.constant`: Adam's step counter, read back by `.item()`) and
inspector.fakevalues keeps others; those run. Ops that change metadata in place
(`resize_`, `transpose_`), out-of-place ops (whose results can become state: SGD's
`clone` of the first gradient) and other tensor subclasses all run as usual. A DTensor
whose local shard is such a fake tensor is skipped as that shard would be.

On real tensors (the measured step's warm-up, `warm_up(values=False)`) the gradients are
zeros, so the state the step leaves is known without its arithmetic: the moments stay the
zeros `zeros_like` made, SGD's momentum is the `clone` of a zero gradient. Skipped there:
the same in-place updates of tensors with at least one dimension (the 0-dim step counters
still count), and Adam's denominator (`sqrt`, `div`), read only by a skipped update, which
gets an uninitialised tensor of its size. What is allocated stays as it was, byte for byte;
what is not done is touching it: over VGG-11's six largest parameter shapes (130 M values)
the warm-up faulted in 1 GB of denominators and updated 2 GB of state, 3.7 s against 1.0 s
for the state's allocation alone.

The measured step on the CPU (inspector/memory/measure.py) goes one further: its copy of
the model is thrown away after, so no value of its optimizer's state, its gradients or its
step is ever read, nor, where the load recorded the inference forward, of the copy itself.
There (`allocations_only`) the state-setting ops are skipped too, `zeros_like` and `clone`
give uninitialised tensors, and the step runs without its arithmetic: every allocation of
the real step is made, in the same order and of the same size, and none is touched. A
skipped op still makes what its kernel would allocate: the float32 (or bf16) copy the CPU
kernel makes of a Python number given for a tensor argument (`mul_(0.9)`), freed as the
op returns. VGG-11-BN's optimizer phase at [2, 3, 224, 224]: 3.3-8.1 s, most of it the
first touch of 2.9 GB of fresh pages, against 0.04 s; the same figures to the byte on the
zoo (bench/optimizer_phase.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, is_fake

from inspector.dispatchmode import LeanDispatchMode
from inspector.fakevalues import value_of

__all__ = [
    "skipped_inplace_arithmetic", "without_inplace_arithmetic", "state_allocation_only", "is_fake",
    "SKIPPED", "allocations_only",
]  # fmt: skip

_aten = torch.ops.aten
# In-place elementwise updates of the torch optimizers' single-tensor steps.
SKIPPED = frozenset(
    {
        _aten.add_,
        _aten.sub_,
        _aten.mul_,
        _aten.div_,
        _aten.lerp_,
        _aten.addcmul_,
        _aten.addcdiv_,
        _aten.sqrt_,
        _aten.neg_,
        _aten.copy_,
        _aten.zero_,
        _aten.fill_,
        _aten.clamp_,
    }
)


# Out-of-place ops of Adam's step whose results only skipped in-place updates read.
_DENOMINATOR = frozenset({_aten.sqrt, _aten.div})
# In-place ops that set state rather than update it: they run on real tensors.
_SETS_STATE = frozenset({_aten.copy_, _aten.zero_, _aten.fill_})
# New tensors filled with values (a copy's): only their allocation is made under
# `allocations_only`.
_FILLED_LIKE = frozenset({_aten.zeros_like, _aten.ones_like, _aten.full_like, _aten.clone})


class _SkipInplace(LeanDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204 - torch's
        kwargs = kwargs or {}
        if _skips(func, args, kwargs):
            return args[0]
        return func(*args, **kwargs)


def _skips(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if func.overloadpacket not in SKIPPED or not args or "out" in kwargs:
        return False
    target = _local(args[0])
    return (
        type(target) is FakeTensor
        and target.is_floating_point()
        and target.constant is None
        and value_of(target) is None
    )


def _local(tensor: Any) -> Any:
    """A DTensor's local shard (FSDP2 and TP parameters and their state): an in-place
    update changes neither its placements nor its shard, and going through DTensor's own
    dispatch for it cost a third of a 70B rank run's warm-up."""
    local = getattr(tensor, "_local_tensor", None) if _is_dtensor(tensor) else None
    return tensor if local is None else local


def _is_dtensor(tensor: Any) -> bool:
    return type(tensor).__name__ == "DTensor" and hasattr(tensor, "_spec")


@contextmanager
def skipped_inplace_arithmetic() -> Iterator[None]:
    """Within: in-place arithmetic on valueless fake floating tensors returns its target
    without running its kernel."""
    with _SkipInplace():
        yield


class _SkipRealArithmetic(LeanDispatchMode):
    """`sets_state` False (`allocations_only`): the state-setting ops are skipped too,
    `zeros_like` (the state's and the gradients' zeros) makes an uninitialised tensor, and
    the 0-dim tensors are no exception: their updates are skipped but for a number added
    (the step counters, whose value Adam reads), which is added without the kernel. Run
    from here, that kernel would wrap the number in a tensor once more than the
    optimizer's own call did: 8 bytes that the step without this mode never allocates
    (CLIP's 0-dim `logit_scale` under momentum: its measured peak 8 bytes high)."""

    def __init__(self, sets_state: bool = True) -> None:
        super().__init__()
        self.kept = _SETS_STATE if sets_state else frozenset()
        self.filled = frozenset() if sets_state else _FILLED_LIKE
        self.scalars = not sets_state

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # noqa: ANN204 - torch's
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if self.scalars and args and "out" not in kwargs and _scalar(args[0]):
            return self._scalar_update(func, args, kwargs)
        if args and "out" not in kwargs and _updatable(args[0]):
            first = args[0]
            if packet in SKIPPED and packet not in self.kept and _allocation_free(args):
                _cast_numbers(func, args)
                return first
            if packet in _DENOMINATOR and all(_elementwise_partner(a, first) for a in args[1:]):
                out = torch.empty_like(first)
                _cast_numbers(func, args)
                return out
            if packet in self.filled:
                return torch.empty_like(first, **_like_options(kwargs))
        return func(*args, **kwargs)

    def _scalar_update(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op on a 0-dim floating tensor: a number added (a step counter's `+= 1`) by
        its value, another update skipped, a denominator allocated; each making the copy
        its kernel makes."""
        first, packet = args[0], func.overloadpacket
        out = first
        if packet is _aten.add_ and len(args) == 2 and _number(args[1]):
            first.fill_(first.item() + kwargs.get("alpha", 1) * args[1])  # no tensor made
        elif packet in _DENOMINATOR and all(_elementwise_partner(a, first) for a in args[1:]):
            out = torch.empty_like(first)
        elif packet not in SKIPPED or not _allocation_free(args):
            return func(*args, **kwargs)
        _cast_numbers(func, args)
        return out


def _scalar(t: Any) -> bool:
    """A plain real floating 0-dim tensor: a step counter, a 0-dim weight's state."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point() and not t.dim()


def _number(arg: Any) -> bool:
    return isinstance(arg, int | float) and not isinstance(arg, bool)


def _updatable(t: Any) -> bool:
    """A plain real floating tensor with values to update (not a 0-dim step counter)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point() and t.dim() > 0


def _allocation_free(args: tuple[Any, ...]) -> bool:
    """Whether an in-place op on `args[0]` allocates nothing but the copies of Python
    numbers and 0-dim tensors (`_cast_numbers`): its other tensors share the target's
    dtype (one of another dtype would be copied to the common one first), or are 0-dim."""
    first = args[0]
    return all(
        a.dtype == first.dtype or a.dim() == 0 for a in args[1:] if isinstance(a, torch.Tensor)
    )


def _cast_numbers(func: Any, args: tuple[Any, ...]) -> None:
    """What the CPU kernel of `func` allocates for the Python numbers given for its tensor
    arguments: each is wrapped in a 0-dim tensor and copied to the target's dtype (4 bytes
    for float32), the copy freed as the op returns; a 0-dim tensor of another dtype is
    copied so too. A `Scalar` argument (`lerp_`'s weight, `addcdiv_`'s value) is read as
    it is."""
    first = args[0]
    if first.device.type != "cpu":
        return
    schema = func._schema.arguments
    for arg, spec in zip(args[1:], schema[1:], strict=False):
        if _copied_to(arg, spec, first.dtype):
            torch.empty((), dtype=first.dtype)  # made and freed, as the kernel's copy


def _copied_to(arg: Any, spec: Any, dtype: torch.dtype) -> bool:
    """A Python number for a tensor argument, or a 0-dim tensor of another dtype."""
    if isinstance(arg, torch.Tensor):
        return arg.dim() == 0 and arg.dtype != dtype
    return _number(arg) and str(spec.type) == "Tensor"


def _like_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of `zeros_like` or `clone` that `empty_like` takes (all but a fill
    value; `clone`'s memory format, None or not, is `empty_like`'s)."""
    return {k: v for k, v in kwargs.items() if k != "fill_value"}


def _elementwise_partner(arg: Any, first: torch.Tensor) -> bool:
    """A Python number, or a tensor of `first`'s shape and dtype: the result is `first`'s."""
    if isinstance(arg, torch.Tensor):
        return arg.shape == first.shape and arg.dtype == first.dtype
    return isinstance(arg, int | float)


def state_allocation_only(params: list[torch.Tensor]) -> AbstractContextManager[None]:
    """For a warm-up step over zero gradients: its arithmetic skipped, fake `params` as in
    `without_inplace_arithmetic`, real ones as the module's docstring says."""
    if not params:
        return nullcontext()
    return skipped_inplace_arithmetic() if is_fake(params[0]) else _SkipRealArithmetic()


def without_inplace_arithmetic(params: list[torch.Tensor]) -> AbstractContextManager[None]:
    """`skipped_inplace_arithmetic` for an optimizer step over fake `params`, else nothing.
    A tracked step loses nothing by it: on fake tensors those kernels allocate nothing
    (no kernel memory model covers them) and the tracker counts allocations only."""
    return skipped_inplace_arithmetic() if params and is_fake(params[0]) else nullcontext()


@contextmanager
def allocations_only() -> Iterator[None]:
    """Within: the arithmetic of real optimizer steps (and of their warm-up, and zeros for
    gradients) is skipped, each allocation it makes is still made; for a copy of the model
    whose values are never read after (the module's docstring)."""
    with _SkipRealArithmetic(sets_state=False):
        yield
