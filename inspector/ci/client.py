"""A small HTTP client for the inspector service API v1 (used by `inspector submit`).

Every refusal becomes a `ClientError` carrying the server's own message (the API's
`{"error": {"code", "message", "detail"}}`) and a hint of what to do.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import httpx

from inspector.ci.upload_source import InputUpload, ModelUpload
from inspector.errors import UserError
from inspector.schema.statuses import FINAL_STATUSES

__all__ = ["ClientError", "InspectorClient", "progress_printer"]

_HINTS = {
    401: "Give a valid API token: --token or $INSPECTOR_TOKEN (an operator creates one with "
    "`inspector token create NAME`).",
    403: "This token may not do that; ask an operator for one with the right scope.",
    413: "The upload is over the server's size limit: upload only the files the model needs.",
    503: "The server cannot run uploads now; ask its operator (see /healthz).",
}


class ClientError(UserError):
    """The server refused or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status


def _refusal(response: httpx.Response, what: str) -> ClientError:
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    message = error.get("message") or response.text[:500] or response.reason_phrase
    hint = _HINTS.get(response.status_code)
    if response.status_code == 429:
        hint = f"Rate limited: retry after {response.headers.get('Retry-After', '?')} s."
    return ClientError(
        f"{what}: HTTP {response.status_code}: {message}", status=response.status_code, hint=hint
    )


class InspectorClient:
    """One server, one optional token; use as a context manager."""

    def __init__(self, server: str, token: str | None = None, timeout_s: float = 120) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def __enter__(self) -> InspectorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"{what}: cannot reach {self.server}: {exc}",
                hint="Check --server / $INSPECTOR_SERVER and that the server is running.",
            ) from None
        if response.status_code >= 400:
            raise _refusal(response, what)
        return response

    def upload(self, model: ModelUpload, inputs: InputUpload, form: dict[str, Any]) -> dict:
        """POST the model (and input); returns `{slug, status, url, api_url}`."""
        files: dict[str, Any] = {"model": (model.filename, model.data, "application/octet-stream")}
        if inputs.data is not None:
            files["input_file"] = (inputs.filename, inputs.data, "application/octet-stream")
        data = {k: v for k, v in form.items() if v is not None}
        if model.entrypoint:
            data["entrypoint"] = model.entrypoint
        if inputs.spec:
            data["input"] = inputs.spec
        return self._call(
            "POST", "/api/v1/reports", "upload refused", data=data, files=files
        ).json()

    def report(self, slug: str) -> dict:
        return self._call("GET", f"/api/v1/reports/{slug}", f"report {slug!r}").json()

    def newest_done(self, tags: list[str]) -> dict | None:
        """The newest finished report carrying every tag (`k=v`), or None."""
        params = {"tag": tags, "status": "done", "limit": 1}
        body = self._call("GET", "/api/v1/reports", "baseline lookup", params=params).json()
        return body["items"][0] if body.get("items") else None

    def markdown(self, slug: str, baseline: str | None) -> str:
        params = {"baseline": baseline} if baseline else {}
        path = f"/api/v1/reports/{slug}/markdown"
        return self._call("GET", path, "Markdown summary", params=params).text

    def wait(
        self,
        slug: str,
        timeout_s: float,
        on_progress: Callable[[dict], None] | None = None,
    ) -> dict:
        """Poll until the job is final; ClientError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        pause = 0.25
        while True:
            body = self._poll(slug)
            if body is not None:
                if on_progress is not None:
                    on_progress(body)
                if body["status"] in FINAL_STATUSES:
                    return body
            if time.monotonic() + pause > deadline:
                raise ClientError(
                    f"report {slug} is not finished after {timeout_s:g} s",
                    hint="Raise --timeout, or check the server's workers; the job keeps going.",
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 2.0)

    def _poll(self, slug: str) -> dict | None:
        try:
            return self.report(slug)
        except ClientError as exc:
            if exc.status is not None:  # the server answered with a refusal: stop
                raise
            print(f"warning: {exc.message}; retrying", file=sys.stderr)  # a blip: keep polling
            return None


def progress_printer(stream: TextIO = sys.stderr) -> Callable[[dict], None]:
    """Prints a line to `stream` whenever the status, stage or percent changes."""
    last: list[tuple] = []

    def show(body: dict) -> None:
        state = (
            body["status"],
            body.get("stage"),
            body.get("progress"),
            body.get("queue_position"),
        )
        if last and last[-1] == state:
            return
        last.append(state)
        status, stage, percent, position = state
        if status == "queued":
            line = f"queued (position {position})" if position else "queued"
        elif status == "running":
            line = f"[{percent or 0:3d}%] {stage or 'running'}"
        else:
            line = status
        print(line, file=stream, flush=True)

    return show
