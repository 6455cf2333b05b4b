/* SVG export of the graph as drawn: boxes, labels and edge routes at their current positions
   and colours (a small serializer: Cytoscape itself only exports PNG/JPG). */
"use strict";
const MGIGraphSVG = (() => {
  const esc = (t) => String(t ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const n1 = (x) => Math.round(x * 10) / 10;

  function text(lines, x, y, style) {
    const size = parseFloat(style["font-size"]) || 11;
    const top = y - ((lines.length - 1) * size * 1.2) / 2;
    const spans = lines.map((l, i) => `<tspan x="${n1(x)}" y="${n1(top + i * size * 1.2)}">${esc(l)}</tspan>`).join("");
    return `<text font-family="${esc(style["font-family"])}" font-size="${size}" font-weight="${esc(style["font-weight"] || "normal")}" `
      + `fill="${esc(style.color)}" text-anchor="middle" dominant-baseline="central">${spans}</text>`;
  }

  function node(n) {
    const s = n.style();
    const bb = n.boundingBox({ includeLabels: false, includeOverlays: false });
    const p = n.position();
    const w = n.data("w"), h = n.data("h");
    const kind = n.data("kind");
    const dash = s["border-style"] === "dashed" ? ' stroke-dasharray="5 3"' : "";
    const radius = kind === "label" ? 0 : 6;
    const rect = `<rect x="${n1(p.x - w / 2)}" y="${n1(p.y - h / 2)}" width="${n1(w)}" height="${n1(h)}" rx="${radius}" `
      + `fill="${esc(s["background-color"])}" fill-opacity="${esc(s["background-opacity"])}" stroke="${esc(s["border-color"])}" `
      + `stroke-width="${parseFloat(s["border-width"]) || 0}"${dash}/>`;
    const lines = String(n.data("label") || "").split("\n");
    const y = kind === "group" ? bb.y1 + 14 : p.y;
    return `<g class="${esc(kind)}" data-id="${esc(n.id())}">${rect}${text(lines, p.x, y, s)}</g>`;
  }

  function edge(e) {
    const route = e.data("route");
    const pts = route || [e.sourceEndpoint(), e.targetEndpoint()];
    const d = pts.map((p, i) => `${i ? "L" : "M"}${n1(p.x)},${n1(p.y)}`).join(" ");
    return `<path d="${d}" fill="none" stroke="#8a94a6" stroke-width="1.3" marker-end="url(#arrow)"/>`;
  }

  function serialize(cy) {
    const bb = cy.elements().boundingBox();
    const pad = 20;
    const w = n1(bb.w + 2 * pad), h = n1(bb.h + 2 * pad);
    const byZ = (a, b) => a.data("z") - b.data("z");
    const groups = cy.nodes("[kind = 'group']").sort(byZ).map(node);
    const edges = cy.edges().map(edge);
    const rest = cy.nodes("[kind != 'group']").map(node);
    return `<?xml version="1.0" encoding="UTF-8"?>\n`
      + `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="${n1(bb.x1 - pad)} ${n1(bb.y1 - pad)} ${w} ${h}">\n`
      + `<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">`
      + `<path d="M0,0 L10,5 L0,10 z" fill="#8a94a6"/></marker></defs>\n`
      + `<rect x="${n1(bb.x1 - pad)}" y="${n1(bb.y1 - pad)}" width="${w}" height="${h}" fill="#ffffff"/>\n`
      + [...groups, ...edges, ...rest].join("\n") + "\n</svg>\n";
  }

  return { serialize };
})();
