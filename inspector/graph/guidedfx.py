"""fx tracing guided by meta values, for models plain symbolic_trace cannot trace.

Plain fx fails at the first Python decision on a traced value (`if q_len == kv_len:`,
`len(x)`, `int(x.size(1))`), which Hugging Face models make everywhere. Here every
node also gets a meta value (the op run on meta tensors: shapes, dtypes, no data), and
such a decision uses it: the graph is the one the example input takes, as torch.export
specializes, at a fraction of export's cost (GPT-2 small: 0.2 s against 1.1 s on two
cores; no sympy). Each decision is recorded with the node it read, which stays in the
graph: the graph pass reads those nodes again in its runs with a named dim changed, and
a dim that changes a decision is not symbolic (a trace there would be another graph).

A decision on tensor data (`if x.sum() > 0:`), a value no meta kernel computes, or a node
whose meta run fails rejects the trace (export comes next). The graph's placeholders are
the input tensors in flattened order (as export's), and its targets are the model's own
module paths.
"""

from __future__ import annotations

import inspect
import keyword
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx._symbolic_trace import _maybe_revert_all_patches
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_map

from inspector.graph.exportcapture import Flat, flat_tensors
from inspector.graph.fxcapture import FLAT_INPUTS, FxTracer, trace_with_leaves
from inspector.graph.metarun import meta_like, on_meta_device, single_device, unique_tensor_names
from inspector.graph.tensors import tensor_leaves

__all__ = [
    "Decision", "GuidedCapture", "GuidedTraceError", "changed_decision", "meta_state",
    "trace_guided",
]  # fmt: skip

_WRAPPED = "model"  # the user's model inside the flat root
_VALUE = "inspector_meta"  # node.meta key of a node's meta value
_MISSING = object()
# tensor attributes that no named dim can change: given as values, not nodes
_STATIC_ATTRS = frozenset(
    {"dtype", "ndim", "layout", "is_cuda", "is_meta", "is_sparse", "is_quantized", "is_nested"}
)


_DECIDE: dict[str, Any] = {
    "bool": bool, "int": int, "index": operator.index, "float": float, "len": len,
    "rank": len, "keys": lambda v: list(v.keys()),
}  # fmt: skip


@dataclass(frozen=True)
class Decision:
    """A Python decision the trace took on a node's value: `bool(gt_3)` was True."""

    node: str
    why: str  # a key of _DECIDE
    value: Any

    def holds(self, value: Any) -> bool:
        """Whether the node's value in another run leads to the same decision."""
        try:
            return _DECIDE[self.why](value) == self.value
        except Exception:  # noqa: BLE001 - a value that cannot decide: it does not hold
            return False


class GuidedTraceError(RuntimeError):
    """The trace needs what meta values cannot give (tensor data, a failing op)."""


@dataclass
class GuidedCapture:
    graph_module: fx.GraphModule
    leaves: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # in the order taken
    first_error: BaseException | None = None  # why the first leaf was needed


def changed_decision(decisions: list[Decision], values: dict[str, Any]) -> Decision | None:
    """The first decision that another run of the graph (its node values in `values`)
    would take differently: tracing at those inputs would give another graph."""
    for d in decisions:
        if d.why != "rank" and not d.holds(values.get(d.node)):  # rank: no dim moves it
            return d
    return None


class _MetaProxy(fx.Proxy):
    def value(self) -> Any:
        return self.node.meta.get(_VALUE, _MISSING)

    def decide(self, why: str) -> Any:
        v = self.value()
        if v is _MISSING or isinstance(v, torch.Tensor):
            what = "control flow on tensor data" if v is not _MISSING else "value unknown"
            error = GuidedTraceError(f"{why}() of `{self.node.name}`: {what}")
            self.tracer.failed = self.tracer.failed or error  # even if the model catches it
            raise error
        self.tracer.decisions.append(Decision(self.node.name, why, _DECIDE[why](v)))
        return v

    def __len__(self) -> int:
        v = self.value()
        if isinstance(v, torch.Size | torch.Tensor | list | tuple | dict):
            why = "rank" if isinstance(v, torch.Size) else "len"
            self.tracer.decisions.append(Decision(self.node.name, why, len(v)))
            return len(v)
        return len(self.decide("len"))

    def __int__(self) -> int:
        return int(self.decide("int"))

    def __index__(self) -> int:  # a slice of a plain list or tensor: `x[:, :n]`
        return operator.index(self.decide("index"))

    def __float__(self) -> float:
        return float(self.decide("float"))

    def __iter__(self) -> Any:
        return iter([self[i] for i in range(len(self))])

    def __getattr__(self, name: str) -> Any:
        v = self.value()
        if v is not _MISSING and not hasattr(v, name):
            # as eager: `hasattr(x, "jax")` is False (fx would say True to anything)
            raise AttributeError(f"{type(v).__name__!r} object has no attribute {name!r}")
        if isinstance(v, torch.Tensor) and (name in _STATIC_ATTRS or name == "device"):
            return self.tracer.device if name == "device" else getattr(v, name)
        return _MetaAttribute(self, name)


