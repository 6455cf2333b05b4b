/* The report page: module tree / node table (Tabulator), findings that jump to rows, actions.
   Runs of identical blocks fold into one row ("GPT2Block × 12": totals, and each block's
   numbers) that opens into the blocks. */
"use strict";
(() => {
  performance.mark("mgi:start");
  const data = MGI.readJSON("page-data");
  const report = MGI.readJSON("report-data") || {};
  performance.mark("mgi:parsed");
  const $ = (id) => document.getElementById(id);
  const findingsAt = new Map();
  (report.findings || []).forEach((f) => { if (!findingsAt.has(f.where)) findingsAt.set(f.where, []); findingsAt.get(f.where).push(f); });
  const problemVerdicts = new Set((data || {}).problem_verdicts || []);  // inspector.schema.findings
  const gradVerdict = new Map(((report.gradients || {}).layers || []).map((g) => [g.module_path, g.verdict]));
  const nodeNames = new Set((report.nodes || []).map((n) => n.name));
  const folds = MGIFolds.index((data || {}).folds);
  const modulePaths = new Set((report.modules || []).map((m) => m.path).concat([...folds.byId.keys()]));

  // --- rows ---------------------------------------------------------------------------
  function flagsOf(where, extra) {
    const flags = extra.slice();
    (findingsAt.get(where) || []).forEach((f) => flags.push({ sev: f.severity, text: f.rule }));
    return flags;
  }

  function moduleRows() {
    const rows = new Map();
    for (const m of report.modules || []) {
      const verdict = gradVerdict.get(m.path);
      const extra = problemVerdicts.has(verdict) ? [{ sev: "warning", text: `grad ${verdict}` }] : [];
      if ((m.tied_params || []).length) extra.push({ sev: "info", text: "tied" });
      rows.set(m.path, {
        path: m.path, label: m.path === "" ? "(root)" : m.path.split(".").pop(), type: m.type,
        inputs: MGI.formatShapes(m.input_shapes), outputs: MGI.formatShapes(m.output_shapes),
        dtype: (m.output_dtypes || []).join(", "), params: m.params, flops: m.flops_forward,
        out_bytes: m.output_bytes, saved_bytes: m.saved_activation_bytes, grad_norm: m.grad_norm,
        calls: m.calls, location: m.location, flags: flagsOf(m.path, extra),
      });
    }
    const top = [];
    const link = (row, parent) => (parent ? (parent._children = parent._children || []).push(row) : top.push(row));
    const foldRows = new Map();
    for (const m of report.modules || []) {
      const row = rows.get(m.path);
      const fold = folds.ofBlock.get(m.path);
      if (fold) {
        // The fold's row takes the place of its first block; the blocks go inside it.
        if (!foldRows.has(fold.id)) { foldRows.set(fold.id, foldRow(fold, rows)); link(foldRows.get(fold.id), rows.get(fold.parent)); }
        link(row, foldRows.get(fold.id));
        continue;
      }
      const parentPath = m.parent !== undefined && m.parent !== null ? m.parent
        : (m.path === "" ? null : (m.path.includes(".") ? m.path.slice(0, m.path.lastIndexOf(".")) : ""));
      link(row, parentPath === null || parentPath === m.path ? null : rows.get(parentPath));
    }
    return { top, byPath: rows };
  }

  function foldRow(fold, rows) {
    const blocks = fold.paths.map((p) => rows.get(p)).filter(Boolean);
    const first = blocks[0] || {};
    const t = fold.total, each = fold.per_block;
    const grads = blocks.map((b) => b.grad_norm).filter((g) => g !== null && g !== undefined);
    const flags = new Map();
    for (const b of blocks) for (const f of b.flags) flags.set(`${f.sev}:${f.text}`, f);
    return {
      path: fold.id, label: fold.label, type: fold.type, inputs: first.inputs, outputs: first.outputs, dtype: first.dtype,
      params: t.params, flops: t.flops_forward, out_bytes: t.output_bytes, saved_bytes: t.saved_activation_bytes,
      grad_norm: grads.length ? Math.max(...grads) : null, calls: t.calls, location: first.location, flags: [...flags.values()],
      _fold: fold, _each: { params: each.params, flops: each.flops_forward, out_bytes: each.output_bytes, saved_bytes: each.saved_activation_bytes },
    };
  }

  const tensorShape = (t) => (t.sym_shape || t.shape || []);
  function nodeRows() {
    return (report.nodes || []).map((n) => {
      const s = n.stats || {};
      const extra = [];
      if (s.nan_count) extra.push({ sev: "error", text: "NaN" });
      if (s.inf_count) extra.push({ sev: "error", text: "Inf" });
      if (s.dead_fraction) extra.push({ sev: "warning", text: `${Math.round(s.dead_fraction * 100)}% dead` });
      if (s.saturated_fraction) extra.push({ sev: "warning", text: "saturated" });
      if (s.fp16_overflow_count) extra.push({ sev: "warning", text: "fp16 overflow" });
      // the share inspector/rules/numerics.py (fp16-underflow) reports
      if (s.fp16_underflow_fraction > 0.1) extra.push({ sev: "info", text: "fp16 underflow" });
      if (n.mode_divergence) extra.push({ sev: "info", text: "train≠eval" });
      const outs = n.output_tensors || [];
      return {
        id: n.id, name: n.name, op: n.op, target: n.target, module_path: n.module_path,
        type: n.module_type, inputs: MGI.formatShapes((n.input_tensors || []).map(tensorShape)),
        outputs: MGI.formatShapes(outs.map(tensorShape)), dtype: [...new Set(outs.map((t) => t.dtype))].join(", "),
        params: n.params, flops: n.flops, out_bytes: n.output_bytes, saved_bytes: n.saved_bytes,
        grad_norm: n.grad_norm, location: n.location, flags: flagsOf(n.name, extra),
      };
    });
  }

  // --- formatters -----------------------------------------------------------------------
  function perBlock(format) {
    // A fold's row: the total over its blocks, and under it one block's number.
    return (cell) => {
      const row = cell.getRow().getData();
      const text = format(cell);
      if (!row._fold) return text;
      const one = row._each[cell.getField()];
      const each = one === null || one === undefined ? "blocks differ" : `${cell.getField().endsWith("bytes") ? MGI.formatBytes(one) : MGI.formatCount(one)} each`;
      return `<span class="fold-total">${text}</span><span class="fold-each">${each}</span>`;
    };
  }
  const count = (cell) => MGI.formatCount(cell.getValue());
  const grad = (cell) => { const v = cell.getValue(); return v === null || v === undefined ? "" : v.toPrecision(3); };
  function flags(cell) {
    return (cell.getValue() || []).map((f) => `<span class="flag ${f.sev}">${escapeHtml(f.text)}</span>`).join("");
  }
  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function heat(max) {
    // Shade memory cells by their share of the largest leaf value: hot spots stand out.
    return (cell) => {
      const v = cell.getValue();
      const el = cell.getElement();
      if (v === null || v === undefined) { el.style.backgroundColor = ""; return "-"; }
      const alpha = max > 0 ? 0.6 * Math.min(1, Math.sqrt(v / max)) : 0;
      el.style.backgroundColor = alpha > 0.02 ? `rgba(247, 144, 9, ${alpha.toFixed(3)})` : "";
      return MGI.formatBytes(v);
    };
  }
  const maxOf = (rows, field) => rows.reduce((m, r) => Math.max(m, r[field] || 0), 0);
  const textCell = (cell) => escapeHtml(cell.getValue() ?? "");

  function columns(view, leafRows) {
    const num = (title, field, formatter, tip) => ({ title, field, hozAlign: "right", sorter: "number", formatter, headerHozAlign: "right", minWidth: 96, widthGrow: 1, headerTooltip: tip || title });
    const first = view === "modules"
      ? [{ title: "Module", field: "label", frozen: true, minWidth: folds.size ? 250 : 180, widthGrow: 2, formatter: (c) => `<span title="${escapeHtml(c.getRow().getData().path)}">${escapeHtml(c.getValue())}</span>` },
        { title: "Path", field: "path", visible: false, formatter: textCell }]
      : [{ title: "Node", field: "name", frozen: true, minWidth: 160, widthGrow: 2, formatter: textCell },
        { title: "Op", field: "op", minWidth: 110, widthGrow: 1, headerFilter: "input", headerFilterPlaceholder: "filter" },
        { title: "Target", field: "target", visible: false, formatter: textCell },
        { title: "Module", field: "module_path", minWidth: 120, widthGrow: 2, formatter: textCell }];
    return first.concat([
      { title: "Type", field: "type", minWidth: 100, widthGrow: 1.5, formatter: textCell, ...(view === "nodes" ? { headerFilter: "input", headerFilterPlaceholder: "filter" } : {}) },
      { title: "Input shapes", field: "inputs", minWidth: 110, widthGrow: 2, formatter: textCell },
      { title: "Output shapes", field: "outputs", minWidth: 110, widthGrow: 2, formatter: textCell },
      { title: "Dtype", field: "dtype", minWidth: 84, widthGrow: 1, formatter: textCell },
      num("Params", "params", perBlock(count)), num("FLOPs", "flops", perBlock(count)),
      num("Output", "out_bytes", perBlock(heat(maxOf(leafRows, "out_bytes"))), "Output bytes"),
      num("Saved", "saved_bytes", perBlock(heat(maxOf(leafRows, "saved_bytes"))), "Bytes saved for backward"),
      num("Grad norm", "grad_norm", grad, "Norm of the gradient w.r.t. the output"),
      { title: "Location", field: "location", minWidth: 100, widthGrow: 1, visible: false, formatter: textCell },
      { title: "Flags", field: "flags", minWidth: 110, widthGrow: 2, formatter: flags, sorter: (a, b) => (a || []).length - (b || []).length },
      { title: "Graph", field: "_graph", headerSort: false, width: 66, hozAlign: "center", headerTooltip: "Show the row in the graph",
        formatter: () => '<button type="button" class="to-graph" title="Show in graph">◈ show</button>',
        cellClick: (e, cell) => { const d = cell.getRow().getData(); showInGraph(view === "modules" ? d.path : d.name); } },
    ]);
  }

  // --- tables -----------------------------------------------------------------------------
  const host = $("layer-table");
  const tables = {};
  let view = "modules";
  let modules = null;

  function makeTable(kind) {
    const el = document.createElement("div");
    el.id = `table-${kind}`;
    host.appendChild(el);
    let rows, leaves, options;
    if (kind === "modules") {
      modules = moduleRows();
      rows = modules.top;
      leaves = [...modules.byPath.values()].filter((r) => !r._children);
      const startOpen = (row, level) => level < 2 && !row.getData()._fold;  // a fold opens when asked
      options = { dataTree: true, dataTreeStartExpanded: startOpen, dataTreeChildIndent: 14, index: "path" };
    } else {
      rows = nodeRows();
      leaves = rows;
      options = { index: "name" };
    }
    const table = new Tabulator(el, {
      data: rows, columns: columns(kind, leaves), maxHeight: 560, layout: "fitColumns",
      renderVertical: "virtual", selectableRows: 1, movableColumns: true, placeholder: "No rows match.",
      columnDefaults: { headerTooltip: true, tooltip: false }, ...options,
    });
    table.on("tableBuilt", () => { table.built = true; applyFilter(); updateCount(); buildColumnMenu(); if (kind === "modules") markReady("table"); });
    table.on("dataFiltered", () => setTimeout(updateCount, 0));
    tables[kind] = table;
    return table;
  }

  function updateCount() {
    const t = tables[view];
    if (!t || !t.built) return;
    const total = view === "modules" ? (report.modules || []).length : (report.nodes || []).length;
    const shown = view === "modules" ? "" : ` · ${t.getDataCount("active")} shown`;
    $("table-count").textContent = `${total} ${view === "modules" ? "modules" : "graph nodes"}${shown}. Click a header to sort; drag to reorder.`;
  }

  function showView(next) {
    view = next;
    if (!tables[next]) makeTable(next);
    for (const [kind, t] of Object.entries(tables)) t.element.style.display = kind === next ? "" : "none";
    document.querySelectorAll(".seg-btn").forEach((b) => b.classList.toggle("active", b.dataset.view === next));
    $("expand-all").hidden = $("collapse-all").hidden = next !== "modules";
    if (tables[next].built) { tables[next].redraw(true); applyFilter(); }
    buildColumnMenu();
    updateCount();
  }

  // --- search and "flagged only" -------------------------------------------------------------
  function rowMatches(row, q, flaggedOnly) {
    if (flaggedOnly && !(row.flags || []).length) return false;
    if (!q) return true;
    return [row.path, row.name, row.type, row.op, row.target, row.module_path, row.location]
      .some((v) => v && String(v).toLowerCase().includes(q));
  }

  function applyFilter() {
    const t = tables[view];
    const q = $("table-search").value.trim().toLowerCase();
    const flaggedOnly = $("flagged-only").checked;
    if (!q && !flaggedOnly) { t.clearFilter(); return; }
    if (view === "nodes") { t.setFilter((row) => rowMatches(row, q, flaggedOnly)); return; }
    // In the tree a match keeps its ancestors visible, so it can be reached.
    const keep = new Set();
    for (const [path, row] of modules.byPath) {
      if (!rowMatches(row, q, flaggedOnly)) continue;
      for (let p = path; p !== null && !keep.has(p); p = folds.treeParent(p)) keep.add(p);
    }
    t.setFilter((row) => keep.has(row.path));
    if (keep.size < 400) expandPaths(keep);
  }

  function expandPaths(paths) {
    const walk = (rows) => rows.forEach((r) => {
      if (paths.has(r.getData().path) && r.getTreeChildren().length) { r.treeExpand(); walk(r.getTreeChildren()); }
    });
    walk(tables.modules.getRows());
  }

  // --- column chooser -------------------------------------------------------------------------
  function buildColumnMenu() {
    const menu = $("column-menu");
    menu.replaceChildren();
    for (const col of tables[view].getColumns()) {
      const def = col.getDefinition();
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = col.isVisible();
      box.dataset.field = def.field;
      box.addEventListener("change", () => { box.checked ? col.show() : col.hide(); });
      label.append(box, document.createTextNode(def.title));
      menu.appendChild(label);
    }
  }

  // --- findings jump to their row ----------------------------------------------------------------
  async function focusWhere(where, { scroll = true, table = null } = {}) {
    let kind = modulePaths.has(where) ? "modules" : nodeNames.has(where) ? "nodes" : null;
    if (table === "nodes" && nodeNames.has(where)) kind = "nodes";
    if (!kind) { MGI.toast(`"${where}" is not a row of the table`); return; }
    $("table-search").value = "";
    $("flagged-only").checked = false;
    if (view !== kind) showView(kind);
    const t = tables[kind];
    if (!t.built) await new Promise((resolve) => t.on("tableBuilt", resolve));
    t.clearFilter(true);
    if (kind === "nodes") t.clearHeaderFilter();
    const row = kind === "modules" ? expandTo(where) : t.getRow(where);
    if (!row) return;
    if (scroll) $("layers").scrollIntoView({ behavior: "instant", block: "start" });
    await t.scrollToRow(row, "center", true);
    t.deselectRow();
    row.select();
    const el = row.getElement();
    el.classList.remove("flash");
    void el.offsetWidth;
    el.classList.add("flash");
  }

  function expandTo(path) {
    // Open each ancestor from the root down to the module's row.
    const chain = [];
    for (let p = path; p !== null; p = folds.treeParent(p)) chain.unshift(p);
    let rows = tables.modules.getRows();
    let found = null;
    for (const p of chain) {
      const next = rows.find((r) => r.getData().path === p);
      if (!next) continue;
      found = next;
      if (p !== path) { next.treeExpand(); rows = next.getTreeChildren(); }
    }
    return found && found.getData().path === path ? found : null;
  }

  function bindFindings() {
    document.querySelectorAll(".finding[data-where], .node-link[data-where]").forEach((el) => {
      const go = (e) => { if (!el.dataset.where) return; e.preventDefault(); focusWhere(el.dataset.where); };
      el.addEventListener("click", go);
      el.addEventListener("keydown", (e) => { if (e.key === "Enter") go(e); });
    });
  }

  // --- actions ---------------------------------------------------------------------------------
  function bindActions() {
    const link = `${window.location.origin}/r/${data.slug}`;
    $("copy-link").addEventListener("click", () => MGI.copyText(link, "Link"));
    $("copy-md").addEventListener("click", async () => {
      const response = await fetch(`/api/v1/reports/${encodeURIComponent(data.slug)}/markdown`);
      if (!response.ok) { MGI.toast(`No Markdown: ${await MGI.apiError(response)}`); return; }
      MGI.copyText(await response.text(), "Markdown summary");
    });
    $("download-json").addEventListener("click", () => {
      const blob = new Blob([JSON.stringify(report, null, 1)], { type: "application/json" });
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = `report-${data.slug}.json`;
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    });
    $("compare-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("compare-with").value.trim();
      const match = text.match(/\/r\/([A-Za-z0-9_-]+)/) || text.match(/^([A-Za-z0-9_-]+)$/);
      if (!match) { MGI.toast("Give a report slug or its link"); return; }
      window.location.assign(`/compare/${data.slug}..${match[1]}`);
    });
  }

  // --- the graph: a node selects its table row; a row's "show" opens the graph at it -----------
  let graph = null;
  const isRow = (where) => modulePaths.has(where) || nodeNames.has(where);
  const tableOf = (item) => (item.kind === "node" ? "nodes" : "modules");  // fx names "fc" both
  function startGraph() {
    const el = $("report-graph");
    if (!el || typeof MGIGraph === "undefined") return;
    let painted = false;
    graph = MGIGraph.mount(el, report, {
      filename: `graph-${data.slug}`, folds: data.folds,
      onSelect: (item) => { if (isRow(item.where)) steady(() => focusWhere(item.where, { scroll: false, table: tableOf(item) })); },
      onShowInTable: (item) => (isRow(item.where) ? focusWhere(item.where, { table: tableOf(item) }) : MGI.toast(`"${item.where}" is not a row of the table`)),
      onRender: () => { if (!painted) { painted = true; performance.mark("mgi:graph"); } },
    });
    window.MGIReport.graph = graph;
  }

  function steady(change) {
    // The table above the graph grows when a row is opened for the graph's selection: scroll
    // by as much, so the graph stays under the pointer (the second click of a double-click).
    const graphEl = $("graph");
    const top = graphEl.getBoundingClientRect().top;
    const keep = () => window.scrollBy(0, graphEl.getBoundingClientRect().top - top);
    const done = change();
    keep();
    return Promise.resolve(done).then(keep);
  }

  async function showInGraph(where) {
    if (!graph || !graph.reveal) { MGI.toast("No graph for this report"); return; }
    await graph.ready;
    $("graph").scrollIntoView({ behavior: "instant", block: "start" });
    if (!(await graph.reveal(where))) MGI.toast(`"${where}" is not in the graph`);
  }

  // --- readiness, for tests and the benchmark ----------------------------------------------------
  const pending = new Set(["table", "charts"]);
  function markReady(what) {
    pending.delete(what);
    performance.mark(`mgi:${what}`);
    if (!pending.size) { window.__reportReady = performance.now(); document.body.dataset.ready = "1"; }
  }

  bindActions();
  bindFindings();
  if (host) {
    $("view-modules").addEventListener("click", () => showView("modules"));
    $("view-nodes").addEventListener("click", () => showView("nodes"));
    let timer = null;
    $("table-search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(applyFilter, 150); });
    $("flagged-only").addEventListener("change", applyFilter);
    $("expand-all").addEventListener("click", () => tables.modules.getRows().forEach(function open(r) { r.treeExpand(); r.getTreeChildren().forEach(open); }));
    $("collapse-all").addEventListener("click", () => tables.modules.getRows().forEach((r) => r.getTreeChildren().forEach((c) => c.treeCollapse())));
    if ((report.modules || []).length) showView("modules"); else { markReady("table"); showView("nodes"); }
  } else {
    markReady("table");
  }
  // Charts after the table's first paint: the table is what people look at first.
  // The graph's layout runs in a worker meanwhile.
  window.MGIReport = { focusWhere, tables, showInGraph, graph: null };
  requestAnimationFrame(() => setTimeout(() => { startGraph(); MGICharts.renderReport(report, data.budgets); markReady("charts"); }, 0));
})();
