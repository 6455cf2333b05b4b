"""Memory estimate vs torchinfo vs measured, on the test models; fake-mode speed; and a
Llama-style decoder with 70B dimensions analysed on fake tensors.

    .venv/bin/python bench/memory.py                    # every comparison case
    .venv/bin/python bench/memory.py mlp small_cnn      # some of them
    .venv/bin/python bench/memory.py llama70b [LAYERS]  # the 70B-shaped decoder (fake)
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py kernels  # the kernel-memory nets
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py kernel-shapes  # formulas vs kernels
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py kernel-grid  # 480 3x3 conv calls
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory.py kernel-depthwise  # 1,152 dw calls

"kernels" runs the nets whose CPU kernels allocate memory of their own (issue #16:
oneDNN's LSTM workspace, convolution layout copies): 2-layer LSTMs and GRUs, small
r3d_18, DeepLabV3 and ConvNeXt equivalents (tests/kernel_models.py), at one thread
(oneDNN's per-thread reduction buffers are not modelled).

Each comparison runs the memory pass three ways: on the real model with the measurement
(torch.profiler on CPU, cuda.max_memory_allocated on GPU), and on the same architecture
built inside a FakeTensorMode (no weight allocated). Optimizer AdamW, float32.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import kernel_models as km  # noqa: E402  (tests/kernel_models.py)
import models  # noqa: E402  (tests/models.py)

from inspector.context import Context, InputFactory, Inputs, LoadedModel, Options  # noqa: E402
from inspector.loaders.fakebuild import building_under  # noqa: E402
from inspector.memory.shadow import new_fake_mode  # noqa: E402
from inspector.passes import measure as measure_pass  # noqa: E402
from inspector.passes import memory as memory_pass  # noqa: E402
from inspector.report import Report  # noqa: E402

CASES = {  # name: (maker, batch, extra shape args)
    "resnet18": (models.make_resnet18, 32, (224,)),
    "gpt2": (models.make_gpt2, 4, (512,)),
    "bert": (models.make_bert, 8, (128,)),
    "mlp": (models.make_mlp, 32, ()),
    "small_cnn": (models.make_small_cnn, 8, ()),
}


def _rnn(cell: str, **kw: Any) -> Any:
    def make(batch: int, steps: int) -> Any:
        return km.make_rnn(cell, batch, steps, **kw)

    return make


KERNEL_CASES = {  # 2 layers, input 64, hidden 128, 50 steps
    "lstm": (_rnn("lstm"), 16, (50,)),
    "lstm_batch_first": (_rnn("lstm", batch_first=True), 16, (50,)),
    "lstm_bidirectional": (_rnn("lstm", bidirectional=True), 16, (50,)),
    "gru": (_rnn("gru"), 16, (50,)),
    "gru_batch_first_bidirectional": (_rnn("gru", batch_first=True, bidirectional=True), 16, (50,)),
    "r3d_small": (km.make_r3d, 2, (8, 56)),
    "deeplab_small": (km.make_deeplab, 2, (256,)),
    "convnext_small": (km.make_convnext, 4, (128,)),
}
CASES.update(KERNEL_CASES)


class BatchFactory(InputFactory):
    """Inputs from a tests/models.py maker at any batch size (dim "B")."""

    def __init__(self, maker: Any, batch: int, extra: tuple[int, ...]) -> None:
        super().__init__({"B": batch})
        self.maker, self.extra = maker, extra

    def build(self, dims: dict[str, int] | None = None, device: str = "cpu") -> Inputs:
        b = (dims or {}).get("B", self.dims["B"])
        _, (args, kwargs) = self.maker(b, *self.extra)
        return Inputs(args, kwargs, {"B": b})

    @property
    def batch_dim(self) -> str:
        return "B"


def context(model: Any, inputs: Inputs, factory: InputFactory, options: Options, fake_mode=None):
    loaded = LoadedModel(model, "python", "bench", fake_mode=fake_mode)
    return Context(loaded, factory, inputs, options, Report(), fake_mode=fake_mode)


def torchinfo_bytes(model: Any, inputs: Inputs) -> int:
    """torchinfo's "Forward/backward pass size" + "Params size", in bytes."""
    from torchinfo import summary

    stats = summary(model, input_data=list(inputs.args) or None, verbose=0, **inputs.kwargs)
    return int(stats.total_output_bytes + stats.total_param_bytes)


