"""One-click unsubscribe (RFC 8058 and RFC 2369): the link, the headers, the footer.

Every email carries ``List-Unsubscribe: <PUBLIC_URL/u/TOKEN>`` (plus ``<mailto:...>`` when an
unsubscribe mailbox is set) and ``List-Unsubscribe-Post: List-Unsubscribe=One-Click``; the
token is :func:`~sendqueue.domain.tokens.sign_task` of the task id for the unsubscribe purpose.

Templates are rendered at import, before the campaign and its task ids exist, so
``{{ unsubscribe_url }}`` renders as :data:`UNSUBSCRIBE_URL_PLACEHOLDER`, which the worker
replaces with the task's own link at send time (:func:`personalize`). The link is therefore
always made with the current public URL and secret key, never a stale one stored with the task.
Pure, no I/O.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from urllib.parse import quote

from sendqueue.domain.tokens import TokenPurpose, sign_task, verify_task

__all__ = [
    "ONE_CLICK_BODY",
    "UNSUBSCRIBE_PATH",
    "UNSUBSCRIBE_URL_PLACEHOLDER",
    "Personalized",
    "UnsubscribeLinks",
    "personalize",
]

#: What ``{{ unsubscribe_url }}`` renders as until the worker puts the task's link in its place.
#: Letters, digits and ``:/.-`` only, so HTML escaping leaves it whole (``urlencode`` quotes
#: the ``:``; that form is replaced too); the ``.invalid`` domain (RFC 2606) can never
#: resolve should it reach a reader unreplaced.
UNSUBSCRIBE_URL_PLACEHOLDER = "https://sendqueue.invalid/u/unsubscribe-url"

#: The path prefix of the public unsubscribe routes (``/u/<token>``).
UNSUBSCRIBE_PATH = "/u/"

#: The form field and value of an RFC 8058 one-click POST.
ONE_CLICK_BODY = "List-Unsubscribe=One-Click"

#: The placeholder after Jinja's ``urlencode`` filter (``quote`` keeping only ``/``).
_ENCODED_PLACEHOLDER = quote(UNSUBSCRIBE_URL_PLACEHOLDER, safe="/")
_CLOSING_BODY = re.compile(r"</body\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class UnsubscribeLinks:
    """How the links are made: ``public_url`` without a trailing slash (``https://mail.example
    .com`` or ``https://example.com/mail``), the signing ``secret`` and the optional ``mailbox``
    (a bare address) of the ``mailto:`` alternative."""

    public_url: str
    secret: str = field(repr=False)  # never in a log line
    mailbox: str | None = None

    def token(self, task_id: str) -> str:
        return sign_task(task_id, self.secret, TokenPurpose.UNSUBSCRIBE)

    def task_of(self, token: str) -> str | None:
        """The task id of a genuine token; None for a forged, altered or malformed one."""
        return verify_task(token, self.secret, TokenPurpose.UNSUBSCRIBE)

    def url(self, task_id: str) -> str:
        return f"{self.public_url}{UNSUBSCRIBE_PATH}{self.token(task_id)}"

    def headers(self, task_id: str) -> dict[str, str]:
        """The RFC 2369 and RFC 8058 headers of the task's email."""
        token = self.token(task_id)
        targets = [f"<{self.public_url}{UNSUBSCRIBE_PATH}{token}>"]
        if self.mailbox:
            # RFC 6068: the address percent-encoded but for "@"; the subject names the token.
            address = quote(self.mailbox, safe="@")
            targets.append(f"<mailto:{address}?subject=unsubscribe%20{token}>")
        return {"List-Unsubscribe": ", ".join(targets), "List-Unsubscribe-Post": ONE_CLICK_BODY}


@dataclass(frozen=True)
class Personalized:
    """An email's parts with its unsubscribe link in place."""

    subject: str
    text: str
    html: str | None


def personalize(
    subject: str, text: str, html_part: str | None, url: str | None, *, footer: bool
) -> Personalized:
    """Put ``url`` where the templates rendered :data:`UNSUBSCRIBE_URL_PLACEHOLDER` and, with
    ``footer``, add the one-line footer to the text part (and the html part, escaped, before
    ``</body>`` when it has one). Without a ``url`` (links not configured) the parts are
    returned as they are, with no footer."""
    if url is None:
        return Personalized(subject, text, html_part)
    subject = _put_url(subject, url)
    text = _put_url(text, url)
    if html_part is not None:
        html_part = _put_url(html_part, url, html.escape(url))
    if footer:
        text = _text_footer(text, url)
        if html_part is not None:
            html_part = _html_footer(html_part, url)
    return Personalized(subject, text, html_part)


def _put_url(part: str, url: str, plain: str | None = None) -> str:
    """The placeholder replaced by ``url`` (``plain``: its form in this part), and its
    ``urlencode`` form (Jinja quotes all but ``/``) by the link quoted the same way."""
    part = part.replace(_ENCODED_PLACEHOLDER, quote(url, safe="/"))
    return part.replace(UNSUBSCRIBE_URL_PLACEHOLDER, url if plain is None else plain)


def _text_footer(text: str, url: str) -> str:
    separator = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{separator}\nUnsubscribe: {url}\n"


def _html_footer(part: str, url: str) -> str:
    escaped = html.escape(url)
    line = (
        '<p style="font-size:12px;color:#666666">'
        f'<a href="{escaped}">Unsubscribe</a> from these emails.</p>'
    )
    closings = list(_CLOSING_BODY.finditer(part))
    if not closings:
        return f"{part}\n{line}\n"
    at = closings[-1].start()  # the last </body>
    return f"{part[:at]}{line}\n{part[at:]}"
