"""The public one-click unsubscribe routes (issue 14, RFC 8058) in the FastAPI app: a POST
unsubscribes at once with no token, cookie or CSRF token; a GET never does; a forged token
changes nothing; the routes are rate-limited; and a message sent through a real SMTP server
(aiosmtpd) carries both headers, whose link works.

The app runs over the in-memory task store: it is a FeedbackStore already (the SQL stores' side
of it is written separately), and the routes see only the port.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from email.utils import parseaddr
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi import FastAPI

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Task
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.services.templates.render import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.web.app import create_app
from sendqueue.web.errors import HttpProblem
from sendqueue.web.middleware.throttle import RequestRate
from sendqueue.web.session import CSRF_COOKIE, SESSION_COOKIE
from tests.support.app import T0, fake_app, open_policy
from tests.support.smtp import SmtpSink
from tests.web.conftest import TOKEN

SECRET = "web-unsubscribe-key-0123456789abcdef"
PUBLIC_URL = "https://mail.example.com"
ONE_CLICK = {"List-Unsubscribe": "One-Click"}


class Site:
    """An app with unsubscribe links and an API token, and a client that holds no token."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.app: FastAPI = create_app(container)
        self.client = TestClient(self.app, base_url="http://testserver", follow_redirects=False)
        self.client.__enter__()

    def campaign(self, count: int = 3, *, days: int = 0) -> tuple[str, list[Task]]:
        """A provisioned campaign of user0..; sent at once unless it starts ``days`` later."""
        rows = "".join(f"user{i}@example.com,User {i},Hello\n" for i in range(count))
        cid = self.container.campaign_import.create(
            name="News",
            recipients=f"email,name,subject\n{rows}".encode(),
            policy=open_policy(start=T0 + timedelta(days=days)),
            from_addr="News <news@example.com>",
            templates=Templates(body="Hi {{ name }}"),
        ).campaign.id
        assert self.container.provisioner.provision(cid).status == "done"
        if not days:
            clock, scheduler = self.container.clock, self.container.scheduler
            assert isinstance(clock, FakeClock)
            assert isinstance(scheduler, FakeScheduler)
            clock.advance(hours=1)
            scheduler.fire_due(self.container.invoke)
        return cid, self.container.store.list_tasks(cid, limit=100)

    def path(self, task: Task) -> str:
        links = self.container.config.unsubscribe
        assert links is not None
        return urlsplit(links.url(task.id)).path

    def close(self) -> None:
        self.client.__exit__(None, None, None)


@pytest.fixture
def make_site() -> Iterator[Callable[..., Site]]:
    made: list[Site] = []

    def make(**settings: Any) -> Site:
        values: dict[str, Any] = {
            "public_url": PUBLIC_URL,
            "secret_key": SECRET,
            "api_token": TOKEN,
        }
        values.update(settings)
        site = Site(fake_app(**values))
        made.append(site)
        return site

    yield make
    for site in made:
        site.close()


@pytest.fixture
def site(make_site: Callable[..., Site]) -> Site:
    return make_site()


def _unchanged(site: Site) -> tuple[int, int]:
    return site.container.store.last_change_id(), site.container.suppressions.count_suppressions()


def test_one_click_post_suppresses_and_cancels_the_recipients_other_pending_emails(
    site: Site,
) -> None:
    _, sent = site.campaign()
    later, _ = site.campaign(days=10)
    target = sent[1]
    # what a mail provider sends: no token, no cookie, no CSRF token, its own Origin
    response = site.client.post(
        site.path(target), data=ONE_CLICK, headers={"Origin": "https://mail.google.com"}
    )
    assert response.status_code == 200, response.text
    assert "You are unsubscribed" in response.text
    assert "u***@example.com" in response.text and target.email not in response.text
    assert "set-cookie" not in response.headers  # neither a session nor a CSRF cookie
    store = site.container.store
    assert store.get_task(target.id).outcome is TaskOutcome.UNSUBSCRIBED  # type: ignore[union-attr]
    entry = site.container.suppressions.suppressed([target.email])[target.email]
    assert (entry.reason, entry.task_id) == (SuppressionReason.UNSUBSCRIBED, target.id)
    others = {t.email: t for t in store.list_tasks(later, limit=10)}
    assert others[target.email].state is TaskState.CANCELLED
    assert others[target.email].reason == "suppressed: unsubscribed"
    assert [others[t.email].state for t in (sent[0], sent[2])] == [TaskState.PENDING] * 2
    # twice: still 2xx, and still says so
    again = site.client.post(site.path(target), data=ONE_CLICK)
    assert again.status_code == 200
    assert "You are unsubscribed" in again.text


