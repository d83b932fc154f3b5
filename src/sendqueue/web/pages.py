"""HTML pages of the web UI: server-rendered with Jinja2 (autoescaped), kept live by plain JS.

Routes are thin: they read the store and the scheduler through the Container the app factory
puts on ``app.state.container`` (and timelines through the cache on ``app.state.timelines``, which
the API shares) and render a template. The first render already shows the data;
the scripts in ``static/`` then keep it live through the JSON API and the event stream
(docs/api.md). Everything a user typed reaches the page as text: Jinja2 escapes every value, and
the scripts only ever use ``textContent``.

Public for the app factory and the login route:

- ``router``: the page routes (``/``, ``/campaigns/new``, ``/campaigns/{id}``,
  ``/dead-letters``, ``GET /login``);
- ``STATIC_DIR``: the directory to serve at ``/static``;
- ``render_login(request, error=..., status_code=...)``: the login page, e.g. after a wrong token;
- ``campaign_timeline(store, campaign, now)``: planned and done emails per local day, the rows
  the timeline chart draws (the one definition; the API's ``timeline`` uses it too).

The CSRF token a page embeds is ``request.state.csrf_token`` (the CSRF middleware's); without
that middleware the page falls back to the ``sq_csrf`` cookie, or makes a token and sets it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import zoneinfo
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InfrastructureError, InvalidField, NoSendingDay, NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.planner import per_day_summary, plan
from sendqueue.domain.policy import WEEKDAY_NAMES
from sendqueue.ports import TaskStore
from sendqueue.services.campaigns import iter_tasks
from sendqueue.services.views import iso
from sendqueue.web.queries import TimelineCache, next_send_at
from sendqueue.web.security import safe_next

__all__ = [
    "CSRF_COOKIE",
    "PAGE_SIZE",
    "STATIC_DIR",
    "TEMPLATES_DIR",
    "ChartBar",
    "DayChart",
    "Segment",
    "campaign_timeline",
    "day_chart",
    "progress_segments",
    "render_login",
    "router",
    "static_url",
]

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"

#: The double-submit CSRF cookie (docs/api.md, "Access"). Not HttpOnly: the scripts echo it.
CSRF_COOKIE = "sq_csrf"
#: Rows of the task table per page; the scripts ask the API for the same.
PAGE_SIZE = 50
_SEARCH_MAX = 200

router = APIRouter(include_in_schema=False)

_env = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)

_FINAL_STATES = (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED)
# Which controls a campaign state offers; campaign.js keeps the same table.
_ACTIONS: dict[str, frozenset[CampaignState]] = {
    "provision": frozenset({CampaignState.DRAFT}),
    "pause": frozenset({CampaignState.ACTIVE}),
    "resume": frozenset({CampaignState.PAUSED}),
    "retry-failed": frozenset(
        {CampaignState.ACTIVE, CampaignState.PAUSED, CampaignState.COMPLETED}
    ),
    "cancel": frozenset(
        {
            CampaignState.DRAFT,
            CampaignState.PROVISIONING,
            CampaignState.ACTIVE,
            CampaignState.PAUSED,
        }
    ),
}


# -- helpers -----------------------------------------------------------------------------------
def _container(request: Request) -> Container:
    return cast(Container, request.app.state.container)


def _timelines(request: Request) -> TimelineCache:
    """The app's cache of :func:`campaign_timeline` results, shared with the API."""
    return cast(TimelineCache, request.app.state.timelines)


@functools.cache
def _static_version(name: str) -> str:
    """A short content hash, so a browser never runs a stale script against a new page."""
    try:
        return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:10]
    except OSError:
        return "0"


def static_url(name: str) -> str:
    """The URL of a file in STATIC_DIR, versioned by its content (safe to cache)."""
    return f"/static/{name}?v={_static_version(name)}"


def _csrf_token(request: Request) -> tuple[str, bool]:
    """The request's CSRF token and whether it is new (then the response must set the cookie).

    The middleware sets the cookie on responses that lack it; a token it made for this request
    (``request.state.csrf_token``) wins, so the page and the cookie always agree.
    """
    token = getattr(request.state, "csrf_token", None)
    if isinstance(token, str) and token:
        return token, False
    cookie = request.cookies.get(CSRF_COOKIE)
    if cookie:
        return cookie, False
    return secrets.token_urlsafe(32), True


