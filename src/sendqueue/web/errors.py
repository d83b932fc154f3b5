"""Errors as JSON: every exception the API can raise, mapped to its status and one body shape.

The shape (docs/api.md)::

    {"error": {"status": 422, "message": "...", "field": "...", "reason": "...", "value": ...,
               "errors": [{"row": 3, "field": "email", "reason": "...", "value": "x"}],
               "total": 1}}

``message`` is always there; the other keys only where they mean something.

==========================================  ======
exception                                    status
==========================================  ======
InvalidField, NoSendingDay, request errors     422
InvalidInput (rows of a CSV or of JSON)        422
NotFound                                       404
IllegalTransition, Conflict                    409
InfrastructureError (store, scheduler)         503 + ``Retry-After``
:class:`HttpProblem` (413, 401, 403, ...)      its own
==========================================  ======
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InfrastructureError,
    InvalidField,
    InvalidInput,
    NoSendingDay,
    NotFound,
)

__all__ = [
    "RETRY_AFTER_SECONDS",
    "HttpProblem",
    "error_body",
    "error_response",
    "http_exception_response",
    "install_error_handlers",
    "shown_value",
]

log = logging.getLogger(__name__)

#: What a 503 tells the client to wait before trying again.
RETRY_AFTER_SECONDS = 5


class HttpProblem(Exception):
    """An HTTP error with its status, raised where no domain error fits (413, 401, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


#: A value quoted back in an error is cut to this many characters (a malformed body would
#: otherwise come back whole).
_VALUE_SHOWN_CHARS = 200


def shown_value(value: object) -> object:
    """``value`` as an error may quote it: JSON-safe (NaN and infinities become text, as
    strict JSON has no spelling for them) and, when it is text, cut to a readable length."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bool | int | float | None):
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) > _VALUE_SHOWN_CHARS:
        return text[:_VALUE_SHOWN_CHARS] + f"... ({len(text)} characters)"
    return text


def error_body(status: int, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON body of an error; ``extra`` keys whose value is None are left out."""
    inner: dict[str, Any] = {"status": status, "message": message}
    inner.update({k: v for k, v in extra.items() if v is not None})
    return {"error": inner}


def error_response(
    status: int, message: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(error_body(status, message, **extra), status_code=status, headers=headers)


def _field_error(exc: InvalidField) -> JSONResponse:
    data = exc.as_dict()
    return error_response(
        422, str(exc), field=data["field"], reason=data["reason"], value=shown_value(data["value"])
    )


def _invalid_input(exc: InvalidInput) -> JSONResponse:
    return error_response(
        422,
        str(exc),
        errors=[{**e.as_dict(), "value": shown_value(e.value)} for e in exc.errors],
        total=exc.total,
    )


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("query", "limit") -> "limit"; ("body", "policy", "per_day") -> "policy.per_day"
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"query", "path", "header", "cookie", "body"}:
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_errors(errors: list[Mapping[str, Any]]) -> JSONResponse:
    """pydantic's / FastAPI's validation errors in the one error shape, naming the fields."""
    shaped: list[dict[str, Any]] = []
    for error in errors:
        value = error.get("input")
        shaped.append(
            {
                "field": _location(error.get("loc", ())),
                "reason": str(error.get("msg", "invalid")),
                "value": shown_value(value),
            }
        )
    first = shaped[0] if shaped else {"field": "body", "reason": "invalid", "value": None}
    return error_response(
        422,
        f"{first['field']}: {first['reason']}",
        field=first["field"],
        reason=first["reason"],
        value=first["value"],
        errors=shaped if len(shaped) > 1 else None,
        total=len(shaped) if len(shaped) > 1 else None,
    )


def http_exception_response(exc: StarletteHTTPException) -> JSONResponse:
    """A routing error (404 no such route, 405 a method it does not take) in the one shape."""
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping above on ``app``."""

    async def invalid_field(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidField)
        return _field_error(exc)

    async def invalid_input(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidInput)
        return _invalid_input(exc)

    async def no_sending_day(_: Request, exc: Exception) -> JSONResponse:
        reason = str(exc)
        return error_response(422, f"policy: {reason}", field="policy", reason=reason)

    async def not_found(_: Request, exc: Exception) -> JSONResponse:
        return error_response(404, str(exc))

    async def conflict(_: Request, exc: Exception) -> JSONResponse:
        return error_response(409, str(exc))

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(
            503,
            f"{type(exc).__name__}: {exc}",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    async def problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HttpProblem)
        return error_response(exc.status, exc.message, headers=exc.headers, field=exc.field)

    async def request_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_errors(list(exc.errors()))

    async def client_gone(request: Request, exc: Exception) -> JSONResponse:
        # The client closed the connection while its body was being read: nobody is left to
        # answer, and it is no fault of the server (uvicorn would log a traceback at ERROR).
        log.info(
            "%s %s: the client disconnected before its body was read",
            request.method,
            request.url.path,
        )
        return error_response(400, "the client disconnected before the body was read")

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return http_exception_response(exc)

    app.add_exception_handler(InvalidInput, invalid_input)
    app.add_exception_handler(InvalidField, invalid_field)
    app.add_exception_handler(NoSendingDay, no_sending_day)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(IllegalTransition, conflict)
    app.add_exception_handler(Conflict, conflict)
    app.add_exception_handler(InfrastructureError, unavailable)
    app.add_exception_handler(HttpProblem, problem)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_gone)