def compare(name: str, with_torchinfo: bool = True) -> dict[str, Any]:
    maker, batch, extra = CASES[name]
    torch.manual_seed(0)
    model, (args, kwargs) = maker(batch, *extra)
    factory = BatchFactory(maker, batch, extra)
    real = context(model, Inputs(args, kwargs, {"B": batch}), factory, Options(fake=False))
    memory_pass.run(real)
    measure_pass.run(real)
    info = torchinfo_bytes(model, real.inputs) if with_torchinfo else 0
    measured = real.results.memory_measured
    del model, real.loaded.model
    fake_mode = new_fake_mode()
    with building_under(fake_mode):
        fmodel, (fargs, fkwargs) = maker(batch, *extra)
    fake = context(
        fmodel, Inputs(fargs, fkwargs, {"B": batch}), factory, Options(fake=True), fake_mode
    )
    memory_pass.run(fake)  # once to warm up imports (torch._dynamo is imported lazily)
    fake = context(
        fmodel, Inputs(fargs, fkwargs, {"B": batch}), factory, Options(fake=True), fake_mode
    )
    start = time.perf_counter()
    memory_pass.run(fake)
    fake_s = time.perf_counter() - start
    return {
        "name": name,
        "torchinfo": info,
        "real": real.report.memory,
        "fake": fake.report.memory,
        "measured": measured,
        "fake_s": fake_s,
    }


def _err(estimate: int | None, measured: int) -> str:
    return "-" if estimate is None else f"{(estimate - measured) / measured * 100:+.3f}%"


def print_kernel_row(r: dict[str, Any]) -> None:
    """Saved, training-step peak and inference forward peak: ours on the real model / on
    the model built fake (--fake) / measured (errors)."""
    m, real, fake = r["measured"], r["real"], r["fake"]
    mib = 1024**2
    cells = [
        f"{getattr(real, key) / mib:.2f} / {getattr(fake, key) / mib:.2f} / "
        f"{theirs / mib:.2f} ({_err(getattr(real, key), theirs)}, "
        f"{_err(getattr(fake, key), theirs)})"
        for key, theirs in (
            ("saved_activation_bytes", m.saved_activation_bytes),
            ("train_peak_bytes", m.train_peak_bytes),
            ("forward_peak_bytes", m.forward_peak_bytes),
        )
    ]
    ops = ", ".join(getattr(r["real"], "unmodelled_kernel_ops", ["(not reported)"])) or "-"
    print(f"| {r['name']} | {' | '.join(cells)} | {ops} |", flush=True)


CONV_SHAPES = [  # (Conv2d/Conv3d args, input shape, channels-last)
    ((3, 32, 3, 1, 1), (2, 3, 32, 32), False),
    ((16, 32, 3, 1, 1), (2, 16, 32, 32), False),
    ((24, 32, 3, 1, 1), (2, 24, 32, 32), False),
    ((32, 24, 3, 1, 1), (2, 32, 32, 32), False),
    ((32, 32, 3, 2, 1), (2, 32, 32, 32), False),
    ((32, 64, 1, 2, 0), (2, 32, 32, 32), False),
    ((64, 64, 3, 1, 2, 2), (2, 64, 32, 32), False),
    ((64, 64, 3, 1, 6, 6), (2, 64, 32, 32), False),
    ((64, 64, 3, 1, 12, 12), (2, 64, 32, 32), False),
    ((64, 64, 3, 1, 24, 24), (2, 64, 64, 64), False),
    ((96, 96, 7, 1, 3, 1, 96), (2, 96, 56, 56), False),
    ((64, 64, 5, 1, 2), (2, 64, 32, 32), False),
    ((64, 128, 3, 1, 1, 1, 2), (2, 64, 32, 32), False),
    ((16, 16, 3, 1, 1), (2, 16, 8, 16, 16), False),
    ((32, 64, 3, 2, 1), (2, 32, 8, 16, 16), False),
    ((3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3)), (2, 3, 8, 32, 32), False),
    ((32, 32, 7, 1, 3, 1, 32), (4, 32, 32, 32), True),
    ((32, 64, 2, 2, 0), (4, 32, 32, 32), True),
    ((32, 32, 3, 1, 1), (2, 32, 32, 32), True),
    ((3, 32, 3, 1, 1), (2, 3, 32, 32), True),
    ((96, 96, 7, 1, 3, 1, 96), (2, 96, 16, 16), True),
    ((24, 32, 3, 1, 1), (2, 24, 16, 16), True),
    ((48, 48, 7, 1, 3, 1, 48), (2, 48, 28, 28), True),
]