def _render(
    request: Request,
    template: str,
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    token, fresh = _csrf_token(request)
    html = _env.get_template(template).render(
        csrf_token=token,
        static_url=static_url,
        path=request.url.path,
        logged_in=getattr(request.state, "auth", None) == "cookie",
        **context,
    )
    response = HTMLResponse(html, status_code=status_code, headers=dict(headers or {}))
    # pages carry live data and a CSRF token: never serve them from a cache
    response.headers["Cache-Control"] = "no-store"
    if fresh:
        response.set_cookie(
            CSRF_COOKIE,
            token,
            path="/",
            samesite="strict",
            secure=request.url.scheme == "https",
            httponly=False,
        )
    return response


def _error_page(request: Request, exc: Exception) -> HTMLResponse:
    """An unknown id or an unreachable backend, as an HTML page instead of JSON."""
    if isinstance(exc, NotFound):
        return _render(request, "error.html", status_code=404, title="Not found", message=str(exc))
    if isinstance(exc, InvalidField):
        return _render(
            request, "error.html", status_code=400, title="Bad request", message=str(exc)
        )
    log.warning("page %s: %s", request.url.path, exc)
    return _render(
        request,
        "error.html",
        status_code=503,
        headers={"Retry-After": "5"},
        title="Temporarily unavailable",
        message=f"{type(exc).__name__}: {exc}",
    )


def _local(value: datetime | None, zone: ZoneInfo) -> str:
    """``2026-12-01 09:15:03`` in the campaign's zone; campaign.js formats the same way."""
    if value is None:
        return ""
    return value.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


def _total(campaign: Campaign, counts: Mapping[TaskState, int]) -> int:
    return max(campaign.recipient_count, sum(counts.values()))


@dataclass(frozen=True)
class Segment:
    """One coloured part of a progress bar (x and width in a 0..1000 viewBox)."""

    state: str
    x: int
    width: int


def progress_segments(counts: Mapping[str, int], total: int) -> list[Segment]:
    """The stacked progress bar: Finished, Failed, Cancelled, then Running (common.js agrees)."""
    segments: list[Segment] = []
    x = 0
    for state in ("Finished", "Failed", "Cancelled", "Running"):
        width = counts.get(state, 0) * 1000 // total if total > 0 else 0
        segments.append(Segment(state, x, width))
        x += width
    return segments


def _summary(store: TaskStore, campaign: Campaign) -> dict[str, Any]:
    """What the list and the campaign page show about one campaign."""
    counts = store.count_tasks(campaign.id)
    by_name = {state.value: counts.get(state, 0) for state in TaskState}
    total = _total(campaign, counts)
    final = sum(counts.get(s, 0) for s in _FINAL_STATES)
    zone = campaign.policy.zone
    next_send = next_send_at(store, campaign)
    return {
        "campaign": campaign,
        "counts": by_name,
        "total": total,
        "final": final,
        "percent": final * 100 // total if total else 0,
        "segments": progress_segments(by_name, total),
        "next_send": _local(next_send, zone),
        "next_send_iso": iso(next_send) or "",
    }


# -- the timeline chart --------------------------------------------------------------------------
def campaign_timeline(store: TaskStore, campaign: Campaign, now: datetime) -> list[dict[str, Any]]:
    """Planned and done emails per local day (the campaign's zone), in day order.

    ``planned`` counts every task that is not cancelled by the local day of its send time;
    ``done`` counts the Finished ones by the local day they were sent. Before provisioning has
    created any task, the plan from ``now`` stands in for the tasks (``done`` is 0).
    """
    zone = campaign.policy.zone
    planned: Counter[str] = Counter()
    done: Counter[str] = Counter()
    seen = False
    for task in iter_tasks(store, campaign.id):
        seen = True
        if task.state is not TaskState.CANCELLED:
            planned[task.send_at.astimezone(zone).date().isoformat()] += 1
        if task.state is TaskState.FINISHED and task.sent_at is not None:
            done[task.sent_at.astimezone(zone).date().isoformat()] += 1
    if not seen and campaign.state in {CampaignState.DRAFT, CampaignState.PROVISIONING}:
        try:
            sends = plan(campaign.policy, campaign.recipient_count, now=now)
        except NoSendingDay:
            return []
        for day in per_day_summary(sends, campaign.policy.timezone):
            planned[day.day.isoformat()] = day.count
    days = sorted(set(planned) | set(done))
    return [{"day": d, "planned": planned.get(d, 0), "done": done.get(d, 0)} for d in days]


# Geometry of the day chart, in SVG user units. common.js (sq.drawDayChart) draws the very same
# chart from the same rows; keep both in step (the browser tests compare them).
CHART_MAX_BARS = 60
CHART_SLOT = 32
CHART_BAR = 22
CHART_LEFT = 44
CHART_RIGHT = 8
CHART_TOP = 12
CHART_PLOT = 120
CHART_BOTTOM = 28


@dataclass(frozen=True)
class ChartBar:
    x: int
    label_x: int
    label: str
    title: str
    planned_y: int
    planned_h: int
    done_y: int
    done_h: int


@dataclass(frozen=True)
class DayChart:
    """A bar chart of planned and done emails per day, ready for the template."""

    width: int
    height: int
    baseline: int
    left: int
    top: int
    label_y: int
    axis_end: int
    bar_width: int
    peak: int
    bars: list[ChartBar]
    planned: int
    done: int

    @property
    def summary(self) -> str:
        days = len(self.bars)
        return f"{self.planned} planned and {self.done} sent over {days} bar(s)"


def day_chart(rows: Sequence[Mapping[str, Any]]) -> DayChart:
    """Lay out ``rows`` (``day``, ``planned``, ``done``). More than CHART_MAX_BARS days are
    summed into buckets of consecutive days, so the chart stays readable for long campaigns."""
    buckets: list[tuple[str, str, int, int]] = []
    size = max(1, -(-len(rows) // CHART_MAX_BARS))
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        first, last = str(chunk[0]["day"]), str(chunk[-1]["day"])
        buckets.append(
            (
                first,
                last,
                sum(int(r["planned"]) for r in chunk),
                sum(int(r["done"]) for r in chunk),
            )
        )
    peak = max([1, *(max(b[2], b[3]) for b in buckets)])
    baseline = CHART_TOP + CHART_PLOT
    bars: list[ChartBar] = []
    for i, (first, last, planned, done) in enumerate(buckets):
        x = CHART_LEFT + i * CHART_SLOT + (CHART_SLOT - CHART_BAR) // 2
        planned_h = planned * CHART_PLOT // peak
        done_h = done * CHART_PLOT // peak
        span = first if first == last else f"{first} to {last}"
        bars.append(
            ChartBar(
                x=x,
                label_x=x + CHART_BAR // 2,
                label=first[5:],
                title=f"{span}: {planned} planned, {done} sent",
                planned_y=baseline - planned_h,
                planned_h=planned_h,
                done_y=baseline - done_h,
                done_h=done_h,
            )
        )
    return DayChart(
        width=CHART_LEFT + len(buckets) * CHART_SLOT + CHART_RIGHT,
        height=CHART_TOP + CHART_PLOT + CHART_BOTTOM,
        baseline=baseline,
        left=CHART_LEFT,
        top=CHART_TOP,
        label_y=CHART_TOP + CHART_PLOT + CHART_BOTTOM - 10,
        axis_end=CHART_LEFT + len(buckets) * CHART_SLOT,
        bar_width=CHART_BAR,
        peak=peak,
        bars=bars,
        planned=sum(b[2] for b in buckets),
        done=sum(b[3] for b in buckets),
    )


# -- pages ---------------------------------------------------------------------------------------
@router.get("/", response_class=HTMLResponse, name="page_campaigns")
def campaigns_page(request: Request) -> Response:
    """Every campaign with its state, progress, counts and next send."""
    try:
        store = _container(request).store
        rows = [_summary(store, campaign) for campaign in store.list_campaigns()]
        return _render(
            request, "campaigns.html", title="Campaigns", rows=rows, states=list(TaskState)
        )
    except (NotFound, InvalidField, InfrastructureError) as exc:
        return _error_page(request, exc)


@router.get("/campaigns/new", response_class=HTMLResponse, name="page_new_campaign")
def new_campaign_page(request: Request) -> Response:
    """The form that uploads a CSV, sets the policy, previews the plan and creates a draft."""
    settings = _container(request).settings
    return _render(
        request,
        "new.html",
        title="New campaign",
        default_timezone=settings.default_timezone,
        default_from=settings.default_from,
        timezones=_timezones(),
        weekdays=WEEKDAY_NAMES,
        max_upload_mb=max(1, settings.max_upload_bytes // (1024 * 1024)),
        empty_chart=day_chart([]),
    )


@functools.cache
def _timezones() -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if "/" in z or z == "UTC")


def _task_row(task: Task, zone: ZoneInfo) -> dict[str, Any]:
    return {
        "id": task.id,
        "position": task.position,
        "email": task.email,
        "name": task.name,
        "subject": task.subject,
        "state": task.state.value,
        "send_at": _local(task.send_at, zone),
        "sent_at": _local(task.sent_at, zone),
        "attempts": task.attempts,
        "error": task.error or "",
    }


def _int_param(value: str | None, default: int) -> int:
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return default


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse, name="page_campaign")
def campaign_page(
    request: Request,
    campaign_id: str,
    state: str | None = None,
    search: str | None = None,
    after: str | None = None,
) -> Response:
    """One campaign: policy, counts, timeline, actions and the paged task table."""
    try:
        container = _container(request)
        store = container.store
        # the change-log id before reading: the page's stream resumes after it, so a change
        # made while this page renders arrives as an event instead of falling into a gap
        last_change = store.last_change_id()
        campaign = store.get_campaign(campaign_id)
        wanted = TaskState.parse(state) if state and state.strip() else None
        needle = (search or "").strip()[:_SEARCH_MAX] or None
        cursor = max(-1, _int_param(after, -1))
        page = store.list_tasks(
            campaign_id, state=wanted, search=needle, after=cursor, limit=PAGE_SIZE + 1
        )
        more = len(page) > PAGE_SIZE
        page = page[:PAGE_SIZE]
        zone = campaign.policy.zone
        summary = _summary(store, campaign)
        timeline = _timelines(request).get(campaign)
        return _render(
            request,
            "campaign.html",
            title=campaign.name,
            last_change=last_change,
            tasks=[_task_row(t, zone) for t in page],
            next_cursor=page[-1].position if more and page else None,
            cursor=cursor,
            filter_state=wanted.value if wanted else "",
            search=needle or "",
            chart=day_chart(timeline),
            actions={name: campaign.state in allowed for name, allowed in _ACTIONS.items()},
            states=list(TaskState),
            page_size=PAGE_SIZE,
            **summary,
        )
    except (NotFound, InfrastructureError) as exc:
        return _error_page(request, exc)


@router.get("/dead-letters", response_class=HTMLResponse, name="page_dead_letters")
def dead_letters_page(request: Request) -> Response:
    """Invocations the execution layer gave up on, each with a redrive button."""
    try:
        letters = _container(request).scheduler.dead_letters()
        return _render(
            request,
            "dead_letters.html",
            title="Dead letters",
            letters=[
                {
                    "id": d.id,
                    "schedule": d.schedule_name,
                    "group": d.group,
                    "payload": ", ".join(f"{k}={v}" for k, v in sorted(d.payload.items())),
                    "task_id": d.payload.get("task_id", ""),
                    "error": d.error,
                    "attempts": d.attempts,
                    "failed_at": iso(d.failed_at) or "",
                }
                for d in letters
            ],
        )
    except (NotFound, InfrastructureError) as exc:
        return _error_page(request, exc)


def render_login(
    request: Request, *, error: str | None = None, status_code: int = 200
) -> HTMLResponse:
    """The login form (``token``, ``csrf_token``, ``next``) posting to ``/login``.

    ``error`` is shown above the form; ``?error=1`` (where a failed ``POST /login`` redirects)
    shows the wrong-token message.
    """
    if error is None and request.query_params.get("error"):
        error = "That token is not valid. Check SENDQUEUE_API_TOKEN and try again."
    return _render(
        request,
        "login.html",
        status_code=status_code,
        title="Log in",
        error=error,
        next_path=safe_next(request.query_params.get("next") or "/"),
    )


@router.get("/login", response_class=HTMLResponse, name="page_login")
def login_page(request: Request) -> Response:
    """The login form; ``POST /login`` (the API's) checks the token and sets the session."""
    return render_login(request)