class _MetaAttribute(fx.proxy.Attribute, _MetaProxy):
    """`x.shape`, `x.T`: fx's lazy attribute node, with a meta value like any proxy."""


class _GuidedTracer(FxTracer):
    def __init__(
        self, leaves: set[str], state: dict[str, torch.Tensor], device: torch.device,
        stack_traces: bool,
    ) -> None:  # fmt: skip
        super().__init__(leaves, stack_traces=stack_traces)
        # buffers as nodes: `self.position_ids[:, :seq_len]` stays a graph op on a traced
        # length instead of a slice taken at the example's length (a decision on it)
        self.proxy_buffer_attributes = True
        self.state = state  # meta copy of every parameter and buffer, by path
        self.device = device
        self.decisions: list[Decision] = []
        self.placeholder_values: list[torch.Tensor] = []
        self._param_paths: dict[int, str] = {}
        self._inputs_given = 0
        # a node meta could not run or a decision it could not take: eager would have
        # gone on (`try: x.item()`), so the graph is not the model's whatever the model
        # did with the error
        self.failed: GuidedTraceError | None = None

    def trace(self, root: Any, concrete_args: Any = None) -> fx.Graph:
        for name, p in root.named_parameters():  # fx looks each up by a linear search
            self._param_paths.setdefault(id(p), name)
        return super().trace(root, concrete_args)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _MetaProxy(node, self)

    def to_bool(self, obj: fx.Proxy) -> bool:
        return bool(obj.decide("bool"))

    def iter(self, obj: fx.Proxy) -> Any:
        return iter(obj)

    def keys(self, obj: fx.Proxy) -> Any:
        return obj.decide("keys").keys()

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        path = self._param_paths.get(id(attr_val)) if isinstance(attr_val, nn.Parameter) else None
        if path is None:
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if path not in parameter_proxy_cache:
            parameter_proxy_cache[path] = self.create_proxy("get_attr", path, (), {})
        return parameter_proxy_cache[path]

    def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any):  # noqa: ANN201
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **kw)
        if kind == "placeholder":  # created in signature order: the input tensors' order
            value: Any = self.placeholder_values[self._inputs_given]
            self._inputs_given += 1
        else:
            try:
                value = self._run(kind, target, args, kwargs)
            except GuidedTraceError:
                raise
            except Exception as exc:
                error = GuidedTraceError(
                    f"`{proxy.node.name}` does not run on meta tensors: "
                    f"{type(exc).__name__}: {str(exc).strip()[:300]}"
                )
                self.failed = self.failed or error  # even if the model catches it
                raise error from exc
        proxy.node.meta[_VALUE] = value
        return proxy

    def _run(self, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
        a, k = self._values(args), self._values(kwargs)
        a, k = on_meta_device(target if kind == "call_method" else None, a, k, self.device)
        if kind == "get_attr":
            known = self.state.get(target)
            return known if known is not None else _to_meta(_attr(self.root, target))
        if kind == "call_function":
            return target(*a, **k)
        if kind == "call_method":
            return getattr(a[0], target)(*a[1:], **k)
        if kind == "call_module":  # a leaf: its own forward, with meta parameters
            module = self.root.get_submodule(target)
            own = {n: self.state[f"{target}.{n}"] for n in unique_tensor_names(module)}
            with _maybe_revert_all_patches():  # fx patches Module.__call__ while tracing
                return torch.func.functional_call(
                    module, own, a, k, strict=False, tie_weights=False
                )
        raise GuidedTraceError(f"unexpected node kind {kind}")

    def _values(self, obj: Any) -> Any:
        def value(x: Any) -> Any:
            if isinstance(x, slice):  # a pytree leaf, but `x[:, :n]` holds proxies in one
                return slice(value(x.start), value(x.stop), value(x.step))
            if isinstance(x, fx.Proxy):
                v = x.node.meta.get(_VALUE, _MISSING)
                if v is _MISSING:
                    raise GuidedTraceError(f"`{x.node.name}` has no value")
                return v
            return _to_meta(x)

        return tree_map(value, obj)


def _to_meta(x: Any) -> Any:
    """Tensors made during the trace (constants) are used as meta tensors like them."""
    return meta_like(x) if isinstance(x, torch.Tensor) and x.device.type != "meta" else x


def _attr(root: nn.Module, path: str) -> Any:
    owner, _, name = path.rpartition(".")
    return getattr(root.get_submodule(owner) if owner else root, name)


def meta_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Meta copies of the model's parameters and buffers by path under the flat root
    (tied ones stay one tensor): made once for all traces of the model."""
    copies: dict[int, torch.Tensor] = {}
    out = {}
    named = [*model.named_parameters(remove_duplicate=False)]
    named += [*model.named_buffers(remove_duplicate=False)]
    for name, t in named:
        if id(t) not in copies:
            copies[id(t)] = meta_like(t)
        out[f"{_WRAPPED}.{name}"] = copies[id(t)]
    return out


def _flat_root(model: nn.Module, args: tuple, kwargs: dict) -> tuple[nn.Module, list]:
    """export's flat wrapper (input tensors positionally, the rest constants, the output's
    tensors returned), with a signature fx can read: one parameter per tensor, named after
    the inputs."""
    tensors = flat_tensors(args, kwargs)
    leaves, _ = tree_flatten((args, kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    params = "".join(f"{n}, " for n in _input_names(model, args, kwargs, positions))
    namespace: dict[str, Any] = {}
    source = f"def forward(self, {params}):\n    return self._proxies(({params}))"
    exec(source, namespace)  # noqa: S102 - names made identifiers by _input_names

    def proxies(self: Flat, tensors: tuple) -> tuple:
        return tuple(_proxy_leaves(self.call_model(tensors)))

    cls = type("FlatInputs", (Flat,), {"forward": namespace["forward"], "_proxies": proxies})
    return cls(model, args, kwargs), tensors


def _input_names(model: nn.Module, args: tuple, kwargs: dict, positions: list[int]) -> list[str]:
    """Identifiers for the flattened input tensors: `x`, `input_ids`, `batch_image`."""
    try:
        sig = inspect.signature(model.forward).parameters.values()
        params = [p.name for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    paths, _ = tree_flatten_with_path((args, kwargs))
    names: list[str] = []
    for pos in positions:
        keys = [getattr(k, "key", getattr(k, "idx", k)) for k in paths[pos][0]]
        side, first, rest = keys[0], keys[1], keys[2:]  # side 0: args, 1: kwargs
        if side == 0:
            first = params[first] if first < len(params) else f"arg{first}"
        name = re.sub(r"\W", "_", "_".join(str(k) for k in (first, *rest)))
        while not _usable(name, names):  # made from the user's keys: keep it a plain name
            name = f"input{pos}" if _usable(f"input{pos}", names) else f"_{name}"
        names.append(name)
    return names


def _usable(name: str, taken: list[str]) -> bool:
    return (
        name.isidentifier() and not keyword.iskeyword(name) and name != "self"
        and name not in taken
    )  # fmt: skip


def _proxy_leaves(obj: Any) -> list[Any]:
    """The tensors of an output (proxies with a tensor value), as tensor_leaves finds
    them: through tuples, dicts and plain objects such as Hugging Face caches."""
    leaves = tensor_leaves(obj, also=_MetaProxy)
    return [
        t for t in leaves if not isinstance(t, _MetaProxy) or isinstance(t.value(), torch.Tensor)
    ]


def _rebase(tracer: _GuidedTracer, graph: fx.Graph, model: nn.Module) -> fx.GraphModule:
    """The traced graph with the model as its root: targets and module stacks lose the
    flat root's `model.` prefix, as if fx had traced the model itself."""
    prefix = _WRAPPED + "."
    attrs: dict[str, Any] = {}
    for node in graph.nodes:
        node.meta.pop(_VALUE, None)  # meta values are the trace's, not the graph's
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                k.removeprefix(prefix): (path.removeprefix(prefix), t)
                for k, (path, t) in stack.items()
                if path != _WRAPPED
            }
        if node.op in ("get_attr", "call_module"):
            root = tracer.root
            obj = root.get_submodule(node.target) if node.op == "call_module" else None
            obj = obj if obj is not None else _attr(root, node.target)
            node.target = node.target.removeprefix(prefix)
            attrs[node.target] = obj
            if hasattr(node, "_rename"):  # `transformer_wte`, as fx names the model's own
                node._rename(node.name.removeprefix(_WRAPPED + "_"))
    gm = fx.GraphModule(attrs, graph, type(model).__name__)
    gm.meta[FLAT_INPUTS] = True
    return gm


