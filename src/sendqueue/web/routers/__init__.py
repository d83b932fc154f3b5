"""The web app's routes, one module per resource; :data:`ROUTERS` in the order the app
includes them."""

from __future__ import annotations

from fastapi import APIRouter

from sendqueue.web.routers import (
    auth,
    campaigns,
    dead_letters,
    events,
    health,
    pages,
    senders,
    steps,
    suppressions,
    tasks,
    unsubscribe,
    webhooks,
)

__all__ = ["ROUTERS"]

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    campaigns.router,
    steps.router,
    tasks.router,
    events.router,
    dead_letters.router,
    suppressions.router,
    senders.router,
    webhooks.router,
    pages.router,
    auth.router,
    unsubscribe.router,
)
