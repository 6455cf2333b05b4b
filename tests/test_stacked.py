"""`stacked.stack_blocks`, the 80-layer report the page tests use: a real 2-layer Llama
(Hugging Face's code, from a config) stacked to 4 layers is the real 4-layer report, node
for node and module for module; stacked to 80 it has the node and module counts of the
real Llama-3-70B preset."""

from __future__ import annotations

import pytest
from stacked import stack_blocks, tiny_llama_report

from inspector.repeats import find_folds

# From the real preset, `inspector inspect preset:llama-3-70b --input '{"dims": {"B": 1,
# "S": 4096}}' --json l70.json` (65 s here): len(nodes), len(modules).
LLAMA_70B_NODES, LLAMA_70B_MODULES = 7718, 1047


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return tiny_llama_report(tmp_path_factory.mktemp("llama"), 2)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return tiny_llama_report(tmp_path_factory.mktemp("llama"), 4)


def _node(n: dict) -> tuple:
    shapes = [(t["shape"], t.get("sym_shape"), t["dtype"]) for t in n["output_tensors"]]
    return (n["id"], n["op"], n["target"], n["module_path"], n["module_type"], n["inputs"],
            shapes, n["params"], n["flops"])  # fmt: skip


def _module(m: dict) -> tuple:
    keys = ("path", "type", "parent", "params", "own_params", "param_bytes", "flops_forward",
            "flops_backward", "input_shapes")  # fmt: skip
    return (*(m[k] for k in keys), m["output_shapes"][:1])


def test_two_layers_stacked_to_four_are_the_real_four(two, four):
    stacked = stack_blocks(two, 4)
    assert [_node(n) for n in stacked["nodes"]] == [_node(n) for n in four["nodes"]]
    # The root's outputs list every layer's key/value cache: only the logits are compared.
    assert [_module(m) for m in stacked["modules"]] == [_module(m) for m in four["modules"]]
    for key in ("params", "trainable_params", "param_bytes", "flops_forward", "flops_backward"):
        assert stacked["totals"][key] == four["totals"][key], key
    assert stacked["totals"]["params_by_dtype"] == four["totals"]["params_by_dtype"]
    assert stacked["capture"]["node_count"] == len(four["nodes"])
    names = [n["name"] for n in stacked["nodes"]]
    assert len(set(names)) == len(names)


def test_eighty_layers_have_the_70b_presets_counts_and_fold(two):
    stacked = stack_blocks(two, 80)
    per_block = sum(
        1 for n in two["nodes"] if (n["module_path"] or "").startswith("model.layers.1")
    )
    assert per_block == 96  # the same Llama code at any width
    assert len(stacked["nodes"]) == len(two["nodes"]) + 78 * per_block == LLAMA_70B_NODES
    assert len(stacked["modules"]) == LLAMA_70B_MODULES
    [fold] = find_folds(stacked["modules"], stacked["nodes"])
    assert fold.label == "LlamaDecoderLayer × 80" and fold.id == "model.layers.0..79"
    rows = {m["path"]: m for m in stacked["modules"]}
    block = rows["model.layers.1"]["params"]
    # q, k, v, o: 64*64 + 2 * 64*32 + 64*64 = 12,288; gate, up, down: 3 * 64*128 = 24,576;
    # two RMSNorms: 128. 36,992 a block.
    assert block == 12_288 + 24_576 + 128
    assert fold.total["params"] == 80 * block == rows["model.layers"]["params"]
    assert stacked["totals"]["params"] == two["totals"]["params"] + 78 * block


def test_too_few_blocks_to_copy_is_an_error(two):
    with pytest.raises(ValueError, match="from 2 blocks to 1"):
        stack_blocks(two, 1)
