"""A deep report made from a shallow real one: the Llama-3-70B preset's 80 layers cost a
minute to inspect, a 2-layer Llama of the same code a few seconds, and the pages' cost
lies in the number of nodes and modules, not in the widths.

`stack_blocks(report, 80)` copies the last block of the report's block list (with the
nodes and modules inside it) until there are 80 blocks, wired as the model wires them:

- a copy reads what its template reads from outside (the rotary embedding, the mask), the
  previous copy where the template reads the block before it;
- after the list, what read the last block reads the last copy, and what read every
  block at one place (the output's key/value caches) reads every copy there too;
- the block list's ancestors and the totals grow by the copies' parameters and FLOPs.

Node ids are renumbered in order; a copy's node names carry its index. The memory section
(timeline, peaks) stays the shallow model's. tests/test_stacked.py checks a 2-layer Llama
stacked to 4 layers against a real 4-layer one, node for node.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["stack_blocks", "tiny_llama_report", "ADDITIVE", "TINY_LLAMA"]

# Measures of a module that are sums over what it holds.
ADDITIVE = ("params", "trainable_params", "param_bytes", "flops_forward", "flops_backward")
Json = dict[str, Any]
CONSTANT = re.compile(r"_tensor_constant(\d+)")


def _inside(path: str | None, block: str) -> bool:
    return path is not None and (path == block or path.startswith(f"{block}."))


def _renamed(text: str, old: str, new: str) -> str:
    return new + text[len(old) :] if _inside(text, old) else text


def stack_blocks(report: Json, count: int, blocks: str = "model.layers") -> Json:
    """A copy of `report` whose module list `blocks` holds `count` blocks."""
    out = copy.deepcopy(report)
    kids = [m["path"] for m in out["modules"] if m.get("parent") == blocks]
    if len(kids) < 2 or count < len(kids):
        raise ValueError(f"cannot grow {blocks} from {len(kids)} blocks to {count} (2 or more)")
    prev, last = kids[-2], kids[-1]
    nodes = out["nodes"]
    template = [n for n in nodes if _inside(n.get("module_path"), last)]
    before = [n for n in nodes if _inside(n.get("module_path"), prev)]
    if len(template) != len(before):
        raise ValueError(f"{prev} and {last} differ ({len(before)} and {len(template)} nodes)")
    copies = _copy_nodes(template, before, last, blocks, range(len(kids), count), nodes)
    end = nodes.index(template[-1]) + 1
    _rewire_after(nodes[end:], template, before, copies)
    out["nodes"] = _renumbered(nodes[:end] + [n for c in copies for n in c] + nodes[end:])
    added = _copy_modules(out, last, blocks, range(len(kids), count))
    _grow_sums(out, blocks, added)
    out["capture"]["node_count"] = len(out["nodes"])
    return out


def _copy_nodes(template, before, last, blocks, indexes, nodes) -> list[list[Json]]:
    at_template = {n["id"]: q for q, n in enumerate(template)}
    at_before = {n["id"]: q for q, n in enumerate(before)}
    lifted = sum(1 for n in template if CONSTANT.fullmatch(str(n.get("target"))))
    next_id = max(n["id"] for n in nodes) + 1
    previous = [n["id"] for n in template]  # the block before the copy being made
    copies = []
    for k in indexes:
        path, ids = f"{blocks}.{k}", list(range(next_id, next_id + len(template)))
        next_id += len(template)
        shift = lifted * (k - int(last.rsplit(".", 1)[1]))
        block = []
        for q, n in enumerate(template):
            c = copy.deepcopy(n)
            c["id"] = ids[q]
            c["inputs"] = [
                ids[at_template[i]] if i in at_template
                else previous[at_before[i]] if i in at_before else i
                for i in n.get("inputs") or []
            ]  # fmt: skip
            c["module_path"] = _renamed(n["module_path"], last, path)
            c["target"] = _target(str(n.get("target")), last, path, shift)
            c["name"] = _name(n["name"], last, path, k)
            block.append(c)
        copies.append(block)
        previous = ids
    return copies


def _target(target: str, last: str, path: str, shift: int) -> str:
    # fx numbers the constants it lifts onto the root in order: a block's own come later.
    found = CONSTANT.fullmatch(target)
    return f"_tensor_constant{int(found[1]) + shift}" if found else _renamed(target, last, path)


def _name(name: str, last: str, path: str, k: int) -> str:
    """fx names a module's call after its path (`model_layers_1_mlp`); other nodes by a
    counter (`add_7`), which the copy's index keeps apart."""
    old, new = last.replace(".", "_"), path.replace(".", "_")
    return new + name[len(old) :] if name.startswith(f"{old}_") else f"{name}_{k}"


