/* Runs of identical blocks ("GPT2Block × 12"), as the server found them
   (inspector/repeats.py): a fold sits in the module tree between its parent and its
   blocks. Shared by the module table and the graph view; no DOM. */
"use strict";
const MGIFolds = (() => {
  const parentPath = (p) => (p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "");
  const lastName = (p) => p.slice(p.lastIndexOf(".") + 1);

  /** An index over the page's folds: by id, by block path, and tree parents. */
  function index(folds) {
    const byId = new Map();
    const ofBlock = new Map();
    for (const f of folds || []) {
      byId.set(f.id, f);
      for (const p of f.paths) ofBlock.set(p, f);
    }
    // The row or box above `path` in the tree: a block's fold, a fold's parent module.
    function treeParent(path) {
      if (byId.has(path)) return byId.get(path).parent;
      if (ofBlock.has(path)) return ofBlock.get(path).id;
      return path === "" ? null : parentPath(path);
    }
    return { byId, ofBlock, treeParent, size: byId.size };
  }

  /** "h.0–11" for the fold of transformer.h.0 .. transformer.h.11. */
  function rangeName(fold) {
    const first = fold.paths[0];
    const head = fold.parent ? `${lastName(fold.parent)}.` : "";
    return `${head}${lastName(first)}–${lastName(fold.paths[fold.paths.length - 1])}`;
  }

  return { index, rangeName };
})();
if (typeof module !== "undefined") module.exports = MGIFolds;
