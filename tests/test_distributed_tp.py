"""Tensor parallelism (inspector.distributed.tp): torch's `parallelize_module` run on fake
tensors with a plan derived from the model. The MLP is tests/test_distributed.py's: 4
blocks of Linear(256, 1024) + ReLU + Linear(1024, 256), batch 64, float32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inspector.compat  # noqa: F401 - transformers imports beside this torchvision
from inspector.context import Inputs
from inspector.distributed.tp import fsdp_tp_heaviest, tp_rank_memory
from inspector.distributed.tpplan import NoTensorParallelPlan, tensor_parallel_plan
from inspector.memory.shadow import fake_inputs, new_fake_mode
from inspector.memory.step import StepOptions
from inspector.schema.parallel import parse_plan
from tests.test_distributed import mlp


@pytest.fixture(scope="module")
def fake() -> tuple[nn.Module, Inputs, StepOptions]:
    mode = new_fake_mode()
    inputs = fake_inputs(Inputs(args=(torch.randn(64, 256),)), mode)
    return mlp(), inputs, StepOptions(fake_mode=mode, loss_fn=lambda out, _: out.sum())


def small_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512)  # fmt: skip
    return LlamaForCausalLM(config)


def test_mlp_plan_pairs_the_linears() -> None:
    styles = tensor_parallel_plan(mlp(), 2).styles
    assert {k: type(v).__name__ for k, v in styles.items() if k.startswith("0.")} == {
        "0.0": "ColwiseParallel",
        "0.2": "RowwiseParallel",
    }
    assert len(styles) == 8


def test_tp_shards_by_hand(fake) -> None:
    model, inputs, opts = fake
    m = tp_rank_memory(model, inputs, opts, parse_plan("tp:2"))
    # per block: column half of Linear(256, 1024) (512 x 256 + 512) and row half of
    # Linear(1024, 256) (256 x 512) + its bias, whole: 262,912 params, x 4 blocks x 4 B
    assert m.param_bytes == m.grad_bytes == 262_912 * 4 * 4  # 4,206,592
    assert m.optimizer_bytes == 2 * 262_912 * 4 * 4 + 16 * 4  # exp_avg, exp_avg_sq, steps
    # saved per block: its input [64, 256] (every rank has it whole) and the ReLU's
    # output [64, 512] (this rank's half): (16,384 + 32,768) x 4 B x 4 blocks
    assert m.saved_activation_bytes == (64 * 256 + 64 * 512) * 4 * 4  # 786,432
    # the row-parallel output's all-reduce: [64, 256] float32
    assert m.comm_bytes == 64 * 256 * 4
    four = tp_rank_memory(model, inputs, opts, parse_plan("tp:4"))
    assert four.param_bytes == (256 * 256 + 256 + 256 * 256 + 256) * 4 * 4  # 2,105,344
    assert four.peak_bytes < m.peak_bytes


def test_fsdp_across_tp_groups_shards_the_tp_shards(fake) -> None:
    model, inputs, opts = fake
    tp = tp_rank_memory(model, inputs, opts, parse_plan("tp:2"))
    two_d = fsdp_tp_heaviest(model, inputs, opts, parse_plan("fsdp:2+tp:2"))
    assert two_d.world_size == 4
    assert two_d.param_bytes == tp.param_bytes // 2  # FSDP halves each TP-local shard
    assert two_d.optimizer_bytes == tp.optimizer_bytes // 2 + 16 * 4 // 2


def test_llama_sequence_parallel_and_refusals() -> None:
    mode = new_fake_mode()
    ids = torch.randint(0, 512, (2, 64))
    inputs = fake_inputs(Inputs(kwargs={"input_ids": ids, "labels": ids}), mode)
    opts, llama = StepOptions(fake_mode=mode), small_llama()
    styles = tensor_parallel_plan(llama, 2, sp=True).styles
    assert type(styles["model.layers.0.self_attn.q_proj"]).__name__ == "ColwiseParallel"
    assert type(styles["model.layers.1.mlp.down_proj"]).__name__ == "RowwiseParallel"
    assert type(styles["model.layers.0.input_layernorm"]).__name__ == "SequenceParallel"
    assert type(styles["lm_head"]).__name__ == "ColwiseParallel"
    plain = tp_rank_memory(llama, inputs, opts, parse_plan("tp:2"))
    sp = tp_rank_memory(llama, inputs, opts, parse_plan("tp:2,sp"))
    assert sp.param_bytes == plain.param_bytes
    # the norms' inputs are halved on the sequence: less is saved for backward
    assert sp.saved_activation_bytes < plain.saved_activation_bytes
    assert "model.layers.*.input_layernorm" in plain.notes[0]  # norms stay whole
    with pytest.raises(NoTensorParallelPlan, match="4 attention heads do not split over 3"):
        tensor_parallel_plan(llama, 3)
    with pytest.raises(NoTensorParallelPlan, match="HF causal LM"):
        tensor_parallel_plan(mlp(), 2, sp=True)


def test_a_world_after_another_rank_of_the_same_shape() -> None:
    # DTensor caches (C++ and Python) are keyed by meshes, equal across worlds of one
    # shape: run as rank 4 and then rank 0 of fsdp:3+tp:2, the second run resolved rank
    # 4's TP group until each world's end cleared them
    mode = new_fake_mode()
    ids = torch.randint(0, 512, (2, 64))
    inputs = fake_inputs(Inputs(kwargs={"input_ids": ids}), mode)
    opts, llama, spec = StepOptions(fake_mode=mode), small_llama(), parse_plan("fsdp:3+tp:2")
    later = tp_rank_memory(llama, inputs, opts, spec, rank=4)
    first = tp_rank_memory(llama, inputs, opts, spec, rank=0)
    # rank 4 (FSDP index 2) holds the short chunks: 128 rows -> 43, 43, 42
    assert first.optimizer_bytes > later.optimizer_bytes


def test_a_2d_world_joins_its_dp_and_tp_meshes_once() -> None:
    """FSDP2 over TP joins the two meshes for every parameter; in a fake world the join
    is made once per pair (it rebuilt rank-id tensors under FakeTensorMode each time) and
    is the mesh torch would have made; the world gives torch's own join back at its end."""
    from torch.distributed.device_mesh import DeviceMesh

    from inspector.distributed.tp import fake_mesh_2d

    original = DeviceMesh._concatenate
    with fake_mesh_2d(3, 2, rank=4) as mesh:
        joined = DeviceMesh._concatenate([mesh["dp"], mesh["tp"]])
        assert DeviceMesh._concatenate([mesh["dp"], mesh["tp"]]) is joined
        fresh = original([mesh["dp"], mesh["tp"]])
        assert joined.mesh_dim_names == fresh.mesh_dim_names == ("dp", "tp")
        assert torch.equal(joined.mesh, fresh.mesh)  # rank = dp_index * 2 + tp_index
        assert joined.mesh.tolist() == [[0, 1], [2, 3], [4, 5]]
        assert list(joined.get_coordinate()) == list(fresh.get_coordinate()) == [2, 0]
    assert DeviceMesh._concatenate is original


def test_gpt2s_conv1d_blocks_are_refused_by_name() -> None:
    """GPT-2 projects with transformers' Conv1D, which torch's parallelize_module does not
    split: the plan is refused saying so, for the whole model (not from a cut copy)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=9, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    with pytest.raises(NoTensorParallelPlan) as refused:
        tensor_parallel_plan(model, 2)
    text = str(refused.value)
    assert "Conv1D" in text and "FSDP and DDP plans still apply" in text
    assert "transformer.h.0, transformer.h.1, transformer.h.2 ... (9 blocks)" in text
    # through the planner: 9 identical blocks would run cut to 3 and 4 in forked children;
    # the refusal comes first, here, for all 9
    from types import SimpleNamespace

    from inspector.distributed.plan import rank_memories

    analysis = SimpleNamespace(on_fake=True, inputs=None, opts=None)
    with pytest.raises(NoTensorParallelPlan, match=r"\(9 blocks\)"):
        rank_memories(parse_plan("tp:2"), model, analysis, [0])
