"""Training set-ups side by side: derived rows agree with steps actually run that way."""

from __future__ import annotations

import pytest
import torch
from graph_helpers import make_ctx
from models import MLP, ResNet18
from torch import nn
from torch.utils.checkpoint import checkpoint

from inspector.capture import capture_graph
from inspector.memory.setups import Measured, setups
from inspector.passes import graph, memory


def _memory(build, make_inputs, dims, **options):  # noqa: ANN001, ANN003
    ctx = make_ctx(build, make_inputs, dims, fake=True)
    for key, value in options.items():
        setattr(ctx.options, key, value)
    ctx.capture = capture_graph(ctx)
    graph.run(ctx)
    memory.run(ctx)
    return ctx.report.memory


def _row(mem, optimizer: str, dtype: str, checkpointing: bool = False):  # noqa: ANN001
    return next(
        s
        for s in mem.setups
        if (s.optimizer, s.activation_dtype, s.checkpointing) == (optimizer, dtype, checkpointing)
    )


def test_rows_by_hand() -> None:
    m = Measured(
        optimizer="adamw", dtype="float32", resident_bytes=150, param_bytes=100, grad_bytes=100,
        saved_bytes=1000, fb_peak_bytes=1500,
        step={"sgd": (0, 10), "momentum": (100, 20), "adamw": (200, 300)},
        bf16_saved_bytes=500, bf16_fb_peak_bytes=1000,
        checkpoint_saving_bytes=800, largest_block_bytes=200,
    )  # fmt: skip
    rows = {(r.optimizer, r.activation_dtype, r.checkpointing): r for r in setups(m)}
    assert len(rows) == 3 * 2 * 2
    assert rows["adamw", "float32", False].measured
    # forward/backward 1500 vs the step: 150 resident + 100 grads + 200 state + 300 temporaries
    assert rows["adamw", "float32", False].train_peak_bytes == 1500
    assert rows["sgd", "float32", False].train_peak_bytes == 1500 - 200  # no Adam state
    # checkpointing every block: 800 of saved bytes freed; one block (200) back at the peak
    assert rows["adamw", "float32", True].saved_activation_bytes == 1000 - 800
    assert rows["adamw", "float32", True].train_peak_bytes == 1500 - 600
    # in bf16 the blocks hold half as much: (800 - 200) * 500 / 1000 = 300 off the peak
    assert rows["momentum", "bf16", True].train_peak_bytes == 1000 - 100 - 300
    # with no activations left the optimizer step is the peak: 150 + 100 + 200 + 300
    tiny = Measured(**{**m.__dict__, "fb_peak_bytes": 400, "bf16_fb_peak_bytes": None})
    assert setups(tiny)[-2].train_peak_bytes == 750


MLP_INPUTS = (lambda B: ((torch.randn(B, 784),), {}), {"B": 64})


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_optimizer_rows_match_a_step_run_with_that_optimizer(optimizer: str) -> None:
    base = _memory(MLP, *MLP_INPUTS, optimizer="adamw")
    other = _memory(MLP, *MLP_INPUTS, optimizer=optimizer)
    row = _row(base, optimizer, "float32")
    assert row.optimizer_bytes == other.optimizer_bytes
    assert row.train_peak_bytes == pytest.approx(other.train_peak_bytes, rel=1e-3)


def test_bf16_row_matches_a_step_run_under_autocast() -> None:
    inputs = (lambda B: ((torch.randn(B, 3, 64, 64),), {}), {"B": 8})
    base = _memory(ResNet18, *inputs)
    bf16 = _memory(ResNet18, *inputs, dtype="bf16")
    row = _row(base, "adamw", "bf16")
    assert row.saved_activation_bytes == bf16.saved_activation_bytes
    assert row.train_peak_bytes == pytest.approx(bf16.train_peak_bytes, rel=0.02)