def _rewire_after(tail: list[Json], template, before, copies) -> None:
    at_template = {n["id"]: q for q, n in enumerate(template)}
    for n in tail:
        inputs = n.get("inputs") or []
        # Places read in every block (the key/value caches): read in the copies too.
        every = [
            at_template[i]
            for i in inputs
            if i in at_template and before[at_template[i]]["id"] in inputs
        ]
        if not any(i in at_template for i in inputs) or not copies:
            continue
        last_seen = max(j for j, i in enumerate(inputs) if i in at_template)
        new: list[int] = []
        for j, i in enumerate(inputs):
            q = at_template.get(i)
            new.append(copies[-1][q]["id"] if q is not None and q not in every else i)
            if j == last_seen:
                new += [c[q]["id"] for c in copies for q in every]
        n["inputs"] = new


def _renumbered(nodes: list[Json]) -> list[Json]:
    new_id = {n["id"]: k for k, n in enumerate(nodes)}
    for n in nodes:
        n["id"] = new_id[n["id"]]
        n["inputs"] = [new_id.get(i, i) for i in n.get("inputs") or []]
    return nodes


def _copy_modules(out: Json, last: str, blocks: str, indexes) -> list[Json]:
    modules = out["modules"]
    template = [m for m in modules if _inside(m["path"], last)]
    end = modules.index(template[-1]) + 1
    added = []
    for k in indexes:
        path = f"{blocks}.{k}"
        for m in template:
            c = copy.deepcopy(m)
            c["path"] = _renamed(m["path"], last, path)
            c["parent"] = _renamed(m["parent"], last, path) if m["path"] != last else blocks
            added.append(c)
    out["modules"] = modules[:end] + added + modules[end:]
    return [m for m in added if m["parent"] == blocks]


def _grow_sums(out: Json, blocks: str, added: list[Json]) -> None:
    """The block list's ancestors and the totals, grown by the copied blocks."""
    by_path = {m["path"]: m for m in out["modules"]}
    chain, path = [], blocks
    while True:
        chain.append(by_path[path])
        if path == "":
            break
        path = by_path[path].get("parent") or ""
    totals = out["totals"]
    for key in ADDITIVE:
        grow = sum(m.get(key) or 0 for m in added)
        for m in chain:
            m[key] = (m.get(key) or 0) + grow
        totals[key] = (totals.get(key) or 0) + grow
    for key, by_dtype in (("params", "params_by_dtype"), ("param_bytes", "param_bytes_by_dtype")):
        if len(totals.get(by_dtype) or {}) == 1:  # one dtype: it grows with the total
            totals[by_dtype] = dict.fromkeys(totals[by_dtype], totals[key])


# The Llama-3-70B preset's code at a toy width: 64 hidden, 4 heads (2 for keys/values).
TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 256, "max_position_embeddings": 256, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16",
}  # fmt: skip


def tiny_llama_report(folder: Path, layers: int, passes: set[str] | None = None) -> dict:
    """The JSON report of a `layers`-layer tiny Llama on fake tensors, at B=1, S=16."""
    from inspector.analyze import inspect_model
    from inspector.context import Options

    path = folder / f"llama{layers}.json"
    path.write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": layers}))
    spec = json.dumps({"dims": {"B": 1, "S": 16}})
    report = inspect_model(str(path), spec, Options(passes=passes or {"graph"}, fake=True))
    return report.model_dump(mode="json")
