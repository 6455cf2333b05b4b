"""roi_align in pure PyTorch, fast on CPU: torchvision's Python fallback, with its gather
replaced by one `embedding_bag`.

torchvision's fallback (`torchvision.ops.roi_align._roi_align`) samples every bin at
`IY x IX` points and gathers the four neighbours of each point with 6-d advanced indexing
over `[K, C, PH, PW, IY, IX]`: ~1.8 s a Faster R-CNN forward on CPU. Bilinear weights
depend only on the point, not the channel, so the same sum is a weighted bag of rows of
the feature map laid out channels-last (`[N*H*W, C]`): each output bin `(k, ph, pw)` is
the bag of its `IY * IX * 4` neighbour rows with their bilinear weights, and
`embedding_bag(mode="sum", per_sample_weights=...)` computes all bins at once; the
backward sends each bin's gradient to the same rows with the same weights (one sparse
product, no autograd: the op's backward kernel may run where autograd is off). Sample
positions and weights are computed as the fallback does; adaptive sampling
(`sampling_ratio <= 0`) bags the largest grid of any box and points the unused samples at
an excluded padding row, as the fallback masks them out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["roi_align_bags", "roi_align_bags_backward"]


@dataclass
class _Bags:
    index: torch.Tensor  # [K * PH * PW, IY * IX * 4] rows of the channels-last map
    weights: torch.Tensor  # the same shape: bilinear weight of each row
    count: torch.Tensor  # [K] samples a bin (the average's divisor)
    pad: int  # the row index left out (the samples adaptive sampling masks)


def _bags(
    rois: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, spatial_scale: float,
    pooled: tuple[int, int], sampling_ratio: int, aligned: bool,
) -> _Bags:  # fmt: skip
    n, _, h, w = shape
    y, ymask, count_h = _samples(rois, 2, spatial_scale, pooled[0], sampling_ratio, aligned)
    x, xmask, count_w = _samples(rois, 1, spatial_scale, pooled[1], sampling_ratio, aligned)
    ylo, yhi, ly = _neighbours(y.to(dtype), h)  # [K, PH, IY] each
    xlo, xhi, lx = _neighbours(x.to(dtype), w)  # [K, PW, IX]
    hy, hx = 1.0 - ly, 1.0 - lx
    base = rois[:, 0].long()[:, None, None, None, None] * (h * w)  # [K, 1, 1, 1, 1]

    def corner(yi: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:  # [K, PH, PW, IY, IX]
        return base + yi[:, :, None, :, None] * w + xi[:, None, :, None, :]

    def weight(wy: torch.Tensor, wx: torch.Tensor) -> torch.Tensor:
        return wy[:, :, None, :, None] * wx[:, None, :, None, :]

    index = torch.stack(
        [corner(ylo, xlo), corner(ylo, xhi), corner(yhi, xlo), corner(yhi, xhi)], -1
    )
    weights = torch.stack([weight(hy, hx), weight(hy, lx), weight(ly, hx), weight(ly, lx)], -1)
    pad = n * h * w
    if ymask is not None:
        used = ymask[:, None, None, :, None, None] & xmask[:, None, None, None, :, None]
        index = torch.where(used, index, pad)
    bags = rois.shape[0] * pooled[0] * pooled[1]
    count = torch.clamp(count_h * count_w, min=1).to(dtype)
    return _Bags(index.reshape(bags, -1), weights.reshape(bags, -1), count, pad)


def roi_align_bags(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """torchvision's `roi_align(input [N, C, H, W], rois [K, 5], ...)` -> [K, C, PH, PW]."""
    n, c, h, w = input.shape
    k = rois.shape[0]
    if k == 0:
        return input.new_zeros((0, c, pooled_height, pooled_width))
    pooled = (pooled_height, pooled_width)
    b = _bags(rois, input.shape, input.dtype, spatial_scale, pooled, sampling_ratio, aligned)
    rows = torch.cat([input.permute(0, 2, 3, 1).reshape(n * h * w, c), input.new_zeros(1, c)])
    out = F.embedding_bag(
        b.index, rows, mode="sum", per_sample_weights=b.weights, padding_idx=b.pad
    )  # [K * PH * PW, C]
    out = out.view(k, pooled_height, pooled_width, c).permute(0, 3, 1, 2)
    return out / b.count.view(-1, 1, 1, 1)


def roi_align_bags_backward(
    grad: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    shape: tuple[int, int, int, int],
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """The gradient of `roi_align_bags` w.r.t. its input of `shape`, without autograd (a
    kernel may run where autograd is off, under a dispatch mode): each bin's gradient
    goes back to its rows with the same weights, one sparse product."""
    n, c, h, w = shape
    k = rois.shape[0]
    if k == 0:
        return grad.new_zeros(shape)
    pooled = (pooled_height, pooled_width)
    b = _bags(rois, shape, grad.dtype, spatial_scale, pooled, sampling_ratio, aligned)
    per_bin = (grad / b.count.view(-1, 1, 1, 1)).permute(0, 2, 3, 1).reshape(-1, c)
    bins, samples = b.index.shape
    keep = b.index.reshape(-1) != b.pad
    bin_ids = torch.arange(bins, device=grad.device).repeat_interleave(samples)[keep]
    spread = torch.sparse_coo_tensor(
        torch.stack([b.index.reshape(-1)[keep], bin_ids]),
        b.weights.reshape(-1)[keep],
        (n * h * w, bins),
        check_invariants=False,  # in range by construction; says so instead of a warning
    )
    rows = torch.sparse.mm(spread, per_bin)  # [N * H * W, C]; repeated rows are summed
    return rows.view(n, h, w, c).permute(0, 3, 1, 2).contiguous()


def _samples(
    rois: torch.Tensor, axis: int, scale: float, pooled: int, ratio: int, aligned: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Sample coordinates along one axis (2: y, 1: x) [K, P, I], the mask of samples in
    use (adaptive sampling) [K, I], and the grid size per box [K]."""
    offset = 0.5 if aligned else 0.0
    start = rois[:, axis] * scale - offset
    size = rois[:, axis + 2] * scale - offset - start
    if not aligned:
        size = torch.clamp(size, min=1.0)
    bin_size = size / pooled
    if ratio > 0:
        grid = torch.full_like(size, float(ratio))
        points = torch.arange(ratio, device=rois.device)
        mask = None
    else:
        grid = torch.ceil(size / pooled)
        points = torch.arange(max(int(grid.max()), 1), device=rois.device)
        mask = points[None, :] < grid[:, None]
    p = torch.arange(pooled, device=rois.device)
    coords = (
        start[:, None, None]
        + p[None, :, None] * bin_size[:, None, None]
        + (points[None, None, :] + 0.5).to(rois.dtype) * (bin_size / grid)[:, None, None]
    )
    return coords, mask, grid


def _neighbours(v: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(low index, high index, weight of the high one), as torchvision's fallback clamps."""
    v = v.clamp(min=0)
    low = v.int()
    edge = low >= size - 1
    high = torch.where(edge, size - 1, low + 1)
    low = torch.where(edge, size - 1, low)
    v = torch.where(edge, low.to(v.dtype), v)
    return low.long(), high.long(), v - low
