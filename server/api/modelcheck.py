"""Checks on an uploaded model before it is queued: kind, Python syntax, entrypoint, zip rules.

Nothing here imports or runs the user's code: Python files are only parsed with `ast`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

from server.api.errors import ApiError
from server.ziputil import ZipRefused, check_zip, read_member

__all__ = ["MODEL_KINDS", "safe_filename", "model_kind", "check_model", "top_level_names"]

MODEL_KINDS = {".py": "py", ".zip": "zip", ".pt2": "pt2", ".json": "config"}
MAX_CONFIG_BYTES = 1024 * 1024  # a Hugging Face config.json is a few KiB
MAX_SOURCE_BYTES = 16 * 1024 * 1024  # one Python file inside a zip
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def invalid(message: str, detail: object = None) -> ApiError:
    return ApiError(422, "invalid", message, detail)


def safe_filename(name: str | None, default: str = "upload") -> str:
    """The base name only, with odd characters replaced: it becomes a file in the job dir."""
    base = PureWindowsPath(PurePosixPath(name or "").name).name
    base = _UNSAFE_CHARS.sub("_", base).lstrip(".")[:200]
    return base or default


def model_kind(filename: str) -> str:
    kind = MODEL_KINDS.get(Path(filename).suffix.lower())
    if kind is None:
        allowed = ", ".join(MODEL_KINDS)
        raise invalid(f"model file {filename!r}: unsupported type; upload one of {allowed}")
    return kind


def check_model(
    path: Path,
    kind: str,
    filename: str,
    entrypoint: str | None,
    *,
    max_files: int,
    max_bytes: int,
    original_name: str | None = None,
) -> str:
    """Validate the staged upload saved as `filename`; returns the entrypoint to store
    (`file:Name`). `original_name` is the client's name, also accepted in the entrypoint."""
    if kind == "py":
        aliases = {filename, PurePosixPath(original_name or filename).name}
        return _check_py(path.read_bytes(), filename, entrypoint, aliases)
    if kind == "config":
        return _check_config(path, filename)
    try:
        infos = check_zip(path, max_files, max_bytes)
    except ZipRefused as exc:
        what = "zip" if kind == "zip" else ".pt2 archive (a zip file)"
        raise invalid(f"{filename}: {what} refused: {exc}") from exc
    if kind == "pt2":
        return filename  # torch.export archives need no entrypoint
    return _check_zip_entry(path, filename, entrypoint, [i.filename for i in infos])


