"""Do the inputs fit the model? One forward that, when it fails, names the layer that
rejected the inputs, what it got, and what it expects.

Forward pre/post hooks on every module keep the stack of modules currently running; when
the forward raises, the top of that stack is the innermost module that was running.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from inspector.context import Inputs
from inspector.errors import FakeModeLimit, InputMismatchError, UserCodeError, UserError
from inspector.fakekernels import refusal_message
from inspector.health.state import seeded
from inspector.loaders.usercode import user_code_error
from inspector.realcopy import needs_values
from inspector.tracebacks import is_user_file, user_location

__all__ = ["check_inputs_fit", "fake_train_limit", "describe_tensors", "expectation"]


def check_inputs_fit(
    model: nn.Module,
    inputs: Inputs,
    user_files: list[str],
    seed: int | None = None,
    keep: Callable[[Any], None] | None = None,
    watch: AbstractContextManager | None = None,
    around_forward: AbstractContextManager | None = None,
) -> BaseException | None:
    """Run one forward under no_grad; raise InputMismatchError (the inputs do not fit a
    layer) or UserCodeError (the user's code raised). Works on real and fake tensors.

    Exceptions only a fake run can raise (data-dependent control flow, an op without a
    fake kernel) say nothing about the inputs: they are returned, not raised, so the
    caller can decide what a fake run of this model can still do (inspector/realcopy.py).
    Buffers (BatchNorm statistics) are restored afterwards, so the check leaves no trace.
    It runs in eval mode: a train-mode-only failure (BatchNorm on one value per channel)
    is not a shape mismatch, and the modes pass reports it as a finding.

    With `seed`, the forward runs just after `torch.manual_seed(seed)`, and the random
    generators are as they were afterwards: it is then the seeded eval() forward other
    passes run, and `keep` receives its output; `watch` is entered around the forward,
    inside the seeding. `around_forward` is entered around the model's call alone.
    """
    tracker = _Tracker(model)
    saved = {name: b.clone() for name, b in model.named_buffers()}
    training = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad(), tracker, _seeded(seed), watch or nullcontext():
            with around_forward or nullcontext():
                output = inputs.call(model)
            if keep is not None:
                keep(output)
    except Exception as exc:
        if _fake_only(exc):
            return exc
        raise _explain(exc, tracker.stack, model, user_files) from exc
    finally:
        _restore(model, saved)
        for module, mode in training.items():
            module.training = mode
    return None


@contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    if seed is None:
        yield
        return
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        seeded(seed)  # as the passes seed their runs
        yield


def fake_train_limit(model: nn.Module, inputs: Inputs) -> BaseException | None:
    """On fake tensors, what a train-mode forward cannot do that the eval-mode check did:
    a branch on a random draw only training takes (wav2vec2's layerdrop reads
    `torch.rand([]) < rate`). Other train-mode failures are left to the passes that
    report them (BatchNorm on one value per channel: the modes pass). Leaves no trace:
    modes, buffers and the RNG are restored."""
    saved = {name: b.clone() for name, b in model.named_buffers()}
    training = {m: m.training for m in model.modules()}
    model.train()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            inputs.call(model)
    except Exception as exc:  # noqa: BLE001 - only fake tensors' limits are returned
        return exc if _fake_only(exc) else None
    finally:
        _restore(model, saved)
        for module, mode in training.items():
            module.training = mode
    return None


@dataclass
class _Frame:
    path: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


class _Tracker:
    """Hooks on every module: `stack` holds the modules whose forward is running."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack: list[_Frame] = []
        self.handles: list[Any] = []

    def __enter__(self) -> _Tracker:
        for path, module in self.model.named_modules():
            try:
                self.handles.append(
                    module.register_forward_pre_hook(self._pre(path), with_kwargs=True)
                )
                self.handles.append(module.register_forward_hook(self._post))
            except RuntimeError:  # ScriptModules refuse hooks
                continue
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()

    def _pre(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.stack.append(_Frame(path, module, args, kwargs))

        return hook

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        # Pop down to this module: a child that raised inside a caught try leaves its frame.
        while self.stack:
            if self.stack.pop().module is module:
                break


def _restore(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in saved and saved[name].shape == buffer.shape:
                buffer.copy_(saved[name])


def _fake_only(exc: BaseException) -> bool:
    from torch._subclasses import fake_tensor as ft

    unsupported = (ft.UnsupportedOperatorException, ft.UnsupportedFakeTensorException)
    return needs_values(exc) or isinstance(exc, unsupported)


# Mismatch errors raised by torch ops mention sizes, shapes, dtypes or indices.
_MISMATCH_WORDS = re.compile(
    r"size|shape|dimension|dim |channels|mat1|mat2|expected|scalar type|dtype|out of range|"
    r"index|must match|broadcast",
    re.IGNORECASE,
)
_MISMATCH_TYPES = (RuntimeError, ValueError, IndexError, TypeError, AssertionError)


def _is_mismatch(exc: BaseException, user_files: list[str]) -> bool:
    """A torch op (or library layer) rejected the inputs, rather than the user's own code
    failing: the innermost frame is library code, or a torch op called on a user line."""
    frames = traceback.extract_tb(exc.__traceback__)
    innermost = frames[-1] if frames else None
    if innermost is None or not is_user_file(innermost.filename, user_files):
        return isinstance(exc, _MISMATCH_TYPES)
    if (innermost.line or "").lstrip().startswith(("raise", "assert")):
        return False  # the user's own check
    words = bool(_MISMATCH_WORDS.search(str(exc)))
    return isinstance(exc, RuntimeError) or (isinstance(exc, _MISMATCH_TYPES) and words)


def _explain(
    exc: BaseException, stack: list[_Frame], model: nn.Module, user_files: list[str]
) -> UserError:
    frame = stack[-1] if stack else None
    limit = refusal_message(exc, _label(frame) if frame else type(model).__name__)
    if limit is not None:  # torch's fake kernel, not the inputs
        located = user_location(exc, user_files)
        return FakeModeLimit(
            limit,
            location=located[0] if located else None,
            hint="Run without --fake, or with the model in a dtype the fake kernel takes.",
        )
    if not _is_mismatch(exc, user_files):
        what = f"running {type(model).__name__}.forward"
        return user_code_error(UserCodeError, what, exc, user_files)
    lines = [_headline(frame, model)]
    if frame is not None:
        lines.append(f"  it received: {describe_tensors(frame.args, frame.kwargs)}")
        expects = expectation(frame.module, _tensors(frame.args, frame.kwargs))
        if expects:
            lines.append(f"  it expects:  {expects}")
    lines.append(f"  error: {type(exc).__name__}: {_first_lines(str(exc))}")
    located = user_location(exc, user_files)
    if located:
        lines.append(f"  called from: {located[0]}    {located[1]}")
    if len(stack) > 1:
        lines.append("  module stack: " + " > ".join(_label(f) for f in stack))
    return InputMismatchError(
        "\n".join(lines),
        location=located[0] if located else None,
        hint="Check --input: the shapes and dtypes must be what this layer expects.",
    )


def _headline(frame: _Frame | None, model: nn.Module) -> str:
    if frame is None:
        return f"The inputs do not fit {type(model).__name__}."
    where = f"`{frame.path}`" if frame.path else f"the model ({type(model).__name__})"
    return f"The inputs do not fit {where}: {_short_repr(frame.module)}."


def _label(frame: _Frame) -> str:
    kind = type(frame.module).__name__
    return f"{frame.path} ({kind})" if frame.path else f"{kind} (root)"


def _short_repr(module: nn.Module) -> str:
    extra = module.extra_repr()
    text = f"{type(module).__name__}({extra})" if extra or not list(module.children()) else ""
    return text or f"{type(module).__name__}(...)"


def _first_lines(text: str, limit: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    more = " ..." if len(lines) > limit else ""
    return " / ".join(lines[:limit]) + more


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    flat, _ = tree_flatten((args, kwargs))
    return [t for t in flat if isinstance(t, torch.Tensor)]


def describe_tensors(args: tuple, kwargs: dict) -> str:
    """ "float32[8, 4, 224, 224], mask: bool[8, 16]" for a module's inputs."""
    parts = [_describe(v) for v in args] + [f"{k}: {_describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "no inputs"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items()) + "}"
    return type(value).__name__ if value is not None else "None"


# What common layers expect of their input, read off their attributes.
_EXPECTATIONS: list[tuple[tuple[type, ...], Callable[[Any, list[torch.Tensor]], str]]] = []


def _expects(*types: type) -> Callable:
    def register(func: Callable) -> Callable:
        _EXPECTATIONS.append((types, func))
        return func

    return register


def expectation(module: nn.Module, tensors: Iterable[torch.Tensor]) -> str | None:
    """What `module` expects of its input, e.g. "3 channels on dim 1 (in_channels=3)"."""
    tensors = list(tensors)
    for types, func in _EXPECTATIONS:
        if isinstance(module, types):
            return func(module, tensors) + _weight_dtype_note(module, tensors)
    return _weight_dtype_note(module, tensors).removeprefix("; ") or None


def _weight_dtype_note(module: nn.Module, tensors: list[torch.Tensor]) -> str:
    weight = getattr(module, "weight", None)
    first = tensors[0] if tensors else None
    if not isinstance(weight, torch.Tensor) or first is None or not first.is_floating_point():
        return ""
    if not weight.is_floating_point() or weight.dtype == first.dtype:
        return ""
    return f"; its weight is {str(weight.dtype).removeprefix('torch.')}"


@_expects(nn.modules.conv._ConvNd)
def _conv(m: Any, tensors: list[torch.Tensor]) -> str:
    spatial = {1: "L", 2: "H, W", 3: "D, H, W"}.get(len(m.kernel_size), "...")
    return (
        f"{m.in_channels} channels on dim 1 (in_channels={m.in_channels}) "
        f"of an input [N, C, {spatial}]"
    )


@_expects(nn.Linear)
def _linear(m: Any, tensors: list[torch.Tensor]) -> str:
    return f"last dim = {m.in_features} (in_features={m.in_features})"


@_expects(nn.Embedding, nn.EmbeddingBag)
def _embedding(m: Any, tensors: list[torch.Tensor]) -> str:
    text = f"integer ids in [0, {m.num_embeddings}) (num_embeddings={m.num_embeddings})"
    ids = tensors[0] if tensors else None
    if ids is not None and not ids.is_floating_point() and ids.numel() and not _is_fake(ids):
        text += f"; got ids in [{int(ids.min())}, {int(ids.max())}]"
    elif ids is not None and ids.is_floating_point():
        text += f"; got {str(ids.dtype).removeprefix('torch.')} values"
    return text


@_expects(nn.LayerNorm)
def _layer_norm(m: Any, tensors: list[torch.Tensor]) -> str:
    shape = list(m.normalized_shape)
    return f"trailing dims {shape} (normalized_shape={tuple(shape)})"


@_expects(nn.modules.batchnorm._BatchNorm)
def _batch_norm(m: Any, tensors: list[torch.Tensor]) -> str:
    return f"{m.num_features} channels on dim 1 (num_features={m.num_features})"


@_expects(nn.GroupNorm)
def _group_norm(m: Any, tensors: list[torch.Tensor]) -> str:
    return f"{m.num_channels} channels on dim 1 (num_channels={m.num_channels})"


@_expects(nn.MultiheadAttention)
def _mha(m: Any, tensors: list[torch.Tensor]) -> str:
    return f"last dim = {m.embed_dim} (embed_dim={m.embed_dim})"


@_expects(nn.RNNBase)
def _rnn(m: Any, tensors: list[torch.Tensor]) -> str:
    return f"last dim = {m.input_size} (input_size={m.input_size})"


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"
