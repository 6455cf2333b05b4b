/* Shared helpers: number formats (same as inspector/units.py), page data, toasts, clipboard. */
"use strict";
const MGI = (() => {
  function formatBytes(n) {
    if (n === null || n === undefined) return "-";
    const sign = n < 0 ? "-" : "";
    let v = Math.abs(n);
    for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
      if (v < 1024 || unit === "TiB") return unit === "B" ? `${sign}${v.toFixed(0)} B` : `${sign}${v.toFixed(2)} ${unit}`;
      v /= 1024;
    }
  }
  function formatCount(n) {
    if (n === null || n === undefined) return "-";
    const sign = n < 0 ? "-" : "";
    let v = Math.abs(n);
    for (const unit of ["", "K", "M", "G", "T"]) {
      if (v < 1000 || unit === "T") return unit === "" ? `${sign}${v.toFixed(0)}` : `${sign}${v.toFixed(2)}${unit}`;
      v /= 1000;
    }
  }
  function formatShapes(list) {
    if (!list || !list.length) return "";
    const shapes = Array.isArray(list[0]) ? list : [list];
    return shapes.map((s) => (s.length ? s.join("×") : "scalar")).join(", ");
  }
  function readJSON(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  let toastTimer = null;
  function toast(text) {
    const el = document.getElementById("toast");
    if (!el) return;
    el.textContent = text;
    el.classList.add("show");
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => el.classList.remove("show"), 2200);
  }
  async function copyText(text, what) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (err) {
      // Plain http on a LAN has no clipboard API: fall back to a hidden textarea.
      const area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    toast(`${what} copied`);
  }
  /** The message of an API error body `{"error": {"message": ...}}`, or the status line. */
  async function apiError(response) {
    try {
      const body = await response.json();
      if (body && body.error) return body.error.message || JSON.stringify(body.error);
      if (body && body.detail) return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch (err) { /* not JSON */ }
    return `${response.status} ${response.statusText}`;
  }
  return { formatBytes, formatCount, formatShapes, readJSON, toast, copyText, apiError };
})();
