"""Runs of repeated identical blocks (`inspector.repeats`): hand-built stacks whose runs are
known by construction, then real models built by the library (ResNet-18's stages, a
3-layer GPT-2) against the report's own module rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inspector.repeats import MEASURES, find_folds, fold_id

# A block of width w: fc (Linear w -> w, w*w + w params) -> act (ReLU) -> add (residual).
# Forward FLOPs of fc at 8 rows: 2 * 8 * w * w.


def _block(path: str, w: int, first_id: int, source: int, *, extra: bool = False):
    fc_params = w * w + w
    shape = [["B", w]]
    modules = [
        {"path": path, "type": "Block", "parent": path.rsplit(".", 1)[0], "params": fc_params,
         "input_shapes": shape, "output_shapes": shape, "flops_forward": 2 * 8 * w * w,
         "saved_activation_bytes": 8 * w * 4, "calls": 1},
        {"path": f"{path}.fc", "type": "Linear", "parent": path, "params": fc_params,
         "own_params": fc_params, "output_shapes": shape, "flops_forward": 2 * 8 * w * w},
        {"path": f"{path}.act", "type": "ReLU", "parent": path, "output_shapes": shape},
    ]  # fmt: skip
    t = {"shape": [8, w], "sym_shape": ["B", w], "dtype": "float32"}
    i = first_id
    nodes = [
        {"id": i, "op": "call_module", "target": f"{path}.fc", "module_path": f"{path}.fc",
         "inputs": [source], "output_tensors": [t]},
        {"id": i + 1, "op": "call_module", "target": f"{path}.act", "module_path": f"{path}.act",
         "inputs": [i], "output_tensors": [t]},
        {"id": i + 2, "op": "call_function", "target": "operator.add", "module_path": path,
         "inputs": [i + 1, source], "output_tensors": [t]},
    ]  # fmt: skip
    if extra:  # a skip-path module the other blocks lack, like ResNet's downsample
        modules.append({"path": f"{path}.down", "type": "Linear", "parent": path})
    return modules, nodes


def _stack(widths: list[int], *, extra_first: bool = False, parent: str = "layers"):
    """Root Net -> `parent` (ModuleList) -> one Block per width, chained."""
    modules = [{"path": "", "type": "Net"}, {"path": parent, "type": "ModuleList", "parent": ""}]
    nodes = [{"id": 0, "op": "placeholder", "target": "x", "module_path": ""}]
    for k, w in enumerate(widths):
        m, n = _block(f"{parent}.{k}", w, len(nodes), len(nodes) - 1, extra=extra_first and k == 0)
        modules += m
        nodes += n
    return modules, nodes


def test_identical_blocks_fold_with_per_block_and_total_numbers():
    modules, nodes = _stack([16, 16, 16])
    [fold] = find_folds(modules, nodes)
    assert fold.id == "layers.0..2" and fold.parent == "layers" and fold.type == "Block"
    assert fold.paths == ["layers.0", "layers.1", "layers.2"]
    assert fold.label == "Block × 3"
    # 16 * 16 + 16 = 272 params a block; 3 blocks: 816
    assert fold.per_block["params"] == 272 and fold.total["params"] == 816
    # 2 * 8 * 16 * 16 = 4,096 FLOPs a block; 12,288 in all
    assert fold.per_block["flops_forward"] == 4096 and fold.total["flops_forward"] == 12_288
    # 8 * 16 floats * 4 bytes = 512 B saved a block
    assert fold.total["saved_activation_bytes"] == 3 * 512 and fold.total["calls"] == 3
    assert fold.per_block["flops_backward"] is None and fold.total["flops_backward"] is None


def test_totals_are_the_sums_of_the_blocks_rows():
    modules, nodes = _stack([8] * 5)
    rows = {m["path"]: m for m in modules}
    rows["layers.3"]["saved_activation_bytes"] = None  # a block without it: not counted
    [fold] = find_folds(modules, nodes)
    rows = [m for m in modules if m["path"] in fold.paths]
    for key in MEASURES:
        known = [r[key] for r in rows if r.get(key) is not None]
        assert fold.total[key] == (sum(known) if known else None), key
    # 4 of 5 blocks have 8 * 8 * 4 = 256 saved bytes; the odd one makes per-block unknown.
    assert fold.total["saved_activation_bytes"] == 4 * 256
    assert fold.per_block["saved_activation_bytes"] is None


def test_a_different_first_block_stays_out_of_the_run():
    modules, nodes = _stack([16, 16, 16], extra_first=True)
    [fold] = find_folds(modules, nodes)
    assert fold.paths == ["layers.1", "layers.2"] and fold.id == "layers.1..2"


def test_different_shapes_break_the_run_and_a_lone_block_is_no_fold():
    modules, nodes = _stack([16, 16, 32, 16, 16, 16])
    assert [f.paths for f in find_folds(modules, nodes)] == [
        ["layers.0", "layers.1"],
        ["layers.3", "layers.4", "layers.5"],
    ]
    assert find_folds(*_stack([16, 32, 16])) == []
    assert find_folds(*_stack([16, 16, 16]), min_count=4) == []


def test_named_dims_count_as_they_are_named():
    modules, nodes = _stack([16, 16])
    nodes[4]["output_tensors"] = [{"shape": [8, 16], "sym_shape": [8, 16], "dtype": "float32"}]
    assert find_folds(modules, nodes) == []  # [8, 16] is not [B, 16], though B = 8


def test_a_different_op_order_or_wiring_breaks_the_run():
    modules, nodes = _stack([16, 16])
    swapped = json.loads(json.dumps(nodes))
    swapped[6]["inputs"] = [swapped[6]["inputs"][0]]  # block 1's add drops its skip input
    assert find_folds(modules, swapped) == []
    retyped = json.loads(json.dumps(nodes))
    retyped[6]["target"] = "operator.mul"
    assert find_folds(modules, retyped) == []


def test_lifted_constants_and_leaves_do_not_count():
    modules, nodes = _stack([16, 16])
    # fx lifts one constant per block onto the root, numbered in order: not a difference.
    for k in (2, 5):
        nodes.append({"id": 100 + k, "op": "get_attr", "target": f"_tensor_constant{k}",
                      "module_path": f"layers.{k // 3}", "output_tensors": []})  # fmt: skip
    assert [f.paths for f in find_folds(modules, nodes)] == [["layers.0", "layers.1"]]
    # Two alike Linear leaves side by side (Llama's gate_proj, up_proj) are no stack.
    leaves = [{"path": "", "type": "Net"}] + [
        {"path": name, "type": "Linear", "parent": "", "params": 272} for name in ("a", "b")
    ]
    assert find_folds(leaves, []) == []


def test_nested_runs_and_runs_at_the_root():
    # Two identical layers, each holding 3 identical experts: both levels fold.
    modules = [{"path": "", "type": "Net"}]
    nodes: list[dict] = []
    for layer in ("0", "1"):
        modules.append({"path": layer, "type": "Layer", "parent": ""})
        modules.append({"path": f"{layer}.experts", "type": "ModuleList", "parent": layer})
        for e in range(3):
            m, n = _block(f"{layer}.experts.{e}", 8, 1000 * int(layer) + 10 * e, -1)
            modules += m
            nodes += n
    folds = find_folds(modules, nodes)
    assert [(f.id, f.label) for f in folds] == [
        ("0..1", "Layer × 2"),
        ("0.experts.0..2", "Block × 3"),
        ("1.experts.0..2", "Block × 3"),
    ]
    assert folds[0].parent == ""


def test_fold_id():
    assert fold_id(["transformer.h.0", "transformer.h.11"]) == "transformer.h.0..11"
    assert fold_id(["features.block1", "features.block3"]) == "features.block1..block3"


# --- real models, built by the library ------------------------------------------------------

MODELS = Path(__file__).parent / "models.py"
GPT2 = """from transformers import GPT2Config, GPT2LMHeadModel


