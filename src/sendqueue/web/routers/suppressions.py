"""``/api/suppressions``: the global suppression list, thin routes over
:class:`~sendqueue.services.feedback.suppression.SuppressionService` (the one the CLI uses)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue.domain.errors import InvalidField
from sendqueue.services.feedback.suppression import MAX_PAGE, to_csv
from sendqueue.services.reading.views import SuppressionView
from sendqueue.web.deps import SettingsDep, SuppressionDep
from sendqueue.web.errors import HttpProblem
from sendqueue.web.schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    SuppressionAdded,
    SuppressionImported,
    SuppressionPage,
    SuppressionRemoved,
    error_responses,
)

__all__ = ["router"]

router = APIRouter(prefix="/api/suppressions", tags=["suppressions"])

_IMPORT_FORM = {"max_files": 1, "max_fields": 10, "max_part_size": 64 * 1024}

_IMPORT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "CSV: email (required), reason, task_id, at",
                        }
                    },
                }
            }
        },
    }
}


class NewSuppression(BaseModel):
    """The body of ``POST /api/suppressions``."""

    model_config = ConfigDict(extra="forbid")
    email: str = Field(description="the address; compared case-insensitively")
    reason: str = Field("manual", description="unsubscribed, bounced, complained, replied, manual")


@router.get("", responses=error_responses(*READ_ERRORS))
def list_suppressions(
    suppression: SuppressionDep,
    after: Annotated[str | None, Query(max_length=320, description="the last address seen")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> SuppressionPage:
    """A page of suppressed addresses in address order."""
    page = suppression.page(after=after, limit=limit)
    return SuppressionPage(
        suppressions=[SuppressionView.of(e) for e in page],
        total=suppression.count(),
        next=page[-1].email if len(page) == limit else None,
    )


@router.post(
    "",
    status_code=201,
    responses={
        200: {"model": SuppressionAdded, "description": "listed already: its first entry, kept"},
        **error_responses(*WRITE_ERRORS),
    },
)
def add_suppression(
    body: NewSuppression, suppression: SuppressionDep, response: Response
) -> SuppressionAdded:
    """Suppress an address: 201 when it is new, 200 when it was listed already (its first
    entry is kept)."""
    added = suppression.add(body.email, body.reason)
    if not added.new:
        response.status_code = 200
    return SuppressionAdded(**dict(SuppressionView.of(added.entry)), new=added.new)


@router.delete("/{email:path}", responses=error_responses(*WRITE_ERRORS, 404))
def remove_suppression(email: str, suppression: SuppressionDep) -> SuppressionRemoved:
    """Take an address off the list (emails already cancelled for it stay cancelled). A path
    parameter that may hold ``/``: a local part may (``a/b@example.com``)."""
    return SuppressionRemoved(removed=suppression.remove(email))


@router.post(
    "/import", openapi_extra=_IMPORT_BODY, responses=error_responses(*WRITE_ERRORS, 413, 415)
)
async def import_suppressions(
    request: Request, suppression: SuppressionDep, settings: SettingsDep
) -> SuppressionImported:
    """Suppress every address of a CSV upload (field ``file``): every bad row is reported
    with its row number, and nothing is imported if any row is bad (the file is checked whole,
    then written in chunks)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise HttpProblem(415, "send multipart/form-data with the CSV as the field 'file'")
    try:
        form = await request.form(**_IMPORT_FORM)
    except StarletteHTTPException as exc:
        raise InvalidField("body", None, f"malformed form: {exc.detail}") from exc
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidField("file", None, "upload the addresses as a CSV file")
        limit = settings.max_upload_bytes
        if upload.size is not None and upload.size > limit:
            raise HttpProblem(
                413, f"file: larger than {limit} bytes (SENDQUEUE_MAX_UPLOAD_BYTES)", field="file"
            )
        # Starlette spooled the upload to a temporary file: the import reads it twice from
        # there, in the thread pool (blocking reads and store writes).
        imported = await run_in_threadpool(suppression.import_file, upload.file, max_bytes=limit)
    finally:
        await form.close()
    return SuppressionImported(rows=imported.rows, added=imported.added, kept=imported.kept)


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "CSV"},
        **error_responses(*READ_ERRORS, json_only=True),
    },
)
def export_suppressions(suppression: SuppressionDep) -> StreamingResponse:
    """The whole list as CSV (email, reason, task_id, at), what the import reads back."""
    return StreamingResponse(
        to_csv(suppression.all()),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="suppressions.csv"'},
    )
