/* How the graph looks: sizes from measured text, the Cytoscape stylesheet, elements placed at
   ELK's positions (edges follow ELK's orthogonal routes), colour by a measure with its legend,
   and the info card of a selected node. */
"use strict";
const MGIGraphStyle = (() => {
  const FONT = "system-ui, sans-serif";
  const MONO = "ui-monospace, monospace";
  const KIND_FILL = { box: "#e8edff", node: "#ffffff", placeholder: "#e7f8ee", output: "#eef0f4" };
  const SEVERITY_FILL = { error: "#fdd8d3", warning: "#fde9b8", info: "#d6e8fd" };
  const MEASURES = {
    saved: { label: "Saved activation bytes", key: "saved", ramp: ["#fff7ec", "#f79009"], fmt: (v) => MGI.formatBytes(v) },
    flops: { label: "Forward FLOPs", key: "flops", ramp: ["#f1f7ff", "#175cd3"], fmt: (v) => MGI.formatCount(v) },
    grad: { label: "Gradient norm (log scale)", key: "grad", ramp: ["#f4f0ff", "#6938ef"], fmt: (v) => v.toPrecision(3), log: true },
  };
  let ctx = null;
  function textWidth(text, font) {
    ctx = ctx || document.createElement("canvas").getContext("2d");
    ctx.font = font;
    return ctx.measureText(text).width;
  }

  function size(item) {
    const w = Math.max(textWidth(item.title, `600 12px ${FONT}`), textWidth(item.subtitle || "", `11px ${FONT}`));
    return { width: Math.round(Math.min(280, Math.max(70, w + 26))), height: item.kind === "box" ? 46 : 38 };
  }
  function labelSize(text) {
    const lines = text.split("\n");
    const w = Math.max(...lines.map((l) => textWidth(l, `10px ${MONO}`)));
    return { width: Math.round(w + 8), height: lines.length * 12 + 4 };
  }

  function stylesheet() {
    return [
      { selector: "node", style: { shape: "round-rectangle", width: "data(w)", height: "data(h)", label: "data(label)",
        "text-wrap": "wrap", "text-valign": "center", "text-halign": "center", "font-family": FONT, "font-size": 11,
        color: "#1d2330", "background-color": "data(fill)", "border-width": 1, "border-color": "#98a2b3", "z-index-compare": "manual", "z-index": "data(z)" } },
      { selector: "node[kind = 'box']", style: { "border-width": 2, "border-color": "#3b5bdb", "font-weight": 600, "corner-radius": 8 } },
      { selector: "node[op = 'placeholder']", style: { "border-color": "#067647", "border-width": 1.5 } },
      { selector: "node[op = 'output']", style: { "border-color": "#475467", "border-width": 1.5 } },
      { selector: "node[kind = 'group']", style: { "background-color": "#f7f8fb", "background-opacity": 0.9, "border-style": "dashed",
        "border-color": "#98a2b3", "text-valign": "top", "text-halign": "center", "text-margin-y": 20, "font-size": 11,
        "font-weight": 600, color: "#475467" } },
      { selector: "node[kind = 'label']", style: { shape: "rectangle", "background-color": "#ffffff", "background-opacity": 0.92,
        "border-width": 0, "font-family": MONO, "font-size": 10, color: "#344054", events: "no" } },
      { selector: "edge", style: { width: 1.3, "line-color": "#8a94a6", "target-arrow-color": "#8a94a6", "target-arrow-shape": "triangle",
        "arrow-scale": 0.8, "z-index-compare": "manual", "z-index": "data(z)" } },
      { selector: "node.match", style: { "border-color": "#d92d20", "border-width": 3, "underlay-color": "#d92d20", "underlay-opacity": 0.12, "underlay-padding": 5 } },
      { selector: "node.added", style: { "border-color": "#067647", "border-width": 3, "background-color": "#d1fadf" } },
      { selector: "node.removed", style: { "border-color": "#d92d20", "border-width": 3, "background-color": "#fee4e2", "border-style": "dashed" } },
      { selector: "node.changed", style: { "border-color": "#dc6803", "border-width": 3, "background-color": "#fef0c7" } },
      { selector: "node:selected", style: { "border-color": "#f79009", "border-width": 4, "overlay-opacity": 0 } },
    ];
  }

  // --- elements -----------------------------------------------------------------------------
  function depthOf(item) { return item.depth ?? (item.path ? item.path.split(".").length : 0); }

  function elements(v, pos, state) {
    const out = [];
    for (const item of v.items) {
      const at = pos.at.get(item.id);
      if (!at) continue;
      const label = item.kind === "group" ? `▾ ${item.title}` : item.kind === "box" ? `▸ ${item.title}\n${item.subtitle}` : `${item.title}\n${item.subtitle}`;
      const z = item.kind === "group" ? depthOf(item) : 100;
      out.push({ group: "nodes", data: { id: item.id, kind: item.kind, op: item.op || "", label, item, w: at.width, h: at.height, z, fill: KIND_FILL[item.kind] },
        position: { x: at.x + at.width / 2, y: at.y + at.height / 2 } });
    }
    for (const e of v.edges) out.push(...edgeElements(e, pos));
    return out;
  }

  function edgeElements(e, pos) {
    const laid = pos.edges.get(e.id);
    const route = laid ? routeOf(laid, pos) : null;
    const path = route ? segmentStyle(route, pos.at.get(e.source), pos.at.get(e.target)) : null;
    const edge = { group: "edges", data: { id: e.id, source: e.source, target: e.target, label: e.label, route, path, z: 90 } };
    const out = [edge];
    for (const l of (laid && laid.labels) || []) {
      const off = pos.at.get(laid.container) || { x: 0, y: 0 };
      out.push({ group: "nodes", data: { id: `l:${e.id}`, kind: "label", label: l.text, w: l.width, h: l.height, z: 95, fill: "#fff" },
        position: { x: off.x + l.x + l.width / 2, y: off.y + l.y + l.height / 2 } });
    }
    return out;
  }

  function routeOf(laid, pos) {
    const off = pos.at.get(laid.container) || { x: 0, y: 0 };
    const s = (laid.sections || [])[0];
    if (!s) return null;
    return [s.startPoint, ...(s.bendPoints || []), s.endPoint].map((p) => ({ x: off.x + p.x, y: off.y + p.y }));
  }

  function segmentStyle(route, src, dst) {
    // Cytoscape places segment points relative to the line between the two node centres.
    const s = { x: src.x + src.width / 2, y: src.y + src.height / 2 };
    const t = { x: dst.x + dst.width / 2, y: dst.y + dst.height / 2 };
    const first = route[0], last = route[route.length - 1];
    const style = { "source-endpoint": `${(first.x - s.x).toFixed(1)}px ${(first.y - s.y).toFixed(1)}px`,
      "target-endpoint": `${(last.x - t.x).toFixed(1)}px ${(last.y - t.y).toFixed(1)}px` };
    const bends = route.slice(1, -1);
    const vx = t.x - s.x, vy = t.y - s.y;
    const len2 = vx * vx + vy * vy;
    if (!bends.length || len2 < 1) return { ...style, "curve-style": "straight" };
    const len = Math.sqrt(len2);
    return { ...style, "curve-style": "segments", "edge-distances": "node-position",
      "segment-weights": bends.map((p) => (((p.x - s.x) * vx + (p.y - s.y) * vy) / len2).toFixed(4)).join(" "),
      "segment-distances": bends.map((p) => (((p.y - s.y) * vx - (p.x - s.x) * vy) / len).toFixed(2)).join(" ") };
  }

  /** ELK's routes, as style bypasses (Cytoscape ignores some of them at creation). */
  function applyRoutes(cy) {
    cy.edges().forEach((e) => { if (e.data("path")) e.style(e.data("path")); });
  }

  // --- colour by a measure --------------------------------------------------------------------
  function mix(ramp, a) {
    const c = ramp.map((h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)));
    return `rgb(${c[0].map((x, i) => Math.round(x + (c[1][i] - x) * a)).join(",")})`;
  }

  function colour(cy, v, measure) {
    const items = cy.nodes("[kind = 'node'], [kind = 'box']");
    if (measure === "findings") return colourFindings(items);
    const spec = MEASURES[measure];
    if (!spec) {
      items.forEach((n) => n.data("fill", KIND_FILL[n.data("op")] || KIND_FILL[n.data("kind")]));
      return "";
    }
    const values = items.map((n) => n.data("item").measure[spec.key]).filter((x) => x !== null && x !== undefined && (!spec.log || x > 0));
    if (!values.length) {
      items.forEach((n) => n.data("fill", "#f2f4f7"));
      return `<span class="legend-title">${spec.label}</span> <span class="sub">not recorded in this report</span>`;
    }
    const lo = Math.min(...values), hi = Math.max(...values);
    const scale = (x) => (spec.log ? (hi > lo ? (Math.log(x) - Math.log(lo)) / (Math.log(hi) - Math.log(lo)) : 1) : (hi > 0 ? Math.sqrt(x / hi) : 0));
    items.forEach((n) => {
      const x = n.data("item").measure[spec.key];
      n.data("fill", x === null || x === undefined || (spec.log && x <= 0) ? "#f2f4f7" : mix(spec.ramp, scale(x)));
    });
    return `<span class="legend-title">${spec.label}</span> <span class="legend-end">${spec.fmt(spec.log ? lo : 0)}</span>`
      + `<span class="ramp" style="background: linear-gradient(90deg, ${spec.ramp[0]}, ${spec.ramp[1]})"></span>`
      + `<span class="legend-end">${spec.fmt(hi)}</span>`;
  }

  function colourFindings(items) {
    items.forEach((n) => {
      const sev = MGIGraphModel.severityOf(n.data("item").measure.findings);
      n.data("fill", sev ? SEVERITY_FILL[sev] : "#ffffff");
    });
    return `<span class="legend-title">Findings</span>` + Object.entries(SEVERITY_FILL)
      .map(([k, c]) => `<span class="swatch" style="background:${c}"></span>${k}`).join(" ");
  }

  // --- info card --------------------------------------------------------------------------------
  const esc = (t) => String(t ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  function infoHtml(item, model, opts) {
    const m = item.measure || {};
    const rows = [];
    if (item.kind === "node") {
      const n = model.byId.get(item.nodeId);
      rows.push(["Node", n.name], ["Op", `${n.op} ${n.target || ""}`], ["Module", n.module_path || "(root)"]);
      rows.push(["Outputs", (n.output_tensors || []).map(MGIGraphModel.tensorLabel).join(", ") || "-"]);
      if (n.params) rows.push(["Params", MGI.formatCount(n.params)]);
      if (n.location) rows.push(["Location", n.location]);
    } else {
      const g = model.groups.get(item.path);
      const info = g.info || {};
      if (g.fold) rows.push(["Blocks", `${MGIFolds.rangeName(g.fold)} (${g.fold.paths.length} alike)`]);
      else rows.push(["Module", item.path]);
      rows.push(["Type", g.type || "-"], ["Nodes", String(g.count)]);
      if (info.output_shapes) rows.push(["Outputs", MGI.formatShapes(info.output_shapes)]);
      if (info.params !== undefined && info.params !== null) rows.push(["Params", MGI.formatCount(info.params)]);
      if (g.fold) rows.push(["Params a block", MGI.formatCount(g.fold.per_block.params)]);
    }
    rows.push(["FLOPs", MGI.formatCount(m.flops || 0)], ["Saved", MGI.formatBytes(m.saved || 0)]);
    if (m.grad !== null && m.grad !== undefined) rows.push(["Grad norm", m.grad.toPrecision(3)]);
    const findings = (m.findings || []).slice(0, 5).map((f) => `<li><span class="flag ${esc(f.severity)}">${esc(f.rule)}</span> ${esc(f.message)}</li>`).join("");
    const buttons = [
      opts.table ? `<button type="button" class="btn ghost small" data-act="table">Show in table</button>` : "",
      item.kind === "box" ? `<button type="button" class="btn ghost small" data-act="expand">Expand</button>` : "",
      item.kind === "group" ? `<button type="button" class="btn ghost small" data-act="collapse">Collapse</button>` : "",
    ].join("");
    return `<table class="kv">${rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join("")}</table>`
      + (findings ? `<ul class="graph-findings">${findings}</ul>` : "") + `<div class="info-actions">${buttons}</div>`;
  }

  return { size, labelSize, stylesheet, elements, applyRoutes, colour, infoHtml };
})();
