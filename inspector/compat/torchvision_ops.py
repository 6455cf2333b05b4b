"""torchvision without its C++ ops: pure-PyTorch `nms` so that its models import and run.

A torchvision wheel built for another torch (PyPI has only CUDA builds of the release that
matches our CPU torch) cannot load `torchvision/_C.so`. Its import then fails in
`_meta_registrations` (`operator torchvision::nms does not exist`), and with it every
`transformers` import that looks for torchvision. Defining `nms` and `qnms` here, before
torchvision is imported, makes the import and every torchvision model work: detection
post-processing runs the same greedy NMS as torchvision's CPU kernel.

torchvision's own Python fallback for `roi_align` compiles itself with inductor on first use
(30 s, a C compiler, and compiled kernels under fake tensors), keeps its large eager
intermediates for backward and, run eagerly, takes seconds a detection forward. Here the
same computation (`inspector/compat/roialign.py`: one `embedding_bag`, its results those of
the fallback) runs inside one op that, like the C++ kernel, saves only the boxes for
backward and whose fake kernel allocates only the output, so the memory figures of
detection models are the native kernel's.

Where `_C.so` loads (a matching build), nothing is changed. The hook only looks when
torchvision is first imported, so a process that never imports it pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path
from typing import Any

__all__ = ["install_import_hook", "nms_reference", "roi_align_fallback", "uses_pure_torch_ops"]

_state: dict[str, Any] = {"library": None, "roi_align_eager": None, "native": None}


def uses_pure_torch_ops() -> bool:
    """True when this process runs torchvision on the pure-PyTorch `nms` defined here."""
    return _state["library"] is not None


def nms_reference(dets: Any, scores: Any, iou_threshold: float) -> Any:
    """Greedy NMS as torchvision's CPU kernel does it: stable descending score order, a box
    is dropped when its IoU with a kept box is > `iou_threshold`; areas without +1."""
    import numpy as np
    import torch

    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    boxes = dets.detach().to("cpu", torch.float64).numpy()
    order = torch.sort(scores.detach().cpu(), stable=True, descending=True)[1].numpy()
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    suppressed = np.zeros(len(boxes), dtype=bool)
    keep = []
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = order[pos + 1 :]
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[iou > iou_threshold]] = True
    return torch.tensor(keep, dtype=torch.long, device=dets.device)


def _qnms(dets: Any, scores: Any, iou_threshold: float) -> Any:
    # torchvision hands int_repr() values; NMS depends only on their order and overlaps.
    return nms_reference(dets.float(), scores.float(), iou_threshold)


def _roi_align_eager() -> Any:
    from inspector.compat.roialign import roi_align_bags

    return roi_align_bags


def roi_align_fallback() -> Any:
    """torchvision's own eager Python roi_align (the reference of `roi_align_bags`)."""
    return _state["roi_align_eager"]


def _define_roi_align(lib: Any) -> Any:
    import torch

    lib.define(
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    )
    lib.define(
        "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor"
    )

    def forward(x, rois, scale, ph, pw, ratio, aligned):  # noqa: ANN001, ANN202
        with torch.no_grad():
            return _roi_align_eager()(x, rois, scale, ph, pw, ratio, aligned)

    def backward_kernel(grad, rois, scale, ph, pw, b, c, h, w, ratio, aligned):  # noqa: ANN001, ANN202
        from inspector.compat.roialign import roi_align_bags_backward

        return roi_align_bags_backward(grad, rois, scale, ph, pw, (b, c, h, w), ratio, aligned)

    def fake(x, rois, scale, ph, pw, ratio, aligned):  # noqa: ANN001, ANN202
        return x.new_empty((rois.shape[0], x.shape[1], ph, pw))

    def fake_backward(grad, rois, scale, ph, pw, b, c, h, w, ratio, aligned):  # noqa: ANN001, ANN202
        return grad.new_empty((b, c, h, w))

    def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN202
        x, rois, *args = inputs
        ctx.save_for_backward(rois)
        ctx.args, ctx.input_shape = args, x.shape

    def backward(ctx, grad):  # noqa: ANN001, ANN202
        (rois,) = ctx.saved_tensors
        scale, ph, pw, ratio, aligned = ctx.args
        b, c, h, w = ctx.input_shape
        dx = torch.ops.torchvision._roi_align_backward(
            grad, rois, scale, ph, pw, b, c, h, w, ratio, aligned
        )
        return dx, None, None, None, None, None, None

    lib.impl("roi_align", forward, "CPU")
    lib.impl("_roi_align_backward", backward_kernel, "CPU")
    torch.library.register_fake("torchvision::roi_align", fake, lib=lib)
    torch.library.register_fake("torchvision::_roi_align_backward", fake_backward, lib=lib)
    torch.library.register_autograd(
        "torchvision::roi_align", backward, setup_context=setup_context, lib=lib
    )


def _native_ops_load(package_dir: Path) -> bool:
    import torch

    for so in package_dir.glob("_C*.so"):
        try:
            torch.ops.load_library(str(so))
            return True
        except (OSError, ImportError, RuntimeError):
            return False
    return False


def _define_ops() -> None:
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", nms_reference, "CPU")
    lib.impl("qnms", _qnms, "CPU")
    _state["library"] = lib  # the registration lives as long as the Library object


def _after_import() -> None:
    import torch

    _define_roi_align(_state["library"])
    # `nms` asks for the C++ ops before it calls the op defined here.
    sys.modules["torchvision.ops.boxes"]._assert_has_ops = lambda: None
    # roi_align takes its Python fallback when the C++ ops are missing; send it to the op,
    # which runs that fallback eagerly (unwrapped from torchvision's lazy_compile).
    roi_align = sys.modules["torchvision.ops.roi_align"]
    _state["roi_align_eager"] = getattr(roi_align._roi_align, "__wrapped__", roi_align._roi_align)
    roi_align._roi_align = torch.ops.torchvision.roi_align


class _Loader(importlib.abc.Loader):
    """torchvision's own loader, with the ops defined before it runs and patched after."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        _remove_hook()
        if not uses_pure_torch_ops():
            _define_ops()
        self.inner.exec_module(module)
        _after_import()


class _FirstImport(importlib.abc.MetaPathFinder):
    """Hands out torchvision's spec with `_Loader` until torchvision is imported; a plain
    `importlib.util.find_spec("torchvision")` changes nothing."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torchvision":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            return spec
        if _state["native"] is None:
            _state["native"] = _native_ops_load(Path(next(iter(spec.submodule_search_locations))))
        if not _state["native"]:
            spec.loader = _Loader(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _FirstImport)]


def install_import_hook() -> None:
    """Make a later `import torchvision` work without its C++ ops (idempotent)."""
    if "torchvision" in sys.modules or any(isinstance(f, _FirstImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _FirstImport())
