/* Plotly charts drawn from the report data: activations, memory timeline, batch scaling, gradients. */
"use strict";
const MGICharts = (() => {
  const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] };
  const COLORS = { forward: "#3b5bdb", backward: "#f79009", optimizer: "#12b76a", a: "#98a2b3", b: "#3b5bdb" };
  const VERDICT_COLORS = { ok: "#3b5bdb", vanishing: "#7a5af8", exploding: "#d92d20", nan: "#d92d20", cut: "#d92d20", unused: "#98a2b3", frozen: "#98a2b3", gated: "#98a2b3" };

  function layout(extra) {
    return Object.assign({
      margin: { l: 58, r: 14, t: 34, b: 44 }, font: { size: 11, family: "system-ui, sans-serif", color: "#344054" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff", showlegend: true, hovermode: "closest",
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    }, extra);
  }

  function empty(id, text) {
    const el = document.getElementById(id);
    if (el) el.innerHTML = `<div class="no-data">${text}</div>`;
  }

  /** Bytes on an axis in one readable unit, chosen from the largest value. */
  function byteUnit(max) {
    const units = [["B", 1], ["KiB", 1024], ["MiB", 1024 ** 2], ["GiB", 1024 ** 3], ["TiB", 1024 ** 4]];
    let pick = units[0];
    for (const u of units) if (max >= u[1]) pick = u;
    return { name: pick[0], div: pick[1] };
  }

  function savedPerLayer(report) {
    const groups = new Map();
    for (const n of report.nodes || []) {
      if (!n.saved_bytes) continue;
      const key = n.module_path || n.name;
      groups.set(key, (groups.get(key) || 0) + n.saved_bytes);
    }
    if (!groups.size) {
      const parents = new Set((report.modules || []).map((m) => m.parent));
      for (const m of report.modules || []) if (!parents.has(m.path) && m.saved_activation_bytes) groups.set(m.path, m.saved_activation_bytes);
    }
    if (!groups.size) return empty("chart-saved", "No saved-activation figures in this report.");
    const names = [...groups.keys()], values = [...groups.values()];
    const unit = byteUnit(Math.max(...values));
    // One SVG path per bar gets slow past a few hundred layers: draw a filled step line then.
    const many = names.length > 150;
    Plotly.newPlot("chart-saved", [{
      type: many ? "scatter" : "bar", x: names.map((_, i) => i), y: values.map((v) => v / unit.div), customdata: names,
      text: values.map(MGI.formatBytes), marker: { color: "#f79009" },
      ...(many ? { mode: "lines", fill: "tozeroy", line: { shape: "hv", color: "#f79009", width: 1 } } : {}),
      hovertemplate: "%{customdata}<br>%{text}<extra></extra>",
    }], layout({ showlegend: false, bargap: 0.15,
      xaxis: { title: { text: "layer, forward order" }, showticklabels: names.length <= 30, tickvals: names.length <= 30 ? names.map((_, i) => i) : undefined, ticktext: names, tickangle: -35 },
      yaxis: { title: { text: unit.name }, rangemode: "tozero" } }), CONFIG);
  }

  /** At most ~`limit` points: per bucket keep the lowest and the highest, so peaks survive. */
  function thin(points, limit) {
    if (points.length <= limit) return points;
    const size = Math.ceil(points.length / (limit / 2));
    const out = [];
    for (let i = 0; i < points.length; i += size) {
      const bucket = points.slice(i, i + size);
      const lo = bucket.reduce((a, p) => (p.live_bytes < a.live_bytes ? p : a));
      const hi = bucket.reduce((a, p) => (p.live_bytes > a.live_bytes ? p : a));
      out.push(...(lo.step <= hi.step ? [lo, hi] : [hi, lo]).filter((p, k, arr) => k === 0 || p !== arr[0]));
    }
    return out;
  }

  function timeline(report) {
    const points = thin((report.memory || {}).timeline || [], 2000);
    if (!points.length) return empty("chart-timeline", "No memory timeline in this report.");
    const peak = points.reduce((best, p) => (p.live_bytes > best.live_bytes ? p : best), points[0]);
    const unit = byteUnit(peak.live_bytes);
    const traces = ["forward", "backward", "optimizer"].map((phase) => {
      const ps = points.filter((p) => p.phase === phase);
      return ps.length && {
        type: "scatter", mode: "lines", name: phase, line: { color: COLORS[phase], width: 1.8, shape: "hv" },
        x: ps.map((p) => p.step), y: ps.map((p) => p.live_bytes / unit.div), customdata: ps.map((p) => p.node || ""),
        text: ps.map((p) => MGI.formatBytes(p.live_bytes)), hovertemplate: "step %{x} · %{customdata}<br>%{text}<extra>" + phase + "</extra>",
      };
    }).filter(Boolean);
    traces.push({ type: "scatter", mode: "markers+text", name: "peak", x: [peak.step], y: [peak.live_bytes / unit.div],
      marker: { color: "#d92d20", size: 10, symbol: "diamond" }, text: [`peak ${MGI.formatBytes(peak.live_bytes)}`],
      textposition: "top center", hovertemplate: `peak at ${peak.node || "step " + peak.step}<extra></extra>` });
    Plotly.newPlot("chart-timeline", traces, layout({
      xaxis: { title: { text: "step (forward, then backward)" } },
      yaxis: { title: { text: `live ${unit.name}` }, rangemode: "tozero" } }), CONFIG);
  }

  function batchScaling(report, budgets) {
    const memory = report.memory || {};
    const points = memory.batch_scaling || [];
    if (!points.length) return empty("chart-batch", "No batch scaling: the input has no batch dimension.");
    const maxBatch = Object.entries(memory.max_batch || {}).map(([b, n]) => [Number(b), n]).filter(([b, n]) => b > 0 && n > 0);
    const top = Math.max(...points.map((p) => p.train_peak_bytes));
    // The report's own budgets when it has them, else the common accelerator sizes in range.
    const lines = (maxBatch.length ? maxBatch.map(([b]) => b) : budgets.filter((b) => b <= top * 1.05)).sort((x, y) => x - y).slice(0, 6);
    const unit = byteUnit(Math.max(top, ...lines));
    const x = points.map((p) => p.batch);
    const traces = [
      { type: "scatter", mode: "lines+markers", name: "training step", x, y: points.map((p) => p.train_peak_bytes / unit.div), line: { color: COLORS.b }, text: points.map((p) => MGI.formatBytes(p.train_peak_bytes)), hovertemplate: "batch %{x}: %{text}<extra>train</extra>" },
      { type: "scatter", mode: "lines+markers", name: "forward only", x, y: points.map((p) => p.forward_peak_bytes / unit.div), line: { color: "#98a2b3", dash: "dot" }, text: points.map((p) => MGI.formatBytes(p.forward_peak_bytes)), hovertemplate: "batch %{x}: %{text}<extra>forward</extra>" },
    ];
    if (maxBatch.length) traces.push({ type: "scatter", mode: "markers+text", name: "largest batch", x: maxBatch.map(([, n]) => n), y: maxBatch.map(([b]) => b / unit.div),
      marker: { color: "#12b76a", size: 11, symbol: "star" }, text: maxBatch.map(([, n]) => `${n}`), textposition: "top center",
      customdata: maxBatch.map(([b]) => MGI.formatBytes(b)), hovertemplate: "largest batch %{x} in %{customdata}<extra></extra>" });
    const shapes = lines.map((b) => ({ type: "line", xref: "paper", x0: 0, x1: 1, y0: b / unit.div, y1: b / unit.div, line: { color: "#d0d5dd", width: 1, dash: "dash" } }));
    const annotations = lines.map((b) => ({ xref: "paper", x: 0.01, y: b / unit.div, text: `${MGI.formatBytes(b)} budget`, showarrow: false, yshift: 8, xanchor: "left", font: { size: 10, color: "#667085" } }));
    const logX = x.length > 2 && Math.max(...x) / Math.max(1, Math.min(...x)) > 20;
    Plotly.newPlot("chart-batch", traces, layout({ shapes, annotations,
      xaxis: { title: { text: `batch (${memory.batch_dim || "batch"})` }, type: logX ? "log" : "linear", tickvals: logX ? [...new Set([...x, ...maxBatch.map(([, n]) => n)])] : undefined },
      yaxis: { title: { text: unit.name }, rangemode: "tozero" } }), CONFIG);
  }

  function threshold(thresholds, word) {
    const key = Object.keys(thresholds || {}).find((k) => k.toLowerCase().includes(word));
    return key ? thresholds[key] : null;
  }

  function gradients(report) {
    const g = report.gradients || {};
    const layers = (g.layers || []).filter((l) => l.grad_norm > 0).sort((a, b) => a.depth_index - b.depth_index);
    if (!g.computed || !layers.length) return empty("chart-grads", g.error ? `Gradients not computed: ${g.error}` : "No gradient norms in this report.");
    const y = layers.map((l) => l.grad_norm);
    const low = threshold(g.thresholds, "vanish"), high = threshold(g.thresholds, "explod");
    const lo = Math.min(...y, low || Infinity) / 10, hi = Math.max(...y, high || 0) * 10;
    const shapes = [];
    if (low) shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, y0: lo, y1: low, fillcolor: "rgba(122, 90, 248, 0.10)", line: { width: 0 }, layer: "below" });
    if (high) shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, y0: high, y1: hi, fillcolor: "rgba(217, 45, 32, 0.10)", line: { width: 0 }, layer: "below" });
    const annotations = [];
    if (low) annotations.push({ xref: "paper", x: 1, y: Math.log10(low), yanchor: "top", xanchor: "right", text: "vanishing", showarrow: false, font: { size: 10, color: "#7a5af8" } });
    if (high) annotations.push({ xref: "paper", x: 1, y: Math.log10(high), yanchor: "bottom", xanchor: "right", text: "exploding", showarrow: false, font: { size: 10, color: "#d92d20" } });
    Plotly.newPlot("chart-grads", [{
      type: "scatter", mode: layers.length > 200 ? "lines" : "lines+markers", x: layers.map((_, i) => i), y, customdata: layers.map((l) => `${l.module_path} (${l.type || ""})`),
      marker: { color: layers.map((l) => VERDICT_COLORS[l.verdict] || "#98a2b3"), size: 7 }, line: { color: "#c5cbe0", width: 1 },
      text: layers.map((l) => l.verdict), hovertemplate: "%{customdata}<br>grad norm %{y:.3g} · %{text}<extra></extra>",
    }], layout({ showlegend: false, shapes, annotations,
      xaxis: { title: { text: "layer, forward order" }, showticklabels: layers.length <= 30, tickvals: layers.length <= 30 ? layers.map((_, i) => i) : undefined, ticktext: layers.map((l) => l.module_path), tickangle: -35 },
      yaxis: { title: { text: "grad norm (log)" }, type: "log", range: [Math.log10(lo), Math.log10(hi)], exponentformat: "power" } }), CONFIG);
  }

  function renderReport(report, budgets) {
    for (const [name, draw] of [["saved", savedPerLayer], ["timeline", timeline], ["batch", batchScaling], ["grads", gradients]]) {
      draw(report, budgets || []);
      performance.mark(`mgi:chart-${name}`);
    }
  }

  function compareGradients(id, a, b) {
    const usable = (side) => side.layers.filter((l) => l.grad_norm > 0);
    if (!usable(a).length && !usable(b).length) return empty(id, "Neither report has gradient norms.");
    const order = [...new Set([...a.layers.map((l) => l.path), ...b.layers.map((l) => l.path)])];
    const trace = (side, key, dash) => ({
      type: "scatter", mode: order.length > 200 ? "lines" : "lines+markers", name: `${key.toUpperCase()}: ${side.name}`,
      x: usable(side).map((l) => order.indexOf(l.path)), y: usable(side).map((l) => l.grad_norm), customdata: usable(side).map((l) => l.path),
      line: { color: COLORS[key], dash }, hovertemplate: "%{customdata}<br>%{y:.3g}<extra>" + key.toUpperCase() + "</extra>",
    });
    Plotly.newPlot(id, [trace(a, "a", "dot"), trace(b, "b", "solid")], layout({
      xaxis: { title: { text: "layer, forward order" }, showticklabels: order.length <= 30, tickvals: order.length <= 30 ? order.map((_, i) => i) : undefined, ticktext: order, tickangle: -35 },
      yaxis: { title: { text: "grad norm (log)" }, type: "log", exponentformat: "power" } }), CONFIG);
  }

  return { renderReport, compareGradients, byteUnit };
})();