def build():
    config = GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    return GPT2LMHeadModel(config).eval()
"""


def _report(model: str, spec: dict) -> dict:
    from inspector.analyze import inspect_model
    from inspector.context import Options

    options = Options(passes={"graph"}, fake=True)
    return inspect_model(model, json.dumps(spec), options).model_dump(mode="json")


def test_resnet18_folds_only_the_stage_without_a_downsample():
    report = _report(f"{MODELS}:ResNet18", {"x": {"shape": ["B", 3, 32, 32]}, "dims": {"B": 2}})
    folds = find_folds(report["modules"], report["nodes"])
    # layer1: 64 -> 64, stride 1, no downsample: both blocks alike. layer2..4 start with a
    # strided block that has a downsample, and each has one block after it: no run.
    assert [(f.id, f.label) for f in folds] == [("layer1.0..1", "BasicBlock × 2")]
    # Each block: two 3x3 convs of 64 -> 64 (3 * 3 * 64 * 64 = 36,864 weights each) and
    # two BatchNorms of 64 (128 params each): 73,728 + 256 = 73,984
    assert folds[0].per_block["params"] == 73_984
    assert folds[0].total["params"] == 2 * 73_984


def test_gpt2_blocks_fold_and_add_up_to_their_list(tmp_path):
    path = tmp_path / "gpt2_three.py"
    path.write_text(GPT2)
    spec = {
        "input_ids": {"shape": ["B", "S"], "dtype": "int64", "high": 64},
        "dims": {"B": 1, "S": 8},
    }
    report = _report(f"{path}:build", spec)
    [fold] = find_folds(report["modules"], report["nodes"])
    assert fold.label == "GPT2Block × 3" and fold.id == "transformer.h.0..2"
    rows = {m["path"]: m for m in report["modules"]}
    assert fold.total["params"] == rows["transformer.h"]["params"]
    # A block: ln_1, ln_2 (2 * 32 each: 128), c_attn (32 * 96 + 96: 3,168), attn c_proj
    # (32 * 32 + 32: 1,056), mlp c_fc (32 * 128 + 128: 4,224), mlp c_proj (128 * 32 + 32:
    # 4,128): 12,704
    assert fold.per_block["params"] == 12_704
    flops = [rows[p]["flops_forward"] for p in fold.paths]
    assert fold.total["flops_forward"] == sum(flops) > 0
    assert fold.per_block["flops_forward"] == flops[0]


@pytest.mark.parametrize("width", [4, 64])
def test_big_stacks_fold_in_one_run(width):
    modules, nodes = _stack([width] * 80)
    [fold] = find_folds(modules, nodes)
    assert fold.label == "Block × 80" and fold.total["params"] == 80 * (width * width + width)
