"""The tensor-parallel plan of a model, derived from its structure, as torch's
`parallelize_module` takes it (`{module path: ParallelStyle}`).

Inside each repeated block (the blocks FSDP wraps), as torchtitan's Llama plan does:
- attention: q/k/v projections `ColwiseParallel` (each rank computes its heads), the
  output projection `RowwiseParallel` (partial sums all-reduced, or reduce-scattered
  onto the sequence under sequence parallel);
- MLP: up/gate `ColwiseParallel`, down `RowwiseParallel`;
- a plain stack of `nn.Linear`s: consecutive pairs, the first column-, the second
  row-parallel, so the activation between them stays sharded with no collective.
Outside the blocks (HF causal LMs): the token embedding `RowwiseParallel` (vocab rows
sharded, output all-reduced or reduce-scattered), the LM head `ColwiseParallel` with the
logits gathered (torchtitan without loss parallel). With `sp` the norms run
`SequenceParallel` (sharded on the sequence dim, dim 1) and the attention and MLP
inputs are gathered from it (`PrepareModuleInput`).

Nothing is sharded that would change what the model computes: heads must divide among
the ranks, or the plan is refused with `NoTensorParallelPlan` naming what failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from inspector.distributed.fsdp import shard_units

__all__ = ["TensorParallelPlan", "NoTensorParallelPlan", "tensor_parallel_plan"]

_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # HF Llama/Mistral/Qwen
_ROWWISE = ("o_proj", "down_proj")
_ATTENTION = ("self_attn", "attention", "attn")
_MLP = ("mlp", "feed_forward")
_NORMS = ("input_layernorm", "post_attention_layernorm")


class NoTensorParallelPlan(ValueError):
    """No tensor-parallel plan applies to this model at this degree; the message says why."""


@dataclass
class TensorParallelPlan:
    styles: dict[str, Any]  # {module path: ParallelStyle}, for parallelize_module
    sharded: list[str]  # the Linear/Embedding paths split across the ranks
    replicated: list[str] = field(default_factory=list)  # parameters left whole, and why


def tensor_parallel_plan(model: nn.Module, tp: int, sp: bool = False) -> TensorParallelPlan:
    """The plan for `tp` ranks; NoTensorParallelPlan when nothing in the blocks shards."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles: dict[str, Any] = {}
    problems: list[str] = []
    paths = shard_units(model) or [""]
    for path in paths:
        block = model.get_submodule(path)
        named = _named_projections(block)
        pairs = named or _linear_pairs(block)
        problems += [p for p in _head_problems(model, block, tp) if p not in problems]
        for rel, kind in pairs.items():
            styles[_join(path, rel)] = ColwiseParallel() if kind == "col" else RowwiseParallel()
        if named and sp:
            styles.update(_sequence_parallel_block(block, path))
    if problems:  # the blocks repeat: each problem once, for every block
        raise NoTensorParallelPlan(
            f"no tensor-parallel plan for tp:{tp}: in the repeated blocks ({paths[0]}, ...) "
            + "; ".join(problems)
            + "; each rank must compute whole heads: choose a TP degree dividing them"
        )
    if not styles:
        units = shard_units(model)
        shown = ", ".join(units[:3]) + (f" ... ({len(units)} blocks)" if len(units) > 3 else "")
        raise NoTensorParallelPlan(
            f"no tensor-parallel plan for tp:{tp}: the repeated blocks hold no nn.Linear "
            "q/k/v/o or up/gate/down projections and no pairs of nn.Linear to split "
            f"(blocks: {shown or 'none found'})" + _conv1d_note(model, paths)
        )
    outer = _outer_styles(model, sp, tp)
    if sp and not {"model.embed_tokens", "lm_head"} <= set(outer):
        raise NoTensorParallelPlan(
            f"no sequence-parallel plan for tp:{tp}: it needs an HF causal LM whose token "
            "embedding (model.embed_tokens) and untied head (lm_head) split their vocab "
            f"{tp} ways, so the sequence can stay sharded between them; use tp:{tp} alone"
        )
    sharded = list(styles)
    styles.update(outer)
    plan = TensorParallelPlan(styles, sharded + list(outer))
    plan.sharded = [p for p in plan.sharded if isinstance(model.get_submodule(p), _SPLIT)]
    plan.replicated = _left_whole(model, plan.sharded)
    return plan


_SPLIT = (nn.Linear, nn.Embedding)


def _conv1d_note(model: nn.Module, paths: list[str]) -> str:
    """GPT-2-style blocks project with transformers' Conv1D (a Linear with its weight
    transposed), which torch's ColwiseParallel/RowwiseParallel do not take."""
    block = model.get_submodule(paths[0]) if paths and paths[0] else model
    if not any(type(m).__name__ == "Conv1D" for m in block.modules()):
        return ""
    return (
        "; its projections are transformers' Conv1D, which torch's parallelize_module does "
        "not split (it takes nn.Linear and nn.Embedding): FSDP and DDP plans still apply"
    )


