"""Per-rank training memory, predicted from one process vs measured under torchrun (CPU,
gloo), for DDP, ZeRO-1, ZeRO-2, FSDP2, tensor parallel and FSDP x TP; torch's FSDPMemTracker on the
same model for comparison (FSDP).

    .venv/bin/python bench/distributed.py                      # mlp, ddp + fsdp, 2 ranks, 3 runs
    .venv/bin/python bench/distributed.py --nproc 4 --runs 5
    .venv/bin/python bench/distributed.py --plans zero1 fsdp,reshard=false --json out.json
    .venv/bin/python bench/distributed.py --model llama --plans tp tp,sp --runs 2
    .venv/bin/python bench/distributed.py --model gpt2 --plans ddp fsdp --runs 2
    .venv/bin/python bench/distributed.py --nproc 4 --plans fsdp:2+tp:2 --runs 2

Each run is a fresh `torchrun --standalone` of this file in `--worker` mode: every rank
builds the model, wraps it (DDP, `fully_shard` per block + root, `parallelize_module` with
the derived TP plan, or both on a 2-D mesh), and runs STEPS
training steps (forward, loss, backward, AdamW step, zero_grad(set_to_none=True)); the
steps after the first two (optimizer state allocated, DDP buckets rebuilt) are steady
state. Each rank's peak of each steady step, by two instruments:
- allocator: torch.profiler's CPU allocator events from before the model is built, by
  pointer. Frees on threads the profiler does not follow (gloo's workers drop finished
  collectives' tensors) never show: an upper bound (a pointer allocated again retires its
  stale block).
- tensors: every storage the step's ops create (a TorchDispatchMode on the main thread),
  freed when its weak reference dies, on whichever thread; FSDP2's storage resizes. Blind
  to allocations that are no aten op on the main thread (DDP's C++ buckets): the truth
  for FSDP and TP.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = 6  # per run; steps 0 and 1 warm up
WARM = 2
BATCH = 64


def make_mlp() -> nn.Module:
    """The issue's 4-block MLP: 256 -> 1024 -> 256 per block."""
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)) for _ in range(4)]
    )


def mlp_input() -> torch.Tensor:
    return torch.randn(BATCH, 256)


def loss_of(out: Any) -> torch.Tensor:
    return out.loss if hasattr(out, "loss") else out.sum()


LLAMA = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096,
         "tie_word_embeddings": False}  # fmt: skip
GPT2 = {"n_layer": 4, "n_embd": 256, "n_head": 8, "vocab_size": 4096, "n_positions": 256,
        "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
LM_BATCH, LM_SEQ = 4, 128  # both language models
MODELS = ("mlp", "llama", "gpt2")


def make_model(name: str) -> nn.Module:
    """`mlp` (the issue's), `llama` or `gpt2`: small language models built from LLAMA and
    GPT2 in code (transformers' default init), never fetched from a hub."""
    if name == "mlp":
        return make_mlp()
    import inspector.compat  # noqa: F401 - transformers imports beside this torchvision

    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**GPT2))
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**LLAMA))


def model_inputs(name: str) -> tuple[tuple, dict]:
    """(args, kwargs) of one rank's batch; the language models take HF's own loss."""
    if name == "mlp":
        return (mlp_input(),), {}
    vocab = (GPT2 if name == "gpt2" else LLAMA)["vocab_size"]
    ids = torch.randint(0, vocab, (LM_BATCH, LM_SEQ))
    return (), {"input_ids": ids, "labels": ids}


# -- the worker: one rank under torchrun ------------------------------------------------


def _wrap(model: nn.Module, spec: Any) -> nn.Module:
    import torch.distributed as dist

    if spec.strategy == "zero2":  # no wrapper: its optimizer reduces the gradients
        return model
    if spec.strategy in ("ddp", "zero1"):
        cap = int(spec.options.get("bucket_mb", 25))
        # init_sync=False: every rank built the same weights (same seed); rank 0's
        # broadcast buffer would be freed on gloo's thread, unseen by the allocator meter
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap, init_sync=False)
    from torch.distributed.device_mesh import init_device_mesh

    from inspector.distributed.fsdp import shard_model

    if spec.strategy in ("tp", "fsdp+tp"):
        return _tensor_parallel(model, spec)
    paths = shard_model(model, init_device_mesh("cpu", (dist.get_world_size(),)), spec)
    if spec.options.get("checkpoint"):
        from inspector.memory.checkpointing import checkpointed

        checkpointed(model, paths).__enter__()  # for the process's life: never undone
    return model