def _conv_step(conv: Any, x: torch.Tensor, r: torch.Tensor) -> Any:
    def step() -> None:
        (conv(x) * r).sum().backward()  # a contiguous output gradient, as from a norm

    return step


def kernel_shapes() -> None:
    """Each conv's kernel memory, formula vs the profiler, forward and backward."""
    from torch import nn

    torch.set_num_threads(1)
    print("| conv | input | layout | forward measured / formula | backward measured / formula |")
    print("|---|---|---|---|---|")
    for conv_args, shape, channels_last in CONV_SHAPES:
        conv = (nn.Conv2d if len(shape) == 4 else nn.Conv3d)(*conv_args)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = torch.randn(shape).to(memory_format=fmt).requires_grad_(True)
        r = torch.randn(conv(x).shape).to(memory_format=fmt)
        step = _conv_step(conv, x, r)
        found = km.formulas_of(step)
        cells = []
        for op, name in (
            (torch.ops.aten.convolution.default, "aten::convolution"),
            (torch.ops.aten.convolution_backward.default, "aten::convolution_backward"),
        ):
            km_ = found.get(op)
            text = "-" if km_ is None else f"{km_.scratch_bytes:,}{' (partial)' * km_.partial}"
            cells.append(f"{km.op_excess(step, name):,} / {text}")
        layout = "NHWC" if channels_last else "NCHW"
        print(f"| {conv_args} | {list(shape)} | {layout} | {cells[0]} | {cells[1]} |", flush=True)


_CONV_OPS = (
    (torch.ops.aten.convolution.default, "aten::convolution"),
    (torch.ops.aten.convolution_backward.default, "aten::convolution_backward"),
)


def _tally(step: Any, counts: dict[str, int], label: str) -> None:
    """Each conv call of `step`: its formula against the profiler, counted as exact,
    partial (reported), short or over; short and over calls are printed."""
    found = km.formulas_of(step)
    for op, name in _CONV_OPS:
        k = found.get(op)
        if k is None:  # another backend (batch 1: slow_conv_dilated2d)
            continue
        measured = km.op_excess(step, name)
        kind = "partial" if k.partial else "exact"
        if not k.partial and measured != k.scratch_bytes:
            kind = "short" if measured > k.scratch_bytes else "over"
            print(f"{kind}: {label} {name} {measured:,} / {k.scratch_bytes:,}", flush=True)
        counts[kind] += 1


def kernel_grid() -> None:
    """NCHW 3x3 convs over batch, channels, map size and dilation: each call's formula is
    byte-exact or says it is partial (reported); a call counted short is printed."""
    from torch import nn

    torch.set_num_threads(1)
    counts = {"exact": 0, "partial": 0, "short": 0, "over": 0}
    for n in (1, 2, 4):
        for ic, oc in ((64, 32), (256, 64), (960, 256)):
            for h in (2, 4, 8, 16, 32):
                for d in (1, 2, 4, 6, 8, 12, 24, 36):
                    conv = nn.Conv2d(ic, oc, 3, padding=d, dilation=d, bias=False)
                    x = torch.randn(n, ic, h, h).requires_grad_(True)
                    step = _conv_step(conv, x, torch.randn(conv(x).shape))
                    _tally(step, counts, f"n={n} ic={ic} h={h} d={d}")
    print(counts)


