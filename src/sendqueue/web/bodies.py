"""The body of ``POST /api/campaigns`` and ``POST /api/campaigns/preview``: a CSV upload
(multipart/form-data, the page's form) or JSON rows, parsed into one :class:`NewCampaign`.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.domain.lifecycle import StopOnReply
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import MAX_STEPS, Step
from sendqueue.services.campaigns.creation import CampaignImport, Draft
from sendqueue.services.campaigns.steps_file import steps_from_entries
from sendqueue.services.importing.recipients import ImportLimits, Templates
from sendqueue.settings import Settings
from sendqueue.web.errors import HttpProblem
from sendqueue.web.middleware.csrf import FormCsrf
from sendqueue.web.step_fields import STEP_FIELDS, form_steps

__all__ = [
    "BODY_OVERHEAD_BYTES",
    "CAMPAIGN_FORM_CSRF",
    "CREATE_BODY",
    "CampaignBody",
    "NewCampaign",
    "StepBody",
    "TemplatesBody",
    "add_body_schemas",
    "new_campaign",
    "validate",
]

#: Room for the form fields and multipart framing around a CSV of the largest allowed size.
BODY_OVERHEAD_BYTES = 1 << 20
# Largest text field of a form (a template, say).
_MAX_FORM_FIELD = 512 * 1024
_FORM_LIMITS: dict[str, int] = {
    "max_files": 1,
    "max_fields": 200,
    "max_part_size": _MAX_FORM_FIELD,
}
#: The page's form posts its CSRF token as a field; this checks it (see the CSRF middleware).
CAMPAIGN_FORM_CSRF = FormCsrf(_FORM_LIMITS, malformed_field="body")


class TemplatesBody(BaseModel):
    """Jinja2 templates used where a recipient has no cell of its own."""

    model_config = ConfigDict(extra="forbid")
    subject: str | None = None
    body: str | None = None
    html: str | None = None


class StepBody(BaseModel):
    """One step of a sequence, shaped like an entry of a steps file (docs/sequences.md) with
    its templates inline."""

    model_config = ConfigDict(extra="forbid")
    subject: str | None = Field(
        None,
        description="subject template; step 1 needs one, a later step without one "
        "replies with Re: <step 1's subject>",
    )
    body: str = Field(description="the text body template")
    html: str | None = Field(None, description="the HTML body template")
    after: str | None = Field(
        None,
        description="the wait after the previous step: 3d (sending days), 4h or 30m; "
        "every step but the first",
    )
    new_thread: StrictBool = Field(
        False, description="send it without In-Reply-To and References; not on step 1"
    )


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
    stop_on_reply: StopOnReply = Field(
        StopOnReply.SENDER,
        description="which Pending emails of a recipient a reply cancels: sender (every active "
        "campaign of the same From), campaign (this one) or off",
    )
    unsubscribe_footer: StrictBool = Field(
        False, description="add a one-line unsubscribe footer to every email"
    )
    senders: list[str] = Field(
        default_factory=list,
        description="senders (ids or addresses, GET /api/senders) to spread the emails across, "
        "each within its daily cap; empty: `from` sends, with no cap",
    )
    local_time: StrictBool = Field(
        False,
        description="read the windows in each recipient's own timezone (its `timezone` column)",
    )
    steps: list[StepBody] | None = Field(
        None,
        # checked before the entries: a long list of bad ones would make as many errors
        max_length=MAX_STEPS,
        description="1 to 10 steps making it a sequence, step 1 first; step 1's templates are "
        "then the campaign's, so give no `templates` too",
    )


# A checkbox's spellings (a browser sends "on", or the input's value); anything else is refused.
_FLAG_VALUES = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False,
                "no": False, "0": False}  # fmt: skip

_STEP_FIELD_HELP = {
    "after": "its wait after the step before (3d: sending days; 4h, 30m: elapsed)",
    "subject": "its subject template (left out: Re: and step 1's subject)",
    "text": "its text body template",
    "html": "its HTML body template (optional)",
    "new_thread": "a checkbox: start a new thread instead of replying",
}

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
        "stop_on_reply": {"type": "string", "enum": [s.value for s in StopOnReply]},
        "unsubscribe_footer": {
            "type": "string",
            "enum": sorted(_FLAG_VALUES),
            "description": "a checkbox: true, on, yes or 1 adds the footer; left out, off",
        },
        "senders": {
            "type": "array",
            "items": {"type": "string"},
            "description": "sender ids or addresses, repeated or comma-separated",
        },
        "local_time": {
            "type": "string",
            "enum": sorted(_FLAG_VALUES),
            "description": "a checkbox: windows in each recipient's own timezone",
        },
        **{
            f"steps[{k}].{name}": {
                "type": "string",
                "description": f"step {k} of a sequence: " + _STEP_FIELD_HELP[name],
            }
            for k in range(2, 11)
            for name in STEP_FIELDS
        },
    },
}  # fmt: skip

CREATE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {"schema": _FORM_SCHEMA},
            "application/json": {"schema": {"$ref": "#/components/schemas/CampaignBody"}},
        },
    }
}


def add_body_schemas(document: dict[str, Any]) -> None:
    """Put :class:`CampaignBody` and the models it names into an OpenAPI ``document``'s
    components, where :data:`CREATE_BODY` refers to it (the routes read their body
    themselves, so FastAPI does not add it)."""
    schema = CampaignBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components = document.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    components["CampaignBody"] = schema


@dataclass
class NewCampaign:
    """A create or preview request, parsed; the recipients are rows or a spooled CSV."""

    name: str
    from_addr: str | None
    reply_to: str | None
    templates: Templates
    policy: SendingPolicy
    rows: list[Any] | None = None
    csv: BinaryIO | None = None
    stop_on_reply: StopOnReply | str = StopOnReply.SENDER
    unsubscribe_footer: bool = False
    senders: list[str] = field(default_factory=list)
    local_time: bool = False
    steps: list[Step] | None = None
    """A sequence's steps from the form (step 1's templates then in them, not in
    ``templates``)."""
    step_entries: list[dict[str, Any]] | None = None
    """A sequence's steps from the API's JSON, shaped like a steps file's entries."""


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


