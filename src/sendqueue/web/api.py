"""The HTTP API (docs/api.md): thin routes over the service layer the CLI uses.

Each route parses and checks its input, calls a service, and shapes the answer with
:mod:`sendqueue.services.views` / :mod:`sendqueue.web.queries`. Store and scheduler calls are
blocking, so routes that make them are plain ``def`` (FastAPI runs them in its thread pool)
or hand them to :func:`run_in_threadpool`. Errors become JSON in :mod:`sendqueue.web.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue.domain.errors import InfrastructureError, InvalidField, NotFound
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import MAX_CURSOR
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import SendingPolicy
from sendqueue.services.campaigns import Draft
from sendqueue.services.dead_letters import redrive_all as redrive_all_letters
from sendqueue.services.importing import ImportLimits, Templates
from sendqueue.services.views import dead_letter_dict, task_dict
from sendqueue.settings import Settings
from sendqueue.web.deps import BrokerDep, ContainerDep, ProvisioningDep
from sendqueue.web.errors import RETRY_AFTER_SECONDS, HttpProblem, error_body
from sendqueue.web.queries import campaign_view, plan_view
from sendqueue.web.stream import EventStreamResponse, TooManyClients

__all__ = [
    "BODY_OVERHEAD_BYTES",
    "CampaignBody",
    "ErrorBody",
    "ErrorInfo",
    "Health",
    "TemplatesBody",
    "router",
]

#: Cursors are positions and change-log ids: 64-bit integers in every store.


log = logging.getLogger(__name__)

router = APIRouter()

#: Room for the form fields and multipart framing around a CSV of the largest allowed size.
BODY_OVERHEAD_BYTES = 1 << 20
# Largest text field of a form (a template, say).
_MAX_FORM_FIELD = 512 * 1024


# -- request bodies -------------------------------------------------------------------------


class TemplatesBody(BaseModel):
    """Jinja2 templates used where a recipient has no cell of its own."""

    model_config = ConfigDict(extra="forbid")
    subject: str | None = None
    body: str | None = None
    html: str | None = None


class CampaignBody(BaseModel):
    """The JSON body of ``POST /api/campaigns`` and ``POST /api/campaigns/preview``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    from_addr: str | None = Field(None, alias="from")
    reply_to: str | None = None
    recipients: list[Any] = Field(
        description="rows as in a CSV: email (required), name, subject, body, html, variables"
    )
    templates: TemplatesBody = Field(default_factory=TemplatesBody)
    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="timezone, per_day, weekdays, windows, start, skip_dates, jitter_seconds, seed",
    )


class ErrorInfo(BaseModel):
    """The inside of every error response (docs/api.md, "Errors")."""

    status: int
    message: str
    field: str | None = None
    reason: str | None = None
    value: Any = None
    errors: list[dict[str, Any]] | None = Field(
        None, description="with several problems (rows of a CSV): each with row, field, reason"
    )
    total: int | None = Field(None, description="how many problems in all")


class ErrorBody(BaseModel):
    """Every error the API answers: ``{"error": {...}}``."""

    error: ErrorInfo


class Health(BaseModel):
    """``GET /healthz``: ``ok``, or ``unavailable`` with the error."""

    status: str
    error: ErrorInfo | None = None


_ERROR_TEXT = {
    401: "no or wrong token (`WWW-Authenticate: Bearer`)",
    403: "CSRF token missing or wrong (session cookie requests)",
    404: "unknown campaign, task or dead letter",
    409: "illegal transition or conflict",
    413: "body or CSV larger than SENDQUEUE_MAX_UPLOAD_BYTES",
    415: "neither multipart/form-data nor application/json",
    422: "invalid input, naming the field or the rows",
    503: "the store or the execution layer is unreachable (`Retry-After`)",
}


