"""Hand-made reports for the page tests and the web benchmark (no torch, no worker).

`small_report()` has numbers chosen by hand so tests can check what the pages show;
`synthetic_report(n)` is a transformer-like stack of about `n` nodes for scale tests.
"""

from __future__ import annotations

from inspector.report import (
    BatchPoint,
    Capture,
    CaptureAttempt,
    Finding,
    Gradients,
    LayerGrad,
    Memory,
    Meta,
    ModeDiff,
    Module,
    Node,
    NumericStats,
    ParamGrad,
    Report,
    TensorInfo,
    TimelinePoint,
    Totals,
)

GIB = 1024**3
MIB = 1024**2


def _tensor(shape: list[int], sym: list | None = None, dtype: str = "float32") -> TensorInfo:
    numel = 1
    for d in shape:
        numel *= d
    return TensorInfo(shape=shape, sym_shape=sym, dtype=dtype, bytes=numel * 4)


def small_report(
    *, name: str = "tiny-mlp", params: int = 676, flops: int = 10_240, train_peak: int = 4 * MIB
) -> Report:
    """A 2-layer MLP: root Net -> fc1 (Linear), act (ReLU), fc2 (Linear)."""
    x, h, y = _tensor([8, 16], ["B", 16]), _tensor([8, 32], ["B", 32]), _tensor([8, 4], ["B", 4])
    nodes = [
        Node(id=0, name="x", op="placeholder", target="x", output_tensors=[x]),
        Node(
            id=1,
            name="fc1",
            op="call_module",
            target="fc1",
            module_path="fc1",
            module_type="Linear",
            inputs=[0],
            input_tensors=[x],
            output_tensors=[h],
            params=544,
            flops=8192,
            output_bytes=1024,
            saved_bytes=512,
            grad_norm=0.5,
            location="model.py:12",
        ),
        Node(
            id=2,
            name="relu",
            op="call_function",
            target="torch.relu",
            module_path="",
            module_type="Net",
            inputs=[1],
            input_tensors=[h],
            output_tensors=[h],
            output_bytes=1024,
            saved_bytes=1024,
            grad_norm=0.25,
            stats=NumericStats(min=0.0, max=3.0, dead_fraction=0.5),
        ),
        Node(
            id=3,
            name="fc2",
            op="call_module",
            target="fc2",
            module_path="fc2",
            module_type="Linear",
            inputs=[2],
            input_tensors=[h],
            output_tensors=[y],
            params=132,
            flops=2048,
            output_bytes=128,
            saved_bytes=0,
            grad_norm=1.0,
        ),
        Node(id=4, name="output", op="output", target="output", inputs=[3]),
    ]
    modules = [
        Module(
            path="",
            type="Net",
            params=params,
            trainable_params=params,
            calls=1,
            input_shapes=[["B", 16]],
            output_shapes=[["B", 4]],
            output_dtypes=["float32"],
            flops_forward=flops,
            output_bytes=2176,
            saved_activation_bytes=1536,
        ),
        Module(
            path="fc1",
            type="Linear",
            depth=1,
            parent="",
            params=544,
            own_params=544,
            input_shapes=[["B", 16]],
            output_shapes=[["B", 32]],
            output_dtypes=["float32"],
            flops_forward=8192,
            output_bytes=1024,
            saved_activation_bytes=512,
            grad_norm=0.5,
        ),
        Module(
            path="fc2",
            type="Linear",
            depth=1,
            parent="",
            params=132,
            own_params=132,
            input_shapes=[["B", 32]],
            output_shapes=[["B", 4]],
            output_dtypes=["float32"],
            flops_forward=2048,
            output_bytes=128,
            saved_activation_bytes=0,
            grad_norm=1.0,
        ),
    ]
    return Report(
        meta=Meta(
            source_kind="python",
            source_name=f"{name}.py:Net",
            entrypoint="Net",
            input_spec={"x": {"shape": ["B", 16]}, "dims": {"B": 8}},
            dims={"B": 8},
            torch_version="2.13.0",
            inspector_version="0.1.0",
            timings_s={"load": 0.1, "capture": 0.2},
        ),
        capture=Capture(
            method="fx",
            node_count=len(nodes),
            attempts=[CaptureAttempt(method="fx", ok=True, seconds=0.01)],
        ),
        totals=Totals(
            params=params,
            trainable_params=params,
            flops_forward=flops,
            flops_backward=2 * flops,
            param_bytes=4 * params,
        ),
        nodes=nodes,
        modules=modules,
        memory=_memory(train_peak, nodes),
        gradients=Gradients(
            computed=True,
            loss="sum of outputs",
            thresholds={"vanishing": 1e-6, "exploding": 1e3},
            params=[
                ParamGrad(name="fc1.weight", module_path="fc1", shape=[32, 16], grad_norm=0.5),
                ParamGrad(name="fc2.weight", module_path="fc2", shape=[4, 32], grad_norm=1.0),
            ],
            layers=[
                LayerGrad(module_path="fc1", type="Linear", depth_index=0, grad_norm=0.5),
                LayerGrad(module_path="fc2", type="Linear", depth_index=1, grad_norm=1.0),
            ],
        ),
        modes=ModeDiff(computed=True, output_max_abs_diff=0.0),
        findings=[
            Finding(
                rule="dead-relu",
                severity="warning",
                where="relu",
                message="50% of the ReLU features are zero for the whole batch.",
                fix="Lower the learning rate or use LeakyReLU.",
            ),
            Finding(
                rule="no-bias-before-norm",
                severity="info",
                where="fc2",
                message="fc2 is a Linear layer feeding the loss.",
                fix="",
            ),
        ],
    )