def _join(path: str, rel: str) -> str:
    return f"{path}.{rel}" if path and rel else path or rel


def _named_projections(block: nn.Module) -> dict[str, str]:
    """{relative path: "col"/"row"} of the HF-named nn.Linear projections in a block."""
    out: dict[str, str] = {}
    for rel, m in block.named_modules():
        leaf = rel.rsplit(".", 1)[-1]
        if isinstance(m, nn.Linear) and leaf in _COLWISE + _ROWWISE:
            out[rel] = "col" if leaf in _COLWISE else "row"
    return out


def _linear_pairs(block: nn.Module) -> dict[str, str]:
    """A plain stack: Linear i column-, Linear i+1 row-parallel when they chain."""
    linears = [(rel, m) for rel, m in block.named_modules() if isinstance(m, nn.Linear)]
    out: dict[str, str] = {}
    i = 0
    while i + 1 < len(linears):
        (a, first), (b, second) = linears[i], linears[i + 1]
        if first.out_features == second.in_features:
            out[a], out[b] = "col", "row"
            i += 2
        else:
            i += 1
    return out


def _head_problems(model: nn.Module, block: nn.Module, tp: int) -> list[str]:
    """Attention heads (and key/value heads under GQA) must divide among the ranks: each
    rank computes whole heads (`view(..., -1, head_dim)` in the attention's code)."""
    config = getattr(model, "config", None)
    out: list[str] = []
    for rel, m in block.named_children():
        if rel not in _ATTENTION:
            continue
        for name in ("num_attention_heads", "num_key_value_heads"):
            heads = getattr(config, name, None) or getattr(m, name, None)
            if heads and heads % tp:
                what = name.removeprefix("num_").replace("_", " ")
                out.append(f"{rel}: {heads} {what} do not split over {tp} ranks")
    return out


def _sequence_parallel_block(block: nn.Module, path: str) -> dict[str, Any]:
    """Norms sharded on the sequence; attention and MLP gather their input from it, their
    output projections reduce-scatter back onto it (the block's residual stays sharded)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    styles: dict[str, Any] = {}
    for rel, m in block.named_children():
        if rel in _NORMS:
            styles[_join(path, rel)] = SequenceParallel()
        elif rel in _ATTENTION:  # HF calls the attention with keywords
            styles[_join(path, rel)] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            )
        elif rel in _MLP and not _rowwise_inside(m):
            # an MLP TP does not split (fused MoE experts): it runs whole on the gathered
            # sequence, and its output is cut back to this rank's part (no collective)
            styles[_join(path, rel)] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                use_local_input=True, output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
            )  # fmt: skip
        elif rel in _MLP:  # ... and the MLP with one positional input
            styles[_join(path, rel)] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
        for sub in _rowwise_inside(m) if rel in _ATTENTION + _MLP else []:
            styles[_join(path, _join(rel, sub))] = RowwiseParallel(
                output_layouts=Shard(1), use_local_output=False
            )
    return styles


def _rowwise_inside(m: nn.Module) -> list[str]:
    return [
        sub
        for sub, child in m.named_modules()
        if sub.rsplit(".", 1)[-1] in _ROWWISE and isinstance(child, nn.Linear)
    ]


def _outer_styles(model: nn.Module, sp: bool, tp: int) -> dict[str, Any]:
    """torchtitan's plan for the token embedding, the final norm and the LM head, on
    the HF names (`model.embed_tokens`, `model.norm`, `lm_head`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    names = dict(model.named_modules())
    styles: dict[str, Any] = {}
    embed, head = names.get("model.embed_tokens"), names.get("lm_head")
    if embed is not None and head is not None and head.weight is embed.weight:
        return styles  # tied: one weight cannot be split on rows and columns at once
    if isinstance(embed, nn.Embedding) and embed.num_embeddings % tp == 0:
        # under sp the embedding's output stays a DTensor: HF derives the positions and
        # the causal mask from its shape, which must be the whole sequence's
        out = Shard(1) if sp else Replicate()
        styles["model.embed_tokens"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=out, use_local_output=not sp
        )
    if isinstance(head, nn.Linear) and head.out_features % tp == 0:
        before = Shard(1) if sp and "model.embed_tokens" in styles else Replicate()
        styles["lm_head"] = ColwiseParallel(input_layouts=before, output_layouts=Replicate())
        if sp and "model.norm" in names and before == Shard(1):
            styles["model.norm"] = SequenceParallel()
    return styles


def _left_whole(model: nn.Module, sharded: list[str]) -> list[str]:
    """Modules whose parameters no style splits (norms, routers, fused experts), once
    for all the blocks: `model.layers.*.input_layernorm`."""
    inside = tuple(p + "." for p in sharded)
    whole = {
        re.sub(r"\.\d+\.", ".*.", name.rsplit(".", 1)[0] or name)
        for name, _ in model.named_parameters()
        if not name.startswith(inside)
    }
    return sorted(whole)
