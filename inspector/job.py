"""The service's job child: `python -m inspector.job DIR`, run inside the sandbox.

Reads `DIR/job.json` (`{"model": "upload/model.py:Net", "input": spec text, a tensor file
path or null, "options": {...}}`, paths relative to DIR; an extracted zip's
`upload/mypkg/model.py:Net` is imported as `mypkg.model`), runs the pipeline, and leaves
JSON for the worker and nothing else:
- `DIR/progress.jsonl`: one `{"stage", "percent", "t"}` line per stage;
- `DIR/report.json`: the Report, on success (exit 0);
- `DIR/error.json`: `{"kind", "message", "stage", "traceback"}` otherwise (exit 1). `kind` is
  `user_error` (the user's frames only), `out_of_memory` or `internal`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["main", "error_payload", "options_from_json"]

EXIT_DONE, EXIT_ERROR, EXIT_NO_ERROR_FILE = 0, 1, 3
UPLOAD_DIRS = ("upload", "input")  # where the user's files sit inside DIR
_OOM_TEXT = ("can't allocate memory", "DefaultCPUAllocator", "out of memory")


class Progress:
    """The progress callback: appends a JSON line per stage, remembers the last stage.

    `stage_seconds` (from job.json: what recent jobs took per stage) sizes each stage's
    share of the bar (inspector.progress); the import, before the analysis, gets its own."""

    def __init__(self, path: Path, stage_seconds: dict[str, float] | None = None) -> None:
        from inspector.progress import DEFAULT_STAGE_SECONDS

        self.path = path
        self.stage = "start"
        self.stage_seconds = dict(stage_seconds or {})
        expected = {**DEFAULT_STAGE_SECONDS, **self.stage_seconds}
        expected = {k: float(expected[k]) for k in DEFAULT_STAGE_SECONDS}  # stages only
        import_s = max(expected.pop("import"), 0.0)
        total = import_s + sum(v for v in expected.values() if v > 0)
        self.import_share = round(100 * import_s / total) if total > 0 else 0

    def _scaled(self, stage: str, percent: int) -> int:
        """The analysis' own percent, after the import's share."""
        if stage == "start":
            return 0
        if stage == "imported":
            return self.import_share
        return self.import_share + int(percent) * (100 - self.import_share) // 100

    def __call__(self, stage: str, percent: int) -> None:
        self.stage = stage
        percent = self._scaled(stage, percent)
        line = json.dumps({"stage": stage, "percent": percent, "t": round(time.time(), 4)})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def options_from_json(raw: dict[str, Any]) -> Any:
    """`Options` from the job's options JSON; unknown keys are ignored."""
    from dataclasses import fields

    from inspector.context import Options

    raw = dict(raw)
    if "budgets" in raw and "budgets_bytes" not in raw:
        raw["budgets_bytes"] = raw.pop("budgets")
    if raw.get("passes") is not None:
        raw["passes"] = set(raw["passes"])
    known = {f.name for f in fields(Options)}
    return Options(**{k: v for k, v in raw.items() if k in known and v is not None})


def _is_oom(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or type(current).__name__ == "OutOfMemoryError":
            return True
        if isinstance(current, RuntimeError) and any(t in str(current) for t in _OOM_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def error_payload(exc: BaseException, stage: str, job_dir: Path) -> dict[str, Any]:
    """What error.json holds for `exc`: the user's frames for their errors, ours for bugs."""
    from inspector.errors import UserError
    from inspector.tracebacks import format_user_traceback, user_frames

    user_files = [str(job_dir / d) for d in UPLOAD_DIRS]
    if _is_oom(exc):
        message = f"ran out of memory during {stage}: {type(exc).__name__}: {exc}"
        trace = format_user_traceback(exc, user_files)
        return {"kind": "out_of_memory", "message": message, "stage": stage, "traceback": trace}
    if isinstance(exc, UserError):
        trace = exc.user_traceback or format_user_traceback(exc, user_files)
        return {"kind": "user_error", "message": str(exc), "stage": stage, "traceback": trace}
    if isinstance(exc, SystemExit):
        message = f"the model's code called sys.exit({exc.code!r}) during {stage}"
        trace = format_user_traceback(exc, user_files)
        return {"kind": "user_error", "message": message, "stage": stage, "traceback": trace}
    if user_frames(exc, user_files):  # raised in the user's code, not wrapped by the pipeline
        message = f"your code raised {type(exc).__name__}: {exc}"
        trace = format_user_traceback(exc, user_files)
        return {"kind": "user_error", "message": message, "stage": stage, "traceback": trace}
    message = f"internal error during {stage}: {type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(exc))
    return {"kind": "internal", "message": message, "stage": stage, "traceback": trace}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _run(job_dir: Path, progress: Progress) -> None:
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    start = time.perf_counter()
    from inspector.analyze import inspect_model  # imports torch

    import_s = round(time.perf_counter() - start, 4)
    progress("imported", 0)
    options = options_from_json(job.get("options") or {})
    report = inspect_model(job["model"], job.get("input"), options, progress)
    report.meta.timings_s["import"] = import_s
    _write_atomic(job_dir / "report.json", report.to_json())


def _stage_seconds(job_dir: Path) -> dict[str, float]:
    """job.json's `stage_seconds`, or {} (the table's defaults) when absent or unreadable."""
    try:
        value = json.loads((job_dir / "job.json").read_text(encoding="utf-8")).get("stage_seconds")
    except (OSError, ValueError, AttributeError):
        return {}
    return value if isinstance(value, dict) else {}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m inspector.job DIR", file=sys.stderr)
        return 2
    job_dir = Path(argv[0]).resolve()
    os.chdir(job_dir)  # paths in job.json are relative to DIR
    faulthandler.enable()  # a segfault still prints where (to the captured stderr)
    progress = Progress(job_dir / "progress.jsonl", _stage_seconds(job_dir))
    progress("start", 0)
    try:
        _run(job_dir, progress)
        return EXIT_DONE
    except BaseException as exc:  # noqa: BLE001 - every ending must leave error.json
        try:
            payload = error_payload(exc, progress.stage, job_dir)
            _write_atomic(job_dir / "error.json", json.dumps(payload))
        except BaseException:  # noqa: BLE001 - even out of memory: still say so on stderr
            traceback.print_exc()
            return EXIT_NO_ERROR_FILE
        return EXIT_ERROR


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with torch, dynamo and onnx loaded it takes seconds,
    # and everything the worker reads is already written and closed.
    os._exit(code)
