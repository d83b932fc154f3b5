"""``/api/senders``: the mailboxes campaigns send from, thin routes over
:class:`~sendqueue.services.senders.service.SenderService` (the one ``sendqueue sender`` uses).

A sender is named by its id or its address (``{ref}``). Its transport and mailbox may hold a
password, its OAuth grant secrets: a response only ever carries
:class:`~sendqueue.services.senders.service.SenderView`'s masked form, and a refused body's values
are
masked too before the error quotes them (:class:`_MaskedRoute`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.domain.senders import DEFAULT_DAILY_CAP, DEFAULT_MIN_GAP_SECONDS
from sendqueue.domain.transports import mask_url
from sendqueue.services.senders.service import MASK, MAX_USAGE_DAYS, USAGE_DAYS
from sendqueue.web.deps import MailboxesDep, SendersDep
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

__all__ = ["NewSender", "OAuthFields", "SenderChanges", "router"]


#: The keys whose values are secrets wherever they appear in a body (the OAuth grant's).
_SECRET_KEYS = frozenset({"refresh_token", "client_secret", "password"})


def _masked(value: Any) -> Any:
    """``value`` with every URL's password masked, in strings, lists and mappings, and every
    secret of a mapping (an OAuth grant's refresh token, its client secret) as ``***``."""
    if isinstance(value, str):
        return mask_url(value) if "://" in value and "@" in value else value
    if isinstance(value, dict):
        return {
            key: MASK if key in _SECRET_KEYS and item is not None else _masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


#: The fields of a grant that are no secret; any other value under ``oauth`` (a secret, a
#: misspelt key such as ``refreshToken``, the token given as the grant itself) is never quoted.
_GRANT_SHOWN = frozenset({"token_url", "client_id", "scope"})
#: The fields holding a URL with a password: quoted masked, whatever their shape.
_URL_KEYS = frozenset({"transport", "imap"})


def _masked_input(error: dict[str, Any]) -> Any:
    """A validation error's input, masked: the whole of it when its field is a secret or is
    under ``oauth`` other than a grant's public field; a URL field's by :func:`mask_url`,
    even when it does not look like a URL (no ``://`` or no ``@``)."""
    loc = tuple(error.get("loc") or ())
    value = error.get("input")
    if loc and loc[-1] in _SECRET_KEYS:
        return MASK
    if "oauth" in loc and loc[-1] not in _GRANT_SHOWN:
        return MASK
    if loc and loc[-1] in _URL_KEYS and isinstance(value, str):
        return mask_url(value)
    return _masked(value)


class _MaskedRoute(APIRoute):
    """A route whose request validation errors quote the body with passwords masked: pydantic
    quotes the whole body for a missing field, transport included."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def masked(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                errors = [{**e, "input": _masked_input(e)} for e in exc.errors()]
                raise RequestValidationError(errors) from None

        return masked


router = APIRouter(prefix="/api/senders", tags=["senders"], route_class=_MaskedRoute)

_REF = "{ref:path}"  # an address's local part may hold a slash


_IMAP = (
    "its own mailbox, read for its replies and bounces (imaps://user:password@host:993/INBOX, "
    "imap://...?security=starttls|tls|none); null: none. Never shown unmasked."
)


class OAuthFields(BaseModel):
    """A sender's OAuth 2.0 grant (``XOAUTH2``): the secrets are never shown again."""

    model_config = ConfigDict(extra="forbid")
    token_url: str | None = Field(None, description="the provider's token endpoint (https://)")
    client_id: str | None = Field(None, description="the app's client id")
    refresh_token: str | None = Field(None, description="the refresh token; shown as ***")
    client_secret: str | None = Field(None, description="a confidential client's secret; ***")
    scope: str | None = Field(None, description="the scope asked for with each access token")


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
        None,
        description="a warm-up's cap on its first sending day (its first day with an email); "
        "with warmup_step",
    )
    warmup_step: StrictInt | None = Field(
        None, description="how much the cap grows per sending day, up to daily_cap"
    )
    transport: str | None = Field(
        None,
        max_length=2000,
        description="its own mailer URL (smtp://user:password@host:587?security=starttls, "
        "ses:REGION, maildir:PATH); null: SENDQUEUE_MAILER. Never shown unmasked.",
    )
    reply_to: str | None = Field(None, description="the Reply-To of its emails")
    imap: str | None = Field(None, max_length=2000, description=_IMAP)
    signature_text: str = Field("", description="its signature as text")
    signature_html: str | None = Field(None, description="its signature's HTML form")
    oauth: OAuthFields | None = Field(
        None, description="OAuth 2.0 sign-in (token_url, client_id and refresh_token needed)"
    )


class SenderChanges(BaseModel):
    """The body of ``PATCH /api/senders/{ref}``: only the fields given change; null clears
    ``reply_to``, ``transport``, ``imap``, a signature, ``oauth`` or the warm-up (both of its
    fields)."""

    model_config = ConfigDict(extra="forbid")
    email: str | None = Field(None, max_length=320)
    name: str | None = None
    daily_cap: StrictInt | None = None
    min_gap_seconds: StrictInt | None = None
    timezone: str | None = None
    warmup_start: StrictInt | None = Field(
        None, description="a new value restarts the ramp: sending days before today stop counting"
    )
    warmup_step: StrictInt | None = None
    transport: str | None = Field(None, max_length=2000)
    reply_to: str | None = None
    imap: str | None = Field(None, max_length=2000)
    signature_text: str | None = None
    signature_html: str | None = None
    oauth: OAuthFields | None = Field(
        None, description="the grant's fields given change, its others stay; null removes it"
    )


def _address_taken(exc: Conflict) -> HttpProblem:
    """A taken address is a 409 that names the field, as every other bad input does."""
    return HttpProblem(409, f"email: {exc}", field="email")


@router.get("", responses=error_responses(*READ_ERRORS))
def list_senders(senders: SendersDep) -> SenderList:
    """Every sender, by address (``GET /api/senders/{ref}`` adds its usage)."""
    return SenderList(senders=[sender_out(s) for s in senders.all()])


@router.post("", status_code=201, responses=error_responses(*WRITE_ERRORS, 409))
def add_sender(
    body: NewSender, senders: SendersDep, mailboxes: MailboxesDep, response: Response
) -> SenderDetail:
    """Add a sender; 422 naming the field for a bad value (nothing is stored), 409 when the
    address belongs to a sender already."""
    try:
        values = body.model_dump()
        if body.oauth is not None:
            values["oauth"] = body.oauth.model_dump(exclude_none=True)
        sender = senders.add(**values)
    except Conflict as exc:
        raise _address_taken(exc) from None
    response.headers["Location"] = f"/api/senders/{sender.id}"
    return sender_detail(senders, sender, mailboxes=mailboxes)


@router.get(f"/{_REF}", responses=error_responses(*READ_ERRORS, 404))
def get_sender(
    ref: str,
    senders: SendersDep,
    mailboxes: MailboxesDep,
    days: Annotated[
        int, Query(ge=1, le=MAX_USAGE_DAYS, description="days of usage from today")
    ] = USAGE_DAYS,
) -> SenderDetail:
    """One sender with its planned and sent emails against its cap, per local day from today
    (its own timezone)."""
    return sender_detail(senders, senders.get(ref), days=days, mailboxes=mailboxes)


@router.patch(f"/{_REF}", responses=error_responses(*WRITE_ERRORS, 404, 409))
def update_sender(
    ref: str, body: SenderChanges, senders: SendersDep, mailboxes: MailboxesDep
) -> SenderDetail:
    """Change the fields given; a bad one is a 422 naming it and nothing changes."""
    changes = body.model_dump(exclude_unset=True)
    if body.oauth is not None:  # only the grant's fields given
        changes["oauth"] = body.oauth.model_dump(exclude_unset=True)
    if not changes:
        raise InvalidField("body", {}, "give at least one field to change")
    if "warmup_start" in changes and changes["warmup_start"] is None:
        changes.setdefault("warmup_step", None)  # clearing the ramp clears both halves
    if "warmup_step" in changes and changes["warmup_step"] is None:
        changes.setdefault("warmup_start", None)
    try:
        sender = senders.update(ref, changes)
    except Conflict as exc:
        raise _address_taken(exc) from None
    return sender_detail(senders, sender, mailboxes=mailboxes)


@router.delete(f"/{_REF}", responses=error_responses(*WRITE_ERRORS, 404, 409))
def remove_sender(ref: str, senders: SendersDep) -> SenderRemoved:
    """Delete a sender; 409 while it still has planned emails (cancel or re-plan them)."""
    sender = senders.remove(ref)
    return SenderRemoved(removed=sender.id, email=sender.email)