def _flag(form: FormData, name: str) -> bool:
    """A checkbox: left out (or empty) is off."""
    value = _text(form, name)
    if value is None:
        return False
    flag = _FLAG_VALUES.get(value.strip())
    if flag is None:
        raise InvalidField(name, value, "a checkbox: true or false (on or off)")
    return flag


def _weekdays(form: FormData) -> str | None:
    """The sending days: one field (``mon-fri``, what the page's script sends) or one
    checkbox per day (the form posted without JavaScript)."""
    if len(form.getlist("weekdays")) > 1:
        return ",".join(_listed(form, "weekdays") or [])
    return _text(form, "weekdays", keep_blank=True)


def _listed(form: FormData, name: str) -> list[str] | None:
    out: list[str] = []
    for value in form.getlist(name):
        if not isinstance(value, str):
            raise InvalidField(name, getattr(value, "filename", None), "expected text")
        out += [part.strip() for part in value.split(",") if part.strip()]
    return out or None


def _from_form(form: FormData, settings: Settings) -> NewCampaign:
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
            "weekdays": _weekdays(form),
            "windows": _listed(form, "windows"),
            "start": _text(form, "start"),
            "skip_dates": _listed(form, "skip_dates"),
            "jitter_seconds": _number(form, "jitter_seconds"),
            "seed": _number(form, "seed"),
        },
        settings,
    )
    upload.file.seek(0)
    templates = Templates(
        subject=_text(form, "subject"), body=_text(form, "body"), html=_text(form, "html")
    )
    steps = form_steps(form, templates, text=_text, flag=_flag)
    return NewCampaign(
        name=_text(form, "name") or "",
        from_addr=_text(form, "from"),
        reply_to=_text(form, "reply_to"),
        # a sequence holds step 1's templates itself
        templates=Templates() if steps else templates,
        steps=steps,
        policy=policy,
        csv=upload.file,
        # the service parses the scope, so a bad one is named like any other field
        stop_on_reply=_text(form, "stop_on_reply") or StopOnReply.SENDER,
        unsubscribe_footer=_flag(form, "unsubscribe_footer"),
        senders=_listed(form, "senders") or [],
        local_time=_flag(form, "local_time"),
    )


class _NotFinite:
    """Stands in for ``NaN``, ``Infinity`` or a number that overflows to infinity, so that the
    check below can name the field that held it."""

    def __init__(self, text: str) -> None:
        self.text = text