def _tensor_parallel(model: nn.Module, spec: Any) -> nn.Module:
    """torch's parallelize_module with the plan the inspector derives, then (2-D)
    fully_shard on the mesh's dp dim, as torchtitan does."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from inspector.distributed.fsdp import shard_model, shard_units
    from inspector.distributed.tpplan import tensor_parallel_plan

    mesh = init_device_mesh("cpu", (spec.dp_size, spec.tp_size), mesh_dim_names=("dp", "tp"))
    plan = tensor_parallel_plan(model, spec.tp_size, bool(spec.options.get("sp")))
    parallelize_module(model, mesh["tp"], plan.styles)
    paths = shard_units(model)
    if spec.strategy == "fsdp+tp":
        paths = shard_model(model, mesh["dp"], spec)
    if spec.options.get("checkpoint"):
        from inspector.memory.checkpointing import checkpointed

        checkpointed(model, paths).__enter__()  # for the process's life: never undone
    return model


def _optimizer(model: nn.Module, spec: Any) -> Any:
    if spec.strategy == "zero2":
        from inspector.distributed.zero2 import Zero2

        return Zero2(list(model.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    if spec.strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=1e-3
        )
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: tuple[tuple, dict]) -> None:
    loss = loss_of(model(*x[0], **x[1]))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _tensor_peak(model: nn.Module, optimizer: Any, x: tuple[tuple, dict]) -> int:
    from inspector.distributed.shardtracker import ShardTracker, local, storage_resizes

    tracker = ShardTracker()
    tracker.add_all([local(t) for t in [*model.parameters(), *model.buffers()]], "static")
    for state in optimizer.state.values():
        tracker.add_all([local(v) for v in state.values()], "static")
    tracker.add_all(x, "input")
    with tracker, storage_resizes(tracker):
        _step(model, optimizer, x)
    return tracker.peak


def worker(plan: str, out: str, model_name: str = "mlp") -> None:
    import torch.distributed as dist
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    from inspector.schema.parallel import parse_plan

    spec = parse_plan(plan)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tensors: list[int] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = _wrap(make_model(model_name), spec)
        optimizer = _optimizer(model, spec)
        x = model_inputs(model_name)
        for i in range(STEPS):
            with record_function(f"bench.step{i}"):
                if i < WARM or spec.strategy in ("ddp", "zero1"):
                    _step(model, optimizer, x)
                else:
                    tensors.append(_tensor_peak(model, optimizer, x))
    allocs, ranges = [], {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == _EventType.Allocation:
            allocs.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
        elif e.name.startswith("bench.step"):
            ranges[int(e.name[10:])] = (e.start_time_ns, e.end_time_ns)
    allocator = [_allocator_peak(sorted(allocs), *ranges[i]) for i in range(WARM, STEPS)]
    result = {"rank": dist.get_rank(), "allocator": allocator, "tensors": tensors}
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _allocator_peak(allocs: list[tuple[int, int, int]], start: int, end: int) -> int:
    live, peak, blocks = 0, 0, {}
    for t, ptr, size in allocs:
        if t > end:
            break
        live -= blocks.pop(ptr, 0)  # a free, or a block whose free was never reported
        if size > 0:
            blocks[ptr] = size
            live += size
        if t >= start:
            peak = max(peak, live)
    return peak


# -- the driver -------------------------------------------------------------------------


def measure(
    plan: str, nproc: int, runs: int, timeout_s: int = 300, model: str = "mlp"
) -> list[dict[str, Any]]:
    """Per run, per rank: the steady steps' peaks by each instrument."""
    out: list[dict[str, Any]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for run in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", __file__, "--worker", plan, tmp, model,
            ]  # fmt: skip
            subprocess.run(cmd, env=env, check=True, timeout=timeout_s, capture_output=True)
            for rank in range(nproc):
                row = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
                out.append({"run": run, **row})
    return out


