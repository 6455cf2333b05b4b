/* A failed job: re-run the same upload, then follow it to its (new) report page. */
"use strict";
(() => {
  const button = document.getElementById("rerun");
  const errorEl = document.getElementById("form-error");
  button.addEventListener("click", async () => {
    button.disabled = true;
    errorEl.textContent = "";
    try {
      const response = await fetch(`/api/v1/reports/${encodeURIComponent(button.dataset.slug)}/rerun`, { method: "POST" });
      if (!response.ok) throw new Error(await MGI.apiError(response));
      const body = await response.json().catch(() => ({}));
      const slug = body.slug || (body.job && body.job.slug) || button.dataset.slug;
      window.location.assign(`/r/${encodeURIComponent(slug)}`);
    } catch (err) {
      errorEl.textContent = `Could not re-run: ${err.message}`;
      button.disabled = false;
    }
  });
})();
