"""The refresh-token grant (RFC 6749 section 6) at a provider's token endpoint: one POST of
``grant_type=refresh_token`` and the grant's fields, its answer read, its errors mapped.

urllib rather than an HTTP client library, as for the alarm webhook and the public URL probe:
one POST with a timeout needs nothing more (httpx is only a dev dependency). Redirects are
not followed: a refresh token is posted to the configured endpoint and nowhere else. Each
network step has :data:`TIMEOUT`, the whole request :data:`DEADLINE` (its socket is shut then:
an endpoint that drips its answer never lets a single read time out); at most 64 KiB is read.

Errors (:class:`~sendqueue.domain.errors.OAuthTokenError`) name the sender, the ``oauth``
field and the endpoint (without its query), with the endpoint's ``error`` and
``error_description``; any secret of the grant the endpoint echoes is cut out. Permanent: an
``invalid_grant`` (revoked or expired refresh token), every other 4xx but 408 and 429, and a
redirect: the grant, the client or the token URL must change. Transient: 408, 429, 5xx, timeouts,
connection failures, an answer that is not the JSON of a token.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import ipaddress
import json
import re
import socket
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from sendqueue.domain.errors import InvalidField, OAuthTokenError
from sendqueue.domain.senders import OAuthGrant

__all__ = ["DEADLINE", "TIMEOUT", "Granted", "check_token_url", "endpoint_name", "redeem"]

#: Seconds each network step (connecting, each read) may take.
TIMEOUT = 10.0
#: Seconds the whole request may take: an endpoint that drips its answer a byte at a time
#: never lets one read time out, so its connection is shut at this deadline.
DEADLINE = 30.0
#: The most of an answer read: a token answer is a few kilobytes.
_MAX_BODY = 65_536
#: The most of the endpoint's error_description quoted.
_MAX_DESCRIPTION = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is reported, not followed: the refresh token goes to one endpoint only."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Watch:
    """The sockets of one request, shut down (so that a read blocked on one ends) when the
    request's deadline passes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if not self.expired:
                return
        _shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHttp(http.client.HTTPConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def connect(self) -> None:
        super().connect()
        self._watch.add(self.sock)


class _WatchedHttps(http.client.HTTPSConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def connect(self) -> None:
        super().connect()
        self._watch.add(self.sock)


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req: Any) -> Any:
        return self.do_open(functools.partial(_WatchedHttp, watch=self._watch), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._watch = watch
        self._ssl_context = context

    def https_open(self, req: Any) -> Any:
        connection = functools.partial(_WatchedHttps, watch=self._watch)
        return self.do_open(connection, req, context=self._ssl_context)


@dataclass(frozen=True)
class Granted:
    """A token endpoint's answer: the access token, its lifetime in seconds (None: the
    endpoint gave none) and the new refresh token when the provider rotated it."""

    access_token: str = field(repr=False)
    expires_in: float | None
    refresh_token: str | None = field(default=None, repr=False)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token_url(url: str) -> None:
    """Raise ``InvalidField("oauth.token_url", ...)`` unless ``url`` is https (plain http only
    to a loopback host, for a local endpoint): a refresh token never crosses a network in clear
    text."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return
    raise InvalidField(
        "oauth.token_url",
        endpoint_name(url),
        "expected an https:// token endpoint (http:// only on a loopback host)",
    )


def endpoint_name(url: str) -> str:
    """The endpoint as errors show it: scheme, host and path, no query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def redeem(
    grant: OAuthGrant,
    who: str,
    *,
    timeout: float = TIMEOUT,
    deadline: float = DEADLINE,
    ssl_context: ssl.SSLContext | None = None,
) -> Granted:
    """POST the refresh-token grant to ``grant.token_url`` and return its answer; raises
    :class:`OAuthTokenError` (its message starts with ``who``, the sender) otherwise.
    ``timeout`` bounds each network step, ``deadline`` the whole request."""
    try:
        check_token_url(grant.token_url)
    except InvalidField as exc:
        raise OAuthTokenError(f"{who}: {exc}", permanent=True) from exc
    form = {
        "grant_type": "refresh_token",
        "refresh_token": grant.refresh_token,
        "client_id": grant.client_id,
    }
    if grant.client_secret:
        form["client_secret"] = grant.client_secret
    if grant.scope:
        form["scope"] = grant.scope
    request = urllib.request.Request(
        grant.token_url,
        data=urlencode(form).encode("ascii"),
        method="POST",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "User-Agent": "sendqueue",
        },
    )
    watch = _Watch()
    opener = urllib.request.build_opener(
        _NoRedirect(), _HttpHandler(watch), _HttpsHandler(watch, ssl_context)
    )
    where = f"{who}: the token endpoint {endpoint_name(grant.token_url)}"
    timer = threading.Timer(deadline, watch.expire)
    timer.daemon = True
    timer.start()
    try:
        with opener.open(request, timeout=timeout) as answer:
            status, body = answer.status, answer.read(_MAX_BODY)
    except urllib.error.HTTPError as exc:
        with exc:
            status, body = exc.code, exc.read(_MAX_BODY)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        if watch.expired:
            late = f"{where} did not answer within {deadline:g}s"
            raise OAuthTokenError(late, permanent=False) from exc
        raise OAuthTokenError(f"{where} {_unreachable(exc, timeout)}", permanent=False) from exc
    finally:
        timer.cancel()
    if watch.expired:  # cut off mid-answer: what was read is not the whole of it
        raise OAuthTokenError(f"{where} did not answer within {deadline:g}s", permanent=False)
    secrets = (grant.refresh_token, grant.client_secret)
    if status != 200:
        raise _refused(where, status, body, secrets)
    return _granted(where, body)


def _unreachable(exc: BaseException, timeout: float) -> str:
    reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return f"did not answer within {timeout:g}s"
    if isinstance(reason, OSError):
        return f"could not be reached: {reason.strerror or type(reason).__name__}"
    return f"could not be reached: {reason or type(exc).__name__}"


def _clean(text: object, secrets: tuple[str | None, ...]) -> str:
    """The endpoint's own words, on one line, short, with any secret of the grant cut out."""
    out = _CONTROL.sub(" ", str(text)).strip()
    for secret in secrets:
        if secret:
            out = out.replace(secret, "***")
    if len(out) > _MAX_DESCRIPTION:
        out = out[: _MAX_DESCRIPTION - 1] + "…"
    return out


def _refused(
    where: str, status: int, body: bytes, secrets: tuple[str | None, ...]
) -> OAuthTokenError:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    error = _clean(doc.get("error", ""), secrets) if isinstance(doc, dict) else ""
    description = _clean(doc.get("error_description", ""), secrets) if isinstance(doc, dict) else ""
    said = ": ".join(part for part in (error, description) if part) or "no OAuth error given"
    # A redirect or a 4xx needs the grant or the token_url fixed; 408, 429 and 5xx pass.
    permanent = 300 <= status < 500 and status not in (408, 429)
    if error == "invalid_grant":
        hint = "the refresh token was revoked or has expired; set a new one (oauth)"
    elif permanent:
        hint = "check oauth's client_id, client_secret, scope and token_url"
    else:
        hint = "will try again"
    return OAuthTokenError(
        f"{where} refused the refresh token: HTTP {status}: {said} ({hint})", permanent=permanent
    )


def _granted(where: str, body: bytes) -> Granted:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise OAuthTokenError(f"{where} answered 200 without a JSON object", permanent=False)
    token = doc.get("access_token")
    if not isinstance(token, str) or not token.strip():
        raise OAuthTokenError(f"{where} answered 200 without an access_token", permanent=False)
    kind = doc.get("token_type", "Bearer")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise OAuthTokenError(
            f"{where} gave a token of type {_clean(kind, ())!r}, not Bearer", permanent=True
        )
    expires_in = doc.get("expires_in")
    try:  # a number, which some endpoints send as a string
        lifetime = float(expires_in) if expires_in is not None else None
    except (TypeError, ValueError):
        lifetime = None
    rotated = doc.get("refresh_token")
    return Granted(
        access_token=token,
        expires_in=lifetime if lifetime is not None and lifetime > 0 else None,
        refresh_token=rotated if isinstance(rotated, str) and rotated.strip() else None,
    )
