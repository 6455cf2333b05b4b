"""Process logging for `serve` and `worker`: text for people, JSON lines for log collectors.

Every record carries the id of the job being run on its thread (`job_id`, null outside a
job), so one job's lines can be found across the worker's threads and processes.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator

__all__ = ["configure_logging", "JsonFormatter", "job_context", "current_job_id"]

_job_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("job_id", default=None)
TEXT_FORMAT = "%(levelname)s [%(name)s] %(job_tag)s%(message)s"
# Attributes every LogRecord has: anything else was passed with `extra=` and is kept.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "job_tag"}


def current_job_id() -> int | None:
    return _job_id.get()


@contextlib.contextmanager
def job_context(job_id: int) -> Iterator[None]:
    """Tag the log records of this thread with `job_id` while inside."""
    token = _job_id.set(int(job_id))
    try:
        yield
    finally:
        _job_id.reset(token)


class _JobFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "job_id"):
            record.job_id = current_job_id()
        record.job_tag = f"job {record.job_id}: " if record.job_id is not None else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, job_id, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "job_id": getattr(record, "job_id", None),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in data:
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(log_format: str = "text", level: int = logging.INFO) -> None:
    """Replace the root handlers with one stderr handler in `log_format` (text or json)."""
    handler = logging.StreamHandler()
    handler.addFilter(_JobFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)  # uvicorn's own handlers would bypass the format
        uv.handlers.clear()
        uv.propagate = True