def _check_config(path: Path, filename: str) -> str:
    """A Hugging Face config.json: JSON naming its `model_type`; the model is built from
    it on fake tensors (no weights), so it needs no entrypoint."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise invalid(f"{filename}: a config.json over {MAX_CONFIG_BYTES} bytes is not a config")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"{filename}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise invalid(
            f"{filename}: a Hugging Face config.json names its architecture family in "
            '"model_type", e.g. {"model_type": "llama", ...}'
        )
    return filename


def _split_entrypoint(entrypoint: str | None, what: str) -> tuple[str | None, str]:
    text = (entrypoint or "").strip()
    if not text:
        raise invalid(f"an entrypoint is needed for {what}, e.g. model.py:Net")
    file_part, _, name = text.rpartition(":")
    if not all(part.isidentifier() for part in name.split(".")):
        raise invalid(f"entrypoint {text!r}: {name!r} is not a Python name (e.g. model.py:Net)")
    return (file_part or None), name


def _check_py(data: bytes, filename: str, entrypoint: str | None, aliases: set[str]) -> str:
    file_part, name = _split_entrypoint(entrypoint, "a .py upload")
    if file_part is not None and PurePosixPath(file_part).name not in aliases:
        raise invalid(
            f"entrypoint {entrypoint!r} names {file_part!r}, but the uploaded file is "
            f"{filename!r}; use {filename}:{name}"
        )
    tree = parse_source(data, filename)
    _check_entry(tree, filename, name)
    _check_standalone(tree, filename, name)
    return f"{filename}:{name}"


def _check_standalone(tree: ast.Module, filename: str, name: str) -> None:
    """A single file has no package around it, so its relative imports cannot work."""
    for node in _relative_imports(tree)[:1]:
        raise invalid(
            f"{filename}:{node.lineno}: `{ast.unparse(node)}` is a relative import, and a "
            "single file has no package around it. Upload a .zip of the package folder (with "
            f"its __init__.py) and the entrypoint pkg/{filename}:{name}.",
            {"file": filename, "line": node.lineno},
        )


def _check_zip_entry(path: Path, filename: str, entrypoint: str | None, names: list[str]) -> str:
    file_part, name = _split_entrypoint(entrypoint, "a .zip upload (a path inside it)")
    sources = [n for n in names if n.endswith(".py")]
    member = str(PurePosixPath(file_part)) if file_part else None
    if member not in sources:
        listing = ", ".join(sources[:20]) or "none"
        raise invalid(
            f"entrypoint {entrypoint!r}: give the path of a .py file inside {filename} "
            f"(e.g. pkg/model.py:Net); its .py files: {listing}",
            {"python_files": sources},
        )
    try:
        data = read_member(path, member, MAX_SOURCE_BYTES)
    except ZipRefused as exc:
        raise invalid(f"{filename}: {exc}") from exc
    tree = parse_source(data, member)
    _check_entry(tree, member, name)
    _check_packages(tree, member, set(names), filename)
    return f"{member}:{name}"


def _relative_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """`from .x import y` statements at the top of the module. Those inside a function or
    a `try` (a fallback for running as a script) are left to fail, or not, when run."""
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level > 0]


def _check_packages(tree: ast.Module, member: str, names: set[str], filename: str) -> None:
    """The job imports `pkg/model.py` as `pkg.model` only when `pkg/` holds an
    `__init__.py`: each relative import needs that, one folder further up per extra dot."""
    for node in _relative_imports(tree):
        missing = [i for i in _package_inits(member, node.level) if i not in names]
        if missing:
            raise invalid(
                f"{member}:{node.lineno}: `{ast.unparse(node)}` is a relative import, but "
                f"{filename} has no {missing[0]}: add an empty {missing[0]} so {member} is "
                "imported as part of its package.",
                {"file": member, "line": node.lineno, "missing": missing},
            )


def _package_inits(member: str, level: int) -> list[str]:
    """The `__init__.py` files a relative import with `level` dots in `member` relies on."""
    folder = PurePosixPath(member).parent
    folders = [folder, *folder.parents][:level]
    return [str(f / "__init__.py") for f in folders]


def parse_source(data: bytes, filename: str) -> ast.Module:
    """`ast.parse`, with syntax errors as 422 naming the user's file and line."""
    try:
        return ast.parse(data, filename=filename)
    except SyntaxError as exc:
        where = f"{filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        line = (exc.text or "").strip()
        message = f"{where}: syntax error: {exc.msg}" + (f"\n    {line}" if line else "")
        raise invalid(
            message, {"file": filename, "line": exc.lineno, "column": exc.offset}
        ) from exc
    except ValueError as exc:  # NUL bytes, undecodable source
        raise invalid(f"{filename}: not a readable Python source file ({exc})") from exc


def top_level_names(tree: ast.Module) -> dict[str, list[str]]:
    """Names bound at module level (also inside top-level if/try blocks), by kind."""
    found: dict[str, list[str]] = {"classes": [], "functions": [], "other": []}
    for node in _top_level_statements(tree.body):
        if isinstance(node, ast.ClassDef):
            found["classes"].append(node.name)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found["functions"].append(node.name)
        else:
            found["other"].extend(_bound_names(node))
    return found


def _top_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                out += _top_level_statements(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                out += _top_level_statements(handler.body)
    return out


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    elif isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    else:
        return []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _check_entry(tree: ast.Module, filename: str, name: str) -> None:
    defined = top_level_names(tree)
    head = name.split(".")[0]
    if any(head in names for names in defined.values()):
        return
    callables = defined["classes"] + defined["functions"]
    listing = ", ".join(callables) or "no classes or functions"
    hint = " or ".join(f"{filename}:{n}" for n in callables[:3])
    message = f"entrypoint {name!r} not found in {filename} (defined: {listing})."
    raise invalid(message + (f" Use {hint}." if hint else ""), {"defined": defined})