def _depthwise_input(layout: str, n: int, c: int, h: int) -> torch.Tensor:
    """Dense NCHW/NHWC, or channels c..2c of a 3c tensor (CoaT's qkv slices)."""
    if layout == "nhwc":
        return torch.randn(n, c, h, h).to(memory_format=torch.channels_last)
    if layout == "nhwc-slice":
        return torch.randn(n, h, h, 3 * c).permute(0, 3, 1, 2)[:, c : 2 * c].detach()
    if layout == "nchw-slice":
        return torch.randn(n, 3 * c, h, h)[:, c : 2 * c].detach()
    return torch.randn(n, c, h, h)


def kernel_depthwise() -> None:
    """Depthwise convs (3x3-7x7, 2-16 px, 16/24/96 channels, stride 1-2, bias or not) in
    four layouts: each call's formula byte-exact, or partial (reported); short or over
    calls are printed."""
    from torch import nn

    torch.set_num_threads(1)
    counts = {"exact": 0, "partial": 0, "short": 0, "over": 0}
    grid = [
        (layout, k, h, c, stride, bias)
        for layout in ("nhwc", "nhwc-slice", "nchw", "nchw-slice")
        for k in (3, 5, 7)
        for h in (2, 4, 8, 16)
        for c in (16, 24, 96)
        for stride in (1, 2)
        for bias in (True, False)
    ]
    for layout, k, h, c, stride, bias in grid:
        conv = nn.Conv2d(c, c, k, padding=k // 2, groups=c, bias=bias, stride=stride)
        x = _depthwise_input(layout, 2, c, h).requires_grad_(True)
        fmt = torch.channels_last if layout.startswith("nhwc") else torch.contiguous_format
        step = _conv_step(conv, x, torch.randn(conv(x).shape).to(memory_format=fmt))
        _tally(step, counts, f"{layout} k={k} h={h} c={c} s={stride} bias={bias:d}")
    print(counts)


def print_row(r: dict[str, Any]) -> None:
    m, real, fake = r["measured"], r["real"], r["fake"]
    mib = 1024**2
    print(
        f"| {r['name']} | {r['torchinfo'] / mib:.1f} | "
        f"saved {real.saved_activation_bytes / mib:.2f} / "
        f"{fake.saved_activation_bytes / mib:.2f} / {m.saved_activation_bytes / mib:.2f} "
        f"({_err(real.saved_activation_bytes, m.saved_activation_bytes)}, "
        f"{_err(fake.saved_activation_bytes, m.saved_activation_bytes)}) | "
        f"peak {real.train_peak_bytes / mib:.2f} / {fake.train_peak_bytes / mib:.2f} / "
        f"{m.train_peak_bytes / mib:.2f} ({_err(real.train_peak_bytes, m.train_peak_bytes)}, "
        f"{_err(fake.train_peak_bytes, m.train_peak_bytes)}) | "
        f"fwd {fake.forward_peak_bytes / mib:.2f} / {m.forward_peak_bytes / mib:.2f} "
        f"({_err(fake.forward_peak_bytes, m.forward_peak_bytes)}) | "
        f"fake {r['fake_s']:.2f} s, measured step {m.step_seconds:.2f} s "
        f"({m.step_seconds / r['fake_s']:.1f}x) |",
        flush=True,
    )


def llama70b(layers: int = 80, seq: int = 4096) -> dict[str, Any]:
    """The 70B-shaped decoder built inside a FakeTensorMode, bf16 weights, AdamW."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
        vocab_size=128256,
        max_position_embeddings=seq,
        attention_dropout=0.0,
    )
    config._attn_implementation = "sdpa"
    fake_mode = new_fake_mode()
    start = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # bf16 weights from the start
    try:
        with building_under(fake_mode):
            model = LlamaForCausalLM(config)
            ids = torch.randint(0, config.vocab_size, (1, seq))
    finally:
        torch.set_default_dtype(default)
    build_s = time.perf_counter() - start

    class Factory(InputFactory):
        def build(self, dims=None, device="cpu"):  # noqa: ANN001, ANN202
            b = (dims or {}).get("B", 1)
            return Inputs(
                (), {"input_ids": torch.randint(0, config.vocab_size, (b, seq))}, {"B": b}
            )

        @property
        def batch_dim(self) -> str:
            return "B"

    ctx = context(
        model,
        Inputs((), {"input_ids": ids}, {"B": 1}),
        Factory({"B": 1}),
        Options(fake=True),
        fake_mode,
    )
    start, cpu = time.perf_counter(), time.process_time()
    memory_pass.run(ctx)
    run_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    by_label = ctx.results.memory.train.saved_by_label
    from inspector.memory.advice import subtree_bytes

    per_layer = subtree_bytes(by_label).get("model.layers.1", 0)
    if "--detail" in sys.argv:
        s, h = seq, config.hidden_size
        for k, v in sorted(by_label.items(), key=str):
            if k and k.startswith("model.layers.1"):
                print(f"    {k}: {v:,} B = {v / (s * h):.3f} sbh")
    return {
        "build_s": build_s,
        "run_s": run_s,
        "cpu_s": cpu_s,
        "rss": rss,
        "memory": ctx.report.memory,
        "per_layer": per_layer,
        "config": config,
        "seq": seq,
    }


def korthikanti(s: int, b: int, h: int, a: int) -> int:
    """Korthikanti et al. 2022, 16-bit activations per transformer layer: sbh(34 + 5as/h)."""
    return int(s * b * h * (34 + 5 * a * s / h))


def print_llama(r: dict[str, Any]) -> None:
    m, c, s = r["memory"], r["config"], r["seq"]
    gib = 1024**3
    print(f"llama-70B-shaped, {c.num_hidden_layers} layers, [1, {s}], bf16 weights, AdamW, fake")
    print(
        f"  build {r['build_s']:.1f} s, memory pass {r['run_s']:.1f} s wall / "
        f"{r['cpu_s']:.1f} s CPU, max RSS {r['rss'] / gib:.2f} GiB"
    )
    print(
        f"  params {m.param_bytes / gib:.2f} GiB, grads {m.grad_bytes / gib:.2f} GiB, "
        f"optimizer {m.optimizer_bytes / gib:.2f} GiB"
    )
    print(
        f"  saved activations {m.saved_activation_bytes / gib:.2f} GiB, train peak "
        f"{m.train_peak_bytes / gib:.2f} GiB at {m.train_peak_node} ({m.train_peak_phase})"
    )
    print(
        f"  per layer (model.layers.1): {r['per_layer']:,} B = "
        f"{r['per_layer'] / (s * c.hidden_size):.2f} sbh;"
        f" Korthikanti {korthikanti(s, 1, c.hidden_size, c.num_attention_heads):,} B"
    )
    print(
        f"  max batch: {m.max_batch}, fixed {m.fixed_bytes:,} B + {m.per_sample_bytes:,} B/sample"
    )


def main(argv: list[str]) -> None:
    if argv and argv[0] == "llama70b":
        print_llama(llama70b(*(int(x) for x in argv[1:] if x.isdigit())))
        return
    if argv and argv[0] == "kernel-grid":
        kernel_grid()
        return
    if argv and argv[0] == "kernel-shapes":
        kernel_shapes()
        return
    if argv and argv[0] == "kernel-depthwise":
        kernel_depthwise()
        return
    if argv and argv[0] == "kernels":
        print(
            "| net | saved MiB real / fake / measured (err) | train peak MiB real / fake / "
            "measured (err) | forward peak MiB real / fake / measured (err) "
            "| kernels not modelled |"
        )
        print("|---|---|---|---|---|")
        for name in argv[1:] or list(KERNEL_CASES):
            print_kernel_row(compare(name, with_torchinfo=False))
        return
    print(
        "| model | torchinfo MiB | saved MiB ours real / fake / measured (err) | "
        "train peak MiB ours real / fake / measured (err) | forward peak fake / measured | speed |"
    )
    print("|---|---|---|---|---|---|")
    for name in argv or list(CASES):
        print_row(compare(name))


if __name__ == "__main__":
    main(sys.argv[1:])
