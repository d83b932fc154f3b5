"""Browser tests in real Chromium (Debian's package) against real sendqueue processes.

- ``browser``: one headless Chromium per test session (per xdist worker), driven by Playwright
  for Python. Without /usr/bin/chromium or Playwright the tests skip with the reason on a
  laptop and fail when ``SENDQUEUE_REQUIRE_SERVICES=1`` (CI).
- ``sendqueue``: a factory that starts ``sendqueue serve --no-worker`` on 127.0.0.1 (a free port,
  SQLite files in tmp_path) and, on request, ``sendqueue worker`` in another process with the
  same SENDQUEUE_* environment. Both are stopped at the end of the test.
- ``page``: a fresh browser context and page. It records JavaScript errors and CSP violations
  (the test fails on any), and a failing test leaves a full-page screenshot and the server and
  worker logs in ``test-artifacts/``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import missing
from tests.support.smtp import SmtpSink

if TYPE_CHECKING:
    from playwright.sync_api import APIResponse, Browser, Page

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can tell that the test failed."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _failed(node: pytest.Item) -> bool:
    reports = node.stash.get(_REPORTS, {})
    return any(r.failed for r in reports.values())


def _artifact_name(node: pytest.Item) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", node.nodeid.split("::", 1)[-1])[:120]


# -- the browser ---------------------------------------------------------------------------------
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests run one after another in one xdist worker: two Chromiums at once on two
    cores only make both slow."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.xdist_group("browser"))


# Module scope, not session: Playwright's sync API keeps an asyncio loop running in this thread
# while it is open, which would break every later test in the same worker that runs asyncio.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} not found (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Playwright for Python is not installed (pip install -e '.[dev]')")
        raise
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageProblems:
    """JavaScript errors and CSP violations a page reported."""

    errors: list[str] = field(default_factory=list)


@pytest.fixture
def page_problems() -> PageProblems:
    return PageProblems()


@pytest.fixture
def page(
    browser: Browser, request: pytest.FixtureRequest, page_problems: PageProblems
) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()

    def on_console(message: Any) -> None:
        text = message.text
        if message.type == "error" and "Content Security Policy" in text:
            page_problems.errors.append(f"CSP: {text}")

    page.on("pageerror", lambda exc: page_problems.errors.append(f"JS error: {exc}"))
    page.on("console", on_console)
    try:
        yield page
    finally:
        if _failed(request.node):
            ARTIFACTS.mkdir(exist_ok=True)
            try:
                page.screenshot(
                    path=str(ARTIFACTS / f"{_artifact_name(request.node)}.png"), full_page=True
                )
            except Exception as exc:  # the page may be gone; the test's own error matters more
                sys.stderr.write(f"no failure screenshot: {exc}\n")
            for app in _RUNNING:
                _save_logs(request.node, app)
        context.close()
    assert not page_problems.errors, "the page reported problems:\n" + "\n".join(
        page_problems.errors
    )


# -- sendqueue processes ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sendqueue:
    """One ``serve --no-worker`` process (and optional workers) over files in ``home``."""

    home: Path
    env: dict[str, str]
    url: str = ""
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    @property
    def database_url(self) -> str:
        return self.env["SENDQUEUE_DATABASE_URL"]

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.home / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sendqueue.cli", *args],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((name, proc, log))
        return proc

    def serve(self) -> str:
        port = _free_port()
        proc = self._spawn(
            "server", "serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port)
        )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(
                    f"sendqueue serve exited with {proc.returncode}:\n{self.logs()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"sendqueue serve did not answer /healthz in 30 s:\n{self.logs()}")

    def start_worker(self, *, timeout: float = 30.0) -> subprocess.Popen[bytes]:
        """``sendqueue worker`` in its own process; returns once it says it has started."""
        name = f"worker{len(self.procs)}"
        proc = self._spawn(name, "worker")
        log = self.home / f"{name}.log"
        deadline = time.monotonic() + timeout
        while "worker started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sendqueue worker did not start:\n{self.logs()}")
            time.sleep(0.05)
        return proc

    def logs(self) -> str:
        parts = []
        for name, _, log in self.procs:
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"--- {name} ---\n{text[-4000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


#: The sendqueue processes running now; a failing test leaves their logs in test-artifacts/.
_RUNNING: list[Sendqueue] = []


def _launch(
    home: Path, mailer_url: str | None, token: str | None, extra: dict[str, str] | None = None
) -> Sendqueue:
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{home / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{home / 'scheduler.db'}",
        SENDQUEUE_MAILER=mailer_url or f"maildir:{home / 'outbox'}",
        SENDQUEUE_RETRY_BACKOFF="0.5",
        SENDQUEUE_SCHEDULER_RETRY_BACKOFF="0.2",
        SENDQUEUE_SCHEDULER_LEASE="5",
        SENDQUEUE_RECONCILE_INTERVAL="3600",
        SENDQUEUE_DEFAULT_TIMEZONE="UTC",
        # The pages are under test, not the spacing of late sends: a worker started after
        # provisioning meets a backlog, which goes out as fast as it can (docs/guarantees.md).
        SENDQUEUE_SPACE_LATE_SENDS="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])),
    )
    if token:
        env["SENDQUEUE_API_TOKEN"] = token
    env.update(extra or {})
    app = Sendqueue(home, env)
    _RUNNING.append(app)
    try:
        app.serve()
    except BaseException:
        app.stop()
        _RUNNING.remove(app)
        raise
    return app


def _shut(app: Sendqueue) -> None:
    app.stop()
    _RUNNING.remove(app)


def _save_logs(node: pytest.Item, app: Sendqueue) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"{_artifact_name(node)}-{app.home.name}.log").write_text(app.logs())


@pytest.fixture
def sendqueue(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Sendqueue]]:
    """``sendqueue(mailer_url=None, token=None, env=None)`` starts a web app of its own (a
    Maildir outbox unless a mailer URL is given; ``env`` adds SENDQUEUE_* settings);
    ``.start_worker()`` adds a worker process with the same settings."""
    started: list[Sendqueue] = []

    def start(
        mailer_url: str | None = None,
        *,
        token: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Sendqueue:
        app = _launch(tmp_path / f"sq{len(started)}", mailer_url, token, env)
        started.append(app)
        return app

    try:
        yield start
    finally:
        for app in started:
            _shut(app)
            if _failed(request.node):
                _save_logs(request.node, app)


@pytest.fixture(scope="module")
def shared_sendqueue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sendqueue]:
    """One web app (no worker, no token) for a module's tests that each make their own
    campaigns: it saves a server start per test."""
    app = _launch(tmp_path_factory.mktemp("shared") / "sq", None, None)
    try:
        yield app
    finally:
        _shut(app)


class SlowSmtpSink(SmtpSink):
    """An SmtpSink that takes ``delay`` seconds before it accepts a message, so each send
    stays Running for a moment a person (and a test) can see."""

    def __init__(self, delay: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.sleep(self.delay)
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def slow_smtp_sink() -> Iterator[SmtpSink]:
    with SlowSmtpSink(0.8) as sink:
        yield sink


# -- helpers the tests share ----------------------------------------------------------------
def csrf_token(page: Page) -> str:
    """The sq_csrf cookie of the page's context (a page must have been loaded)."""
    for cookie in page.context.cookies():
        if cookie["name"] == "sq_csrf":
            return str(cookie["value"])
    raise AssertionError("no sq_csrf cookie: load a page first")