def predict(plan: str, model_name: str = "mlp") -> dict[str, Any]:
    """Our heaviest rank, and FSDPMemTracker's peak (FSDP), on fake tensors."""
    from inspector.context import Inputs
    from inspector.distributed.ddp import ddp_rank_memory
    from inspector.distributed.fsdp import fsdp_heaviest
    from inspector.distributed.tp import fsdp_tp_heaviest
    from inspector.distributed.zero import zero1_rank_memory
    from inspector.distributed.zero2 import zero2_rank_memory
    from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode
    from inspector.memory.step import StepOptions, train_step, unique_tensors
    from inspector.schema.parallel import parse_plan

    spec = parse_plan(plan)
    mode = new_fake_mode()
    model = make_model(model_name)
    args, kwargs = model_inputs(model_name)
    inputs = fake_inputs(Inputs(args=args, kwargs=kwargs), mode)
    opts = StepOptions(fake_mode=mode, loss_fn=lambda out, _: loss_of(out))
    start = time.perf_counter()
    if spec.strategy == "ddp":
        shadow = fake_shadow(model, mode)
        ours = ddp_rank_memory(
            train_step(shadow, inputs, opts), unique_tensors(shadow.parameters()), spec
        )
        tracker = None
    elif spec.strategy == "zero1":
        ours = zero1_rank_memory(model, inputs, opts, spec)
        tracker = None
    elif spec.strategy == "zero2":
        ours = zero2_rank_memory(model, inputs, opts, spec)
        tracker = None
    elif spec.strategy in ("tp", "fsdp+tp"):
        ours = fsdp_tp_heaviest(model, inputs, opts, spec)
        tracker = None
    else:
        ours = fsdp_heaviest(model, inputs, opts, spec)
        tracker = fsdp_mem_tracker_peak(spec, model_name)
    return {
        "ours": ours.peak_bytes,
        "ours_s": round(time.perf_counter() - start, 2),
        "fsdp_mem_tracker": tracker,
    }