def _errors(*statuses: int, json_only: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, all in the one error shape.

    ``json_only`` for a route whose success is not JSON (the event stream, the metrics):
    FastAPI would document its errors in the success's media type, but errors are JSON.
    """
    if json_only:
        ref = {"$ref": "#/components/schemas/ErrorBody"}
        return {
            s: {"description": _ERROR_TEXT[s], "content": {"application/json": {"schema": ref}}}
            for s in statuses
        }
    return {s: {"model": ErrorBody, "description": _ERROR_TEXT[s]} for s in statuses}


#: What every API route may answer besides its success.
_READ = (401, 422, 503)
_WRITE = (401, 403, 422, 503)


_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file", "name"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the recipients CSV"},
        **{
            name: {"type": "string"}
            for name in (
                "name", "from", "reply_to", "subject", "body", "html", "timezone", "weekdays",
                "start",
            )
        },
        "per_day": {"type": "integer"},
        "windows": {
            "type": "array",
            "items": {"type": "string"},
            "description": "HH:MM-HH:MM, repeated or comma-separated",
        },
        "skip_dates": {"type": "array", "items": {"type": "string", "format": "date"}},
        "jitter_seconds": {"type": "integer"},
        "seed": {"type": "integer"},
    },
}  # fmt: skip

_CREATE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {"schema": _FORM_SCHEMA},
            "application/json": {"schema": {"$ref": "#/components/schemas/CampaignBody"}},
        },
    }
}


@dataclass
class _NewCampaign:
    """A create or preview request, parsed; the recipients are rows or a spooled CSV."""

    name: str
    from_addr: str | None
    reply_to: str | None
    templates: Templates
    policy: SendingPolicy
    rows: list[Any] | None = None
    csv: BinaryIO | None = None


def _policy(data: dict[str, Any], settings: Settings) -> SendingPolicy:
    data = {k: v for k, v in data.items() if v is not None}
    if not data.get("timezone"):
        data["timezone"] = settings.default_timezone
    return SendingPolicy.from_dict(data)


def _text(form: FormData, name: str, *, keep_blank: bool = False) -> str | None:
    """A text field; an empty one counts as left out (HTML forms send every field), unless
    ``keep_blank`` (a field whose emptiness is itself a mistake)."""
    values = form.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidField(name, len(values), "give this field once")
    value = values[0]
    if not isinstance(value, str):
        raise InvalidField(name, getattr(value, "filename", None), "expected text, not a file")
    return value if keep_blank or value.strip() else None


def _number(form: FormData, name: str) -> int | None:
    value = _text(form, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError as exc:
        raise InvalidField(name, value, "expected a whole number") from exc


def _listed(form: FormData, name: str) -> list[str] | None:
    out: list[str] = []
    for value in form.getlist(name):
        if not isinstance(value, str):
            raise InvalidField(name, getattr(value, "filename", None), "expected text")
        out += [part.strip() for part in value.split(",") if part.strip()]
    return out or None


def _from_form(form: FormData, settings: Settings) -> _NewCampaign:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidField("file", upload, "upload the recipients as a CSV file")
    if upload.size is not None and upload.size > settings.max_upload_bytes:
        raise HttpProblem(
            413,
            f"file: larger than {settings.max_upload_bytes} bytes (SENDQUEUE_MAX_UPLOAD_BYTES); "
            "split the file",
            field="file",
        )
    policy = _policy(
        {
            "timezone": _text(form, "timezone"),
            "per_day": _number(form, "per_day"),
            "weekdays": _text(form, "weekdays", keep_blank=True),
            "windows": _listed(form, "windows"),
            "start": _text(form, "start"),
            "skip_dates": _listed(form, "skip_dates"),
            "jitter_seconds": _number(form, "jitter_seconds"),
            "seed": _number(form, "seed"),
        },
        settings,
    )
    upload.file.seek(0)
    return _NewCampaign(
        name=_text(form, "name") or "",
        from_addr=_text(form, "from"),
        reply_to=_text(form, "reply_to"),
        templates=Templates(
            subject=_text(form, "subject"), body=_text(form, "body"), html=_text(form, "html")
        ),
        policy=policy,
        csv=upload.file,
    )


def _from_json(raw: bytes, settings: Settings) -> _NewCampaign:
    try:
        body = CampaignBody.model_validate_json(raw)
    except ValidationError as exc:
        # Shaped like FastAPI's own body errors, so the one handler names the field.
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None
    return _NewCampaign(
        name=body.name,
        from_addr=body.from_addr or None,
        reply_to=body.reply_to or None,
        templates=Templates(
            subject=body.templates.subject, body=body.templates.body, html=body.templates.html
        ),
        policy=_policy(body.policy, settings),
        rows=body.recipients,
    )


@asynccontextmanager
async def _new_campaign(request: Request, settings: Settings) -> AsyncIterator[_NewCampaign]:
    """Parse a create/preview body: multipart (the CSV goes to a spooled temporary file,
    bounded by the body limit) or JSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        try:
            form = await request.form(max_files=1, max_fields=200, max_part_size=_MAX_FORM_FIELD)
        except StarletteHTTPException as exc:
            raise InvalidField("body", None, f"malformed form: {exc.detail}") from exc
        try:
            yield _from_form(form, settings)
        finally:
            await form.close()
    elif content_type == "application/json":
        yield _from_json(await request.body(), settings)
    else:
        raise HttpProblem(415, "send multipart/form-data (with a CSV file) or application/json")


def _validate(container: Any, new: _NewCampaign) -> Draft:
    limits = ImportLimits(
        max_bytes=container.settings.max_upload_bytes,
        max_rows=container.settings.max_recipients,
    )
    draft: Draft = container.campaigns.validate(
        name=new.name,
        recipients=new.csv,
        rows=new.rows,
        from_addr=new.from_addr,
        reply_to=new.reply_to,
        templates=new.templates,
        limits=limits,
    )
    return draft


# -- health and metrics ----------------------------------------------------------------------


@router.get(
    "/healthz",
    tags=["operations"],
    response_model=Health,
    responses={503: {"model": Health, "description": "the task store does not answer"}},
)
def healthz(c: ContainerDep) -> JSONResponse:
    """``{"status": "ok"}`` when the task store answers; 503 when it does not."""
    try:
        c.store.last_change_id()
    except InfrastructureError as exc:
        body = {"status": "unavailable", **error_body(503, f"{type(exc).__name__}: {exc}")}
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    return JSONResponse({"status": "ok"})


@router.get(
    "/metrics",
    tags=["operations"],
    response_class=PlainTextResponse,
    responses=_errors(401, json_only=True),
)
def metrics_text(c: ContainerDep) -> PlainTextResponse:
    """Prometheus text: sends by outcome, lateness, dead-letter depth, repairs, alarms."""
    body, content_type = c.metrics_text()
    return PlainTextResponse(body, media_type=content_type)


# -- campaigns -------------------------------------------------------------------------------


@router.get("/api/campaigns", tags=["campaigns"], responses=_errors(*_READ))
def list_campaigns(c: ContainerDep) -> dict[str, Any]:
    """Every campaign with its counts, newest first."""
    return {"campaigns": [campaign_view(c.store, x) for x in c.store.list_campaigns()]}


@router.post(
    "/api/campaigns",
    tags=["campaigns"],
    status_code=201,
    openapi_extra=_CREATE_BODY,
    responses=_errors(*_WRITE, 413, 415),
)
async def create_campaign(request: Request, c: ContainerDep) -> JSONResponse:
    """Create a draft from a CSV upload or JSON rows; nothing is written if anything is
    invalid."""
    async with _new_campaign(request, c.settings) as new:

        def create() -> dict[str, Any]:
            draft = _validate(c, new)
            created = c.campaigns.create_draft(draft, new.policy)
            data = campaign_view(c.store, created.campaign)
            data["import"] = {
                "rows": created.imported.rows,
                "duplicates": created.imported.duplicates,
                "duplicate_rows": created.imported.duplicate_rows,
            }
            return data

        data = await run_in_threadpool(create)
    return JSONResponse(data, status_code=201, headers={"Location": f"/api/campaigns/{data['id']}"})


@router.post(
    "/api/campaigns/preview",
    tags=["campaigns"],
    openapi_extra=_CREATE_BODY,
    responses=_errors(*_WRITE, 413, 415),
)
async def preview_new_campaign(request: Request, c: ContainerDep) -> dict[str, Any]:
    """The plan a create with this body would get if provisioned now; nothing is written."""
    async with _new_campaign(request, c.settings) as new:

        def preview() -> dict[str, Any]:
            draft = _validate(c, new)
            recipients = draft.imported.recipients
            sends = plan(new.policy, len(recipients), now=c.clock.now())
            return plan_view(
                new.policy,
                sends,
                emails=[r.email for r in recipients[: len(sends)]],
                duplicates=draft.imported.duplicates,
            )

        return await run_in_threadpool(preview)


@router.get("/api/campaigns/{campaign_id}", tags=["campaigns"], responses=_errors(*_READ, 404))
def get_campaign(campaign_id: str, c: ContainerDep, request: Request) -> dict[str, Any]:
    """The campaign with its counts, next send and per-day ``timeline``."""
    campaign = c.store.get_campaign(campaign_id)
    data = campaign_view(c.store, campaign)
    data["timeline"] = request.app.state.timelines.get(campaign)
    return data


@router.get(
    "/api/campaigns/{campaign_id}/preview", tags=["campaigns"], responses=_errors(*_READ, 404)
)
def preview_campaign(campaign_id: str, c: ContainerDep) -> dict[str, Any]:
    """The plan of a stored campaign's recipients if it were provisioned now."""
    campaign = c.store.get_campaign(campaign_id)
    pairs = c.campaigns.preview(campaign_id)
    sends = [when for _, when in pairs]
    return plan_view(campaign.policy, sends, emails=[r.email for r, _ in pairs[: len(sends)]])


@router.post(
    "/api/campaigns/{campaign_id}/provision",
    tags=["controls"],
    status_code=202,
    responses=_errors(*_WRITE, 404, 409),
)
def provision(campaign_id: str, c: ContainerDep, runner: ProvisioningDep) -> dict[str, Any]:
    """Start provisioning in the background: 202 at once, progress on the event stream.

    A draft goes to provisioning; one already provisioning continues from its checkpoint;
    any other state is 409.
    """
    campaign = c.campaigns.start_provisioning(campaign_id)
    runner.start(campaign_id)
    return campaign_view(c.store, campaign)


@router.post(
    "/api/campaigns/{campaign_id}/pause", tags=["controls"], responses=_errors(*_WRITE, 404, 409)
)
def pause(campaign_id: str, c: ContainerDep) -> dict[str, Any]:
    """Stop sending: the schedules of Pending emails are deleted; they stay Pending."""
    c.campaigns.pause(campaign_id)
    return campaign_view(c.store, c.store.get_campaign(campaign_id))


@router.post(
    "/api/campaigns/{campaign_id}/resume", tags=["controls"], responses=_errors(*_WRITE, 404, 409)
)
def resume(campaign_id: str, c: ContainerDep) -> dict[str, Any]:
    """Re-plan the Pending emails from now and schedule them again."""
    c.campaigns.resume(campaign_id)
    return campaign_view(c.store, c.store.get_campaign(campaign_id))


@router.post(
    "/api/campaigns/{campaign_id}/cancel", tags=["controls"], responses=_errors(*_WRITE, 404, 409)
)
def cancel(campaign_id: str, c: ContainerDep) -> dict[str, Any]:
    """Cancel every Pending email and delete the schedules; Running ones finish."""
    c.campaigns.cancel(campaign_id)
    return campaign_view(c.store, c.store.get_campaign(campaign_id))


@router.post(
    "/api/campaigns/{campaign_id}/retry-failed",
    tags=["controls"],
    responses=_errors(*_WRITE, 404, 409),
)
def retry_failed(campaign_id: str, c: ContainerDep) -> dict[str, Any]:
    """Send the Failed emails again, re-planned from now; ``affected`` counts them."""
    affected = c.campaigns.retry_failed(campaign_id)
    data = campaign_view(c.store, c.store.get_campaign(campaign_id))
    data["affected"] = affected
    return data


# -- tasks -----------------------------------------------------------------------------------


def _task_state(value: str | None) -> TaskState | None:
    if value is None or not value.strip():
        return None
    return TaskState.parse(value)


@router.get("/api/campaigns/{campaign_id}/tasks", tags=["tasks"], responses=_errors(*_READ, 404))
def list_tasks(
    campaign_id: str,
    c: ContainerDep,
    state: Annotated[str | None, Query(max_length=20, description="a task state")] = None,
    search: Annotated[
        str | None, Query(max_length=254, description="part of the address, any case")
    ] = None,
    after: Annotated[
        int, Query(ge=-1, le=MAX_CURSOR, description="the cursor: `next` of the last page")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """A page of the campaign's emails in position order."""
    page = c.store.list_tasks(
        campaign_id,
        state=_task_state(state),
        search=search or None,
        after=after,
        limit=limit + 1,
    )
    more = len(page) > limit
    page = page[:limit]
    return {
        "tasks": [task_dict(t) for t in page],
        "next": page[-1].position if more else None,
    }


@router.post(
    "/api/campaigns/{campaign_id}/tasks/{task_id}/cancel",
    tags=["tasks"],
    responses=_errors(*_WRITE, 404, 409),
)
def cancel_task(campaign_id: str, task_id: str, c: ContainerDep) -> dict[str, Any]:
    """Cancel one Pending email and delete its schedule; 409 if it is past Pending."""
    task = c.store.get_task(task_id)
    if task is None or task.campaign_id != campaign_id:
        raise NotFound("task", task_id)
    return task_dict(c.campaigns.cancel_task(task_id))


# -- the event stream ------------------------------------------------------------------------


def _resume_point(last_event_id: str | None, after: int | None) -> int | None:
    # A browser reconnects to the URL it first opened, ?after= included, and says where it
    # got to in Last-Event-ID: the header wins.
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit() or int(text) > MAX_CURSOR:
            raise InvalidField("Last-Event-ID", last_event_id, "expected a change id")
        return int(text)
    return after


@router.get(
    "/api/campaigns/{campaign_id}/events",
    tags=["campaigns"],
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "change events"},
        **_errors(*_READ, 404, json_only=True),
    },
)
async def events(
    campaign_id: str,
    c: ContainerDep,
    broker: BrokerDep,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_CURSOR, description="resume after this change id")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventStreamResponse:
    """Server-Sent Events of the campaign's change log (see docs/api.md)."""
    start = _resume_point(last_event_id, after)
    await run_in_threadpool(c.store.get_campaign, campaign_id)
    try:
        sub = await broker.subscribe(campaign_id, start)
    except TooManyClients as exc:
        raise HttpProblem(
            503,
            f"too many live streams: {exc}; fall back to polling",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from exc
    return EventStreamResponse(broker.frames(sub))


# -- dead letters ----------------------------------------------------------------------------


@router.get("/api/dead-letters", tags=["dead letters"], responses=_errors(*_READ))
def dead_letters(c: ContainerDep) -> dict[str, Any]:
    """Invocations the execution layer gave up on, oldest first."""
    return {"dead_letters": [dead_letter_dict(d) for d in c.scheduler.dead_letters()]}


@router.post("/api/dead-letters/redrive", tags=["dead letters"], responses=_errors(*_WRITE))
def redrive_all(c: ContainerDep) -> dict[str, Any]:
    """Turn every dead letter back into a schedule due now (those redriven meanwhile skipped)."""
    report = redrive_all_letters(c.scheduler)
    return {"redriven": report.redriven, "schedules": report.schedules}


@router.post(
    "/api/dead-letters/{letter_id}/redrive",
    tags=["dead letters"],
    responses=_errors(*_WRITE, 404),
)
def redrive_one(letter_id: str, c: ContainerDep) -> dict[str, Any]:
    """Turn one dead letter back into a schedule due now."""
    schedule = c.scheduler.redrive(letter_id)
    return {"redriven": [letter_id], "schedules": [schedule.name]}