class Blocks(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(6)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x


def test_checkpoint_row_is_close_to_a_checkpointed_model() -> None:
    inputs = (lambda B: ((torch.randn(B, 256),), {}), {"B": 128})
    base = _memory(Blocks, *inputs)
    done = _memory(lambda: Blocks(checkpointed=True), *inputs)
    row = _row(base, "adamw", "float32", checkpointing=True)
    # each block keeps its input (128*256*4 = 128 KiB) either way; the rest is recomputed
    assert row.saved_activation_bytes == done.saved_activation_bytes == 6 * 128 * 256 * 4
    assert row.train_peak_bytes == pytest.approx(done.train_peak_bytes, rel=1e-3)


def test_checkpoint_row_matches_a_checkpointed_transformer() -> None:
    """Checkpointing every decoder layer of a Llama: the derived row against a model run
    with Hugging Face's gradient checkpointing on."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, dtype="bfloat16",
    )  # fmt: skip

    def build(checkpointed: bool):  # noqa: ANN202
        def make():  # noqa: ANN202
            torch.set_default_dtype(torch.bfloat16)
            try:
                model = LlamaForCausalLM(config)
            finally:
                torch.set_default_dtype(torch.float32)
            model.config.use_cache = False
            if checkpointed:
                model.gradient_checkpointing_enable({"use_reentrant": False})
            return model.train()

        return make

    inputs = (lambda B, S: ((), {"input_ids": torch.randint(0, 1000, (B, S))}), {"B": 2, "S": 512})
    base = _memory(build(False), *inputs)
    done = _memory(build(True), *inputs)
    row = _row(base, "adamw", "bf16", checkpointing=True)  # bf16 weights compute in bf16
    # The row is the memory pass's own checkpointed run (every decoder layer wrapped in
    # torch.utils.checkpoint on fake tensors): it saves what Hugging Face's gradient
    # checkpointing saves, and peaks where it peaks.
    assert row.saved_activation_bytes == done.saved_activation_bytes
    assert row.train_peak_bytes == pytest.approx(done.train_peak_bytes, rel=0.01)
    assert done.saved_activation_bytes < 0.1 * base.saved_activation_bytes


def _stack(blocks: int) -> list[torch.Tensor]:
    """A residual stack's parameters: the same four kinds over and over."""
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 16)]
    return list(nn.Sequential(*layers).parameters())


def _mixed() -> list[torch.Tensor]:
    """Three kinds in an order with no period, so the walk is most of the list."""
    sizes = [(64, 64), (8,), (64, 64), (64, 64), (8,), (3, 5), (8,), (8,), (3, 5), (64, 64)]
    return [torch.zeros(*s, requires_grad=True) for s in sizes]


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
def test_a_step_over_the_neighbour_pairs_is_the_step_over_every_parameter(optimizer) -> None:
    """The optimizer's one-by-one loop: a walk over every pair of neighbouring parameter
    kinds gives the same temporaries as the whole list, and the state of the rest added
    by kind gives the same state bytes (the full run is the reference)."""
    from inspector.fakevalues import new_fake_mode
    from inspector.memory.kinds import kind, pairs_walk
    from inspector.memory.setups import step_cost

    stack = _stack(100)  # 600 parameters: the walk is one block and one more weight
    assert pairs_walk([kind(p) for p in stack]) == list(range(7))
    headed = [*stack, torch.zeros(3, 16, requires_grad=True), torch.zeros(3, requires_grad=True)]
    assert len(pairs_walk([kind(p) for p in headed])) < 15  # the head's pairs come last
    for params in (stack, _mixed(), headed):
        short = step_cost(optimizer, params, new_fake_mode())
        full = step_cost(optimizer, params, new_fake_mode(), shorten=False)
        assert short == full
    # by hand: Adam keeps two copies of each parameter and a float32 step scalar
    state = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}[optimizer]
    scalars = 4 if optimizer.startswith("adam") else 0
    assert full[0] == sum(state * p.numel() + scalars for p in params)


def test_a_batched_step_runs_over_every_parameter(monkeypatch) -> None:
    """foreach and fused steps allocate for all parameters at once: no walk then."""
    from inspector.fakevalues import new_fake_mode
    from inspector.memory import setups as setups_module

    shadowed: list[int] = []
    real = setups_module._shadows
    monkeypatch.setattr(setups_module, "looped", lambda params: False)
    monkeypatch.setattr(
        setups_module, "_shadows", lambda params: shadowed.append(len(params)) or real(params)
    )
    params = _stack(10)
    setups_module.step_cost("adamw", params, new_fake_mode())
    assert sum(shadowed) == len(params) == 60