def test_a_multipart_one_click_body_counts_too(site: Site) -> None:
    _, sent = site.campaign(1)
    files = {"List-Unsubscribe": (None, "One-Click")}
    assert site.client.post(site.path(sent[0]), files=files).status_code == 200
    assert site.container.suppressions.count_suppressions() == 1


def test_get_shows_a_button_that_posts_and_never_unsubscribes(site: Site) -> None:
    _, sent = site.campaign(1)
    before = _unchanged(site)
    for _ in range(3):  # a link scanner prefetching
        page = site.client.get(site.path(sent[0]))
        assert page.status_code == 200
    assert _unchanged(site) == before
    assert "set-cookie" not in page.headers
    assert page.headers["cache-control"] == "no-store"
    html = page.text
    token = site.path(sent[0]).removeprefix("/u/")
    assert f'<form method="post" action="{token}">' in html  # relative: back to the link
    assert '<input type="hidden" name="List-Unsubscribe" value="One-Click">' in html
    assert "News &lt;news@example.com&gt;" in html
    # self-contained: the only style is inline, allowed by its hash; nothing else loads
    assert '<link rel="stylesheet"' not in html and "<script" not in html
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    csp = page.headers["content-security-policy"]
    assert f"style-src 'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp and "form-action 'self'" in csp
    # the page's own form post is the one-click post
    done = site.client.post(site.path(sent[0]), data=ONE_CLICK)
    assert done.status_code == 200
    assert "You are unsubscribed" in site.client.get(site.path(sent[0])).text
    assert "<form" not in site.client.get(site.path(sent[0])).text


@pytest.mark.parametrize(
    "alter",
    [
        lambda path: path[:-1] + ("0" if path[-1] != "0" else "1"),  # the mac altered
        lambda path: path.replace("-0.", "-1."),  # another task, same mac
        lambda path: path.split(".")[0],  # no mac
        lambda path: "/u/" + "x" * 300,
        lambda path: path + "%00",
    ],
)
def test_a_forged_token_gets_404_and_changes_nothing(
    site: Site, alter: Callable[[str], str]
) -> None:
    _, sent = site.campaign(2)
    before = _unchanged(site)
    forged = alter(site.path(sent[0]))
    assert site.client.post(forged, data=ONE_CLICK).status_code == 404
    assert site.client.get(forged).status_code == 404
    assert _unchanged(site) == before


def test_a_post_without_the_one_click_body_gets_400_and_changes_nothing(site: Site) -> None:
    _, sent = site.campaign(1)
    before = _unchanged(site)
    for data in ({}, {"List-Unsubscribe": "yes"}):
        response = site.client.post(site.path(sent[0]), data=data)
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "List-Unsubscribe"
    assert _unchanged(site) == before


def test_only_the_unsubscribe_routes_are_open_without_the_token(site: Site) -> None:
    _, sent = site.campaign(1)
    path = site.path(sent[0])
    assert site.client.get(path).status_code == 200
    # the rest still needs it, for a GET and for a state change
    assert site.client.get("/api/campaigns").status_code == 401
    assert site.client.get("/", headers={"Accept": "text/html"}).status_code == 303
    assert site.client.post("/api/suppressions", json={"email": "x@example.com"}).status_code == 401
    # prefixes that merely look alike are not exempt
    assert site.client.get("/u", headers={"Accept": "application/json"}).status_code == 401
    assert site.client.get("/ux/a", headers={"Accept": "application/json"}).status_code == 401
    # a session cookie or a wrong bearer token changes nothing for the public route
    site.client.cookies.set(SESSION_COOKIE, "forged")
    site.client.cookies.set(CSRF_COOKIE, "forged")
    assert (
        site.client.post(path, data=ONE_CLICK, headers={"Authorization": "Bearer no"}).status_code
        == 200
    )


def test_the_public_urls_host_is_answered(site: Site) -> None:
    _, sent = site.campaign(1)
    response = site.client.get(site.path(sent[0]), headers={"Host": "mail.example.com"})
    assert response.status_code == 200
    assert site.client.get("/healthz", headers={"Host": "elsewhere.example"}).status_code == 400


def test_the_routes_are_rate_limited_per_client(make_site: Callable[..., Site]) -> None:
    site = make_site(unsubscribe_rate=3)
    _, sent = site.campaign(1)
    path = site.path(sent[0])
    statuses = [site.client.get(path).status_code for _ in range(3)]
    refused = site.client.post(path, data=ONE_CLICK)
    assert statuses == [200, 200, 200]
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert "too many unsubscribe requests from this address" in refused.json()["error"]["message"]
    assert site.container.suppressions.count_suppressions() == 0  # refused before anything
    # the token-guarded routes are not counted by it
    assert site.client.get("/healthz").status_code == 200


