"""`POST /api/v1/reports`: check an upload, store it, record the job, queue it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile

from inspector.schema.options import (
    AUTOCAST_DTYPES,
    DEFAULT_COMPILE,
    DEFAULT_DTYPE,
    DEFAULT_EXPORT,
    DEFAULT_OPTIMIZER,
    DEFAULT_SERVING,
    DEVICES,
    OPTIMIZERS,
)
from inspector.schema.presets import PRESETS, preset_names
from server.api import queries
from server.api.dispatch import enqueue, require_sandbox
from server.api.errors import ApiError
from server.api.formfields import parse_name, parse_options, parse_tags
from server.api.inputcheck import check_input_file, check_input_spec, input_file_kind
from server.api.modelcheck import check_model, model_kind, safe_filename
from server.api.quota import check_quota, commit_upload, disk_full_error, is_disk_full
from server.api.schemas import CreatedReport, ErrorResponse
from server.api.views import job_urls
from server.auth import UPLOAD_AUTH_RESPONSES, UploaderDep
from server.db import SessionDep
from server.resultkey import result_key, reused_columns
from server.settings import Settings
from server.storage import Staged, TooLarge, UploadStore, iter_file

router = APIRouter(prefix="/api/v1", tags=["reports"])

_ERRORS = {
    413: {"model": ErrorResponse, "description": "upload over the size limit"},
    422: {"model": ErrorResponse, "description": "the upload does not check out"},
    503: {"model": ErrorResponse, "description": "no sandbox: uploads refused"},
    507: {"model": ErrorResponse, "description": "the upload store is full"},
} | UPLOAD_AUTH_RESPONSES


# Uploads checked and stored at once: a burst of them (CI fanning out) waits for a turn on
# the event loop, instead of taking every worker thread, and with them the GIL, from the
# readers of reports.
UPLOADS_AT_ONCE = 4


async def upload_turn(request: Request) -> AsyncIterator[None]:
    """Dependency: hold one of the UPLOADS_AT_ONCE turns while the upload is handled."""
    async with request.app.state.upload_turns:
        yield


UploadTurn = Annotated[None, Depends(upload_turn, scope="function")]


@dataclass
class StagedUpload:
    staged: Staged
    filename: str  # the safe name it will have in the job dir
    kind: str


def _stage(stack: ExitStack, store: UploadStore, upload: UploadFile, limit: int) -> Staged:
    try:
        return stack.enter_context(store.staging(iter_file(upload.file), limit))
    except TooLarge as exc:
        what = upload.filename or "upload"
        raise ApiError(413, "too_large", f"{what} is larger than {exc.limit} bytes") from exc
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error() from exc
        raise


def _stage_preset(
    stack: ExitStack, store: UploadStore, name: str, model: UploadFile | None
) -> tuple[StagedUpload, str]:
    """A preset has no file: its stored "upload" is a one-line JSON naming it, so a re-run
    and the upload columns work as for any model."""
    if model is not None and model.filename:
        raise ApiError(422, "invalid", "give either a model file or a preset, not both")
    name = name.strip()
    if name.removeprefix("preset:") not in PRESETS:
        raise ApiError(
            422, "invalid", f"unknown preset {name!r}; presets: {', '.join(preset_names())}"
        )
    name = name.removeprefix("preset:")
    data = json.dumps({"preset": name}).encode()
    staged = stack.enter_context(store.staging(iter([data]), limit=len(data)))
    return StagedUpload(staged, f"{name}.preset.json", "preset"), f"preset:{name}"


def _stage_model(
    stack: ExitStack,
    store: UploadStore,
    settings: Settings,
    model: UploadFile | None,
    entry: str | None,
) -> tuple[StagedUpload, str]:
    if model is None or not model.filename:
        raise ApiError(422, "invalid", "a model file (or a preset name) is required")
    kind = model_kind(model.filename or "")
    filename = safe_filename(model.filename, default=f"model.{kind}")
    staged = _stage(stack, store, model, settings.max_upload_bytes)
    entrypoint = check_model(
        staged.path,
        kind,
        filename,
        entry,
        max_files=settings.max_zip_files,
        max_bytes=settings.max_zip_uncompressed_bytes,
        original_name=model.filename,
    )
    return StagedUpload(staged, filename, kind), entrypoint


def _stage_input(
    stack: ExitStack,
    store: UploadStore,
    settings: Settings,
    spec: str | None,
    file: UploadFile | None,
) -> StagedUpload | None:
    has_file = file is not None and bool(file.filename)
    if spec and spec.strip() and has_file:
        raise ApiError(
            422,
            "invalid",
            "give either an input spec (input) or a tensor file (input_file), not both",
        )
    if spec and spec.strip():
        check_input_spec(spec)
    if not has_file:
        return None
    kind = input_file_kind(file.filename or "")
    staged = _stage(stack, store, file, settings.max_upload_bytes)
    filename = safe_filename(file.filename, default=f"input.{kind}")
    check_input_file(staged.path, kind, filename)
    return StagedUpload(staged, filename, kind)


@router.post("/reports", status_code=201, response_model=CreatedReport, responses=_ERRORS)
def create_report(
    request: Request,
    _turn: UploadTurn,  # first: waited for before the other dependencies run
    session: SessionDep,
    _identity: UploaderDep,
    model: UploadFile | None = File(
        None, description="the model: a .py file, a .zip of a package, a .pt2, a config.json"
    ),
    preset: str | None = Form(None, description="a built-in model instead of a file"),
    entrypoint: str | None = Form(None, description="model.py:Net, pkg/model.py:Net in a zip"),
    input: str | None = Form(None, description='input spec JSON, e.g. {"x": {"shape": [1, 8]}}'),
    input_file: UploadFile | None = File(None, description="tensors: .pt or .safetensors"),
    name: str | None = Form(None),
    tags: list[str] = Form([], description="key=value, comma-separated or repeated"),
    optimizer: str = Form(DEFAULT_OPTIMIZER, description=", ".join(OPTIMIZERS)),
    dtype: str = Form(DEFAULT_DTYPE, description=", ".join(AUTOCAST_DTYPES)),
    device: str | None = Form(None, description=", ".join(DEVICES)),
    fake: bool = Form(False, description="fake tensors: no weights or activations allocated"),
    budget: str | None = Form(None, description="memory budgets, e.g. 24GiB,80GiB"),
    export: str = Form(
        DEFAULT_EXPORT,
        description="export readiness: none, fast (torch.export), all (+strict, TorchScript, ONNX)",
    ),
    serving: str = Form(
        DEFAULT_SERVING, description="serving memory: auto (decoder LM presets/configs), on, off"
    ),
    compile: str = Form(
        DEFAULT_COMPILE,
        description="torch.compile readiness: none, fast (graph breaks, first failed guard "
        "per named dim), all (+ every recompile counted)",
    ),
    parallel: list[str] = Form(
        [], description="per-rank plans, e.g. fsdp:8 or ddp:4,bucket_mb=50; repeated or ;-separated"
    ),
    fit: str | None = Form(
        None, description="search the cheapest verified changes that fit this budget, e.g. 24GiB"
    ),
    fit_batch: str | None = Form(
        None, description="with fit: the effective batch per optimizer step the plan keeps"
    ),
    blocks: str | None = Form(
        None,
        description="the model's blocks (checkpointing, fit plans, FSDP/TP units): module "
        "classes or path globs, comma-separated, e.g. LlamaDecoderLayer or layers.*",
    ),
    rerun: bool = Form(
        False,
        description="run it again even when a done report has the same model bytes, input "
        "and options (by default that report's result is reused at once)",
    ),
) -> CreatedReport:
    """Upload a model (and its input) to be inspected; returns the report's links."""
    settings: Settings = request.app.state.settings
    store: UploadStore = request.app.state.store
    require_sandbox(settings)
    tag_dict = parse_tags(tags)
    options = parse_options(
        optimizer=optimizer, dtype=dtype, device=device, fake=fake, budget=budget,
        default_device=settings.device, export=export, serving=serving, compile=compile,
        parallel=parallel, fit=fit, fit_batch=fit_batch, blocks=blocks,
    )  # fmt: skip
    with ExitStack() as stack:
        if preset:
            upload, entry = _stage_preset(stack, store, preset, model)
        else:
            upload, entry = _stage_model(stack, store, settings, model, entrypoint)
        tensors = _stage_input(stack, store, settings, input, input_file)
        default_name = upload.filename if upload.kind in ("pt2", "config") else entry
        job_name = parse_name(name, default=default_name)
        check_quota(session, settings, store, [i.staged for i in filter(None, (upload, tensors))])
        for item in filter(None, (upload, tensors)):  # files first: a row never lacks its file
            commit_upload(session, store, item.staged)
            queries.ensure_upload(
                session, sha256=item.staged.sha256, size_bytes=item.staged.size_bytes,
                filename=item.filename, kind=item.kind,
            )  # fmt: skip
    columns = {
        "upload_sha256": upload.staged.sha256,
        "upload_kind": upload.kind,
        "entrypoint": entry,
        "input_spec": input if input and input.strip() else None,
        "input_sha256": tensors.staged.sha256 if tensors else None,
        "options": options,
    }
    key = result_key(**columns)
    source = None if rerun else queries.reusable_job(session, key)
    job = queries.add_job(
        session,
        tags=tag_dict,
        name=job_name,
        upload_filename=upload.filename,
        input_filename=tensors.filename if tensors else None,
        result_key=key,
        **columns,
        **(reused_columns(source) if source is not None else {}),
    )
    session.commit()
    if source is None:
        enqueue(job.id, settings)
    urls = job_urls(request, job.slug)
    return CreatedReport(slug=job.slug, status=job.status, reused_from=job.reused_from, **urls)
