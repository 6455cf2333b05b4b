"""A FakeTensorMode whose small integer tensors keep their values.

Libraries branch on the values of masks and ids: transformers skips the causal mask when
the padding mask is all ones (`_ignore_causal_mask_sdpa`), and that choice decides
whether SDPA gets `is_causal=True` or an explicit mask (and then grouped K/V heads
expanded by `repeat_kv`). A plain fake tensor has no values, so transformers asks
`is_fake_tensor(mask)` and takes its tracing path: a fake run then allocates and saves
what a real run never does (+3..8% saved activations on Llama-family decoders).

Here the values that decide such branches are computed for real beside the fake run:
- a value starts at an integer or bool tensor: an input, a buffer, a factory
  (`arange`, `randint` of token ids);
- an op whose tensor inputs all have values gets its real result too (`mask.bool()`,
  `sum() == numel`, a constructor's `linspace(0, rate, depth).tolist()`), when the
  result is at most `MAX_NUMEL` elements (`MAX_FLOAT_NUMEL` for floats);
- a scalar read (`bool()`, `.item()`) of such a tensor answers the real value, and an
  op that needs data for its shape (`nonzero`) gets the real shape.
Weights and activations never have values, so the cost is the mask plumbing only.
The real values live on the CPU, whatever device the fake tensors claim.

The mode also runs the ops whose fake kernel refuses what the real kernel of the device
takes (inspector.fakekernels: `_grouped_mm` in float32 on the CPU).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakTensorKeyDictionary

from inspector.dispatchmode import LeanDispatchMode, unwrapped
from inspector.fakekernels import Widening, remember_refusal, standins, widening_for
from inspector.fakememo import FakeMemo
from inspector.fakenew import FakeMaker
from inspector.fakerules import FakeRules
from inspector.fakeviews import PLAIN_VIEWS, plain_view

__all__ = [
    "ValuedFakeTensorMode", "new_fake_mode", "value_of", "has_value", "give_value", "MAX_NUMEL",
]  # fmt: skip

MAX_NUMEL = 1 << 24  # a [1, 1, 4096, 4096] bool mask; a real value costs real memory
# Floats with values are small things read in Python (drop-path rates, a scale): never
# a weight-sized tensor, so a model built on fake tensors still allocates nothing.
MAX_FLOAT_NUMEL = 1 << 16
_ATTR = "_inspector_value"  # the real CPU tensor a fake tensor stands for
_NEEDS_DATA = (DataDependentOutputException, DynamicOutputShapeException)
_aten = torch.ops.aten
_UNINITIALISED = frozenset(
    {_aten.empty, _aten.empty_strided, _aten.empty_like, _aten.new_empty, _aten.new_empty_strided}
)


def value_of(t: Any) -> torch.Tensor | None:
    """The real value a fake tensor carries, or None."""
    return getattr(t, _ATTR, None) if isinstance(t, FakeTensor) else None


def has_value(t: Any) -> bool:
    """Whether a fake tensor carries a real value."""
    return value_of(t) is not None


def give_value(fake: torch.Tensor, value: torch.Tensor | None) -> torch.Tensor:
    """Let `fake` carry `value` (a same-shaped real tensor; a copy is kept on the CPU)."""
    if not isinstance(fake, FakeTensor) or not isinstance(value, torch.Tensor):
        return fake
    if isinstance(value, FakeTensor) or value.device.type == "meta":
        return fake  # no values to give
    if _valued_dtype(value) and _fits(value, fake):
        with no_dispatch():
            real = value.detach().to("cpu", copy=True)
        _set(fake, real)
    return fake


def _fits(value: Any, fake: torch.Tensor) -> bool:
    """A real value can stand for `fake`: same shape, and small enough to keep."""
    if not isinstance(value, torch.Tensor) or value.shape != fake.shape:
        return False
    return value.numel() <= (MAX_NUMEL if _valued_dtype(value) else MAX_FLOAT_NUMEL)


def _valued_dtype(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def _set(fake: Any, real: torch.Tensor) -> None:
    setattr(fake, _ATTR, real)
    mode = getattr(fake, "fake_mode", None)
    if isinstance(mode, ValuedFakeTensorMode):
        mode.valued[fake] = None


class ValuedFakeTensorMode(LeanDispatchMode, FakeTensorMode):
    """FakeTensorMode (non-fake inputs allowed) with values for small integer tensors."""

    # the fake mode's own hook, under our cheaper guard (inspector/dispatchmode.py)
    __torch_dispatch__ = unwrapped(FakeTensorMode.__torch_dispatch__)

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.valued = WeakTensorKeyDictionary()  # the fakes with values, for aliases
        self.maker = FakeMaker(self)  # new fake tensors for the views and the memo
        self.memo = FakeMemo(self, has_value, self.maker)
        self.rules = FakeRules(self, has_value, self.maker)  # at any size, by rule

    def __enter__(self) -> ValuedFakeTensorMode:
        _teach_transformers()
        return super().__enter__()

    def dispatch(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201 - torch's
        kwargs = kwargs or {}
        if func in PLAIN_VIEWS:
            out = plain_view(self.maker, func, args, kwargs, has_value)
            if out is not None:
                return out
        widening = widening_for(func, args, kwargs)
        if widening is not None:  # the fake kernel refuses what the real one runs
            return self._widened(func, types, args, kwargs, widening)
        # the same shapes as before from the memo (20-40 us), other sizes by rule (50 us)
        key = self.memo.key(func, args, kwargs)
        out = None if key is None else self.memo.answer(key)
        if out is not None:
            return out
        out = self._by_rule(func, types, args, kwargs)
        if key is not None:
            self.memo.remember(key, args, kwargs, out)
        return out

    def _by_rule(self, func: Any, types: Any, args: Any, kwargs: dict) -> Any:
        """The outputs by rule (inspector/fakerules.py), else the fake mode's own."""
        rule_key = self.rules.key(func, args, kwargs)
        out = None if rule_key is None else self.rules.answer(rule_key, func, args, kwargs)
        if out is None:
            out = self._dispatch(func, types, args, kwargs)
            if rule_key is not None:
                self.rules.remember(rule_key, func, args, kwargs, out)
        return out

    def _dispatch(self, func: Any, types: Any, args: Any, kwargs: dict) -> Any:
        real = _real_args(func, args, kwargs)
        try:
            out = super().dispatch(func, types, args, kwargs)
        except _NEEDS_DATA:
            if real is None:
                raise
            return self._from_real(_run(func, real), args, kwargs)
        except Exception as exc:
            remember_refusal(exc, func, args, kwargs)  # for the message (fakekernels)
            raise
        if real is not None and not _no_value(func, real, out):
            self._carry(func, real, out)
        elif _mutates(func):
            self._forget_written(func, args, kwargs)
        return out

    def _widened(self, func: Any, types: Any, args: Any, kwargs: Any, widening: Widening) -> Any:
        """The fake kernel run on stand-ins it accepts; the output in the real dtype."""
        with self:
            standin_args = standins(args, widening.standin)
            standin_kwargs = standins(kwargs, widening.standin)
        out = super().dispatch(func, types, standin_args, standin_kwargs)
        with self:
            return torch.empty_strided(
                out.shape, out.stride(), dtype=widening.out_dtype(args, kwargs), device=out.device
            )

    def _carry(self, func: Any, real: tuple[tuple, dict], out: Any) -> None:
        """Give `out` the real result of `func` (or forget what the op wrote on failure)."""
        try:
            result = _run(func, real)
        except Exception:  # noqa: BLE001 - the fake result stands; only the values go
            self._forget_written(func, *real)
            return
        fakes, _ = tree_flatten(out)
        reals, _ = tree_flatten(result)
        if len(fakes) != len(reals):
            return
        for fake, value in zip(fakes, reals, strict=True):
            if isinstance(fake, FakeTensor) and _fits(value, fake):
                _set(fake, value)

    def _from_real(self, result: Any, args: Any, kwargs: Any) -> Any:
        """An op whose output shape depends on data: fake outputs of the real shapes."""
        device = _fake_device(args, kwargs)

        def fake(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            with self:
                out = torch.empty_strided(
                    value.shape, value.stride(), dtype=value.dtype, device=device
                )
            _set(out, value)
            return out

        return tree_map(fake, result)

    def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op wrote into tensors without computing their values: they and every
        tensor sharing their storage lose their values."""
        for written in _written_args(func, args, kwargs):
            value = value_of(written) if isinstance(written, FakeTensor) else written
            storage = _storage_ptr(value)
            if storage is None:
                continue
            for fake in list(self.valued.keys()):
                known = value_of(fake)
                if known is not None and _storage_ptr(known) == storage:
                    delattr(fake, _ATTR)
                    self.valued.pop(fake, None)


def _storage_ptr(value: Any) -> int | None:
    """Where a real tensor's data lives; None for what has no data of its own (a fake, a
    wrapper subclass such as FSDP's DTensor, a storage resized away)."""
    if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
        return None
    try:
        return value.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def _real_args(func: Any, args: Any, kwargs: Any) -> tuple[tuple, dict] | None:
    """The op's arguments with each tensor replaced by its real value, or None when a
    tensor has none."""
    if _plainly_fake(args) or _plainly_fake(kwargs.values()):
        return None  # most ops (weights, activations): no flattening
    flat, spec = tree_flatten((args, kwargs))
    for i, x in enumerate(flat):
        if isinstance(x, FakeTensor):
            value = value_of(x)
            if value is None:
                return None
            flat[i] = value
        elif isinstance(x, torch.Tensor):  # a real tensor the fake mode was handed
            # real weights stay constants: a value from them would be a real forward
            if not _valued_dtype(x) or x.numel() > MAX_NUMEL or x.device.type == "meta":
                return None
        elif isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return None
    real_args, real_kwargs = tree_unflatten(flat, spec)
    return real_args, _on_cpu(real_kwargs)


def _plainly_fake(values: Any) -> bool:
    """A fake tensor without a value among `values` or one list deep."""
    for x in values:
        if isinstance(x, FakeTensor) and getattr(x, _ATTR, None) is None:
            return True
        if isinstance(x, list | tuple) and _plainly_fake(x):
            return True
    return False


def _no_value(func: Any, real: tuple[tuple, dict], out: Any) -> bool:
    """Factories whose result has no value to keep: uninitialised memory, and random
    floats (noise, a dropout draw). Random integers or bools (token ids, masks) start a
    value, as deterministic factories (`arange`, `full`) do."""
    if getattr(func, "overloadpacket", None) in _UNINITIALISED:
        return True
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    if any(isinstance(x, torch.Tensor) for x in tree_flatten(real)[0]):
        return False
    return any(isinstance(t, torch.Tensor) and not _valued_dtype(t) for t in tree_flatten(out)[0])


def _on_cpu(kwargs: dict) -> dict:
    """Real values are computed on the CPU whatever device the fake tensors claim."""
    out = dict(kwargs)
    if "device" in out and out["device"] is not None:
        out["device"] = torch.device("cpu")
    if out.get("pin_memory"):
        out["pin_memory"] = False
    return out


def _run(func: Any, real: tuple[tuple, dict]) -> Any:
    with no_dispatch():
        return func(*real[0], **real[1])


def _fake_device(args: Any, kwargs: Any) -> torch.device:
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, FakeTensor):
            return x.fake_device
    return torch.device(kwargs.get("device") or "cpu")


def _mutates(func: Any) -> bool:
    schema = getattr(func, "_schema", None)  # higher-order ops have none
    return schema is not None and schema.is_mutable


def _written_args(func: Any, args: Any, kwargs: Any) -> list[Any]:
    out: list[Any] = []
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        out.extend(x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor))
    return out


def _teach_transformers() -> None:
    """transformers takes a fake tensor for a traced one and never reads its values
    (`is_tracing` -> `is_fake_tensor`); one that carries its values can be read, as the
    real tensor would be. Patched once, when transformers is loaded."""
    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None)
    if original is None or getattr(original, "_inspector", False):
        return

    def is_fake_tensor(x: Any) -> bool:
        return original(x) and value_of(x) is None

    is_fake_tensor._inspector = True  # type: ignore[attr-defined]
    utils.is_fake_tensor = is_fake_tensor  # type: ignore[union-attr]


def new_fake_mode() -> ValuedFakeTensorMode:
    """The fake mode every fake run uses. Real tensors handed to it (weights of a model
    built for real) become constants of the fake run."""
    return ValuedFakeTensorMode()
