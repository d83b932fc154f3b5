"""Whether the public URL answers (``SENDQUEUE_PUBLIC_URL``, the base of every unsubscribe
link): one GET of sendqueue's health route through it, redirects not followed.

urllib rather than an HTTP client library, as for the alarm webhook: one GET with a timeout
needs nothing more.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from sendqueue.domain.errors import InfrastructureError

__all__ = ["HEALTH_PATH", "PublicUrlProbe"]

#: The web app's public health route (web/routers/health.py).
HEALTH_PATH = "/healthz"
#: The most of an answer read: the health answer is a few bytes.
_MAX_BODY = 4096


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer to report, not to follow: the links in emails are not
    redirected by the mail provider's one-click POST (RFC 8058)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class PublicUrlProbe:
    """A :class:`~sendqueue.ports.Probe` of the public URL: ``GET BASE/healthz`` must answer
    200 with sendqueue's ``{"status": "ok"}``. ``ssl_context`` defaults to the system's trust
    store with host name checks."""

    def __init__(self, base_url: str, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = base_url.rstrip("/") + HEALTH_PATH
        self._opener = urllib.request.build_opener(
            _NoRedirect(), urllib.request.HTTPSHandler(context=ssl_context)
        )

    def __repr__(self) -> str:
        return f"PublicUrlProbe({self.url!r})"

    def probe(self, timeout: float) -> str:
        request = urllib.request.Request(self.url, headers={"User-Agent": "sendqueue-check"})
        try:
            with self._opener.open(request, timeout=timeout) as answer:
                status, body = answer.status, answer.read(_MAX_BODY)
        except urllib.error.HTTPError as exc:
            raise InfrastructureError(self._refused(exc)) from exc
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                text = f"timed out after {timeout:g}s"
            elif isinstance(reason, OSError):
                text = reason.strerror or str(reason)
            else:
                text = str(reason)
            raise InfrastructureError(f"GET {self.url}: {text}") from exc
        except TimeoutError as exc:
            raise InfrastructureError(f"GET {self.url}: timed out after {timeout:g}s") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise InfrastructureError(f"GET {self.url}: {type(exc).__name__}: {exc}") from exc
        if not _is_health(body):
            raise InfrastructureError(
                f"GET {self.url} answered {status}, but not sendqueue's health answer: is it "
                "served by `sendqueue serve` (or a proxy in front of it)?"
            )
        return f"GET {self.url}: {status}"

    def _refused(self, exc: urllib.error.HTTPError) -> str:
        code = exc.code
        if 300 <= code < 400:
            where = exc.headers.get("Location") or "?"
            return (
                f"GET {self.url} answered {code}, a redirect to {where} (not followed): set "
                "SENDQUEUE_PUBLIC_URL to the address that answers itself"
            )
        if code == 503:
            return f"GET {self.url} answered 503: sendqueue answers, but its task store does not"
        return f"GET {self.url} answered {code} {exc.reason}"


def _is_health(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("status") == "ok"
