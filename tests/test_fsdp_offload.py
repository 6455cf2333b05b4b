"""FSDP2 CPU offload (`fsdp:N,offload=true`, inspector.distributed.offload) on the 4-block
MLP of tests/test_distributed.py: Linear(256, 1024) + ReLU + Linear(1024, 256) per block,
batch 64, float32, AdamW.

On 2 ranks each block's local shard is 512 of the first weight's 1,024 rows (x 256), 512
bias rows, 128 of the second weight's 256 rows (x 1,024) and 128 bias rows:
(131,072 + 512 + 131,072 + 128) x 4 B = 1,051,136 B; the 4 blocks 4,204,544 B."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspector import cli
from inspector.context import Inputs
from inspector.distributed import offload
from inspector.distributed.fsdp import fsdp_rank_memory
from inspector.memory.shadow import fake_inputs, new_fake_mode
from inspector.memory.step import StepOptions
from inspector.render.markdown import render_markdown
from inspector.report import Report
from inspector.schema.options import OptionError
from inspector.schema.parallel import parse_plan
from tests.test_distributed import mlp

UNIT = 1_051_136  # one block's local shard on 2 ranks, float32
SHARDS = 4 * UNIT  # 4,204,544: this rank's parameters, and as much gradient
STATE = 2 * SHARDS + 16 * 4  # AdamW's exp_avg and exp_avg_sq + 16 float32 `step`s


@pytest.fixture(scope="module")
def fake() -> tuple[nn.Module, Inputs, StepOptions]:
    mode = new_fake_mode()
    inputs = fake_inputs(Inputs(args=(torch.randn(64, 256),)), mode)
    return mlp(), inputs, StepOptions(fake_mode=mode, loss_fn=lambda out, _: out.sum())


def test_offload_grammar() -> None:
    spec = parse_plan("FSDP:8, Offload=TRUE,param_dtype=bf16")
    assert spec.options == {"offload": True, "param_dtype": "bf16"}
    assert spec.text == "fsdp:8,offload=true,param_dtype=bf16"
    assert parse_plan(spec.text) == spec  # the normal form reads back the same
    assert spec.family == "fsdp,offload=true,param_dtype=bf16"  # the GPUs search keeps it
    assert parse_plan("fsdp:8,offload=false").text == "fsdp:8,offload=false"
    two_d = parse_plan("fsdp:8,offload=true+tp:4,sp")  # offload belongs to the FSDP part
    assert (two_d.text, two_d.family) == (
        "fsdp:8,offload=true+tp:4,sp",
        "fsdp,offload=true+tp:4,sp",
    )
    assert two_d.with_world_size(8).text == "fsdp:2,offload=true+tp:4,sp"
    with pytest.raises(OptionError, match="offload must be true or false, not 'yes'"):
        parse_plan("fsdp:8,offload=yes")
    for bad in ("ddp:2,offload=true", "zero2:2,offload=true", "fsdp:2+tp:2,offload=true"):
        with pytest.raises(OptionError, match="not 'offload'"):
            parse_plan(bad)


def test_host_holds_shards_grads_and_state(fake) -> None:
    model, inputs, opts = fake
    m = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2,offload=true"))
    assert (m.param_bytes, m.grad_bytes, m.optimizer_bytes) == (SHARDS, SHARDS, STATE)
    assert m.host_bytes == SHARDS + SHARDS + STATE  # 16,818,240
    # 3 ranks, rank 2: chunks of ceil(rows / 3) = 342 and 86 rows; it holds 340 and 84.
    # On the host its parameter shard stays padded (FSDP's `_sharded_param_data`), the
    # gradient is the device->host copy of the unpadded slice, the state follows it
    last = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:3,offload=true"), rank=2)
    padded = (342 * 256 + 342 + 86 * 1024 + 86) * 4 * 4  # 2,816,704
    held = (340 * 256 + 340 + 84 * 1024 + 84) * 4 * 4  # 2,775,680
    assert (last.param_bytes, last.grad_bytes) == (padded, held)
    assert last.host_bytes == padded + held + 2 * held + 16 * 4


def test_device_peak_against_the_plain_plan(fake) -> None:
    model, inputs, opts = fake
    for in_flight in (0, 2):
        plain = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2"), in_flight=in_flight)
        off = fsdp_rank_memory(
            model, inputs, opts, parse_plan("fsdp:2,offload=true"), in_flight=in_flight
        )
        saved = plain.peak_bytes - off.peak_bytes
        # at every moment the device holds what the plain rank holds, less what lives on
        # the host (the shards and state throughout, P + S; the gradients reduced so far,
        # up to G), plus one unit's shards copied in at an all-gather (at most UNIT) and
        # the reduce-scatter outputs a process group still holds (`in_flight` of them,
        # each a unit's padded shard, UNIT here), which the plain rank counts as grads:
        #   P + S - UNIT - in_flight * UNIT <= saved <= P + S + G
        assert SHARDS + STATE - (1 + in_flight) * UNIT <= saved <= SHARDS + STATE + SHARDS
        assert off.peak_phase == "backward"  # the optimizer step runs on the host


def test_the_copy_to_the_device_is_counted(fake, monkeypatch) -> None:
    model, inputs, opts = fake
    spec = parse_plan("fsdp:2,offload=true")
    counted = fsdp_rank_memory(model, inputs, opts, spec)
    monkeypatch.setattr(offload, "copied_to_device", lambda gather_inputs: gather_inputs)
    uncounted = fsdp_rank_memory(model, inputs, opts, spec)
    # the peak is in block 2's backward, as block 1's shards come in for its all-gather
    assert counted.peak_bytes - uncounted.peak_bytes == UNIT


def test_cli_report_has_the_host_figure(tmp_path) -> None:
    (tmp_path / "m.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 32), nn.ReLU(),"
        " nn.Linear(32, 8)) for _ in range(2)])\n"
        "def example_inputs():\n    return torch.randn(4, 8)\n"
    )
    out = tmp_path / "r.json"
    argv = ["inspect", str(tmp_path / "m.py:make"), "--fake", "--passes",
            "graph,memory,distributed", "--parallel", "fsdp:2", "--parallel",
            "fsdp:2,offload=true", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    data = json.loads(out.read_text())
    plain, off = data["distributed"]["plans"]
    # a block's shard on 2 ranks: 16 x 8 + 16 + 4 x 32 + 4 = 276 parameters; 2 blocks
    # 552 x 4 B = 2,208 B of shards, as much gradient, AdamW 2 x 2,208 + 8 steps x 4 B
    assert plain["host_bytes"] is None
    assert (off["spec"], off["param_bytes"]) == ("fsdp:2,offload=true", 2_208)
    assert off["host_bytes"] == 2_208 + 2_208 + 2 * 2_208 + 8 * 4
    assert off["per_rank_peak_bytes"] < plain["per_rank_peak_bytes"]
    assert "fsdp,offload=true" in {g["strategy"] for g in data["distributed"]["gpus_needed"]}
    report = Report.model_validate(data)
    assert "| Host memory (CPU offload), `fsdp:2,offload=true` | 8.66 KiB |" in render_markdown(
        report
    )  # 8,864 B
    from server.pages.rendering import templates

    html = templates.env.get_template("_distributed.html").render(report=report)
    assert '<th class="num">Host (offload)</th>' in html and "8.66 KiB" in html