def trace_guided(
    model: nn.Module, args: tuple, kwargs: dict, *, stack_traces: bool = False,
    state: dict[str, torch.Tensor] | None = None,
) -> GuidedCapture:  # fmt: skip
    """Trace `model(*args, **kwargs)` (real, fake or meta inputs); raises
    GuidedTraceError (or fx's error) where the trace needs more than meta values."""
    root, tensors = _flat_root(model, args, kwargs)
    device = single_device(model, tensors)
    if device is None:
        raise GuidedTraceError("the model's tensors are on several devices")
    state = state if state is not None else meta_state(model)
    values = [meta_like(t) for t in tensors]

    def make_tracer(leaves: set[str]) -> _GuidedTracer:
        tracer = _GuidedTracer(leaves, state, device, stack_traces)
        tracer.placeholder_values = values
        return tracer

    graph, tracer, leaves, first = trace_with_leaves(
        make_tracer, root, None, roots=frozenset({_WRAPPED}),
        retry=lambda exc: not isinstance(exc, GuidedTraceError),  # meta fails in a leaf too
    )  # fmt: skip
    if tracer.failed is not None:
        raise tracer.failed
    gm = _rebase(tracer, graph, model)
    leaves = sorted(p.removeprefix(_WRAPPED + ".") for p in leaves)
    return GuidedCapture(gm, leaves, tracer.decisions, first)
