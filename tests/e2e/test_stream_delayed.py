"""The live page never shows stale state as live: in Chromium, with the server's change-log
reader made to fail and to lag, the page says "Delayed" (pings or not), refetches every poll
interval and shows what the stream did not bring; healthy, it still refetches in the background
while emails are in flight.

The server runs in this process (uvicorn in a thread, as in tests/web), over a task store whose
reader-side reads (the whole log, ``campaign_id=None``) this test makes fail or hold back;
every other call, the pages' and the API's, reaches the real SQLite store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.models import ChangeLogEntry
from sendqueue.web.stream import StreamConfig
from tests.e2e.conftest import api, provision
from tests.web.conftest import live_server, sqlite_settings

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

# Counts the pings each EventSource of the page receives (the page's own script does not
# expose its stream). An init script: the CSP does not apply to it.
COUNT_PINGS = """(() => {
  const Native = window.EventSource;
  window.__pings = 0;
  window.EventSource = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("ping", () => { window.__pings += 1; });
    }
  };
})();"""
# Every mode the indicator takes, in order.
RECORD_MODES = """() => {
  const node = document.getElementById("connection");
  window.__modes = [node.dataset.connection];
  new MutationObserver(() => window.__modes.push(node.dataset.connection))
    .observe(node, {attributes: true, attributeFilter: ["data-connection"]});
}"""


class ReaderFault:
    """A task store whose whole-log reads (the stream reader's) fail while ``mode`` is
    "fail" and bring nothing new while it is "lag"; everything else goes to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.mode = ""

    def changes_after(
        self, after_id: int, *, campaign_id: str | None = None, limit: int = 1000
    ) -> list[ChangeLogEntry]:
        if campaign_id is None and self.mode == "fail":
            raise StoreUnavailable("injected: the change log cannot be read")
        if campaign_id is None and self.mode == "lag":
            return []
        entries: list[ChangeLogEntry] = self.inner.changes_after(
            after_id, campaign_id=campaign_id, limit=limit
        )
        return entries

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Stage:
    def __init__(self, url: str, store: ReaderFault) -> None:
        self.url = url
        self.store = store


@pytest.fixture
def stage(tmp_path: Path) -> Callable[..., Any]:
    @contextmanager
    def start(stream: StreamConfig, **settings: Any) -> Iterator[Stage]:
        config = sqlite_settings(tmp_path / f"s{time.monotonic_ns()}", **settings)
        Path(config.database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True)
        store = ReaderFault(open_store(config.database_url, upgrade=True))
        container = bootstrap(config, store=store)
        try:
            with live_server(container, stream=stream) as (url, _):
                yield Stage(url, store)
        finally:
            container.close()
            store.inner.close()

    return start


def _active_campaign(page: Page, base: str, count: int = 4) -> str:
    """A provisioned campaign whose emails are all Pending (due in 2099)."""
    page.goto(f"{base}/")
    created = api(
        page,
        "POST",
        f"{base}/api/campaigns",
        data={
            "name": "Watched",
            "recipients": [{"email": f"w{i}@example.com"} for i in range(count)],
            "templates": {"subject": "S", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = str(created["id"])
    provision(page, base, cid)
    return cid


def _count_refetches(page: Page, cid: str) -> list[float]:
    """The times (monotonic) of the page's requests for its task rows, as they happen."""
    times: list[float] = []

    def on_request(request: Request) -> None:
        if f"/api/campaigns/{cid}/tasks" in request.url:
            times.append(time.monotonic())

    page.on("request", on_request)
    return times


def _since(times: list[float], start: float) -> int:
    return sum(1 for t in times if t >= start)


# A heartbeat every 0.3 s, so that many pings arrive while the reader is failing.
FAST = StreamConfig(poll_interval=0.1, heartbeat=0.3, lag_threshold=1.0, status_interval=0.2)


@pytest.mark.parametrize("fault", ["fail", "lag"])
def test_a_failing_or_lagging_reader_shows_delayed_and_the_page_polls(
    page: Page, stage: Callable[..., Any], fault: str
) -> None:
    page.context.add_init_script(COUNT_PINGS)
    with stage(FAST, ui_refetch_interval=30.0, ui_poll_interval=1.0) as st:
        cid = _active_campaign(page, st.url)
        refetches = _count_refetches(page, cid)
        page.goto(f"{st.url}/campaigns/{cid}")
        indicator = page.locator("#connection")
        expect(indicator).to_have_attribute("data-connection", "live")
        page.evaluate(RECORD_MODES)
        page.wait_for_timeout(1500)
        live_since = time.monotonic()
        page.wait_for_timeout(2000)
        # live and healthy, the 30 s background refetch has not come round yet
        assert _since(refetches, live_since) == 0

        st.store.mode = fault
        # a change the reader will not deliver: only a refetch can show it
        api(page, "POST", f"{st.url}/api/campaigns/{cid}/tasks/{cid}-0/cancel")
        expect(indicator).to_have_attribute("data-connection", "delayed", timeout=10_000)
        expect(page.locator("#connection-text")).to_contain_text("Delayed")
        expect(page.locator(f'#tasks tr[data-task-id="{cid}-0"]')).to_have_attribute(
            "data-state", "Cancelled", timeout=5_000
        )
        delayed_since = time.monotonic()
        pings = page.evaluate("() => window.__pings")
        page.wait_for_timeout(3500)
        polled = _since(refetches, delayed_since)
        assert 2 <= polled <= 5, f"{polled} refetches in 3.5 s at a 1 s poll interval"
        # the heartbeats went on, and none of them made the page say "Live"
        assert page.evaluate("() => window.__pings") >= pings + 5
        expect(indicator).to_have_attribute("data-connection", "delayed")

        st.store.mode = ""
        expect(indicator).to_have_attribute("data-connection", "live", timeout=10_000)
        modes = page.evaluate("() => window.__modes")
        assert modes == ["live", "delayed", "live"], modes
        page.wait_for_timeout(2000)  # the catch-up refetch, and the events held back
        quiet = time.monotonic()
        page.wait_for_timeout(3000)
        assert _since(refetches, quiet) == 0, "still polling at 1 s once live again"


def test_a_healthy_stream_still_refetches_in_the_background(
    page: Page, stage: Callable[..., Any]
) -> None:
    """While emails are in flight the page refetches every SENDQUEUE_UI_REFETCH_INTERVAL
    (1.5 s here, 30 s by default) even with the stream live, so a change the stream missed
    without noticing (a reader behind by less than its threshold) still shows."""
    lenient = StreamConfig(poll_interval=0.1, lag_threshold=600.0, status_interval=0.2)
    with stage(lenient, ui_refetch_interval=1.5, ui_poll_interval=0.5) as st:
        cid = _active_campaign(page, st.url)
        refetches = _count_refetches(page, cid)
        page.goto(f"{st.url}/campaigns/{cid}")
        indicator = page.locator("#connection")
        expect(indicator).to_have_attribute("data-connection", "live")
        start = time.monotonic()
        page.wait_for_timeout(5000)
        count = _since(refetches, start)
        assert 2 <= count <= 5, f"{count} background refetches in 5 s at a 1.5 s interval"

        st.store.mode = "lag"  # the stream stays "live" (600 s threshold) but brings nothing
        api(page, "POST", f"{st.url}/api/campaigns/{cid}/tasks/{cid}-1/cancel")
        expect(page.locator(f'#tasks tr[data-task-id="{cid}-1"]')).to_have_attribute(
            "data-state", "Cancelled", timeout=4_000
        )
        expect(indicator).to_have_attribute("data-connection", "live")

        # with nothing in flight any more, the background refetch stops
        st.store.mode = ""
        api(page, "POST", f"{st.url}/api/campaigns/{cid}/cancel")
        expect(page.locator('#tasks tr[data-state="Pending"]')).to_have_count(0)
        page.wait_for_timeout(2000)  # one refetch may be on its way
        quiet = time.monotonic()
        page.wait_for_timeout(3500)
        assert _since(refetches, quiet) == 0, "refetching a campaign with nothing in flight"
