"""`--fit BUDGET`: the cheapest set of changes that brings the training-step peak under a
budget, verified by running it.

- `candidate`: one plan (autocast, bf16 parameters, optimizer, micro-batch, checkpointed
  blocks, GPUs) and its cost: GPUs first, then numerical risk, then extra compute.
- `knapsack`: which blocks to checkpoint: the fewest recompute FLOPs that free enough.
- `selective`: per-op checkpointing of a block: matmul outputs kept, the rest recomputed.
- `pieces`: what the memory pass measured, which the prediction composes.
- `predict`: a candidate's training-step peak from those pieces, without a run.
- `verify`: the candidate run on fake tensors: the real model with its blocks under
  `torch.utils.checkpoint`, the autocast, the optimizer, the micro-batch and accumulation.
- `trials`: each run recorded as a try; candidates run cheapest first until one fits.
- `search`: candidates in cost order, the cheapest predicted to fit verified first.
- `sharded`: FSDP when no one-GPU plan fits: the fewest GPUs, then the cheapest plan on
  them (fewer blocks checkpointed, larger micro-batches per rank, autocast off).
- `changes`: a plan as a short list of changes with their code.
"""
