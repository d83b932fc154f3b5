"""Operations: ``/healthz`` (for load balancers; public) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from sendqueue.domain.errors import InfrastructureError
from sendqueue.web.deps import MetricsTextDep, QueriesDep
from sendqueue.web.errors import RETRY_AFTER_SECONDS, error_body
from sendqueue.web.schemas import Health, error_responses

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    response_model_exclude_none=True,
    responses={503: {"model": Health, "description": "the task store does not answer"}},
)
def healthz(queries: QueriesDep) -> Health | JSONResponse:
    """``{"status": "ok"}`` when the task store answers; 503 when it does not."""
    try:
        queries.last_change_id()
    except InfrastructureError as exc:
        # Public: the driver's text (host, port, user) goes to the log, never to the caller.
        log.warning("healthz: the task store does not answer: %s: %s", type(exc).__name__, exc)
        body = {"status": "unavailable", **error_body(503, "the task store does not answer")}
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    return Health(status="ok")


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses=error_responses(401, json_only=True),
)
def metrics_text(metrics_text: MetricsTextDep) -> PlainTextResponse:
    """Prometheus text: sends by outcome, lateness, dead-letter depth, repairs, alarms."""
    body, content_type = metrics_text()
    return PlainTextResponse(body, media_type=content_type)
