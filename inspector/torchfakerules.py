"""torch's own fake runs answered by the memory pass's rules at sizes their first call never
saw: Dynamo's (the compile check) and torch.export's (the export checks).

Both run each op they trace on fake tensors of a fake mode of their own, to learn the
outputs' shapes. Where torch's fake kernel is Python, a call at new sizes is dear: a batch
norm 4-6 ms in training mode, 8-18 ms in an export's eval mode, a hardswish 3-5 ms (their
decompositions, op by op, each a miss of the fake mode's cache). MobileNetV3-small's
compile check spent 0.23 s of its 1.3 s in such calls, its export 0.53 s of 1.5. The
size-free rules (inspector/fakerules.py) answer them after one call of each kind, checked
against torch's own answer at that call.

Only while inside, only in torch's plain FakeTensorMode (the memory pass's modes answer
by themselves), and only calls whose tensors have no symbolic size: a dim made dynamic
takes the mode's whole path, guards and all. On 60 zoo models Dynamo's graphs, ops and
breaks, and torch.export's graphs (every node's target, arguments and output metadata),
are the same either way.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode

from inspector.fakenew import FakeMaker
from inspector.fakerules import FakeRules

__all__ = ["Answered", "rules_in_torch_modes"]


class Answered:
    """The rules of each of torch's fake modes, one learned table for all."""

    def __init__(self) -> None:
        self.learned: dict[tuple, Any] = {}
        self._rules: weakref.WeakKeyDictionary[FakeTensorMode, FakeRules] = (
            weakref.WeakKeyDictionary()
        )

    def rules(self, mode: FakeTensorMode) -> FakeRules:
        rules = self._rules.get(mode)
        if rules is None:
            maker = FakeMaker(mode)
            rules = FakeRules(mode, _no_value, maker, self.learned, in_shape_env=True)
            self._rules[mode] = rules
        return rules

    @property
    def hits(self) -> int:
        """Calls a rule answered."""
        return sum(rules.hits for rules in self._rules.values())


def _no_value(t: Any) -> bool:
    return False  # torch's fake tensors carry no real values (inspector/fakevalues.py's do)


@contextlib.contextmanager
def rules_in_torch_modes() -> Iterator[Answered]:
    """While inside, every plain FakeTensorMode answers by rule where one covers the call."""
    original = FakeTensorMode.dispatch
    answered = Answered()

    def dispatch(mode, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202 - torch's
        kwargs = kwargs or {}
        if type(mode) is not FakeTensorMode:  # a subclass (ours) has its own answers
            return original(mode, func, types, args, kwargs)
        rules = answered.rules(mode)
        key = rules.key(func, args, kwargs)
        out = None if key is None else rules.answer(key, func, args, kwargs)
        if out is None:
            out = original(mode, func, types, args, kwargs)
            if key is not None:
                rules.remember(key, func, args, kwargs, out)
        return out

    FakeTensorMode.dispatch = dispatch
    try:
        yield answered
    finally:
        FakeTensorMode.dispatch = original
