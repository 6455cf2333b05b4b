"""Per-rank training memory (inspector.distributed) on a 4-block MLP whose bytes are known
by hand: each block is Linear(256, 1024) + ReLU + Linear(1024, 256),
256 * 1024 + 1024 + 1024 * 256 + 256 = 525,568 parameters, 2,102,272 float32 bytes;
the model 4 * 525,568 = 2,102,272 parameters, 8,409,088 bytes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspector import cli
from inspector.context import Inputs
from inspector.distributed.ddp import bucket_sizes, ddp_rank_memory
from inspector.distributed.fsdp import (
    distinct_ranks,
    fsdp_heaviest,
    fsdp_rank_memory,
    shard_units,
)
from inspector.distributed.gpus import fewest_gpus, fewest_gpus_checked
from inspector.distributed.zero import zero1_rank_memory
from inspector.memory.shadow import fake_inputs, fake_shadow, new_fake_mode
from inspector.memory.step import StepOptions, train_step, unique_tensors
from inspector.schema.options import OptionError
from inspector.schema.parallel import parse_plan

MODEL_BYTES = 2_102_272 * 4  # 8,409,088
ADAM_STEPS = 16 * 4  # one float32 `step` scalar per parameter tensor (8 Linear x 2)


def mlp() -> nn.Module:
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)) for _ in range(4)]
    )


@pytest.fixture(scope="module")
def fake() -> tuple[nn.Module, Inputs, StepOptions]:
    mode = new_fake_mode()
    inputs = fake_inputs(Inputs(args=(torch.randn(64, 256),)), mode)
    return mlp(), inputs, StepOptions(fake_mode=mode, loss_fn=lambda out, _: out.sum())


def test_plan_grammar() -> None:
    assert parse_plan("FSDP:8").text == "fsdp:8"
    assert parse_plan("fsdp:8, reshard=False,param_dtype=bfloat16").text == (
        "fsdp:8,param_dtype=bf16,reshard=false"
    )
    assert parse_plan("ddp:4,bucket_mb=50").options == {"bucket_mb": 50}
    assert parse_plan("zero1:2").strategy == "zero1"
    assert parse_plan("tp:4,SP").text == "tp:4,sp"
    two_d = parse_plan("fsdp:8,checkpoint=true+tp:4,sp")
    assert (two_d.strategy, two_d.world_size, two_d.tp_size, two_d.dp_size) == ("fsdp+tp", 32, 4, 8)
    assert two_d.text == "fsdp:8,checkpoint=true+tp:4,sp"
    assert two_d.family == "fsdp,checkpoint=true+tp:4,sp"  # what the GPUs search varies
    assert two_d.with_world_size(8).text == "fsdp:2,checkpoint=true+tp:4,sp"
    for bad in ("fsdp", "pp:2", "fsdp:0", "fsdp:x", "ddp:2,reshard=true", "fsdp:2,reshard=1",
                "tp:2+fsdp:2", "tp:2,reshard=false", "ddp:2+tp:2"):  # fmt: skip
        with pytest.raises(OptionError):
            parse_plan(bad)


def test_ddp_buckets_by_hand() -> None:
    # reverse order: the last Linear(1024, 256)'s bias (1,024 B) and weight (1,048,576 B)
    # reach the first bucket's 1 MiB: 1,049,600; the rest (8,409,088 - 1,049,600) < 25 MiB
    assert bucket_sizes(list(mlp().parameters())) == [1_049_600, 7_359_488]
    # 1 MiB caps: every weight of 1,048,576 B closes a bucket with what came before it
    assert sum(bucket_sizes(list(mlp().parameters()), cap_mb=1)) == MODEL_BYTES
    assert len(bucket_sizes(list(mlp().parameters()), cap_mb=1)) == 8


def test_ddp_rank_is_the_one_process_step_plus_buckets(fake) -> None:
    model, inputs, opts = fake
    shadow = fake_shadow(model, opts.fake_mode)
    train = train_step(shadow, inputs, opts)
    m = ddp_rank_memory(train, unique_tensors(shadow.parameters()), parse_plan("ddp:4"))
    assert m.comm_bytes == MODEL_BYTES  # one more copy of every gradient
    assert m.peak_bytes == train.peak_bytes + MODEL_BYTES
    assert m.optimizer_bytes == 2 * MODEL_BYTES + ADAM_STEPS  # exp_avg, exp_avg_sq, steps


def test_zero1_shards_the_optimizer_state(fake) -> None:
    model, inputs, opts = fake
    ddp = train_step(fake_shadow(model, opts.fake_mode), inputs, opts)
    m = zero1_rank_memory(model, inputs, opts, parse_plan("zero1:2"))
    # whole parameters, greedily by size: 4 of the 8 weights (1,048,576 B), 2 of each
    # kind of bias per rank: 4,204,544 B each; AdamW keeps 2 copies + 8 step scalars
    assert m.optimizer_bytes == 2 * MODEL_BYTES // 2 + 8 * 4
    assert (m.param_bytes, m.comm_bytes) == (MODEL_BYTES, MODEL_BYTES)  # all params, buckets
    # the DDP rank's peak is the AdamW step's; ZeRO's rank steps half the parameters
    assert m.peak_bytes < ddp.peak_bytes + MODEL_BYTES - MODEL_BYTES // 2
    with pytest.raises(ValueError, match="keeps none"):
        zero1_rank_memory(model, inputs, StepOptions(optimizer="sgd", fake_mode=opts.fake_mode),
                          parse_plan("zero1:2"))  # fmt: skip


def test_fsdp_shards_by_hand(fake) -> None:
    model, inputs, opts = fake
    assert shard_units(model) == ["0", "1", "2", "3"]
    m = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2"))
    assert m.units == 5  # 4 blocks + the root
    assert m.param_bytes == MODEL_BYTES // 2  # 4,204,544
    assert m.grad_bytes == MODEL_BYTES // 2
    assert m.optimizer_bytes == 2 * MODEL_BYTES // 2 + ADAM_STEPS
    assert m.comm_bytes == 2 * 2_102_272  # one block gathered + its reduce-scatter input
    # resident shards + state + input, plus at least one gathered block
    assert m.peak_bytes >= 3 * MODEL_BYTES // 2 + 64 * 256 * 4 + 2_102_272
    bf16 = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2,param_dtype=bf16"))
    assert bf16.comm_bytes == 2 * 525_568 * 2  # gathered and reduced in bf16
    assert bf16.peak_bytes < m.peak_bytes


def test_fsdp_heaviest_rank_on_uneven_shards(fake) -> None:
    model, inputs, opts = fake
    spec = parse_plan("fsdp:3")
    first = fsdp_rank_memory(model, inputs, opts, spec, rank=0)
    last = fsdp_rank_memory(model, inputs, opts, spec, rank=2)
    # chunks of ceil(rows / 3): 342 of Linear(256, 1024)'s 1,024 rows, 86 of the other's
    # 256; every rank pads to them: (342 * 256 + 342 + 86 * 1024 + 86) * 4 B * 4 blocks
    padded = (342 * 256 + 342 + 86 * 1024 + 86) * 4 * 4
    assert first.param_bytes == last.param_bytes == padded  # 2,816,704
    # the last rank holds 1024 - 684 = 340 and 256 - 172 = 84 rows: less optimizer state
    assert first.optimizer_bytes == 2 * padded + ADAM_STEPS
    assert last.optimizer_bytes == 2 * (340 * 256 + 340 + 84 * 1024 + 84) * 4 * 4 + ADAM_STEPS
    # ... but copies its gradient shard out of the padded reduce-scatter output: heavier
    assert last.peak_bytes > first.peak_bytes
    assert distinct_ranks(model, 3) == [0, 2]  # ranks 0 and 1 hold the same chunks
    assert distinct_ranks(model, 4) == [0]
    assert fsdp_heaviest(model, inputs, opts, spec).rank == 2


def test_fsdp_keeping_gathered_params_costs_memory(fake) -> None:
    model, inputs, opts = fake
    keep = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:4,reshard=false"))
    free = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:4"))
    # without resharding all 4 gathered blocks are live at the end of forward; with it
    # at most the one running and the one prefetched (2 of 2,102,272 B)
    assert keep.peak_bytes - free.peak_bytes >= 2 * 2_102_272


def test_fsdp_checkpointing_keeps_only_block_inputs(fake) -> None:
    model, inputs, opts = fake
    ckpt = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2,checkpoint=true"))
    # each checkpointed block saves its input only: 4 x [64, 256] float32 = 4 x 65,536 B
    # (the first is the model's input, kept anyway), instead of 1,310,720 B
    assert ckpt.saved_activation_bytes == 4 * 64 * 256 * 4
    plain = fsdp_rank_memory(model, inputs, opts, parse_plan("fsdp:2"))
    # the peak here is block 0's backward, where its recomputed activations are live
    # again and the others' are freed: checkpointing cannot lower it
    assert ckpt.peak_bytes == plain.peak_bytes


def test_fewest_gpus_are_run_not_only_drawn() -> None:
    def line(n: int) -> int:  # fixed + sharded / n
        return 1000 + 64_000 // n

    got = fewest_gpus(line, [2000, 1500, 900], sharded=True)
    # 1000 + 64,000 / 64 = 2,000 fits; 1000 + 64,000 / 128 = 1,500 (127: 1,503 does not)
    assert [(c.budget_bytes, c.gpus) for c in got[:2]] == [(2000, 64), (1500, 128)]
    assert got[2].gpus is None  # 900 is under the fixed part: no world size fits

    def bumped(n: int) -> int:  # the line says 64, the run says no: the next size is run
        return 2100 if n == 64 else line(n)

    got = fewest_gpus(bumped, [2000], sharded=True)
    assert (got[0].gpus, got[0].per_rank_peak_bytes) == (65, 1000 + 64_000 // 65)

    def drifting(n: int) -> int:  # what does not shard grows by 3 B a rank
        return 1000 + 64_000 // n + 3 * n

    # the line through 8 (9,024) and 64 (2,192) guesses 80; 80-83 do not fit (83: 2,020);
    # doubling to 166 fits (1,883), bisecting finds 87 (1,996; 86: 2,002)
    got = fewest_gpus(drifting, [2000], sharded=True)
    assert (got[0].gpus, got[0].per_rank_peak_bytes) == (87, 1996)

    def growing(n: int) -> int:  # a dim-0 shard of 8 rows: past 8 ranks only padding
        return 1000 + 8_000 // min(n, 8) + 100 * max(0, n - 8)

    # the line through 8 (2,000) and 64 (7,600) rises: 8 ranks fit 2,000, 7 (2,142) not
    got = fewest_gpus(growing, [2000, 1500], sharded=True)
    assert [c.gpus for c in got] == [8, None]
    flat = fewest_gpus(lambda n: 1500, [1000, 2000], sharded=False)
    assert [c.gpus for c in flat] == [None, 1]


def test_cli_parallel(tmp_path, capsys) -> None:
    (tmp_path / "m.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 32), nn.ReLU(),"
        " nn.Linear(32, 8)) for _ in range(2)])\n"
        "def example_inputs():\n    return torch.randn(4, 8)\n"
    )
    assert cli.main(["inspect", str(tmp_path / "m.py:make"), "--parallel", "pp:2"]) == 2
    out = tmp_path / "r.json"
    argv = ["inspect", str(tmp_path / "m.py:make"), "--fake", "--passes",
            "graph,memory,distributed", "--parallel", "ddp:2", "--parallel", "fsdp:2",
            "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    section = json.loads(out.read_text())["distributed"]
    ddp, fsdp = section["plans"]
    # 2 blocks x (8 * 32 + 32 + 32 * 8 + 8) = 1,104 parameters, 4,416 float32 bytes
    assert (ddp["strategy"], ddp["world_size"], ddp["comm_bytes"]) == ("ddp", 2, 4_416)
    assert fsdp["param_bytes"] == 4_416 // 2
    assert fsdp["per_rank_peak_bytes"] < ddp["per_rank_peak_bytes"]
    assert all(fsdp["fits"].values())
    assert {g["strategy"] for g in section["gpus_needed"]} == {"ddp", "fsdp"}
    assert "Distributed" in capsys.readouterr().out


def test_distinct_ranks_match_every_rank_looked_at() -> None:
    # rows 7, 7, 3, 3, 10, 10: short and empty chunks at many world sizes
    model = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3), nn.Linear(3, 10))
    rows = [p.shape[0] for p in model.parameters()]
    for n in range(1, 40):
        kinds: dict[tuple[int, ...], int] = {}
        for rank in range(n):
            sizes = tuple(max(0, min(-(-r // n), r - rank * -(-r // n))) for r in rows)
            kinds.setdefault(sizes, rank)
        assert distinct_ranks(model, n) == sorted(kinds.values()), n


def test_zero2_shards_gradients_and_state(fake) -> None:
    from inspector.distributed.zero2 import zero2_rank_memory

    model, inputs, opts = fake
    m = zero2_rank_memory(model, inputs, opts, parse_plan("zero2:2"))
    assert m.param_bytes == MODEL_BYTES  # every rank holds all the parameters
    assert m.grad_bytes == MODEL_BYTES // 2  # its half of every flat gradient
    assert m.optimizer_bytes == 2 * MODEL_BYTES // 2 + ADAM_STEPS
    # the largest reduce-scatter: a 1024 x 256 weight's gradient (1,048,576 B) + its half
    assert m.comm_bytes == 1_048_576 + 524_288
    zero1 = zero1_rank_memory(model, inputs, opts, parse_plan("zero1:2"))
    assert m.peak_bytes < zero1.peak_bytes  # no full gradients, no DDP buckets
    # 3 ranks: chunks of ceil(numel / 3), rank 0's all full: 262,144 -> 87,382 of a weight
    three = zero2_rank_memory(model, inputs, opts, parse_plan("zero2:3"))
    chunks = 4 * (2 * -(-262_144 // 3) + -(-1024 // 3) + -(-256 // 3))
    assert three.grad_bytes == chunks * 4


def test_fsdp_warnings_meant_for_its_users_stay_out_of_the_report_run(fake) -> None:
    """FSDP2 warns when the wrapped model returns a view (HF's causal LMs do): advice for
    people training with it, not for someone asking for a figure."""
    import warnings

    class ViewOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)[:, :128]  # a view of the last block's output

    _, inputs, opts = fake
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = fsdp_rank_memory(ViewOut(), inputs, opts, parse_plan("fsdp:2"))
    assert m.units == 5
    assert not [w for w in seen if "FSDP2-wrapped module" in str(w.message)]


def test_fewest_gpus_agree_with_every_world_size_run_at_a_fraction_of_the_runs() -> None:
    """Padded shards (whole rows a rank) and what grows with N (a heaviest rank that holds
    more the more ranks there are): the answers are the first world size that fits of all
    of 1..4,096 run, and each budget costs a few runs, not a walk or a doubling to 65,536."""
    import math

    gib = 2**30
    budgets = [16 * gib, 24 * gib, 40 * gib, 48 * gib, 80 * gib, 141 * gib]
    cases = [  # (does not shard, shards, rows of the widest parameter, bytes added a rank)
        (42 * gib, 564e9, 8192, 0.0),  # Llama-3-70B-like, bf16 + AdamW
        (42 * gib, 564e9, 8192, 30e6),
        (30 * gib, 564e9, 1024, 60e6),
        (10 * gib, 100e9, 28672, 5e6),
    ]
    for fixed, sharded, rows, drift in cases:

        def peak(n: int, fixed=fixed, sharded=sharded, rows=rows, drift=drift) -> int:
            return int(fixed + sharded * math.ceil(rows / n) / rows + drift * n)

        runs: list[int] = []

        def counted(n: int, runs=runs, peak=peak) -> int:
            runs.append(n)
            return peak(n)

        got = fewest_gpus(counted, budgets, sharded=True)
        every = [next((n for n in range(1, 4097) if peak(n) <= b), None) for b in budgets]
        assert [c.gpus for c in got] == every, (fixed, sharded, rows, drift)
        assert len(runs) == len(set(runs)) <= 16, runs  # no world size is run twice
    # more ranks made it worse (168 over 84): the curve F + S / n + d n through the last
    # three runs says where a dip under the budget is, or that there is none
    from inspector.distributed.gpus import _dip

    def curve(n: int) -> int:  # 1e9 + 1e12 / n + 1e8 n: lowest at 100 ranks, 2.1e10
        return int(1e9 + 1e12 / n + 1e8 * n)

    runs3 = {n: curve(n) for n in (50, 200, 400)}
    # under 2.2e10: 1e8 n^2 - 2.1e10 n + 1e12 <= 0 from n = (210 - sqrt(4,100)) / 2 = 73
    assert _dip(runs3, int(2.2e10)) == 73 and curve(73) <= 2.2e10 < curve(72)
    assert _dip(runs3, int(2.0e10)) is None  # under the curve's lowest point: no fit


def test_lazy_chunks_are_fsdps_chunks() -> None:
    """Every chunk FSDP2 could read: the same shape, stride and offset as its own list."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from inspector.distributed.lazychunks import LazyChunks

    for rows, n in [(8192, 117), (1024, 116), (10, 4), (6, 4), (3, 8), (7, 7), (1, 1)]:
        t = torch.empty(rows, 5)
        eager, lazy = _chunk_with_empty(t, n, 0), LazyChunks(t, n, 0)
        assert len(lazy) == len(eager) == n
        for a, b in zip(eager, [lazy[i] for i in range(n)], strict=True):
            assert (a.shape, a.stride(), a.storage_offset()) == (
                b.shape, b.stride(), b.storage_offset()
            ), (rows, n)  # fmt: skip
        assert lazy[-1].shape == eager[-1].shape


def test_fewest_gpus_searched_on_one_kind_of_rank_then_checked_on_every_kind() -> None:
    """Two kinds of rank: the last, whose short chunk costs a gradient copy out of the padded
    buffer (1e8 B where 8,192 rows do not divide by n), and one with full chunks, lighter
    except at one world size. The search runs only the last kind; each answer is then run
    for every kind, and a budget the other kind breaks there is searched again."""
    import math

    def last(n: int) -> int:  # 1e9 + 64e9 / n in whole rows, + 1e8 on a short chunk
        return int(1e9 + 64e9 * math.ceil(8192 / n) / 8192 + (1e8 if 8192 % n else 0))

    budgets = [int(3e9), int(5e9), int(2e10)]
    # 3e9: 32 ranks hold 2e9 (31: 2.07e9 + 1e8 over); 5e9: 16 hold 4e9 (15: 4.27e9);
    # 2e10: 4 hold 16e9 (3: 21.3e9)
    for heavy_at, answers in ((0, [32, 16, 4]), (33, [32, 16, 4]), (16, [32, 17, 4])):
        searched: list[int] = []
        checked: list[int] = []

        def lower(n: int, searched=searched) -> int:
            searched.append(n)
            return last(n)

        def heaviest(n: int, checked=checked, heavy_at=heavy_at) -> int:
            checked.append(n)
            full = int(1e9 + 64e9 * math.ceil(8192 / n) / 8192)
            return max(last(n), full + (int(3e8) if n == heavy_at else 0))

        got = fewest_gpus_checked(lower, heaviest, budgets, sharded=True)
        assert [c.gpus for c in got] == answers, heavy_at
        assert all(c.per_rank_peak_bytes == heaviest(c.gpus) for c in got)
        if heavy_at != 16:  # every kind is run at the answers only
            assert sorted(set(checked) - {c.gpus for c in got}) == []
        else:  # at 16 the full kind is 5.3e9: 5e9 searched again on every kind, 17 fits
            assert 16 in checked and 17 in checked
        assert len(set(searched)) <= 14  # 3 budgets, 2 kinds of rank: no walk


def test_a_search_stops_at_the_first_kind_of_rank_over_its_budget() -> None:
    """A world size the search finds over its budget needs one kind of rank over it, not
    all: the lower bound may stop there (`AtLeast`). The answers are those of the full
    lower bound, at fewer kind runs, and a larger budget reruns what stopped below it."""
    import math

    from inspector.distributed.gpus import AtLeast

    def last(n: int) -> int:  # the short chunk's gradient copy, as above
        return int(1e9 + 64e9 * math.ceil(8192 / n) / 8192 + (1e8 if 8192 % n else 0))

    def full(n: int) -> int:  # lighter by the copy, heavier by 4e8 where 8192 divides
        return int(1e9 + 64e9 * math.ceil(8192 / n) / 8192 + (4e8 if 8192 % n == 0 else 0))

    budgets = [int(3e9), int(5e9), int(2e10), int(3e10)]
    results = []
    for stops in (False, True):
        kind_runs: list[tuple[str, int]] = []

        def lower(n: int, over: int | None = None, kind_runs=kind_runs) -> int:
            kind_runs.append(("last", n))
            if over is not None and last(n) > over:
                return AtLeast(last(n))
            kind_runs.append(("full", n))
            return max(last(n), full(n))

        got = fewest_gpus_checked(
            lower, lambda n: max(last(n), full(n)), budgets, sharded=True, stops_over=stops
        )
        results.append(([c.gpus for c in got], len(set(kind_runs))))
    (answers, every_kind), (stopped, fewer) = results
    # by hand: 3e9 needs 34 (33: 3.05e9 with the copy); 5e9 needs 17 (16: 5.4e9, the full
    # kind where 8,192 divides); 2e10 needs 4 (3: 22.4e9); 3e10 needs 3 (2: 33.4e9)
    assert stopped == answers == [34, 17, 4, 3]
    every = [next(n for n in range(1, 5000) if max(last(n), full(n)) <= b) for b in budgets]
    assert answers == every
    assert (fewer, every_kind) == (24, 28)
