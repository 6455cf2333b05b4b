"""The captured fx graph's nodes, met on the eager forward as it runs.

The per-node gradients and statistics came from a replay of the fx graph: a second
forward after the eager one (ResNet-18 at [8, 3, 224, 224]: 0.3 s of the gradients
pass's 1.2 s). An fx graph is the forward's own calls, in order: its leaf modules'
calls, and between them the torch functions and tensor methods the Python code around
them calls. Watching the eager forward, each call made outside a leaf module is matched
to the graph's next node: the same module object, or the same function or method with an
output of the node's shape. Nodes that compute on Python values alone (an item of a
module's tuple output, a size times two) make no torch call: their values are computed
here from their inputs' values, as the graph would. Where every node is met in order and
nothing else is called, each node's value is the eager forward's own, and the eager
backward fills the per-node gradients: no replay. At the first call that is not the next
node the watching stops (`matched` False) and the replay runs, as before.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from inspector.context import Context
from inspector.health import nodegrads
from inspector.health.nodegrads import NodeGrads, Observer, recording_grads
from inspector.health.outputs import flat_tensors
from inspector.health.recorder import op_name
from inspector.health.values import NodeRef, graph_feed, kind_of

__all__ = ["EagerGraphNodes"]

# where the graph's functions that also run on Python values come from
_PYTHON_MODULES = frozenset({"_operator", "operator", "builtins"})


class EagerGraphNodes:
    """A ForwardWatch: the fx graph's node values from the eager forward it watches
    (`also` sees each, as in the replay), and their gradients from its backward."""

    def __init__(self, ctx: Context, also: Observer | None) -> None:
        self.result = NodeGrads(method="graph")
        self.unmet: str | None = None  # why the watching stopped, if it did
        self.matched = False  # every node met, in order
        self.error: Exception | None = None  # recording a node's gradient failed
        gm = ctx.capture.graph_module
        self._gm = gm
        self._nodes = [n for n in gm.graph.nodes if n.op != "output"]
        self._next = 0
        self._values: dict[str, Any] = {}
        self._uses = {n.name: len(n.users) for n in self._nodes}
        calls = [n for n in self._nodes if n.op == "call_module"]
        self._leaves = {id(gm.get_submodule(n.target)) for n in calls}
        self._depth = 0  # leaf modules running
        self._paths = {n.name: n.module_path for n in ctx.report.nodes}
        self._shapes = {
            n.name: [tuple(t.shape) for t in n.output_tensors] for n in ctx.report.nodes
        }
        self._feed = iter(graph_feed(gm, ctx) or ())
        self._on_value = recording_grads(self.result, also, self._record)

    @contextmanager
    def watching(self, ctx: Context) -> Iterator[None]:
        handles = []
        for module in ctx.model.modules():
            if id(module) in self._leaves:
                handles.append(module.register_forward_pre_hook(self._entered))
                handles.append(module.register_forward_hook(self._left))
        try:
            with _Calls(self):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def finish(self, output: Any) -> None:
        try:
            with torch._C.DisableTorchFunction():
                self._computed()
        except Exception as exc:  # noqa: BLE001 - per-node values are extra
            self._stop(f"{type(exc).__name__}: {exc}")
        if self.unmet is None and self._next < len(self._nodes):
            self._stop(f"the forward ended before node {self._nodes[self._next].name}")
        self.matched = self.unmet is None
        self._values.clear()

    def _entered(self, module: torch.nn.Module, args: Any) -> None:
        self._depth += 1

    def _left(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            fits = lambda n: n.op == "call_module" and self._module(n) is module  # noqa: E731
            self._met(fits, output, type(module).__name__)

    def called(self, func: Any, args: Any, output: Any) -> None:
        """A torch function or tensor method called outside every leaf module. One that
        makes no tensor (`x.shape`, `x.dim()`, our hooks' reads) is no node's: the graph's
        nodes that make none are computed here. One that makes a tensor out of Python
        values alone (`torch.tensor(3.0)`) may be a constant of the graph's, where it is
        not its next node."""
        if self.unmet is None and not self._depth and _makes_tensors(output):
            fits = lambda n: _same_call(n, func) and self._shaped(n, output)  # noqa: E731
            self._met(fits, output, op_name(func), constant=not _makes_tensors(args))

    def _met(
        self,
        fits: Callable[[torch.fx.Node], bool],
        value: Any,
        what: str,
        constant: bool = False,
    ) -> None:
        if self.unmet is not None:
            return
        if not torch.is_grad_enabled():  # a no_grad block, or an autograd.Function's
            # forward: the graph keeps its ops, not what autograd makes of them (the
            # replay tells them apart, by the loss's autograd graph)
            self._stop(f"{what} called without grad")
            return
        # hidden from the recorder of the user's ops; a failure of ours stops the watching
        with torch._C.DisableTorchFunction():
            try:
                self._computed()
                if self.unmet is not None:
                    return
                if self._next >= len(self._nodes) or not fits(self._nodes[self._next]):
                    if constant:  # fx made it once, at the trace: an attribute of the graph's
                        return
                    expected = (
                        self._nodes[self._next].name if self._next < len(self._nodes) else "its end"
                    )
                    self._stop(f"{what} called where the graph has {expected} next")
                    return
                self._take(self._nodes[self._next], value)
            except Exception as exc:  # noqa: BLE001 - per-node values are extra; keep the forward
                self._stop(f"{type(exc).__name__}: {exc}")

    def _computed(self) -> None:
        """The nodes before the next call: inputs, attributes, Python values."""
        while self.unmet is None and self._next < len(self._nodes):
            node = self._nodes[self._next]
            if node.op == "placeholder":
                value = next(self._feed, _MISSING)
                if value is _MISSING:
                    self._stop(f"no value for the graph's input {node.name}")
                    return
            elif node.op == "get_attr":
                value = operator.attrgetter(node.target)(self._gm)
            elif _reads_attributes(node):  # no tensor: read off its input's value here
                value = self._evaluated(node)
            elif self._on_python_values(node):  # a tensor out of a tuple, say
                try:
                    value = self._evaluate(node)
                except Exception as exc:  # noqa: BLE001 - not the graph's: replay instead
                    self._stop(f"node {node.name}: {type(exc).__name__}")
                    return
            else:
                return  # made by the next call
            self._take(node, value)

    def _take(self, node: torch.fx.Node, value: Any) -> None:
        self._next += 1
        for used in node.all_input_nodes:
            self._uses[used.name] -= 1
            if not self._uses[used.name]:
                self._values.pop(used.name, None)
        if self._uses[node.name]:
            self._values[node.name] = value
        if node.op == "get_attr":
            return  # as the replay: an attribute is no node's output
        module = node.op == "call_module"
        target = self._module(node) if module else node.target
        path = self._paths.get(node.name, node.target if module else None)
        self._on_value(NodeRef(node.name, kind_of(target), path), value)

    def _on_python_values(self, node: torch.fx.Node) -> bool:
        """A function of `operator` or a builtin (no torch call) whose arguments are no
        tensors themselves (a tuple of them is Python's)."""
        owner = getattr(node.target, "__module__", None)
        if node.op != "call_function" or owner not in _PYTHON_MODULES:
            return False
        args = [self._values.get(n.name) for n in node.all_input_nodes]
        return not any(isinstance(a, torch.Tensor) for a in args)

    def _evaluated(self, node: torch.fx.Node) -> Any:
        """A size, a dtype...: its value, or None where it cannot be read here (only a
        later node computed here reads it; that one then stops the watching)."""
        try:
            return self._evaluate(node)
        except Exception:  # noqa: BLE001 - as above
            return None

    def _evaluate(self, node: torch.fx.Node) -> Any:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), self._value)
        if node.op == "call_method":
            owner, *rest = args
            return getattr(owner, node.target)(*rest, **kwargs)
        return node.target(*args, **kwargs)

    def _value(self, node: torch.fx.Node) -> Any:
        if node.name not in self._values:
            raise KeyError(node.name)
        return self._values[node.name]

    def _module(self, node: torch.fx.Node) -> torch.nn.Module:
        return self._gm.get_submodule(node.target)

    def _shaped(self, node: torch.fx.Node, output: Any) -> bool:
        want = self._shapes.get(node.name)
        got = [tuple(t.shape) for _, t in flat_tensors(output)]
        return not want or not got or want == got

    def _record(self, name: str, grad: torch.Tensor) -> None:
        if not self.matched or self.error is not None:  # else the replay gives them
            return
        try:
            nodegrads.record_grad(self.result, name, grad)
        except Exception as exc:  # noqa: BLE001 - per-node grads are extra; the gradient flows on
            self.error = exc

    def _stop(self, why: str) -> None:
        if self.unmet is None:
            self.unmet = why
            self._values.clear()


