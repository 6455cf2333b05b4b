/* A queued or running job: poll the API for stage and percent, show the report when done. */
"use strict";
(() => {
  const panel = document.getElementById("progress");
  const slug = panel.dataset.slug;
  const stageEl = document.getElementById("job-stage");
  const statusEl = document.getElementById("job-status");
  const percentEl = document.getElementById("job-percent");
  const bar = document.getElementById("job-bar");
  let delay = 700;

  function show(job) {
    const percent = Math.max(0, Math.min(100, job.progress || 0));
    statusEl.textContent = (job.status || "").replace(/_/g, " ");
    statusEl.className = `status s-${job.status}`;
    stageEl.textContent = job.stage || (job.status === "queued" ? "waiting for a worker" : "starting");
    percentEl.textContent = `${percent}%`;
    bar.style.width = `${percent}%`;
  }
  async function poll() {
    try {
      const response = await fetch(`/api/v1/reports/${encodeURIComponent(slug)}`, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const body = await response.json();
        const job = body.job || body;
        show(job);
        if (job.status && job.status !== "queued" && job.status !== "running") {
          window.location.reload();
          return;
        }
      }
    } catch (err) { /* the server restarting: keep trying */ }
    delay = Math.min(delay * 1.3, 3000);
    setTimeout(poll, delay);
  }
  setTimeout(poll, delay);
})();
