"""The one-click unsubscribe routes (RFC 8058): ``/u/<token>``, open to everyone.

- ``POST /u/<token>`` with the form body ``List-Unsubscribe=One-Click`` (what a mail provider
  posts, and what the confirmation page's button posts) unsubscribes at once: 200 and the
  "you are unsubscribed" page, also when the address already was.
- ``GET /u/<token>`` shows the confirmation page with that button, and never unsubscribes:
  link scanners prefetch links.
- A forged, altered or malformed token gets 404 and changes nothing; a POST without the
  one-click field gets 400.

No API token, cookie or CSRF token is asked (the middlewares exempt exactly these paths:
:func:`sendqueue.web.middleware.auth.is_unsubscribe_path`); the signed token is the authority.
Each client address may make ``SENDQUEUE_UNSUBSCRIBE_RATE`` requests a minute (429 beyond).
The page is self-contained (its style inline, allowed by its hash), so a reverse proxy can
publish ``/u/`` alone. The routes only parse and call
:class:`~sendqueue.services.feedback.unsubscribe.UnsubscribeService`.
"""

from __future__ import annotations

import base64
import hashlib

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue.domain.errors import NotFound
from sendqueue.domain.unsubscribe import ONE_CLICK_BODY, UNSUBSCRIBE_PATH
from sendqueue.services.feedback.unsubscribe import Unsubscription
from sendqueue.web.deps import UnsubscribeDep
from sendqueue.web.errors import HttpProblem
from sendqueue.web.middleware.auth import client_address
from sendqueue.web.middleware.throttle import RequestRate
from sendqueue.web.rendering import TEMPLATES_DIR, render_public

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

_FORM_LIMITS: dict[str, int] = {"max_files": 0, "max_fields": 5, "max_part_size": 1024}
_FIELD, _, _VALUE = ONE_CLICK_BODY.partition("=")

_STYLE = (TEMPLATES_DIR / "unsubscribe.css").read_text(encoding="utf-8")
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
# The page loads nothing: its one style block by hash, its one form to itself.
_PAGE_CSP = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


async def _limit_rate(request: Request) -> None:
    """429 for a client past its rate (before the token is checked or the body read)."""
    rate: RequestRate = request.app.state.unsubscribe_rate
    rate.check(client_address(request.scope))


_RATE = Depends(_limit_rate)


def _page(state: str, context: dict[str, str], *, status_code: int = 200) -> HTMLResponse:
    titles = {"confirm": "Unsubscribe", "done": "Unsubscribed", "invalid": "Invalid link"}
    return render_public(
        "unsubscribe.html",
        status_code=status_code,
        headers={"Content-Security-Policy": _PAGE_CSP, "Referrer-Policy": "no-referrer"},
        title=titles[state],
        style=Markup(_STYLE),  # the project's own file, hashed into the CSP
        state=state,
        **context,
    )


def _shown(found: Unsubscription) -> dict[str, str]:
    return {"address": found.address, "sender": found.sender}  # never the address whole


def _invalid(exc: NotFound) -> HTMLResponse:
    del exc  # one message for every refusal
    message = "The link is unknown, altered or no longer valid."
    return _page("invalid", {"message": message}, status_code=404)


@router.get(UNSUBSCRIBE_PATH + "{token}", response_class=HTMLResponse, dependencies=[_RATE])
async def confirm_page(token: str, service: UnsubscribeDep) -> HTMLResponse:
    """The confirmation page: one button that posts the one-click body here. Changes nothing."""
    try:
        found = await run_in_threadpool(service.look_up, token)
    except NotFound as exc:
        return _invalid(exc)
    if found.unsubscribed:
        return _page("done", _shown(found))
    # Relative to the page itself (".../u/<token>"), so the button posts back to the link also
    # under a SENDQUEUE_PUBLIC_URL with a path that the reverse proxy strips.
    canonical = token.strip().lower()  # what verify_task read: [0-9a-z.-] only
    return _page("confirm", {**_shown(found), "action": canonical})


@router.post(UNSUBSCRIBE_PATH + "{token}", response_class=HTMLResponse, dependencies=[_RATE])
async def unsubscribe(token: str, request: Request, service: UnsubscribeDep) -> HTMLResponse:
    """RFC 8058 one-click: the form body ``List-Unsubscribe=One-Click`` unsubscribes at once."""
    try:
        form = await request.form(**_FORM_LIMITS)
    except StarletteHTTPException as exc:
        raise HttpProblem(400, f"malformed form: {exc.detail}", field=_FIELD) from exc
    if form.get(_FIELD) != _VALUE:
        raise HttpProblem(400, f"expected the form body {ONE_CLICK_BODY} (RFC 8058)", field=_FIELD)
    try:
        found = await run_in_threadpool(service.unsubscribe, token)
    except NotFound as exc:
        return _invalid(exc)
    return _page("done", _shown(found))
