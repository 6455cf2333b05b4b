/* The upload form: drop a model, pick its entrypoint, write or pick its input, submit. */
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const form = $("upload-form"), dropzone = $("dropzone"), fileInput = $("model-file");
  const presetSelect = $("preset");
  const entrySelect = $("entry-select"), entryInput = $("entrypoint"), entryHint = $("entry-hint");
  const specArea = $("input-spec"), specStatus = $("spec-status"), errorEl = $("form-error");
  let modelFile = null;
  let inputTab = "spec";

  // --- entrypoints: top-level classes and functions of a .py, or of the .py files in a zip.
  const ENTRY = /^(?:class|def)\s+([A-Za-z_]\w*)/gm;
  function entrypointsIn(source, path) {
    const names = [];
    for (const m of source.matchAll(ENTRY)) {
      if (!m[1].startsWith("_") && m[1] !== "example_inputs") names.push(`${path}:${m[1]}`);
    }
    return names;
  }

  async function zipPythonFiles(file) {
    // Read the zip's central directory: enough to list names without unpacking everything.
    const buf = await file.arrayBuffer();
    const view = new DataView(buf);
    let eocd = -1;
    for (let i = buf.byteLength - 22; i >= Math.max(0, buf.byteLength - 65557); i--) {
      if (view.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
    }
    if (eocd < 0) throw new Error("not a zip archive");
    const count = view.getUint16(eocd + 10, true);
    let at = view.getUint32(eocd + 16, true);
    const decoder = new TextDecoder();
    const entries = [];
    for (let n = 0; n < count && view.getUint32(at, true) === 0x02014b50; n++) {
      const method = view.getUint16(at + 10, true), size = view.getUint32(at + 20, true);
      const nameLen = view.getUint16(at + 28, true), extraLen = view.getUint16(at + 30, true);
      const commentLen = view.getUint16(at + 32, true), local = view.getUint32(at + 42, true);
      const name = decoder.decode(new Uint8Array(buf, at + 46, nameLen));
      if (name.endsWith(".py") && !name.startsWith("__MACOSX/")) entries.push({ name, method, size, local });
      at += 46 + nameLen + extraLen + commentLen;
    }
    return { buf, view, entries };
  }

  async function zipMemberText(zip, entry) {
    const { buf, view } = zip;
    const start = entry.local + 30 + view.getUint16(entry.local + 26, true) + view.getUint16(entry.local + 28, true);
    const bytes = new Uint8Array(buf, start, entry.size);
    if (entry.method === 0) return new TextDecoder().decode(bytes);
    if (entry.method !== 8 || typeof DecompressionStream === "undefined") return "";
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    return await new Response(stream).text();
  }

  async function zipEntrypoints(file) {
    const zip = await zipPythonFiles(file);
    const names = [];
    for (const entry of zip.entries.slice(0, 200)) {
      if (entry.size > 2_000_000) continue;
      try { names.push(...entrypointsIn(await zipMemberText(zip, entry), entry.name)); } catch (err) { /* skip */ }
    }
    return { names, files: zip.entries.length };
  }

  function fillEntrypoints(names, hint) {
    entrySelect.replaceChildren();
    const first = new Option(names.length ? `${names.length} found: pick one` : "none found: type it", "");
    entrySelect.append(first, ...names.map((n) => new Option(n, n)));
    // A model class is the usual choice: prefer the last class, which usually wraps the rest.
    const preferred = names.filter((n) => /:[A-Z]/.test(n)).pop() || names[0] || "";
    entrySelect.value = preferred;
    entryInput.value = preferred;
    entryHint.textContent = hint;
  }

  async function setModel(file) {
    const ext = (file.name.split(".").pop() || "").toLowerCase();
    if (!["py", "zip", "pt2", "json"].includes(ext)) {
      showError(`${file.name}: upload a .py file, a .zip of a package, a .pt2 archive or a config.json.`);
      return;
    }
    presetSelect.value = "";
    modelFile = file;
    showError("");
    dropzone.classList.add("has-file");
    dropzone.querySelector(".dz-empty").hidden = true;
    dropzone.querySelector(".dz-file").hidden = false;
    $("file-name").textContent = file.name;
    $("file-size").textContent = MGI.formatBytes(file.size);
    $("entry-field").hidden = ext === "pt2" || ext === "json";
    if (!$("name").value) $("name").placeholder = file.name.replace(/\.(py|zip|pt2|json)$/, "");
    if (ext === "py") {
      fillEntrypoints(entrypointsIn(await file.text(), file.name), `Top-level classes and functions of ${file.name}.`);
    } else if (ext === "zip") {
      try {
        const { names, files } = await zipEntrypoints(file);
        fillEntrypoints(names, `${files} Python file${files === 1 ? "" : "s"} in the archive; or type pkg/model.py:Net.`);
      } catch (err) {
        fillEntrypoints([], `Could not read the archive here (${err.message}); type pkg/model.py:Net.`);
      }
    }
  }

  function clearModel() {
    modelFile = null;
    fileInput.value = "";
    dropzone.classList.remove("has-file");
    dropzone.querySelector(".dz-empty").hidden = false;
    dropzone.querySelector(".dz-file").hidden = true;
  }

  // --- the input spec: JSON checked as it is typed.
  function checkSpec(text) {
    if (!text.trim()) return { ok: true, note: "Empty: the model's own example_inputs() will be used." };
    let spec;
    try { spec = JSON.parse(text); } catch (err) { return { ok: false, note: `Not valid JSON: ${err.message}` }; }
    if (spec === null || typeof spec !== "object") return { ok: false, note: "The spec is a JSON object (named inputs) or a list (positional inputs)." };
    const dims = (!Array.isArray(spec) && spec.dims) || {};
    const named = new Set();
    const problems = [];
    const visit = (value, where) => {
      if (value && typeof value === "object" && !Array.isArray(value) && "shape" in value) {
        if (!Array.isArray(value.shape)) problems.push(`${where}.shape must be a list`);
        else value.shape.forEach((d) => {
          if (typeof d === "string") named.add(d);
          else if (!Number.isInteger(d) || d < 0) problems.push(`${where}.shape has ${JSON.stringify(d)}: use sizes or dim names`);
        });
      } else if (Array.isArray(value)) value.forEach((v, i) => visit(v, `${where}[${i}]`));
      else if (value && typeof value === "object") Object.entries(value).forEach(([k, v]) => visit(v, `${where}.${k}`));
      else problems.push(`${where} is not a tensor: write {"shape": [...]}`);
    };
    if (Array.isArray(spec)) spec.forEach((v, i) => visit(v, `[${i}]`));
    else Object.entries(spec).forEach(([k, v]) => { if (k !== "dims") visit(v, k); });
    if (problems.length) return { ok: false, note: problems.slice(0, 3).join("; ") };
    const missing = [...named].filter((d) => !/[*+\-/]/.test(d) && !(d in dims));
    if (missing.length) return { ok: true, warn: true, note: `Dim ${missing.join(", ")} has no value in "dims".` };
    return { ok: true, note: "Valid input spec." };
  }

  function showSpecStatus() {
    const result = checkSpec(specArea.value);
    specArea.classList.toggle("invalid", !result.ok);
    specStatus.textContent = result.note;
    specStatus.className = `hint ${result.ok ? (result.warn ? "" : "good") : "bad"}`;
    return result;
  }

  function showError(text) { errorEl.textContent = text; }

  // --- analysis options: the selects' choices and defaults come from the server (schema).
  function appendOptions(data) {
    form.querySelectorAll("select[data-option]").forEach((select) => data.append(select.name, select.value));
    if ($("opt-fake").checked) data.append("fake", "true");
    if ($("opt-budget").value.trim()) data.append("budget", $("opt-budget").value.trim());
  }

  async function submit(event) {
    event.preventDefault();
    const preset = presetSelect.value;
    if (!modelFile && !preset) { showError("Choose a model file or a built-in model first."); return; }
    const needsEntry = !preset && !/\.(pt2|json)$/i.test(modelFile.name);
    if (needsEntry && !entryInput.value.trim()) { showError("Give the entrypoint: the class or function that builds the model."); entryInput.focus(); return; }
    const data = new FormData();
    if (preset) data.append("preset", preset);
    else data.append("model", modelFile, modelFile.name);
    if (needsEntry) data.append("entrypoint", entryInput.value.trim());
    if (inputTab === "spec" && specArea.value.trim()) {
      if (!showSpecStatus().ok) { showError("Fix the input spec first."); specArea.focus(); return; }
      data.append("input", specArea.value);
    }
    if (inputTab === "file") {
      const tensors = $("input-file").files[0];
      if (!tensors) { showError("Choose a tensor file, or switch to another input."); return; }
      data.append("input_file", tensors, tensors.name);
    }
    if ($("name").value.trim()) data.append("name", $("name").value.trim());
    if ($("tags").value.trim()) data.append("tags", $("tags").value.trim().split(/[\s,]+/).join(","));
    appendOptions(data);
    const button = $("submit");
    button.disabled = true;
    button.textContent = "Uploading…";
    showError("");
    try {
      const response = await fetch("/api/v1/reports", { method: "POST", body: data });
      if (!response.ok) throw new Error(await MGI.apiError(response));
      const body = await response.json();
      window.location.assign(`/r/${encodeURIComponent(body.slug)}`);
    } catch (err) {
      showError(err.message);
      button.disabled = false;
      button.textContent = "Inspect";
    }
  }

  // --- presets: a built-in model replaces the file
  presetSelect.addEventListener("change", () => {
    if (!presetSelect.value) return;
    clearModel();
    showError("");
    $("entry-field").hidden = true;
    if (!$("name").value) $("name").placeholder = presetSelect.value;
  });

  // --- wiring
  $("pick-file").addEventListener("click", () => fileInput.click());
  $("clear-file").addEventListener("click", () => { clearModel(); fileInput.click(); });
  dropzone.addEventListener("keydown", (e) => { if (e.key === "Enter" && !modelFile) fileInput.click(); });
  fileInput.addEventListener("change", () => fileInput.files[0] && setModel(fileInput.files[0]));
  ["dragenter", "dragover"].forEach((t) => dropzone.addEventListener(t, (e) => { e.preventDefault(); dropzone.classList.add("over"); }));
  ["dragleave", "drop"].forEach((t) => dropzone.addEventListener(t, () => dropzone.classList.remove("over")));
  dropzone.addEventListener("drop", (e) => { e.preventDefault(); if (e.dataTransfer.files[0]) setModel(e.dataTransfer.files[0]); });
  entrySelect.addEventListener("change", () => { if (entrySelect.value) entryInput.value = entrySelect.value; });
  specArea.addEventListener("input", showSpecStatus);
  document.querySelectorAll("[data-example]").forEach((chip) => chip.addEventListener("click", () => {
    specArea.value = chip.dataset.example;
    showSpecStatus();
  }));
  document.querySelectorAll(".tab").forEach((tab) => tab.addEventListener("click", () => {
    inputTab = tab.dataset.tab;
    document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
    document.querySelectorAll(".tab-body").forEach((b) => { b.hidden = b.dataset.body !== inputTab; });
  }));
  form.addEventListener("submit", submit);
})();