def fsdp_mem_tracker_peak(spec: Any, model_name: str = "mlp") -> int:
    """torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker's peak of a steady step,
    the model built and run on fake tensors, wrapped as the real ranks wrap it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from inspector.distributed.fsdp import shard_model
    from inspector.distributed.world import fake_world

    with fake_world(spec.world_size) as mesh, FakeTensorMode():
        model = make_model(model_name)
        paths = shard_model(model, mesh, spec)
        if spec.options.get("checkpoint"):
            from inspector.memory.checkpointing import checkpointed

            checkpointed(model, paths).__enter__()  # a model of this call only
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = model_inputs(model_name)
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((*x[0], *x[1].values()))
        with tracker:
            for i in range(2):
                _step(model, optimizer, x)
                if i == 0:
                    tracker.reset_mod_stats()
        return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def compare(plan: str, nproc: int, runs: int, model: str = "mlp") -> dict[str, Any]:
    from inspector.schema.parallel import parse_plan

    spec = parse_plan(plan)
    rows = measure(spec.text, nproc, runs, model=model)
    truth = "allocator" if spec.strategy in ("ddp", "zero1") else "tensors"
    pred = predict(spec.text, model)
    largest = max(max(r[truth]) for r in rows)
    result = {
        "plan": spec.text, "model": model, "runs": runs, "truth": truth,
        "measured_max": largest,
        "per_rank": {
            str(rank): {
                inst: [min(v for r in rows if r["rank"] == rank for v in r[inst] or [0]),
                       max(v for r in rows if r["rank"] == rank for v in r[inst] or [0])]
                for inst in ("allocator", "tensors")
            }
            for rank in range(nproc)
        },
        **pred,
        "ours_error": round(pred["ours"] / largest - 1, 4),
    }  # fmt: skip
    if pred["fsdp_mem_tracker"]:
        result["fsdp_mem_tracker_error"] = round(pred["fsdp_mem_tracker"] / largest - 1, 4)
    return result


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| plan | rank: tensors min-max (MB) | rank: allocator min-max (MB) | largest measured | "
        "ours | error | FSDPMemTracker | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = "; ".join(
            f"{k}: {_mb(v['tensors'][0])}-{_mb(v['tensors'][1])}" for k, v in r["per_rank"].items()
        )
        a = "; ".join(
            f"{k}: {_mb(v['allocator'][0])}-{_mb(v['allocator'][1])}"
            for k, v in r["per_rank"].items()
        )
        fmt = r.get("fsdp_mem_tracker")
        fmt_err = f"{r['fsdp_mem_tracker_error']:+.1%}" if fmt else "-"
        lines.append(
            f"| `{r['plan']}` {r.get('model', 'mlp')} | {t} | {a} | "
            f"{_mb(r['measured_max'])} ({r['truth']}) | "
            f"{_mb(r['ours'])} | {r['ours_error']:+.1%} | {_mb(fmt)} | {fmt_err} |"
        )
    return "\n".join(lines)


def gpus_needed(preset: str, plan: str, budgets: list[int], dims: dict[str, int]) -> dict:
    """The fewest GPUs for `plan` (its data-parallel degree varied; a 2-D plan keeps its
    TP degree) on a preset, as the report's table is made (inspector.distributed.search):
    each kind of rank run at the first 3 and 4 decoder layers and scaled to all of them,
    the search on the first and last kinds, each answer checked on every kind."""
    from types import SimpleNamespace

    from inspector.distributed import search
    from inspector.loaders.presets import load_preset
    from inspector.memory.shadow import fake_inputs, new_fake_mode
    from inspector.memory.step import StepOptions
    from inspector.schema.parallel import parse_plan

    start, cpu = time.perf_counter(), time.process_time()
    mode = new_fake_mode()
    loaded = load_preset(preset, fake_mode=mode)
    with mode:
        inputs = fake_inputs(loaded.inputs.build(dims), mode)
    spec = parse_plan(plan)
    a = SimpleNamespace(on_fake=True, inputs=inputs, opts=StepOptions(fake_mode=mode))
    plan_runs = search.PlanRuns(loaded.model, a)
    counts = search.gpus_needed(plan_runs, spec, budgets)
    runs = sorted({parse_plan(text).world_size for text, _ in plan_runs.ranks})
    return {
        "preset": preset, "plan": spec.family, "dims": dims, "runs": runs,
        "rank_runs": len(plan_runs.ranks),
        "gpus": {c.budget_bytes: (c.gpus, c.per_rank_peak_bytes) for c in counts},
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", nargs=3, metavar=("PLAN", "DIR", "MODEL"))
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--plans", nargs="+", default=["ddp", "fsdp"], metavar="PLAN")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--gpus", nargs=2, metavar=("PRESET", "PLAN"), help="fewest GPUs on a preset")
    p.add_argument("--budget", action="append", default=[], help="with --gpus (default 80GiB)")
    args = p.parse_args()
    if args.gpus:
        from inspector.units import parse_size

        budgets = [parse_size(b) for b in args.budget or ["80GiB"]]
        print(json.dumps(gpus_needed(*args.gpus, budgets, {"B": 1, "S": 4096}), indent=1))
        return
    if args.worker:
        plan, out, model = args.worker
        worker(plan, str(Path(out) / f"rank{os.environ['RANK']}.json"), model)
        return
    results = []
    for text in args.plans:  # "fsdp,reshard=false": the plan without its world size
        if ":" in text:  # a whole plan, e.g. fsdp:2+tp:2 (its world size is nproc's)
            results.append(compare(text, args.nproc, args.runs, args.model))
            continue
        name, _, rest = text.partition(",")
        plan = f"{name}:{args.nproc}" + (f",{rest}" if rest else "")
        results.append(compare(plan, args.nproc, args.runs, args.model))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
