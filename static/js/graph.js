/* The graph view: the captured graph drawn with Cytoscape, laid out top to bottom by ELK in a
   web worker, modules collapsible, tensor shapes on edges, colour by a measure, search, export.
   `MGIGraph.mount(root, report, options)` returns a controller; the report and compare pages
   wire it to their tables. Needs graph-model.js, graph-style.js, graph-svg.js, cytoscape, elk-api. */
"use strict";
const MGIGraph = (() => {
  const M = MGIGraphModel;
  const S = MGIGraphStyle;
  const WORKER = "/static/vendor/elkjs/elk-worker.min.js";
  let elk = null;
  const early = (url) => { const w = window.MGIGraphWorker; window.MGIGraphWorker = null; return w || new Worker(url); };
  const layoutEngine = () => (elk = elk || new ELK({ workerUrl: WORKER, workerFactory: early }));
  // Start the worker (it loads 1.6 MB of ELK) while the rest of the page is built.
  if (typeof ELK !== "undefined" && document.querySelector(".graph-view")) layoutEngine();
  if (typeof cytoscape !== "undefined") cytoscape.warnings(false);

  const ELK_ROOT = {
    "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
    "elk.edgeRouting": "ORTHOGONAL", "elk.layered.spacing.nodeNodeBetweenLayers": "28",
    "elk.spacing.nodeNode": "22", "elk.spacing.edgeLabel": "4", "elk.spacing.edgeNode": "14",
    "elk.layered.nodePlacement.strategy": "BRANDES_KOEPF", "elk.edgeLabels.placement": "CENTER",
  };
  const ELK_GROUP = { "elk.padding": "[top=30,left=14,bottom=14,right=14]" };

  // --- ELK graph from the visible items -------------------------------------------------------
  function elkGraph(v) {
    const nodes = new Map();
    const root = { id: "root", layoutOptions: ELK_ROOT, children: [], edges: [] };
    for (const item of v.items) {
      const size = item.kind === "group" ? {} : S.size(item);
      nodes.set(item.id, { id: item.id, ...size, children: [], layoutOptions: item.kind === "group" ? ELK_GROUP : undefined });
    }
    for (const item of v.items) (item.parent && nodes.has(item.parent) ? nodes.get(item.parent).children : root.children).push(nodes.get(item.id));
    for (const e of v.edges) {
      const labels = e.label ? [{ id: `l:${e.id}`, text: e.label, ...S.labelSize(e.label) }] : [];
      root.edges.push({ id: e.id, sources: [e.source], targets: [e.target], labels });
    }
    return root;
  }

  function absolute(laid) {
    // ELK gives positions relative to the parent; edges relative to their container.
    const at = new Map([["root", { x: 0, y: 0, width: laid.width, height: laid.height }]]);
    const walk = (node, ox, oy) => (node.children || []).forEach((c) => {
      at.set(c.id, { x: ox + c.x, y: oy + c.y, width: c.width, height: c.height });
      walk(c, ox + c.x, oy + c.y);
    });
    walk(laid, 0, 0);
    const edges = new Map();
    const collect = (node) => {
      for (const e of node.edges || []) edges.set(e.id, e);
      (node.children || []).forEach(collect);
    };
    collect(laid);
    return { at, edges };
  }

  // --- the controller ---------------------------------------------------------------------------
  function mount(root, report, options = {}) {
    performance.mark("mgi:graph-mount");
    const q = (role) => root.querySelector(`[data-role='${role}']`);
    const state = { model: M.build(report, { folds: options.folds }), expanded: null, measure: "kind", query: "", marks: new Map(),
      token: 0, cy: null, view: null, layouts: 0 };
    state.expanded = M.initialExpanded(state.model);
    const listeners = { select: options.onSelect || (() => {}), toggle: options.onToggle || (() => {}),
      rendered: options.onRender || (() => {}) };
    if (!state.model.nodes.length) {
      q("canvas").replaceChildren(Object.assign(document.createElement("p"), { className: "empty", textContent: "No graph was captured for this report." }));
      root.dataset.graphReady = "1";
      return (root.mgiGraph = { state, ready: Promise.resolve() });
    }
    state.cy = cytoscape({ container: q("canvas"), style: S.stylesheet(), minZoom: 0.05, maxZoom: 3,
      boxSelectionEnabled: false, autoungrabify: true });
    const api = { state, root, render, expand, collapse, toggle, reveal, setMeasure, search, setMarks, exportPNG, exportSVG, setExpanded, select };

    async function render(focus = null) {
      const token = ++state.token;
      const v = M.view(state.model, state.expanded);
      state.view = v;
      root.classList.add("busy");
      let laid;
      try {
        const g = elkGraph(v);
        performance.mark("mgi:graph-layout-sent");
        laid = await layoutEngine().layout(g);
        performance.mark("mgi:graph-layout-back");
      } catch (err) {
        root.classList.remove("busy");
        q("status").textContent = `Layout failed: ${err && err.message ? err.message : err}`;
        throw err;
      }
      if (token !== state.token) return;
      draw(v, absolute(laid), focus);
      root.classList.remove("busy");
      state.layouts += 1;
      listeners.rendered(api);
    }

    function draw(v, pos, focus) {
      const cy = state.cy;
      const selected = cy.$(":selected").map((e) => e.id());
      cy.startBatch();
      cy.elements().remove();
      cy.add(S.elements(v, pos, state));
      S.applyRoutes(cy);
      cy.endBatch();
      applyColours();
      applySearch();
      applyMarks();
      cy.$(selected.map((id) => `[id = ${JSON.stringify(id)}]`).join(",") || "#__none").select();
      const target = focus ? cy.getElementById(focus) : null;
      if (target && target.length) focusOn(cy, target);
      else if (!state.layouts) startView(cy);
      else cy.fit(undefined, 24);
      const still = cy.$(":selected");
      showInfo(still.length ? still.data("item") : null);
      updateStatus();
    }

    function focusOn(cy, el) {
      // The module just opened or closed, centred (or its top, when taller than the view).
      const z = Math.min(1, Math.max(cy.zoom(), 0.6));
      const bb = el.boundingBox();
      const fits = bb.h * z < cy.height() - 40;
      cy.zoom(z);
      cy.pan({ x: cy.width() / 2 - ((bb.x1 + bb.x2) / 2) * z, y: fits ? cy.height() / 2 - ((bb.y1 + bb.y2) / 2) * z : 20 - bb.y1 * z });
    }

    function startView(cy) {
      // A long narrow graph fitted whole is unreadable: show its top at a readable zoom.
      cy.fit(undefined, 24);
      const bb = cy.elements().boundingBox();
      const readable = Math.min(0.9, (cy.width() - 40) / bb.w);
      if (cy.zoom() >= 0.6 || readable <= cy.zoom()) return;
      cy.zoom(readable);
      cy.pan({ x: cy.width() / 2 - ((bb.x1 + bb.x2) / 2) * readable, y: 20 - bb.y1 * readable });
    }

    function updateStatus() {
      const shown = state.view.items.filter((i) => i.kind !== "group").length;
      const boxes = state.view.items.filter((i) => i.kind === "box").length;
      q("status").textContent = `${state.model.nodes.length} nodes · showing ${shown} (${boxes} collapsed modules). Double-click a module to open or close it.`;
    }

    // --- expand / collapse / reveal -----------------------------------------------------------
    function setExpanded(path, open) {
      if (!state.model.groups.has(path) || state.expanded.has(path) === open) return false;
      if (open) state.expanded.add(path);
      else for (const p of [...state.expanded]) if (M.within(state.model, p, path)) state.expanded.delete(p);
      return true;
    }
    function toggle(path, open) {
      if (!setExpanded(path, open)) return Promise.resolve();
      listeners.toggle(path, open, api);
      return render(`m:${path}`);
    }
    function expand(path) { return toggle(path, true); }
    function collapse(path) { return toggle(path, false); }

    async function reveal(where) {
      const target = M.pathTo(state.model, where);
      if (!target) return false;
      let changed = false;
      for (const p of target.groups) changed = setExpanded(p, true) || changed;
      if (changed) await render();
      select(target.id, { center: true });
      return true;
    }

    function select(id, { center = false, notify = false } = {}) {
      const el = state.cy.getElementById(id);
      if (!el.length) return;
      state.cy.$(":selected").unselect();
      el.select();
      if (center) state.cy.animate({ center: { eles: el }, zoom: Math.max(state.cy.zoom(), 0.8) }, { duration: 200 });
      showInfo(el.data("item"));
      if (notify) listeners.select(el.data("item"), api);
    }

    // --- colour, search, marks ------------------------------------------------------------------
    function setMeasure(measure) {
      state.measure = measure;
      applyColours();
    }
    function applyColours() {
      const legend = S.colour(state.cy, state.view, state.measure);
      q("legend").innerHTML = legend;
    }

    function search(text) {
      state.query = text.trim().toLowerCase();
      applySearch();
      return state.matches;
    }
    function applySearch() {
      const cy = state.cy;
      cy.elements(".match").removeClass("match");
      state.matches = [];
      if (!state.query) { q("found").textContent = ""; return; }
      const hits = state.model.nodes.filter((n) => [n.name, n.target, n.module_path, n.module_type]
        .some((s) => s && String(s).toLowerCase().includes(state.query)));
      const visible = new Set(hits.map((n) => (cy.getElementById(`n:${n.id}`).length ? `n:${n.id}` : ownerBox(n.id))));
      for (const id of visible) cy.getElementById(id).addClass("match");
      state.matches = hits.map((n) => n.name);
      q("found").textContent = hits.length ? `${hits.length} match${hits.length > 1 ? "es" : ""} (Enter: go to the first)` : "no match";
    }
    function ownerBox(id) {
      for (const p of state.model.owner.get(id)) if (!state.expanded.has(p)) return `m:${p}`;
      return `n:${id}`;
    }

    function setMarks(marks) {
      state.marks = marks;
      applyMarks();
    }
    function applyMarks() {
      state.cy.nodes().removeClass("added removed changed");
      for (const [id, mark] of state.marks) state.cy.getElementById(id).addClass(mark);
    }

    // --- info card ------------------------------------------------------------------------------
    function showInfo(item) {
      const card = q("info");
      if (!item) { card.hidden = true; return; }
      card.hidden = false;
      card.innerHTML = S.infoHtml(item, state.model, { table: !!options.onShowInTable, expanded: state.expanded.has(item.path) });
      card.querySelectorAll("button[data-act]").forEach((b) => b.addEventListener("click", () => {
        if (b.dataset.act === "table") options.onShowInTable(item);
        if (b.dataset.act === "expand") expand(item.path);
        if (b.dataset.act === "collapse") collapse(item.path);
      }));
    }

    // --- export ---------------------------------------------------------------------------------
    function exportPNG() {
      return state.cy.png({ output: "blob", bg: "#ffffff", full: true, scale: 2, maxWidth: 12000, maxHeight: 12000 });
    }
    function exportSVG() {
      return new Blob([MGIGraphSVG.serialize(state.cy)], { type: "image/svg+xml" });
    }
    function download(blob, ext) {
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = `${options.filename || "graph"}.${ext}`;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 2000);
    }

    // --- events ---------------------------------------------------------------------------------
    state.cy.on("tap", "node[kind != 'label']", (e) => select(e.target.id(), { notify: true }));
    state.cy.on("tap", (e) => { if (e.target === state.cy) showInfo(null); });
    state.cy.on("dbltap", "node[kind = 'box']", (e) => expand(e.target.data("item").path));
    state.cy.on("dbltap", "node[kind = 'group']", (e) => collapse(e.target.data("item").path));
    bindToolbar();

    function bindToolbar() {
      q("measure").addEventListener("change", (e) => setMeasure(e.target.value));
      let timer = null;
      q("search").addEventListener("input", (e) => { clearTimeout(timer); timer = setTimeout(() => search(e.target.value), 150); });
      q("search").addEventListener("keydown", (e) => {
        if (e.key !== "Enter") return;
        e.preventDefault();
        search(e.target.value);
        if (state.matches.length) reveal(state.matches[0]);
      });
      q("fit").addEventListener("click", () => state.cy.fit(undefined, 24));
      q("reset").addEventListener("click", () => { state.expanded = M.initialExpanded(state.model); render(); });
      q("png").addEventListener("click", async () => download(await exportPNG(), "png"));
      q("svg").addEventListener("click", () => download(exportSVG(), "svg"));
    }

    root.mgiGraph = api;
    api.ready = render().then(() => { root.dataset.graphReady = "1"; });
    return api;
  }

  return { mount };
})();
