/* The graph view's data model, no DOM: the module hierarchy over the report's nodes, which
   modules are drawn as one box, the edges between what is visible (with the tensor shapes
   that cross each boundary), measures for colouring, and the A/B diff for the compare page.
   Runs of identical blocks (`options.folds`, from the server) are one more level of the
   hierarchy: "GPT2Block × 12" holds the blocks, and opens into them. */
"use strict";
const MGIGraphModel = (() => {
  const DTYPES = { float32: "f32", float16: "f16", bfloat16: "bf16", float64: "f64", int64: "i64",
    int32: "i32", int16: "i16", int8: "i8", uint8: "u8", bool: "bool", complex64: "c64" };
  const CONTAINERS = new Set(["ModuleList", "ModuleDict"]);
  const ATOMIC_OPS = new Set(["call_module", "module"]);
  const SEVERITY_RANK = { error: 3, warning: 2, info: 1 };

  const parentPath = (p) => (p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "");
  function ancestors(path) {
    // "a.b.c" -> ["a", "a.b", "a.b.c"]; "" -> []
    if (!path) return [];
    const parts = path.split(".");
    return parts.map((_, i) => parts.slice(0, i + 1).join("."));
  }
  function tensorLabel(t) {
    const shape = t.sym_shape && t.sym_shape.length === (t.shape || []).length ? t.sym_shape : (t.shape || []);
    return `[${shape.join(", ")}] ${DTYPES[t.dtype] || t.dtype}`;
  }
  function shortTarget(node) {
    return String(node.target || "").replace(/^aten\./, "").replace(/\.(default|Tensor|Scalar|int|dim|self|dtype_layout)$/, "")
      .replace(/^_?operator\./, "").replace(/^torch\.(nn\.functional\.)?/, "");
  }

  // --- build: hierarchy, groups, node-level edges ---------------------------------------
  function build(report, options = {}) {
    const hooks = (report.capture || {}).method === "hooks";
    const moduleInfo = new Map((report.modules || []).map((m) => [m.path, m]));
    const all = (report.nodes || []).map((n) => ({ ...n, module_path: knownPath(n.module_path || "", moduleInfo) }));
    let nodes = all.filter((n) => options.showWeights || n.op !== "get_attr");
    if (hooks) nodes = leafCalls(nodes);
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const groups = findGroups(nodes, moduleInfo, all);
    const folds = MGIFolds.index(options.folds);
    const owner = new Map(nodes.map((n) => [n.id, groupChain(n.module_path || "", groups, folds)]));
    addFolds(groups, folds, owner);
    const edges = hooks ? callOrderEdges(nodes, byId) : inputEdges(nodes, byId);
    const byName = new Map(nodes.map((n) => [n.name, n]));
    const model = { report, nodes, byId, byName, groups, folds, owner, edges, moduleInfo, hooks };
    model.measures = measures(model);
    return model;
  }

  function knownPath(path, moduleInfo) {
    // torch.export may tag nodes with paths of its own (e.g. "_empty_nn_module_stack_..."):
    // keep the longest part of the path that is a module of the report.
    if (!moduleInfo.size || moduleInfo.has(path)) return path;
    const known = ancestors(path).filter((p) => moduleInfo.has(p));
    return known.length ? known[known.length - 1] : "";
  }

  function leafCalls(nodes) {
    // A module call that contains other calls is drawn as the box of its module.
    const parents = new Set();
    for (const n of nodes) for (const a of ancestors(n.module_path || "").slice(0, -1)) parents.add(a);
    return nodes.filter((n) => !(n.module_path === "" && nodes.length > 1) && !parents.has(n.module_path || ""));
  }

  function findGroups(nodes, moduleInfo, all) {
    // Which module paths are drawn as a box: those holding 2+ nodes, where the nodes are
    // not all calls of the same leaf module (a ReLU called twice is two nodes, not a box).
    const count = new Map();
    const hasChild = new Set();
    const atomic = new Map();
    for (const n of nodes) {
      const chain = ancestors(n.module_path || "");
      chain.forEach((p, i) => { count.set(p, (count.get(p) || 0) + 1); if (i < chain.length - 1) hasChild.add(p); });
      const leaf = chain[chain.length - 1];
      if (leaf !== undefined) atomic.set(leaf, (atomic.get(leaf) ?? true) && ATOMIC_OPS.has(n.op));
    }
    const typeOf = new Map(all.filter((n) => n.module_type).map((n) => [n.module_path, n.module_type]));
    const groups = new Map();
    for (const [path, c] of count) {
      const leafOnly = !hasChild.has(path);
      if (c < 2 || (leafOnly && atomic.get(path))) continue;
      const info = moduleInfo.get(path) || null;
      groups.set(path, { path, type: (info && info.type) || typeOf.get(path) || "", count: c, info });
    }
    return groups;
  }

  function groupChain(path, groups, folds) {
    // The groups holding `path`, outermost first; a block's fold comes before the block.
    const chain = [];
    for (const p of ancestors(path)) {
      const fold = folds.ofBlock.get(p);
      if (fold) chain.push(fold.id);
      if (groups.has(p)) chain.push(p);
    }
    return chain;
  }

  function addFolds(groups, folds, owner) {
    // A fold is a group of the nodes of its blocks (only folds that hold nodes are drawn).
    const count = new Map();
    for (const chain of owner.values()) for (const p of chain) if (folds.byId.has(p)) count.set(p, (count.get(p) || 0) + 1);
    for (const [id, c] of count) {
      const fold = folds.byId.get(id);
      groups.set(id, { path: id, type: fold.type, count: c, fold, info: { params: fold.total.params } });
    }
  }

  /** The groups from the outermost down to `path` itself (a module path or a fold id). */
  function chainOf(model, path) {
    const fold = model.folds.byId.get(path);
    if (fold) return [...groupChain(fold.parent, model.groups, model.folds), path];
    return groupChain(path, model.groups, model.folds);
  }

  /** Whether group `path` lies inside group `outer` (or is it). */
  const within = (model, path, outer) => path === outer || chainOf(model, path).includes(outer);

  function inputEdges(nodes, byId) {
    const edges = [];
    for (const n of nodes) for (const i of n.inputs || []) if (byId.has(i) && i !== n.id) edges.push([i, n.id]);
    return edges;
  }

  function callOrderEdges(nodes, byId) {
    // Hook captures: producer links where known, else each call follows the previous one.
    const edges = [];
    nodes.forEach((n, k) => {
      const known = (n.inputs || []).filter((i) => byId.has(i) && i !== n.id);
      if (known.length) known.forEach((i) => edges.push([i, n.id]));
      else if (k > 0) edges.push([nodes[k - 1].id, n.id]);
    });
    return edges;
  }

  // --- measures: per node, aggregated per group ---------------------------------------------
  function measures(model) {
    const findings = model.report.findings || [];
    const perNode = new Map();
    const perGroup = new Map([...model.groups.keys()].map((p) => [p, { saved: 0, flops: 0, grad: null, findings: [] }]));
    const nodeByName = new Map(model.nodes.map((n) => [n.name, n]));
    for (const n of model.nodes) {
      const m = { saved: n.saved_bytes ?? 0, flops: n.flops || 0, grad: n.grad_norm ?? null, findings: [] };
      perNode.set(n.id, m);
      for (const p of model.owner.get(n.id)) {
        const g = perGroup.get(p);
        g.saved += m.saved; g.flops += m.flops;
        if (m.grad !== null) g.grad = Math.max(g.grad ?? 0, m.grad);
      }
    }
    for (const [path, g] of perGroup) {
      const info = model.moduleInfo.get(path);
      if (info && info.grad_norm !== null && info.grad_norm !== undefined) g.grad = info.grad_norm;
    }
    for (const f of findings) attachFinding(model, f, nodeByName, perNode, perGroup);
    return { perNode, perGroup };
  }

  function attachFinding(model, f, nodeByName, perNode, perGroup) {
    const where = f.where || "";
    const node = nodeByName.get(where);
    const targets = node ? [node] : model.nodes.filter((n) => ATOMIC_OPS.has(n.op) && n.module_path === where);
    for (const n of targets) perNode.get(n.id).findings.push(f);
    const chain = node ? model.owner.get(node.id) : chainOf(model, where);
    for (const p of chain) if (perGroup.has(p)) perGroup.get(p).findings.push(f);
  }

  function severityOf(list) {
    return list.reduce((best, f) => (SEVERITY_RANK[f.severity] > (SEVERITY_RANK[best] || 0) ? f.severity : best), null);
  }

  // --- the view: what is visible for a set of expanded groups ---------------------------------
  function visibleOf(model, expanded, id) {
    const chain = model.owner.get(id);
    for (const p of chain) if (!expanded.has(p)) return `m:${p}`;
    return `n:${id}`;
  }

  function view(model, expanded) {
    const items = new Map();
    const compounds = new Set();
    for (const n of model.nodes) {
      const chain = model.owner.get(n.id);
      let parent = null;
      let vid = `n:${n.id}`;
      for (const p of chain) {
        if (!expanded.has(p)) { vid = `m:${p}`; break; }
        compounds.add(p);
        parent = p;
      }
      if (!items.has(vid)) items.set(vid, vid.startsWith("m:") ? boxItem(model, vid.slice(2), parent) : nodeItem(model, n, parent));
    }
    const groupItems = [...compounds].map((p) => groupItem(model, p));
    return { items: [...groupItems, ...items.values()], edges: viewEdges(model, expanded) };
  }

  function viewEdges(model, expanded) {
    const byKey = new Map();
    const vis = new Map(model.nodes.map((n) => [n.id, visibleOf(model, expanded, n.id)]));
    for (const [s, d] of model.edges) {
      const vs = vis.get(s), vd = vis.get(d);
      if (vs === vd) continue;
      const key = `${vs}>${vd}`;
      if (!byKey.has(key)) byKey.set(key, { id: `e:${key}`, source: vs, target: vd, from: new Set() });
      byKey.get(key).from.add(s);
    }
    return [...byKey.values()].map((e) => ({ ...e, label: edgeLabel(model, e.from), from: [...e.from] }));
  }

  function edgeLabel(model, sources) {
    const labels = [];
    for (const s of sources) for (const t of (model.byId.get(s).output_tensors || []).slice(0, 1)) labels.push(tensorLabel(t));
    const distinct = [...new Set(labels)];
    if (distinct.length <= 2) return distinct.join("\n");
    return `${distinct[0]}\n+${distinct.length - 1} more`;
  }

  function relativeName(path, parent) {
    if (parent && parent.includes("..")) parent = null;  // a fold's id: its blocks are "h.3"
    const rest = parent && path.startsWith(`${parent}.`) ? path.slice(parent.length + 1) : path;
    const parts = rest.split(".");
    const last = parts[parts.length - 1];
    // "0" alone says little: keep the list's name with a block index ("h.0").
    if (/^\d+$/.test(last)) return path.split(".").slice(-2).join(".");
    return last;
  }

  function boxItem(model, path, parent) {
    const g = model.groups.get(path);
    if (g.fold) {
      return { id: `m:${path}`, kind: "box", path, where: path, parent: parent === null ? null : `m:${parent}`,
        title: g.fold.label, subtitle: `${MGIFolds.rangeName(g.fold)} · ${g.count} nodes`, type: g.type,
        measure: model.measures.perGroup.get(path) };
    }
    return { id: `m:${path}`, kind: "box", path, where: path, parent: parent === null ? null : `m:${parent}`,
      title: relativeName(path, parent), subtitle: `${g.type || "module"} · ${g.count} nodes`, type: g.type,
      measure: model.measures.perGroup.get(path) };
  }

  function groupItem(model, path) {
    const chain = chainOf(model, path);
    const parent = chain.length > 1 ? chain[chain.length - 2] : null;
    const g = model.groups.get(path);
    const title = g.fold ? `${MGIFolds.rangeName(g.fold)} · ${g.fold.label}` : `${relativeName(path, parent)} · ${g.type || "module"}`;
    return { id: `m:${path}`, kind: "group", path, where: path, parent: parent === null ? null : `m:${parent}`,
      depth: chain.length, title, type: g.type, measure: model.measures.perGroup.get(path) };
  }

  function nodeItem(model, n, parent) {
    // A node standing for a module of its own (fx call_module, a hook call, the one op of a
    // leaf module) is named after that module; other nodes by their graph name.
    const path = n.module_path || "";
    const fold = model.folds.byId.get(parent);  // a block's own node, right in its fold
    const inBlock = (p) => path === p || path.startsWith(`${p}.`);
    const own = path && path !== parent && (parent === null || (fold ? fold.paths.some(inBlock) : path.startsWith(`${parent}.`)));
    const title = own ? relativeName(path, parent) : n.name;
    const op = shortTarget(n);
    const subtitle = n.op === "placeholder" ? "input" : n.op === "output" ? "output"
      : ATOMIC_OPS.has(n.op) ? (n.module_type || n.target || "") : own ? `${n.module_type || ""} ${op}`.trim() : op;
    return { id: `n:${n.id}`, kind: "node", op: n.op, nodeId: n.id, where: n.name, path,
      parent: parent === null ? null : `m:${parent}`, title, subtitle, measure: model.measures.perNode.get(n.id) };
  }

  // --- start: open wrappers and lists while the view stays small -------------------------------
  function initialExpanded(model, limit = 60) {
    const expanded = new Set();
    for (let changed = true; changed;) {
      changed = false;
      const v = view(model, expanded);
      const boxes = v.items.filter((i) => i.kind === "box");
      const total = v.items.filter((i) => i.kind !== "group").length;
      for (const box of boxes) {
        const g = model.groups.get(box.path);
        if (g.fold) continue;  // a run of blocks stays folded until asked
        const scope = box.parent ? model.groups.get(box.parent.slice(2)).count : model.nodes.length;
        if (!(CONTAINERS.has(g.type) || g.count > scope / 2)) continue;
        const inside = childCount(model, expanded, box.path);
        if (total - 1 + inside > limit) continue;
        expanded.add(box.path);
        changed = true;
        break;
      }
    }
    return expanded;
  }

  function childCount(model, expanded, path) {
    const trial = new Set(expanded).add(path);
    const seen = new Set();
    for (const n of model.nodes) if (model.owner.get(n.id).includes(path)) seen.add(visibleOf(model, trial, n.id));
    return seen.size;
  }

  /** Groups to open so that `where` (a node name or module path) is visible. */
  function pathTo(model, where) {
    const node = model.byName.get(where);
    if (node) return { groups: model.owner.get(node.id), id: `n:${node.id}` };
    const chain = chainOf(model, where);
    if (model.groups.has(where)) return { groups: chain.slice(0, -1), id: `m:${where}` };
    const holder = model.nodes.find((n) => n.module_path === where || (n.module_path || "").startsWith(`${where}.`));
    if (holder) return { groups: model.owner.get(holder.id), id: `n:${holder.id}` };
    return null;
  }

  // --- compare: mark what changed between A and B --------------------------------------------
  function keyOf(item) { return item.kind === "node" ? `n:${item.where}` : `m:${item.path}`; }

  function signature(model, item) {
    if (item.kind === "node") {
      const n = model.byId.get(item.nodeId);
      return JSON.stringify([(n.output_tensors || []).map((t) => t.shape), n.params || 0]);
    }
    const info = model.moduleInfo.get(item.path) || {};
    const g = model.groups.get(item.path);
    return JSON.stringify([info.output_shapes || [], info.params ?? 0, g ? g.count : 0]);
  }

  /** {key: "added" | "removed" | "changed"} for the items of one side against the other model. */
  function diffMarks(mine, other, items, side) {
    const marks = new Map();
    for (const item of items) {
      if (item.kind === "group") continue;
      const twin = findTwin(mine, other, item);
      if (!twin) marks.set(item.id, side === "a" ? "removed" : "added");
      else if (signature(mine, item) !== signature(other, twin)) marks.set(item.id, "changed");
    }
    return marks;
  }

  function findTwin(mine, other, item) {
    if (item.kind === "node") {
      const n = other.byName.get(item.where);
      return n ? { kind: "node", nodeId: n.id } : null;
    }
    if (other.groups.has(item.path)) return { kind: "box", path: item.path };
    // A fold of 12 blocks and one of 10 under the same parent are one run that changed.
    const fold = mine.folds.byId.get(item.path);
    if (!fold) return null;
    for (const f of other.folds.byId.values()) {
      if (f.parent === fold.parent && f.type === fold.type && other.groups.has(f.id)) return { kind: "box", path: f.id };
    }
    return null;
  }

  return { build, view, initialExpanded, pathTo, within, diffMarks, keyOf, severityOf, tensorLabel, ancestors, parentPath };
})();
if (typeof module !== "undefined") module.exports = MGIGraphModel;
