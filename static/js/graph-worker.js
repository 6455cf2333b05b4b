/* Loaded in <head>: start the ELK layout worker at once, so that its 1.6 MB compile and a
   first small layout (which warms its JIT) run while the page's HTML and data still arrive.
   graph.js hands the worker to ELK; the warm-up's answer (id "warm") is ignored there. */
"use strict";
window.MGIGraphWorker = (() => {
  if (typeof Worker === "undefined") return null;
  const worker = new Worker("/static/vendor/elkjs/elk-worker.min.js");
  const node = (id) => ({ id, width: 80, height: 30 });
  const graph = {
    id: "root", children: [node("a"), { id: "g", children: [node("b"), node("c")] }, node("d")],
    edges: [["a", "b"], ["b", "c"], ["c", "d"], ["a", "d"]].map(([s, t], i) => (
      { id: `e${i}`, sources: [s], targets: [t], labels: [{ text: "[B, 8] f32", width: 60, height: 14 }] })),
  };
  const layoutOptions = { "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
    "elk.edgeRouting": "ORTHOGONAL" };
  worker.postMessage({ id: "warm", cmd: "layout", graph: { ...graph, layoutOptions }, layoutOptions: {}, options: {} });
  return worker;
})();
