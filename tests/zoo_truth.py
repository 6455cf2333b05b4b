"""The zoo's independent truth, measured on a real model with torch's own tools only.

- params: unique parameters (a tied parameter once), counted from `model.parameters()`.
- forward FLOPs: `torch.utils.flop_counter.FlopCounterMode` on a real forward. Its one
  gap we know of here: CPU `scaled_dot_product_attention` dispatches to
  `_scaled_dot_product_flash_attention_for_cpu`, which has no formula (counts 0); that
  op is added with torch's own `sdpa_flop_count`; and the CPU RNN kernels (nn.LSTM,
  nn.GRU, nn.RNN) may count 0 (the fused LSTM does; GRU decomposes into counted
  matmuls): for an RNN call that counted nothing, its gate matmuls are added by the formula
  2 * B * T * gates * H * (input + H) per layer and direction. `flops_raw` keeps the
  plain count.
- saved-activation bytes: `torch.autograd.graph.saved_tensors_hooks` on a real forward
  and loss; each storage a saved tensor lives in, once, excluding parameters and buffers
  (alive anyway). Non-reentrant `torch.utils.checkpoint` installs hooks of its own
  inside, so what it saves is not seen here: its rows are documented, not compared.
- training-step peak: allocator events of `torch.profiler` (profile_memory) over one
  step of a model built inside the profile (weights, inputs and AdamW state allocated there),
  the running sum of `[memory]` events: the allocator's view, kernel scratch included.
- modules that run: forward hooks on every module during a real forward, keeping the
  ones whose output holds a tensor.

None of this imports `inspector`.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

__all__ = ["Truth", "measure_truth", "truth_loss", "SDPA_CPU"]

SDPA_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass
class Truth:
    params: int
    flops: int  # FlopCounterMode with CPU SDPA added
    flops_raw: int  # FlopCounterMode as torch ships it
    saved_bytes: int
    train_peak_bytes: int
    ran: list[str] = field(default_factory=list)  # module paths whose forward returned a tensor


def _sdpa_cpu_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query, key, value)


def _leaves(output: Any) -> list[Any]:
    if hasattr(output, "to_tuple"):  # transformers' ModelOutput
        output = output.to_tuple()
    return tree_leaves(output)


def truth_loss(output: Any, inputs: Any = None) -> torch.Tensor:
    """The project's documented default loss (README): the sum of the `.mean()` of every
    floating output tensor that requires grad."""
    terms = [
        t.mean()
        for t in _leaves(output)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    return torch.stack(terms).sum()


class _Inputs:
    """What a user's loss_fn(output, inputs) reads: .args, .kwargs, .dims."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.args, self.kwargs, self.dims = args, kwargs, {}


def _loss(loss_fn: Any, output: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    return (loss_fn or truth_loss)(output, _Inputs(args, kwargs))


def count_params(model: nn.Module) -> int:
    unique = {id(p): p for p in model.parameters()}  # tied parameters once
    return sum(p.numel() for p in unique.values())


_GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}


def _rnn_flops(module: nn.Module, x: torch.Tensor) -> int:
    """Gate matmuls of a (batch_first or not) RNN over a padded input (B, T, F)."""
    steps = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
    hidden, dirs = module.hidden_size, 2 if module.bidirectional else 1
    total, width = 0, module.input_size
    for _ in range(module.num_layers):
        total += dirs * 2 * steps * _GATES[type(module)] * hidden * (width + hidden)
        width = hidden * dirs
    return total


def _rnn_counter(model: nn.Module, counter: FlopCounterMode) -> tuple[list[int], list[Any]]:
    """Formula FLOPs for each RNN call the counter saw none of (the fused CPU LSTM
    kernel counts 0; GRU decomposes into counted matmuls and is left alone)."""
    added: list[int] = []
    seen: dict[int, int] = {}

    def pre(mod: nn.Module, inp: Any) -> None:
        seen[id(mod)] = counter.get_total_flops()

    def post(mod: nn.Module, inp: Any, out: Any) -> None:
        if counter.get_total_flops() == seen[id(mod)]:
            added.append(_rnn_flops(mod, inp[0]))

    rnns = [m for m in model.modules() if type(m) in _GATES]
    handles = [m.register_forward_pre_hook(pre) for m in rnns]
    handles += [m.register_forward_hook(post) for m in rnns]
    return added, handles


