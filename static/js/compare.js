/* The compare page: both gradient profiles on one chart, the two graphs with what was added,
   removed or changed marked, and the permalink. */
"use strict";
(() => {
  const data = MGI.readJSON("compare-data");
  MGICharts.compareGradients("chart-compare-grads", data.a, data.b);
  document.getElementById("copy-link").addEventListener("click", () => MGI.copyText(window.location.href, "Link"));
  document.body.dataset.ready = "1";

  // --- the two graphs: reports from the API, marks recomputed after each layout ------------------
  async function fetchReport(slug) {
    const response = await fetch(`/api/v1/reports/${encodeURIComponent(slug)}`);
    if (!response.ok) throw new Error(await MGI.apiError(response));
    return (await response.json()).report || {};
  }

  function mark(views) {
    const [a, b] = views;
    if (!a.state.view || !b.state.view) return;
    a.setMarks(MGIGraphModel.diffMarks(a.state.model, b.state.model, a.state.view.items, "a"));
    b.setMarks(MGIGraphModel.diffMarks(b.state.model, a.state.model, b.state.view.items, "b"));
  }

  async function startGraphs() {
    const roots = [document.getElementById("graph-a"), document.getElementById("graph-b")];
    if (!roots[0] || typeof MGIGraph === "undefined") return;
    let reports;
    try {
      reports = await Promise.all([fetchReport(data.a.slug), fetchReport(data.b.slug)]);
    } catch (err) {
      roots.forEach((r) => { r.querySelector("[data-role='status']").textContent = `No graph: ${err.message}`; });
      return;
    }
    const views = [];
    const other = (v) => views[views[0] === v ? 1 : 0];
    const options = (side) => ({
      filename: `graph-${data[side].slug}`,
      folds: data[side].folds,
      onRender: () => mark(views),
      onToggle: (path, open, v) => { const o = other(v); if (o && o.setExpanded && o.setExpanded(path, open)) o.render(`m:${path}`); },
    });
    views.push(MGIGraph.mount(roots[0], reports[0], options("a")), MGIGraph.mount(roots[1], reports[1], options("b")));
    await Promise.all(views.map((v) => v.ready));
    mark(views);
    document.body.dataset.graphsReady = "1";
    window.MGICompare = { views };
  }
  startGraphs();
})();
