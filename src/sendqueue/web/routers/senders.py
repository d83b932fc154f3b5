"""``/api/senders``: the mailboxes campaigns send from, thin routes over
:class:`~sendqueue.services.senders.SenderService` (the one ``sendqueue sender`` uses).

A sender is named by its id or its address (``{ref}``). Its transport may hold a password: a
response only ever carries :class:`~sendqueue.services.senders.SenderView`'s masked form, and a
refused body's values are masked too before the error quotes them (:class:`_MaskedRoute`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.domain.senders import DEFAULT_DAILY_CAP, DEFAULT_MIN_GAP_SECONDS, masked_transport
from sendqueue.services.senders import MAX_USAGE_DAYS, USAGE_DAYS
from sendqueue.web.deps import ContainerDep
from sendqueue.web.errors import HttpProblem
from sendqueue.web.queries import sender_detail, sender_out
from sendqueue.web.schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    SenderDetail,
    SenderList,
    SenderRemoved,
    error_responses,
)

__all__ = ["NewSender", "SenderChanges", "router"]


def _masked(value: Any) -> Any:
    """``value`` with every URL's password masked, in strings, lists and mappings."""
    if isinstance(value, str):
        if "://" not in value or "@" not in value:
            return value
        try:
            return masked_transport(value)
        except ValueError:  # not even a URL urlsplit can read (``[::1``)
            return "***"
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


class _MaskedRoute(APIRoute):
    """A route whose request validation errors quote the body with passwords masked: pydantic
    quotes the whole body for a missing field, transport included."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def masked(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = [{**e, "input": _masked(e.get("input"))} for e in exc.errors()]
                raise RequestValidationError(errors) from None

        return masked


router = APIRouter(prefix="/api/senders", tags=["senders"], route_class=_MaskedRoute)

_REF = "{ref:path}"  # an address's local part may hold a slash


class NewSender(BaseModel):
    """The body of ``POST /api/senders``."""

    model_config = ConfigDict(extra="forbid")
    email: str = Field(max_length=320, description="the bare address it sends from")
    name: str = Field("", description="the display name of its From header")
    daily_cap: StrictInt = Field(
        DEFAULT_DAILY_CAP, description="emails a day at most, per local day (1..10000)"
    )
    min_gap_seconds: StrictInt = Field(
        DEFAULT_MIN_GAP_SECONDS, description="seconds between two of its sends (1..86400)"
    )
    timezone: str | None = Field(
        None, description="IANA zone of its days; null: SENDQUEUE_DEFAULT_TIMEZONE"
    )
    warmup_start: StrictInt | None = Field(
        None, description="a warm-up's cap on its first day (today); with warmup_step"
    )
    warmup_step: StrictInt | None = Field(
        None, description="how much the cap grows each calendar day, up to daily_cap"
    )
    transport: str | None = Field(
        None,
        max_length=2000,
        description="its own mailer URL (smtp://user:password@host:587?security=starttls, "
        "ses:REGION, maildir:PATH); null: SENDQUEUE_MAILER. Never shown unmasked.",
    )
    reply_to: str | None = Field(None, description="the Reply-To of its emails")


class SenderChanges(BaseModel):
    """The body of ``PATCH /api/senders/{ref}``: only the fields given change; null clears
    ``reply_to``, ``transport`` or the warm-up (both of its fields)."""

    model_config = ConfigDict(extra="forbid")
    email: str | None = Field(None, max_length=320)
    name: str | None = None
    daily_cap: StrictInt | None = None
    min_gap_seconds: StrictInt | None = None
    timezone: str | None = None
    warmup_start: StrictInt | None = Field(None, description="a new value restarts the ramp today")
    warmup_step: StrictInt | None = None
    transport: str | None = Field(None, max_length=2000)
    reply_to: str | None = None


def _address_taken(exc: Conflict) -> HttpProblem:
    """A taken address is a 409 that names the field, as every other bad input does."""
    return HttpProblem(409, f"email: {exc}", field="email")


@router.get("", responses=error_responses(*READ_ERRORS))
def list_senders(c: ContainerDep) -> SenderList:
    """Every sender, by address (``GET /api/senders/{ref}`` adds its usage)."""
    return SenderList(senders=[sender_out(s) for s in c.senders.all()])


@router.post("", status_code=201, responses=error_responses(*WRITE_ERRORS, 409))
def add_sender(body: NewSender, c: ContainerDep, response: Response) -> SenderDetail:
    """Add a sender; 422 naming the field for a bad value (nothing is stored), 409 when the
    address belongs to a sender already."""
    try:
        sender = c.senders.add(**body.model_dump())
    except Conflict as exc:
        raise _address_taken(exc) from None
    response.headers["Location"] = f"/api/senders/{sender.id}"
    return sender_detail(c.senders, sender, mailboxes=c.mailboxes)


@router.get(f"/{_REF}", responses=error_responses(*READ_ERRORS, 404))
def get_sender(
    ref: str,
    c: ContainerDep,
    days: Annotated[
        int, Query(ge=1, le=MAX_USAGE_DAYS, description="days of usage from today")
    ] = USAGE_DAYS,
) -> SenderDetail:
    """One sender with its planned and sent emails against its cap, per local day from today
    (its own timezone)."""
    return sender_detail(c.senders, c.senders.get(ref), days=days, mailboxes=c.mailboxes)


@router.patch(f"/{_REF}", responses=error_responses(*WRITE_ERRORS, 404, 409))
def update_sender(ref: str, body: SenderChanges, c: ContainerDep) -> SenderDetail:
    """Change the fields given; a bad one is a 422 naming it and nothing changes."""
    changes = body.model_dump(exclude_unset=True)
    if not changes:
        raise InvalidField("body", {}, "give at least one field to change")
    if "warmup_start" in changes and changes["warmup_start"] is None:
        changes.setdefault("warmup_step", None)  # clearing the ramp clears both halves
    if "warmup_step" in changes and changes["warmup_step"] is None:
        changes.setdefault("warmup_start", None)
    try:
        sender = c.senders.update(ref, changes)
    except Conflict as exc:
        raise _address_taken(exc) from None
    return sender_detail(c.senders, sender, mailboxes=c.mailboxes)


@router.delete(f"/{_REF}", responses=error_responses(*WRITE_ERRORS, 404, 409))
def remove_sender(ref: str, c: ContainerDep) -> SenderRemoved:
    """Delete a sender; 409 while it still has planned emails (cancel or re-plan them)."""
    sender = c.senders.remove(ref)
    return SenderRemoved(removed=sender.id, email=sender.email)
