"""The key of an analysis result: what decides a report, so an upload that repeats one
already done (CI posting an unchanged model on every push) is answered from it at once.

A report is a function of the model's bytes, the entrypoint, the input (spec text or
tensor file bytes), the options, and the code that runs: inspector and the model libraries
a job imports. Timings and the measured peak differ between two runs of the same key;
the reused report keeps its own and says it was reused (`Job.reused_from`).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib import metadata
from typing import Any

from server.models import Job, utcnow
from server.summary import summary_columns

__all__ = ["result_key", "code_versions", "reused_columns"]

_PACKAGES = ("inspector", "torch", "torchvision", "timm", "transformers", "onnxruntime")


@cache
def code_versions() -> dict[str, str | None]:
    """Installed versions of inspector and the libraries that shape a report."""
    found: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def result_key(
    *,
    upload_sha256: str,
    upload_kind: str,
    entrypoint: str,
    input_spec: str | None,
    input_sha256: str | None,
    options: dict[str, Any],
) -> str:
    """sha256 of everything a report depends on, in a canonical JSON."""
    decided = {
        "upload": [upload_sha256, upload_kind, entrypoint],
        "input": [_spec(input_spec), input_sha256],
        "options": options,
        "code": code_versions(),
    }
    text = json.dumps(decided, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _spec(text: str | None) -> Any:
    """The spec as parsed JSON, so whitespace and key order do not change the key."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def reused_columns(source: Job) -> dict[str, Any]:
    """A new job's columns that make it done with `source`'s report: it never ran, so it
    has no start time (run-time statistics and learned stage times leave it out)."""
    report = dict(source.report_json or {})
    return {
        "status": "done",
        "stage": source.stage,
        "progress": 100,
        "report_json": report,
        "finished_at": utcnow(),
        "reused_from": source.reused_from or source.slug,
        **summary_columns(report),
    }