def count_flops(model: nn.Module, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(FLOPs with CPU SDPA and fused RNNs added, FLOPs as FlopCounterMode counts them).
    With grad on: under no_grad its module tracker asserts on CaiT's class-token views."""
    with FlopCounterMode(display=False) as raw:
        model(*args, **kwargs)
    full = FlopCounterMode(display=False, custom_mapping={SDPA_CPU: _sdpa_cpu_flops})
    rnn, handles = _rnn_counter(model, full)
    with full:
        model(*args, **kwargs)
    for h in handles:
        h.remove()
    return full.get_total_flops() + sum(rnn), raw.get_total_flops()


def saved_bytes(model: nn.Module, args: tuple, kwargs: dict, loss_fn: Any) -> int:
    static = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in static and s.nbytes():
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _loss(loss_fn, model(*args, **kwargs), args, kwargs)
    del loss
    return sum(storages.values())


def modules_that_run(model: nn.Module, args: tuple, kwargs: dict) -> list[str]:
    ran: list[str] = []

    def hook(path: str) -> Any:
        def record(module: nn.Module, inp: Any, out: Any) -> None:
            if path not in ran and any(isinstance(t, torch.Tensor) for t in _leaves(out)):
                ran.append(path)

        return record

    handles = [m.register_forward_hook(hook(p)) for p, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return ran


def _clone(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value
    )


def train_peak(build: Any, make_inputs: Any, loss_fn: Any, seed: int = 0) -> int:
    """Peak live bytes of one AdamW step (after the state exists), allocator events. The
    model is built again inside the profile (a deepcopy fails on RAFT's tensor attributes)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(seed)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        shadow = build().train()
        gc.collect()  # garbage of the constructor (reference cycles) is not the step's
        args, kwargs = _clone(make_inputs())
        params = [p for p in shadow.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        for p in params:  # the state, as the first step makes it
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with record_function("zoo.step"):
            _loss(loss_fn, shadow(*args, **kwargs), args, kwargs).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return _peak_in(prof, "zoo.step")


def _peak_in(prof: Any, window: str) -> int:
    """Max running sum of the allocator's `[memory]` events (+alloc, -free) inside the
    `window` annotation; the flat kineto event list (measure.py walks the event tree)."""
    events = prof.profiler.kineto_results.events()
    span = next(e for e in events if e.name() == window)
    allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for t, size in allocs:
        live += size
        if t <= span.end_ns():
            peak = max(peak, live) if t >= span.start_ns() else live
    return peak


def measure_truth(
    build: Any, make_inputs: Any, loss_fn: Any = None, seed: int = 0, draws: int = 1
) -> Truth:
    """`draws` > 1 for a model whose step depends on its random draws (wav2vec2's
    layerdrop skips whole layers): FLOPs, saved bytes and the peak are the largest over
    seeds `seed` .. `seed + draws - 1`, the step a budget must hold."""
    torch.manual_seed(seed)
    model = build()
    args, kwargs = make_inputs()
    flops, raw = count_flops(model, args, kwargs)
    for s in range(seed + 1, seed + draws):  # layerdrop: the forward with every layer
        torch.manual_seed(s)
        flops, raw = max((flops, raw), count_flops(model, args, kwargs))
    saved = []
    for s in range(seed, seed + draws):
        if draws > 1:
            torch.manual_seed(s)
        saved.append(saved_bytes(model, *_clone((args, kwargs)), loss_fn))
    return Truth(
        params=count_params(model),
        flops=flops,
        flops_raw=raw,
        saved_bytes=max(saved),
        train_peak_bytes=max(
            train_peak(build, make_inputs, loss_fn, s) for s in range(seed, seed + draws)
        ),
        ran=modules_that_run(model, args, kwargs),
    )
