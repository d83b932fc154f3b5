"""The "needs attention" banner: every page shows the dead letters and the campaigns paused by
failures, linked to them, to whoever is let in (never on the login page); read at most once per
few seconds."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from sendqueue.domain.errors import PermanentMailError, SchedulerError
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.services.operations.attention import Attention, AttentionCache, read_attention
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0
from tests.web.conftest import TOKEN, Web

BANNER = re.compile(
    r'<section class="attention" aria-label="Needs attention" id="attention">(.*?)</section>', re.S
)


def _dead_letter(web: Web, name: str) -> None:
    scheduler: Any = web.container.scheduler
    scheduler.create(
        name, "sq-test", T0.replace(tzinfo=None), "UTC", {"kind": "test"}, f"tok-{name}", 0
    )

    def fail(_: Any) -> None:
        raise RuntimeError("boom: the target failed")

    scheduler.fire_due(fail)


def _auto_paused(web: Web, name: str = "Winter <sale>") -> str:
    cid: str = web.create(3, name=name)["id"]
    assert web.container.provisioner.provision(cid).status == "done"
    web.mailer.fail_next(*[PermanentMailError("550 rejected")] * 2)
    web.clock.advance(minutes=1)
    web.fire_due()
    assert web.container.store.get_campaign(cid).state is CampaignState.PAUSED
    return cid


def _banner(html: str) -> str | None:
    found = BANNER.search(html)
    return found.group(1) if found else None


def test_no_banner_when_nothing_needs_attention(web: Web) -> None:
    web.active(2)
    for path in ("/", "/campaigns/new", "/dead-letters"):
        assert 'id="attention"' not in web.client.get(path).text


def test_every_page_shows_the_dead_letters_and_the_campaigns_paused_by_failures(
    make_web: Callable[..., Web],
) -> None:
    web = make_web(auto_pause_after=2)
    _dead_letter(web, "sq-test-1")
    _dead_letter(web, "sq-test-2")
    paused = _auto_paused(web)
    by_hand = web.active(1)
    web.client.post(f"/api/campaigns/{by_hand}/pause").raise_for_status()
    pages = ["/", "/campaigns/new", "/dead-letters", f"/campaigns/{paused}", "/campaigns/nope"]
    for path in pages:
        banner = _banner(web.client.get(path).text)
        assert banner is not None, path
        assert '<a href="/dead-letters">2 dead letters</a>' in banner
        assert f'<a href="/campaigns/{paused}">Winter &lt;sale&gt;</a>' in banner  # escaped
        assert "auto-paused after 2 failed sends in a row" in banner
        assert by_hand not in banner  # paused by a person: not an alarm


def test_the_count_says_when_there_are_more_than_it_counts(web: Web) -> None:
    store = InMemoryTaskStore()
    scheduler = FakeScheduler(FakeClock(T0), seed=1)
    for n in range(3):
        scheduler.create(f"s{n}", "g", T0.replace(tzinfo=None), "UTC", {}, f"t{n}", 0)
    scheduler.fire_due(lambda _: (_ for _ in ()).throw(RuntimeError("boom")))
    assert read_attention(store, scheduler, count=2) == Attention(2, True, ())
    assert read_attention(store, scheduler, count=3) == Attention(3, False, ())
    web.app.state.attention = AttentionCache(lambda: Attention(100, True, ()))
    banner = _banner(web.client.get("/").text)
    assert banner is not None and '<a href="/dead-letters">100+ dead letters</a>' in banner


def test_the_login_page_shows_no_banner_until_logged_in(make_web: Callable[..., Web]) -> None:
    web = make_web(api_token=TOKEN)
    _dead_letter(web, "sq-test-1")
    login = web.client.get("/login")
    assert login.status_code == 200 and 'id="attention"' not in login.text
    assert 'id="attention"' not in web.client.get("/").text  # not let in
    bearer = web.client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert '<a href="/dead-letters">1 dead letter</a>' in (_banner(bearer.text) or "")


def test_a_backend_that_fails_leaves_its_part_out_and_the_page_renders(web: Web) -> None:
    class DownScheduler(FakeScheduler):
        def dead_letters(self, *, limit: int = 1000) -> list[Any]:
            raise SchedulerError("the queue does not answer")

    store = InMemoryTaskStore()
    attention = read_attention(store, DownScheduler(FakeClock(T0)))
    assert attention == Attention(None, False, ()) and not attention.needed
    store.set_available(False)
    assert read_attention(store, FakeScheduler(FakeClock(T0))).paused == ()
    web.app.state.attention = AttentionCache(lambda: attention)
    page = web.client.get("/")
    assert page.status_code == 200 and 'id="attention"' not in page.text


def test_the_cache_reads_at_most_once_per_ttl() -> None:
    reads: list[float] = []
    now = [0.0]

    def read() -> Attention:
        reads.append(now[0])
        return Attention(len(reads), False, ())

    cache = AttentionCache(read, ttl=5.0, monotonic=lambda: now[0])
    assert cache.get().dead_letters == 1
    now[0] = 4.9
    assert cache.get().dead_letters == 1
    now[0] = 5.0
    assert cache.get().dead_letters == 2
    assert reads == [0.0, 5.0]


@pytest.mark.parametrize("count", [1, 6, 7])
def test_many_paused_campaigns_are_summed_up(web: Web, count: int) -> None:
    from sendqueue.services.operations.attention import PausedByFailure

    paused = tuple(
        PausedByFailure(f"c{n}", f"Campaign {n}", "auto-paused after 5 ...") for n in range(count)
    )
    web.app.state.attention = AttentionCache(lambda: Attention(0, False, paused))
    banner = _banner(web.client.get("/").text) or ""
    assert banner.count('href="/campaigns/c') == min(count, 5)
    more = {6: "1 more campaign paused", 7: "2 more campaigns paused"}.get(count)
    assert ("more campaign" in banner) is (more is not None)
    assert more is None or f"{more} after failed sends" in banner
