"""Service settings from the environment (`INSPECTOR_*`), checked once at start."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inspector.units import parse_size

__all__ = ["Settings", "get_settings", "normalise_database_url"]

MiB = 1024**2
GiB = 1024**3
# `import torch` alone needs ~1.5 GB of address space (DESIGN.md, sandbox facts).
MIN_JOB_MEMORY_BYTES = 2 * GiB

_SIZE_FIELDS = (
    "max_upload_bytes",
    "max_zip_uncompressed_bytes",
    "job_memory_bytes",
    "job_max_file_bytes",
    "job_tmp_bytes",
    "job_output_bytes",
    "max_data_bytes",
    "read_cache_bytes",
    "blob_cache_bytes",
)


def normalise_database_url(url: str) -> str:
    """Point plain Postgres URLs at the psycopg 3 driver, the one we install."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INSPECTOR_", extra="ignore")

    data_dir: Path = Path("./inspector-data")
    database_url: str | None = None  # default: SQLite in the data dir
    redis_url: str | None = None  # unset: huey's SqliteHuey at <data_dir>/queue.db
    max_upload_bytes: int = 100 * MiB
    max_zip_files: int = 2000
    max_zip_uncompressed_bytes: int = 500 * MiB
    job_timeout_s: float = 600
    job_memory_bytes: int = 8 * GiB
    job_cpu_s: int = 1200
    job_max_procs: int = 256
    job_max_file_bytes: int = 1 * GiB
    device: Literal["auto", "cpu", "cuda"] = "auto"
    worker_concurrency: int = 1
    sandbox: Literal["bwrap", "none"] = "bwrap"
    trusted_only: bool = False
    public_url: str | None = None
    # Worker side (server.worker / server.jobs / server.sandbox):
    job_tmp_bytes: int = 256 * MiB  # the sandbox's /tmp and /dev/shm (tmpfs: RAM), each
    job_output_bytes: int = 256 * 1024  # stdout/stderr of a child kept (head + tail), each
    job_heartbeat_s: float = 2.0  # a running job's row is touched at least this often
    job_stale_after_s: float = 60.0  # no heartbeat for this long: its worker is gone
    job_nice: int = 10  # job children run this much nicer (0-19): web requests go first
    job_sched_idle: bool = False  # job children in SCHED_IDLE: the CPU only when it is idle
    # a job child's intra-op threads; unset: one on up to 4 cores, else the cores up to 8
    job_threads: int | None = None
    # zygote: children forked from a sandboxed process that has torch imported (one per
    # consumer thread, started ahead); fresh: a new sandboxed interpreter per job.
    job_launch: Literal["zygote", "fresh"] = "zygote"
    zygote_max_jobs: int = 100  # a zygote is replaced after this many jobs
    zygote_ready_timeout_s: float = 300.0  # a job waits this long for a starting zygote
    queue_name: str = "inspector"  # the huey queue (one per deployment; a Redis key prefix)
    # Access (server.auth): who may upload, re-run and delete.
    auth: Literal["none", "token"] = "none"  # token: `Authorization: Bearer <API token>`
    # Set only behind an authenticating proxy that strips this header from clients.
    trusted_identity_header: str | None = None  # e.g. X-Forwarded-User
    upload_rate_per_minute: int = 30  # per token or proxy user; 0 = no limit
    # Deployment and operations (server.ops, server.gc, docker-compose.yml):
    embedded_worker: bool = True  # `serve` runs consumer threads too; false with separate workers
    log_format: Literal["text", "json"] = "text"  # json: one object a line, with the job id
    max_data_bytes: int = 0  # stored uploads in total; past it uploads get 507; 0 = no limit
    job_lost_after_s: float = 30.0  # queued this long while the queue is empty: queue it again
    protected_branches: str = "main,master"  # `inspector gc` keeps reports tagged branch=<these>
    # Serving (server.readcache): done reports' JSON and pages kept in memory, per process.
    # An entry is checked against the database again after the TTL, so a report deleted by
    # another process (another web process, `inspector gc`) stops being served by then.
    read_cache_bytes: int = 256 * MiB  # the bodies and their gzip copies in total; 0 = off
    read_cache_ttl_s: float = 30.0
    # Uploads (server.storage, server.blobs): where the server writes them. `database`:
    # chunks in the database, so workers on other hosts need only the database and queue
    # URLs (they read either backend, whatever theirs says).
    blob_store: Literal["local", "database"] = "local"
    blob_cache_bytes: int = 20 * GiB  # a worker's local copies of database blobs; 0 = no limit

    @field_validator(*_SIZE_FIELDS, mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        # Accept "100MiB", "8GiB" as well as plain byte counts.
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("database_url", "redis_url", "public_url", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("trusted_identity_header", mode="before")
    @classmethod
    def _header_name(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip() or None
            if value is not None and not re.fullmatch(r"[A-Za-z0-9-]+", value):
                raise ValueError(f"INSPECTOR_TRUSTED_IDENTITY_HEADER: not a header name: {value!r}")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        return normalise_database_url(value.strip()) if value else value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"INSPECTOR_PUBLIC_URL must start with http:// or https://: {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _defaults_and_safety(self) -> Settings:
        self.data_dir = self.data_dir.expanduser().resolve()  # children run elsewhere
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.data_dir / 'inspector.db'}"
        _refuse_unsafe(self)
        return self

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def protected_branch_list(self) -> list[str]:
        return [b.strip() for b in self.protected_branches.split(",") if b.strip()]

    @property
    def is_sqlite(self) -> bool:
        return str(self.database_url).startswith("sqlite")


def _refuse_unsafe(settings: Settings) -> None:
    """Contradictory or unsafe combinations stop the service at start, with the fix."""
    problems = []
    if settings.trusted_only and settings.sandbox != "none":
        problems.append(
            "INSPECTOR_TRUSTED_ONLY=true only applies with INSPECTOR_SANDBOX=none "
            "(it accepts running uploads unconfined); unset it to keep the sandbox"
        )
    if settings.max_data_bytes < 0:
        problems.append("INSPECTOR_MAX_DATA_BYTES must be 0 (no limit) or more")
    if settings.blob_cache_bytes < 0:
        problems.append("INSPECTOR_BLOB_CACHE_BYTES must be 0 (no limit) or more")
    if settings.read_cache_bytes < 0:
        problems.append("INSPECTOR_READ_CACHE_BYTES must be 0 (off) or more")
    if not 0 <= settings.job_nice <= 19:
        problems.append("INSPECTOR_JOB_NICE must be 0 (off) to 19 (lowest priority)")
    if settings.job_threads is not None and settings.job_threads < 1:
        problems.append("INSPECTOR_JOB_THREADS must be 1 or more (unset: chosen by the cores)")
    if settings.upload_rate_per_minute < 0:
        problems.append("INSPECTOR_UPLOAD_RATE_PER_MINUTE must be 0 (no limit) or more")
    positive = ("max_upload_bytes", "max_zip_files", "max_zip_uncompressed_bytes", "job_timeout_s")
    positive += ("job_cpu_s", "job_max_procs", "job_max_file_bytes", "worker_concurrency")
    positive += ("read_cache_ttl_s",)
    for name in positive:
        if getattr(settings, name) <= 0:
            problems.append(f"INSPECTOR_{name.upper()} must be positive")
    if settings.job_memory_bytes < MIN_JOB_MEMORY_BYTES:
        problems.append(
            f"INSPECTOR_JOB_MEMORY_BYTES={settings.job_memory_bytes} is below 2GiB: "
            "a job child cannot even import torch; use at least 2GiB"
        )
    if problems:
        raise ValueError("unsafe settings: " + "; ".join(problems))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once; tests pass their own `Settings` instead)."""
    return Settings()
