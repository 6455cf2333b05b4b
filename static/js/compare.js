/* The compare page: both gradient profiles on one chart, and the permalink. */
"use strict";
(() => {
  const data = MGI.readJSON("compare-data");
  MGICharts.compareGradients("chart-compare-grads", data.a, data.b);
  document.getElementById("copy-link").addEventListener("click", () => MGI.copyText(window.location.href, "Link"));
  document.body.dataset.ready = "1";
})();