def api(page: Page, method: str, url: str, **kwargs: Any) -> Any:
    """Call the JSON API with the page's cookies and CSRF token; the parsed body, or raise."""
    headers = {"X-CSRF-Token": csrf_token(page), **kwargs.pop("headers", {})}
    response: APIResponse = page.request.fetch(url, method=method, headers=headers, **kwargs)
    if not response.ok:
        raise AssertionError(f"{method} {url}: {response.status} {response.text()}")
    return response.json()


def wait_for_state(page: Page, base: str, cid: str, state: str, timeout: float = 15.0) -> None:
    """Poll the API until the campaign is in ``state`` (background provisioning, say)."""
    deadline = time.monotonic() + timeout
    while True:
        current = api(page, "GET", f"{base}/api/campaigns/{cid}")["state"]
        if current == state:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"campaign {cid} is {current}, not {state}, after {timeout}s")
        time.sleep(0.05)


def provision(page: Page, base: str, cid: str) -> None:
    """Provision through the API and wait until the background provisioning is done."""
    api(page, "POST", f"{base}/api/campaigns/{cid}/provision")
    wait_for_state(page, base, cid, "active")


def sending_window(now: datetime, minutes: int = 4) -> tuple[str, list[str]]:
    """A timezone and windows (HH:MM-HH:MM) that cover ``now`` and the next ``minutes``.

    UTC, unless the window would cross midnight there; then a zone where it is midday.
    """
    zone = "UTC"
    local = now
    if local.hour * 60 + local.minute + minutes >= 1440:
        zone = "Etc/GMT-12"  # UTC+12 (the POSIX sign is inverted)
        local = now + timedelta(hours=12)
    first = local.hour * 60 + local.minute
    if first + minutes >= 1440:  # pragma: no cover - impossible after the shift above
        raise AssertionError("no window fits")
    end = first + minutes
    return zone, [f"{first // 60:02d}:{first % 60:02d}-{end // 60:02d}:{end % 60:02d}"]


def local_start(now: datetime, zone: str, seconds: float) -> str:
    """``now + seconds`` as wall-clock time in ``zone`` (what a datetime-local input holds)."""
    from zoneinfo import ZoneInfo

    return (
        (now + timedelta(seconds=seconds)).astimezone(ZoneInfo(zone)).strftime("%Y-%m-%dT%H:%M:%S")
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)
