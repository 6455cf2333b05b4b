"""MetaMemo: a meta kernel runs once per op and input metadata; the answers are what the
kernel gives."""

from __future__ import annotations

import torch
from torch import nn

from inspector.graph.metamemo import MetaMemo, writes_self_only


def _meta(*shape: int, channels_last: bool = False) -> torch.Tensor:
    t = torch.empty(*shape, device="meta")
    return t.to(memory_format=torch.channels_last) if channels_last else t


def _layers() -> nn.Module:
    block = [nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)]
    return nn.Sequential(*[nn.Sequential(*block) for _ in range(3)]).to("meta")


def _described(out: torch.Tensor) -> tuple:
    return tuple(out.shape), out.stride(), out.dtype, out.device.type


def test_repeated_layers_run_their_kernels_once_and_get_the_same_outputs() -> None:
    model, x = _layers(), _meta(4, 16)
    plain = _described(model(x))
    with MetaMemo() as memo:
        memoised = _described(model(x))
    assert memoised == plain == ((4, 16), (16, 1), torch.float32, "meta")
    # per block: layer_norm, two addmm (different shapes), gelu; the 2nd and 3rd blocks hit
    assert memo.hits == 2 * 4
    assert len(memo.outputs) == 4


def test_strides_and_dtypes_key_the_memo() -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1).to("meta")
    half_conv = nn.Conv2d(8, 8, 3, padding=1).to("meta", torch.float16)
    dense, last = _meta(2, 8, 10, 10), _meta(2, 8, 10, 10, channels_last=True)
    with MetaMemo() as memo:
        outs = [torch.nn.functional.gelu(x) for x in (dense, last)]
        full, half = conv(dense), half_conv(dense.half())
    assert memo.hits == 0
    assert [o.stride() for o in outs] == [(800, 100, 10, 1), (800, 1, 80, 8)]
    assert (full.dtype, half.dtype) == (torch.float32, torch.float16)


def test_ops_that_write_or_alias_are_not_memoised() -> None:
    x = _meta(4, 4)
    with MetaMemo() as memo:
        for _ in range(2):
            x.add_(1)  # writes its input
            view = x.t()  # an alias of its input
            x.relu()
    assert memo.hits == 1  # relu's second call only
    assert view.stride() == (1, 4)
    assert len(memo.outputs) == 1


def test_an_inplace_activation_returns_its_input_without_its_kernel() -> None:
    """hardswish_ runs as a Python decomposition on meta (7 ms a call): not run at all."""
    x, ints = _meta(2, 8, 5, 5), torch.empty(2, 3, dtype=torch.int64, device="meta")
    with MetaMemo() as memo:
        out = nn.functional.hardswish(x, inplace=True)
        same = ints.relu_()  # an integer tensor: its kernel says what it allows
    assert out is x and same is ints
    assert memo.in_place == 1 and memo.hits == 0


def test_which_inplace_ops_only_return_their_input() -> None:
    aten = torch.ops.aten
    assert writes_self_only(aten.relu_.default) and writes_self_only(aten.hardswish_.default)
    assert writes_self_only(aten.fill_.Scalar) and writes_self_only(aten.clamp_.default)
    assert not writes_self_only(aten.add_.Tensor)  # another tensor: it may not broadcast
    assert not writes_self_only(aten.transpose_.default)  # restrides its input
    assert not writes_self_only(aten.resize_.default)
    assert not writes_self_only(aten.bitwise_and_.Scalar)  # refused on float tensors
    assert not writes_self_only(aten.relu.default)  # out of place


def test_batch_norm_in_training_runs_once_per_shape() -> None:
    """native_batch_norm also updates its running statistics in place: on meta that
    changes nothing, so its outputs follow from its inputs as any new tensor's."""
    bn = nn.BatchNorm2d(8).to("meta").train()
    x = _meta(2, 8, 5, 5, channels_last=True)
    plain = [_described(bn(x)) for _ in range(2)]
    with MetaMemo() as memo:
        memoised = [_described(bn(x)) for _ in range(2)]
    assert memoised == plain
    assert plain[0] == ((2, 8, 5, 5), (200, 1, 40, 8), torch.float32, "meta")
    assert memo.hits == 2  # the second call: batch norm and the empty it follows
    assert _described(bn.running_mean) == ((8,), (1,), torch.float32, "meta")


def test_a_tuple_of_outputs_comes_back_whole() -> None:
    x = _meta(2, 5, 16)
    weight, bias = _meta(16), _meta(16)
    with MetaMemo() as memo:
        first = torch.ops.aten.native_layer_norm(x, [16], weight, bias, 1e-5)
        second = torch.ops.aten.native_layer_norm(x, [16], weight, bias, 1e-5)
    assert memo.hits == 1
    assert [_described(t) for t in second] == [_described(t) for t in first]
    assert [tuple(t.shape) for t in second] == [(2, 5, 16), (2, 5, 1), (2, 5, 1)]
    assert all(a is not b for a, b in zip(first, second, strict=True))  # fresh tensors


def test_an_ops_arguments_flatten_one_list_deep_into_a_hashable_structure():
    from inspector.graph.metamemo import flat_arguments

    x = torch.empty(2, device="meta")
    structure, leaves = flat_arguments((x, [2, 3], 1.0), {"dim": (0,), "out": None})
    assert leaves == [x, 2, 3, 1.0, 0, None]
    assert structure == (3, ("dim", "out"), None, (list, 2), None, (tuple, 1), None)
    assert hash(structure) is not None  # a key on any torch (an older TreeSpec is not)
    # the same leaves in another shape are another structure
    assert flat_arguments((x, [2], 3, 1.0), {"dim": (0,), "out": None})[0] != structure
    assert flat_arguments((x, [[2, 3]]), {}) is None  # deeper than aten's lists
    assert flat_arguments((x, {"a": 1}), {}) is None


def test_meta_runs_in_one_graph_pass_share_their_answers(monkeypatch) -> None:  # noqa: ANN001
    """The graph pass runs the model on meta more than once (the leaves' insides, other
    dims): the second run is answered from the first one's memo."""
    import inspector.graph.metamemo as metamemo
    from inspector.graph.metarun import meta_answers_shared, run_on_meta

    block = [nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)]
    model = nn.Sequential(*[nn.Sequential(*block) for _ in range(3)])
    x = _meta(4, 16)
    answered = []
    fresh = metamemo._fresh
    monkeypatch.setattr(metamemo, "_fresh", lambda known: answered.append(1) or fresh(known))
    outs = []
    with meta_answers_shared():
        for _ in range(2):
            outs.append(_described(run_on_meta(model, lambda: model(x))))
    assert outs[0] == outs[1] == ((4, 16), (16, 1), torch.float32, "meta")
    # the first run: blocks 2 and 3 (4 kernels each); the second: all three blocks
    assert len(answered) == 2 * 4 + 3 * 4
    answered.clear()
    run_on_meta(model, lambda: model(x))  # outside: a memo of its own
    assert len(answered) == 2 * 4
