"""The delivery pass among several endpoints and several workers, on the fakes: a slow
receiver gets its turn and then waits for the others', and a worker that lost an endpoint's
lease in the middle of a batch leaves the endpoint to the worker that took it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from sendqueue.ports.webhooks import WebhookResponse
from sendqueue.services.webhooks import DeliveryPolicy, WebhookDelivery
from tests.support.app import T0
from tests.unit.test_webhooks import Receiver, World

T1 = T0 - timedelta(hours=1)


class SlowFor(Receiver):
    """A receiver that takes ``seconds`` for each delivery to ``url`` (others at once), and
    runs ``during`` (once) while it takes them."""

    def __init__(self, url: str, seconds: float) -> None:
        super().__init__()
        self.url = url
        self.seconds = seconds
        self.during: list[Callable[[], None]] = []

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse:
        if url == self.url:
            time.sleep(self.seconds)
            while self.during:
                self.during.pop()()
        return super().post(url, body, headers)


def _delivery(world: World, receiver: Receiver, policy: DeliveryPolicy) -> WebhookDelivery:
    return WebhookDelivery(world.store, world.store, receiver, world.clock, policy=policy)


def test_a_slow_receiver_gets_a_turn_and_the_others_get_theirs() -> None:
    world = World()
    slow = world.service.add("http://slow.example.com/").endpoint
    fast = world.service.add("http://fast.example.com/").endpoint
    for position in range(20):
        world.send(position)
    receiver = SlowFor(slow.url, 0.05)
    delivery = _delivery(world, receiver, DeliveryPolicy(turn=0.2))
    first = delivery.run_pass()
    got = [url for url, _, _ in receiver.got]
    assert got.count(fast.url) == 20  # not behind all of the slow one's batch
    assert 0 < got.count(slow.url) < 20 and first.full  # its turn ended; the next pass goes on
    for _ in range(20):
        if not delivery.run_pass().full:
            break
    ids = [h["webhook-id"] for url, h, _ in receiver.got if url == slow.url]
    assert ids == [h["webhook-id"] for url, h, _ in receiver.got if url == fast.url]
    assert world.service.get(slow.id).cursor == world.store.last_change_id()


def test_a_worker_that_lost_the_lease_mid_batch_leaves_the_endpoint_to_its_new_holder() -> None:
    world = World()
    hook = world.service.add("http://hooks.example.com/").endpoint
    for position in range(3):
        world.send(position)
    receiver = SlowFor(hook.url, 0.06)
    delivery = _delivery(world, receiver, DeliveryPolicy(lease_seconds=0.15))

    def taken_over() -> None:
        # A stall past the lease: another worker takes the endpoint and fails its head event.
        world.clock.advance(1)
        assert world.store.acquire_lease(
            f"webhook:{hook.id}", "other", ttl_seconds=35, at=world.clock.now()
        )
        world.store.update_endpoint(
            hook.id,
            {"cursor": 7, "attempts": 1, "retry_at": world.clock.now(), "failing_since": T1},
        )

    receiver.during.append(taken_over)
    delivery.run_pass()
    assert len(receiver.got) == 1  # it stopped at its next event, once the lease was gone
    after = world.service.get(hook.id)
    assert (after.cursor, after.attempts, after.failing_since) == (7, 1, T1)
