"""The default loss: mean(output * r) over the floating outputs, r a fixed random
direction per output, drawn once where the gradients pass forms the loss twice."""

from __future__ import annotations

import torch

from inspector.context import Inputs
from inspector.health import outputs
from inspector.health.outputs import directions_kept, make_loss


def test_the_loss_is_the_mean_of_each_output_times_its_fixed_direction() -> None:
    out = (torch.arange(6.0).reshape(2, 3), torch.ones(4))
    loss, how = make_loss(out, Inputs(), None)
    first = torch.randn(2, 3, generator=torch.Generator().manual_seed(outputs._PROBE_SEED))
    second = torch.randn(4, generator=torch.Generator().manual_seed(outputs._PROBE_SEED + 1))
    by_hand = (out[0] * first).mean() + second.mean()
    assert torch.allclose(loss, by_hand)
    assert how == outputs.DEFAULT_LOSS


def test_a_direction_is_drawn_once_within_the_block_and_not_kept_after(monkeypatch) -> None:
    drawn = []
    randn = torch.randn

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        drawn.append(args[0])
        return randn(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", counted)
    out = torch.ones(3, 5)
    with directions_kept():
        a, _ = make_loss(out, Inputs(), None)
        b, _ = make_loss(out * 2, Inputs(), None)  # another value, the same direction
        make_loss(torch.ones(7), Inputs(), None)  # another shape: its own
    assert drawn == [torch.Size([3, 5]), torch.Size([7])]
    assert torch.equal(2 * a, b)
    assert outputs._kept is None
    make_loss(out, Inputs(), None)
    assert len(drawn) == 3  # outside the block, drawn again: the same values