def test_without_links_configured_every_token_is_404(make_site: Callable[..., Site]) -> None:
    site = make_site(public_url=None, secret_key=None)
    _, sent = site.campaign(1)
    assert site.client.get(f"/u/{sent[0].id}.{'0' * 32}").status_code == 404


def test_a_message_sent_over_smtp_carries_both_headers_and_its_link_works(
    smtp_sink: SmtpSink,
) -> None:
    clock = FakeClock(T0)
    settings = Settings(
        _env_file=None,
        mailer=smtp_sink.url(),
        public_url=PUBLIC_URL,
        secret_key=SECRET,
        unsubscribe_mailbox="unsubscribe@example.com",
        api_token=TOKEN,
        max_lateness=30 * 86_400.0,
        space_late_sends=False,
    )
    container = bootstrap(
        settings, clock=clock, store=InMemoryTaskStore(), scheduler=FakeScheduler(clock, seed=1)
    )
    site = Site(container)
    try:
        _, sent = site.campaign(2)
        [mail] = [m for m in smtp_sink.wait_for(2) if parseaddr(m["To"] or "")[1] == sent[0].email]
        links = container.config.unsubscribe
        assert links is not None
        token = links.token(sent[0].id)
        header = mail.message["List-Unsubscribe"]
        targets = [part.strip() for part in str(header).split(",")]
        assert targets == [
            f"<{PUBLIC_URL}/u/{token}>",
            f"<mailto:unsubscribe@example.com?subject=unsubscribe%20{token}>",
        ]
        assert str(mail.message["List-Unsubscribe-Post"]) == "List-Unsubscribe=One-Click"
        assert len(mail.message.get_all("List-Unsubscribe") or []) == 1
        # the https link, as the provider would POST it
        url = urlsplit(targets[0].strip("<>"))
        response = site.client.post(url.path, data=ONE_CLICK, headers={"Host": url.hostname or ""})
        assert response.status_code == 200
        listed = container.suppressions.suppressed([sent[0].email])
        assert listed[sent[0].email].reason is SuppressionReason.UNSUBSCRIBED
    finally:
        site.close()
        container.close()


# --- the rate ----------------------------------------------------------------------------------


def test_the_rate_allows_a_burst_then_refills_per_client() -> None:
    now = [0.0]
    rate = RequestRate(3, clock=lambda: now[0])
    assert [rate.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("a") == pytest.approx(20.0)  # one more every 60/3 s
    assert rate.take("b") == 0.0  # another client has its own
    now[0] = 20.0
    assert rate.take("a") == 0.0
    with pytest.raises(HttpProblem, match=r"at most 3 a minute\); try again in 20 s") as refused:
        rate.check("a")
    assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "20"})


def test_behind_a_trusted_proxy_the_rate_is_per_forwarded_client() -> None:
    """The real server (uvicorn as ``serve`` builds it) takes X-Forwarded-For from the proxies
    of SENDQUEUE_FORWARDED_ALLOW_IPS only: each recipient behind the proxy has its own rate."""
    import httpx

    from sendqueue.web.app import build_server

    container = fake_app(
        public_url=PUBLIC_URL,
        secret_key=SECRET,
        api_token=TOKEN,
        unsubscribe_rate=2,
        forwarded_allow_ips="127.0.0.1",
    )
    server = build_server(create_app(container), host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "no server"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        forged = f"/u/c0123456789ab-0.{'0' * 32}"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:

            def get(client_ip: str) -> int:
                headers = {"X-Forwarded-For": client_ip, "Host": "mail.example.com"}
                return client.get(forged, headers=headers).status_code

            assert [get("203.0.113.7") for _ in range(3)] == [404, 404, 429]
            assert [get("198.51.100.9") for _ in range(2)] == [404, 404]
    finally:
        server.should_exit = True
        thread.join(20)
        container.close()


def test_the_button_posts_back_to_the_link_under_a_public_url_with_a_path(
    make_site: Callable[..., Site],
) -> None:
    # Red team: SENDQUEUE_PUBLIC_URL may carry a path (https://example.com/mail); the reverse
    # proxy strips it and forwards /u/<token>. The button must post to the link the reader
    # opened, not to /u/<token> at the site's root, where nothing answers.
    site = make_site(public_url="https://mail.example.com/sq")
    _, sent = site.campaign()
    links = site.container.config.unsubscribe
    assert links is not None
    link = links.url(sent[0].id)
    assert urlsplit(link).path.startswith("/sq/u/")
    forwarded = urlsplit(link).path.removeprefix("/sq")  # what the proxy passes on
    page = site.client.get(forwarded)
    assert page.status_code == 200, page.text
    action = re.search(r'<form method="post" action="([^"]*)">', page.text)
    assert action is not None
    assert urljoin(link, action.group(1)) == link
