"""Fake kernels that refuse what the real kernel runs, and what to say when one refuses.

torch's fake (meta) kernel for `aten._grouped_mm` copies the CUDA kernel's checks and
accepts only bfloat16, while the CPU kernel also runs float32 and float16 (measured with
torch 2.13: Mixtral's experts in float32 train on the CPU). A fake run on the CPU must
take what the real CPU run takes, so such an op is faked with bfloat16 stand-ins of the
same shapes and strides, and its output gets the dtype the real kernel gives.

One entry per op, registered with the devices where the real kernel is known to accept
more than the fake one. Elsewhere the refusal stands, and `refusal_message` says which
op refused which dtype, so nobody is told to check inputs that are fine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "Widening", "widening_for", "standins", "refusal_message", "remember_refusal", "FakeRefusal",
]  # fmt: skip

_STANDINS = (torch.bfloat16, torch.float16, torch.float32)
_ATTR = "_inspector_fake_refusal"


@dataclass(frozen=True)
class Widening:
    """The real kernel on `devices` also takes `dtypes`; the fake one takes `standin`."""

    devices: frozenset[str]
    dtypes: frozenset[torch.dtype]
    standin: torch.dtype
    out_dtype: Callable[[tuple, dict], torch.dtype]

    def applies(self, args: tuple, kwargs: dict) -> bool:
        floats = _float_tensors(args, kwargs)
        return bool(floats) and all(
            t.device.type in self.devices and t.dtype in self.dtypes for t in floats
        )


_WIDENINGS: dict[Any, Widening] = {}


def _register(op: Any, widening: Widening) -> None:
    if op in _WIDENINGS:
        raise ValueError(f"a fake-kernel widening for {op} is already registered")
    _WIDENINGS[op] = widening


def _grouped_mm_out(args: tuple, kwargs: dict) -> torch.dtype:
    return kwargs.get("out_dtype") or args[0].dtype


_register(
    torch.ops.aten._grouped_mm.default,
    Widening(
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32, torch.float16}),
        standin=torch.bfloat16,
        out_dtype=_grouped_mm_out,
    ),
)


def widening_for(func: Any, args: tuple, kwargs: dict) -> Widening | None:
    """The widening that covers this call, or None."""
    widening = _WIDENINGS.get(func)
    return widening if widening is not None and widening.applies(args, kwargs) else None


def standins(args: Any, dtype: torch.dtype) -> Any:
    """The call's floating tensors as empty fakes of `dtype` (run inside the fake mode)."""

    def swap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=x.device)
        return x

    return tree_map(swap, args)


def _float_tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten((args, kwargs))
    return [x for x in flat if isinstance(x, torch.Tensor) and x.is_floating_point()]


@dataclass(frozen=True)
class FakeRefusal:
    """A fake kernel refused a call that it takes in another dtype."""

    op: str
    dtype: torch.dtype  # what the model computes in
    accepted: list[torch.dtype]  # what the fake kernel takes with the same shapes
    error: str


def remember_refusal(exc: BaseException, func: Any, args: tuple, kwargs: dict) -> None:
    """Note on `exc` the innermost fake-kernel call that raised it."""
    if getattr(exc, _ATTR, None) is None:
        setattr(exc, _ATTR, (func, args, kwargs))


def _refusal(exc: BaseException) -> FakeRefusal | None:
    """The fake-kernel call that raised `exc`, when its dtype alone was refused."""
    seen: BaseException | None = exc
    while seen is not None and getattr(seen, _ATTR, None) is None:
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    func, args, kwargs = getattr(seen, _ATTR)
    floats = _float_tensors(args, kwargs)
    fake_mode = getattr(floats[0], "fake_mode", None) if floats else None
    if fake_mode is None:
        return None
    accepted = []
    for dtype in _STANDINS:
        if dtype == floats[0].dtype:
            continue
        try:
            with fake_mode:
                func(*standins(args, dtype), **standins(kwargs, dtype))
        except Exception:  # noqa: BLE001, S112 - this dtype is refused too
            continue
        accepted.append(dtype)
    if not accepted:
        return None  # shapes, not the dtype: an input mismatch after all
    return FakeRefusal(str(func), floats[0].dtype, accepted, str(seen).strip())


def refusal_message(exc: BaseException, where: str) -> str | None:
    """What to tell the user when a fake kernel refused the dtype the model computes in
    (None: it was not that)."""
    found = _refusal(exc)
    if found is None:
        return None
    takes = " or ".join(_name(d) for d in found.accepted)
    first = found.error.splitlines()[0] if found.error else ""
    return (
        f"--fake cannot run {where}: torch's fake-tensor kernel for {found.op} refuses "
        f"{_name(found.dtype)} ({first}); with the same shapes the fake run takes {takes}. Fake "
        "kernels often copy the CUDA kernel's checks, so this is about the dtype the model "
        "computes in on this device, not about your inputs."
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