def _memory(train_peak: int, nodes: list[Node]) -> Memory:
    timeline = [
        TimelinePoint(step=i, phase="forward", node=n.name, live_bytes=(i + 1) * 1024)
        for i, n in enumerate(nodes)
    ]
    timeline += [
        TimelinePoint(
            step=len(nodes) + i,
            phase="backward",
            node=f"{n.name}.grad",
            live_bytes=(len(nodes) - i) * 1024,
        )
        for i, n in enumerate(nodes)
    ]
    scaling = [
        BatchPoint(batch=b, forward_peak_bytes=b * GIB // 4, train_peak_bytes=b * GIB)
        for b in (1, 8, 16, 32, 64)
    ]
    return Memory(
        optimizer="adamw",
        param_bytes=4000,
        grad_bytes=4000,
        optimizer_bytes=8000,
        saved_activation_bytes=1536,
        forward_peak_bytes=2 * MIB,
        train_peak_bytes=train_peak,
        train_peak_node="fc1",
        timeline=timeline,
        batch_dim="B",
        batch_scaling=scaling,
        fixed_bytes=0,
        per_sample_bytes=GIB,
        max_batch={str(16 * GIB): 16, str(80 * GIB): 80},
    )


def synthetic_report(n_nodes: int, *, name: str = "synthetic", width: int = 64) -> Report:
    """About `n_nodes` nodes: blocks of norm -> fc1 -> gelu -> fc2 -> add, 5 nodes a block."""
    blocks = max(1, n_nodes // 5)
    nodes: list[Node] = [Node(id=0, name="x", op="placeholder", target="x")]
    modules = [
        Module(path="", type="Stack"),
        Module(path="layers", type="ModuleList", depth=1, parent=""),
    ]
    grads: list[LayerGrad] = []
    for b in range(blocks):
        _block(b, width, nodes, modules, grads)
    nodes.append(Node(id=len(nodes), name="output", op="output", target="output"))
    modules[1].params = sum(m.params for m in modules if m.type == "Block")
    params = sum(m.own_params for m in modules)
    flops = sum(n.flops for n in nodes)
    modules[0].params = modules[0].trainable_params = params
    modules[0].flops_forward = flops
    report = small_report(name=name, params=params, flops=flops, train_peak=3 * GIB)
    report.nodes, report.modules = nodes, modules
    report.capture.node_count = len(nodes)
    report.gradients.layers = grads
    report.memory.timeline = [
        TimelinePoint(
            step=i,
            phase="forward" if i < len(nodes) else "backward",
            live_bytes=(i if i < len(nodes) else 2 * len(nodes) - i) * MIB,
        )
        for i in range(2 * len(nodes))
    ]
    report.findings = [
        Finding(
            rule="large-activation",
            severity="warning",
            where=f"layers.{blocks - 1}.fc1",
            message="This layer keeps the most activations.",
            fix="Checkpoint it.",
        )
    ]
    return report


def _block(b: int, d: int, nodes: list[Node], modules: list[Module], grads: list) -> None:
    p = f"layers.{b}"
    t_in, t_mid = _tensor([8, 128, d], ["B", "S", d]), _tensor([8, 128, 4 * d], ["B", "S", 4 * d])
    modules.append(
        Module(
            path=p,
            type="Block",
            depth=2,
            parent="layers",
            params=2 * d + 8 * d * d + 5 * d,
            output_shapes=[["B", "S", d]],
        )
    )
    spec = [
        ("norm", "LayerNorm", 2 * d, t_in),
        ("fc1", "Linear", 4 * d * d + 4 * d, t_mid),
        ("act", "GELU", 0, t_mid),
        ("fc2", "Linear", 4 * d * d + d, t_in),
    ]
    for leaf, kind, params, out in spec:
        path = f"{p}.{leaf}"
        flops = 2 * 8 * 128 * params
        modules.append(
            Module(
                path=path,
                type=kind,
                depth=3,
                parent=p,
                params=params,
                own_params=params,
                input_shapes=[["B", "S", d]],
                output_shapes=[out.sym_shape],
                output_dtypes=["float32"],
                flops_forward=flops,
                output_bytes=out.bytes,
                saved_activation_bytes=out.bytes,
            )
        )
        nodes.append(
            Node(
                id=len(nodes),
                name=f"{p.replace('.', '_')}_{leaf}",
                op="call_module",
                target=path,
                module_path=path,
                module_type=kind,
                inputs=[len(nodes) - 1],
                output_tensors=[out],
                params=params,
                flops=flops,
                output_bytes=out.bytes,
                saved_bytes=out.bytes,
                grad_norm=1.0 / (b + 1),
            )
        )
        grads.append(
            LayerGrad(module_path=path, type=kind, depth_index=len(grads), grad_norm=1.0 / (b + 1))
        )
    nodes.append(
        Node(
            id=len(nodes),
            name=f"{p.replace('.', '_')}_add",
            op="call_function",
            target="operator.add",
            module_path=p,
            module_type="Block",
            output_tensors=[t_in],
            output_bytes=t_in.bytes,
        )
    )