def _finite(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def _checked_json(raw: bytes) -> Any:
    """The body as JSON, every number finite and every field outside the recipients at most
    ``_MAX_FORM_FIELD`` bytes, as in a form (the importer bounds the recipients' cells)."""
    try:
        # Decoded here, as strict UTF-8 (json.loads of bytes would accept a BOM or UTF-16).
        data = json.loads(raw.decode("utf-8"), parse_constant=_NotFinite, parse_float=_finite)
    except RecursionError as exc:
        raise InvalidField("body", None, "JSON nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer of over 4300 digits
        raise InvalidField("body", None, f"not valid JSON: {exc}") from exc
    pending: list[tuple[str, int | None, Any]] = [("", None, data)]
    while pending:
        path, row, value = pending.pop()
        if isinstance(value, _NotFinite):
            problem = InvalidField(
                path or "body", value.text, "not a finite number (NaN, Infinity), refused", row=row
            )
            if row is None:
                raise problem
            # A row's problem is reported as the importer reports one: listed with its row.
            raise InvalidInput(f"row {row} is invalid", [problem])
        if isinstance(value, str):
            if row is None and len(value) > _MAX_FORM_FIELD // 4:
                size = len(value.encode("utf-8", "surrogatepass"))
                if size > _MAX_FORM_FIELD:
                    raise InvalidField(
                        path or "body", f"{size} bytes", f"longer than {_MAX_FORM_FIELD} bytes"
                    )
        elif isinstance(value, dict):
            # Named by its own key, as the form names its fields (``subject``, ``per_day``); a
            # step's by its step too (``steps[2].body``).
            within = f"{path}." if path.startswith("steps[") else ""
            pending += [(f"{within}{key}", row, item) for key, item in value.items()]
        elif isinstance(value, list):
            if path == "steps" and row is None:
                pending += [(f"steps[{k}]", row, item) for k, item in enumerate(value, 1)]
            elif path == "recipients" and row is None:
                # Named as the importer names a row's problems: the key and the CSV row number.
                pending += [("row", index + 2, item) for index, item in enumerate(value)]
            else:
                pending += [(path, row, item) for item in value]
    return data


def _from_json(raw: bytes, settings: Settings) -> NewCampaign:
    data = _checked_json(raw)
    try:
        body = CampaignBody.model_validate(data)
    except ValidationError as exc:
        # Shaped like FastAPI's own body errors, so the one handler names the field.
        raise RequestValidationError(
            [{**e, "loc": ("body", *_step_loc(e["loc"]))} for e in exc.errors()]
        ) from None
    return NewCampaign(
        name=body.name,
        from_addr=body.from_addr or None,
        reply_to=body.reply_to or None,
        templates=Templates(
            subject=body.templates.subject, body=body.templates.body, html=body.templates.html
        ),
        policy=_policy(body.policy, settings),
        rows=body.recipients,
        stop_on_reply=body.stop_on_reply,
        unsubscribe_footer=body.unsubscribe_footer,
        senders=body.senders,
        local_time=body.local_time,
        step_entries=None
        if body.steps is None
        else [step.model_dump(exclude_unset=True) for step in body.steps],
    )


def _step_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``("steps", 1, "after")`` -> ``("steps[2]", "after")``: a step named by its number, from
    1, as every other error about steps names it."""
    if len(loc) > 1 and loc[0] == "steps" and isinstance(loc[1], int):
        return (f"steps[{loc[1] + 1}]", *loc[2:])
    return loc


@asynccontextmanager
async def new_campaign(request: Request, settings: Settings) -> AsyncIterator[NewCampaign]:
    """Parse a create/preview body: multipart (the CSV goes to a spooled temporary file,
    bounded by the body limit) or JSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        try:
            form = await request.form(**_FORM_LIMITS)
        except StarletteHTTPException as exc:
            raise InvalidField("body", None, f"malformed form: {exc.detail}") from exc
        try:
            yield _from_form(form, settings)
        finally:
            await form.close()
    elif content_type == "application/json":
        yield _from_json(await _json_body(request, settings.max_json_body_bytes), settings)
    else:
        raise HttpProblem(415, "send multipart/form-data (with a CSV file) or application/json")


async def _json_body(request: Request, limit: int) -> bytes:
    """The JSON body, refused with 413 once it passes ``limit`` bytes: parsed, a JSON list of
    recipients takes about 25 times its size in memory (1M rows: 1.4 GB), a CSV only a pass."""

    def too_large() -> HttpProblem:
        return HttpProblem(
            413,
            f"body: a JSON body may hold at most {limit} bytes (SENDQUEUE_MAX_JSON_BODY_BYTES); "
            "upload a large recipient list as a CSV file (multipart/form-data, field 'file')",
            field="body",
        )

    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _steps_of(new: NewCampaign, limits: ImportLimits) -> list[Step] | None:
    """The steps of a new campaign: the form's, checked as it was read, or the API's entries
    read as a steps file's are."""
    if new.step_entries is not None:
        return steps_from_entries(new.step_entries, limits.templates)
    return new.steps


def validate(importer: CampaignImport, limits: ImportLimits, new: NewCampaign) -> Draft:
    draft: Draft = importer.validate(
        name=new.name,
        recipients=new.csv,
        rows=new.rows,
        from_addr=new.from_addr,
        reply_to=new.reply_to,
        templates=new.templates,
        limits=limits,
        stop_on_reply=new.stop_on_reply,
        unsubscribe_footer=new.unsubscribe_footer,
        senders=new.senders,
        local_time=new.local_time,
        steps=_steps_of(new, limits),
    )
    return draft
