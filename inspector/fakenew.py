"""New fake tensors made as `FakeTensor(mode, elem, device)` makes them, at a fifth of the cost.

The fake views and the fake memo (inspector/fakeviews.py, inspector/fakememo.py) make a
new fake tensor for every answer: tens of thousands in a deep model's fake step.
`FakeTensor.__new__` spends most of its 30 us checking its arguments and setting twenty
attributes one by one, five of them through descriptors that set three each. Here the
tensor is made by the same `Tensor._make_subclass` call and given the attributes a
tensor made the ordinary way has, copied from one such tensor made when the mode was.

Where that would differ from the ordinary way (torch's debug traces, an export's leak
tracking, a torch without the calls used here), the ordinary constructor is used.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["FakeMaker"]

_C = torch._C
_FLAGS = ("_set_throw_on_mutable_data_ptr", "_set_warn_deprecated_on_mutable_data_ptr")
_HAS_CALLS = all(hasattr(_C, name) for name in _FLAGS) and hasattr(torch.Tensor, "_make_subclass")
_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


class FakeMaker:
    """Makes the fake tensors of one fake mode."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        # Made outside every mode: a maker first made mid-trace (torch.export's, where a
        # rule first meets its fake mode) must not put the probe into the traced graph.
        with _disable_current_modes():
            elem = torch.empty(0, device="meta")
        probe = FakeTensor(mode, elem, torch.device("cpu"))
        # What every new tensor of this mode starts with; `_fake_device` is each one's.
        self.template: dict[str, Any] | None = dict(vars(probe))
        known = _HAS_CALLS and hasattr(mode, "_allow_unsafe_data_ptr_access")
        if not known or "_fake_device" not in self.template:
            self.template = None  # not the FakeTensor this module was written against

    def new(self, elem: torch.Tensor, device: torch.device) -> FakeTensor:
        """`FakeTensor(mode, elem, device)` for a meta `elem` and a normalised `device`
        (a fake tensor's own `fake_device`)."""
        template = self.template
        if template is None or FakeTensorConfig.debug or _exporting():
            return FakeTensor(self.mode, elem, device)
        fake = torch.Tensor._make_subclass(
            FakeTensor, elem, elem.requires_grad, dispatch_device=True,
            device_for_backend_keys=device,
        )  # fmt: skip
        if self.mode._allow_unsafe_data_ptr_access:
            _C._set_warn_deprecated_on_mutable_data_ptr(fake)
        else:
            _C._set_throw_on_mutable_data_ptr(fake)
        attributes = fake.__dict__
        attributes.update(template)
        attributes["_fake_device"] = device
        return fake