_MISSING = object()

# What a node reads off a tensor without making one: the eager forward's calls of these
# are no node's (they make no tensor), and the graph's nodes of them are computed here.
_ATTRIBUTES = frozenset({
    "size", "dim", "numel", "shape", "ndim", "dtype", "device", "is_cuda", "layout",
    "requires_grad", "is_floating_point", "is_complex", "is_contiguous", "stride",
    "element_size", "nelement", "ndimension", "item", "tolist", "get_device", "_assert",
})  # fmt: skip


def _reads_attributes(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _ATTRIBUTES
    if node.op != "call_function":
        return False
    if node.target is builtins.getattr:
        return len(node.args) > 1 and node.args[1] in _ATTRIBUTES
    name = getattr(node.target, "__name__", "")
    return getattr(node.target, "__module__", "") == "torch" and name in _ATTRIBUTES


def _makes_tensors(value: Any) -> bool:
    """Whether `value` is a tensor or holds one (in tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return True
    if not isinstance(value, (tuple, list, dict)):
        return False
    with torch._C.DisableTorchFunction():
        return any(True for _ in flat_tensors(value))


def _same_call(node: torch.fx.Node, func: Any) -> bool:
    """Whether a call of `func` is what `node` records: the same function, or a method or
    operator of the same name (`x + y`: `operator.add` in the graph, `Tensor.__add__` or
    `__radd__` called)."""
    if node.op not in ("call_function", "call_method"):
        return False
    got = op_name(func)
    if node.op == "call_function" and node.target is builtins.getattr:
        return len(node.args) > 1 and got == node.args[1]  # `x.shape`: the property's name
    want = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    got, want = got.strip("_"), str(want).strip("_")
    want = _OPERATOR_OPS.get(want, want)
    return got == want or got == "r" + want


# `operator`'s names whose tensor method has another (`x / y` calls `Tensor.div`); an
# in-place one's method (`add_`) is compared without its underscore
_OPERATOR_OPS = {
    "truediv": "div", "itruediv": "div", "mod": "remainder", "imod": "remainder",
    "iadd": "add", "isub": "sub", "imul": "mul", "ipow": "pow", "imatmul": "matmul",
    "iand": "and", "ior": "or", "ixor": "xor",
}  # fmt: skip


class _Calls(TorchFunctionMode):
    def __init__(self, nodes: EagerGraphNodes) -> None:
        super().__init__()
        self.nodes = nodes

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.nodes.called(func, (args, kwargs), out)
        return out
