"""The check service (services/operations/checks.py) over the in-memory fakes and small probes: the
order
of the parts, what a failure, a part that cannot be tried and a dead store report, that the
parts are tried at once, and that no secret reaches a detail."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import pytest

from sendqueue.domain.errors import InfrastructureError, NotChecked, TransientMailError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.ports import FeedbackMessage, FeedbackSource, Mailer, Probe
from sendqueue.services.operations.checks import CHECK_SCHEDULE, CheckedParts, SetupCheck
from sendqueue.testing import FakeClock, FakeScheduler, InMemoryTaskStore, RecordingMailer


class _Probed(RecordingMailer):
    """A mailer (or mailbox, or URL) whose probe answers or raises as told."""

    def __init__(self, answer: Callable[[float], str], name: str = "box") -> None:
        super().__init__()
        self.answer = answer
        self.name = name
        self.timeouts: list[float] = []

    def probe(self, timeout: float) -> str:
        self.timeouts.append(timeout)
        return self.answer(timeout)

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, Iterator[FeedbackMessage]]:
        raise AssertionError("a check never reads the mailbox")


def _ok(text: str) -> Callable[[float], str]:
    return lambda _timeout: text


def _raises(exc: Exception) -> Callable[[float], str]:
    def answer(_timeout: float) -> str:
        raise exc

    return answer


def _parts(
    store: InMemoryTaskStore,
    *,
    mailer: Mailer | None = None,
    transports: dict[str, Mailer] | None = None,
    mailboxes: Sequence[FeedbackSource] = (),
    sender_boxes: dict[str, FeedbackSource] | None = None,
    public_url: Probe | str = "SENDQUEUE_PUBLIC_URL is not set",
    scheduler: FakeScheduler | None = None,
) -> CheckedParts:
    def transport(sender: Sender) -> Mailer:
        return (transports or {})[sender.transport or sender.id]

    return CheckedParts(
        store=lambda: store,
        store_target="memory",
        senders=lambda: store,
        scheduler=lambda: scheduler or FakeScheduler(FakeClock()),
        scheduler_target="fake",
        mailer=lambda: mailer or _Probed(_ok("signed in")),
        mailer_target="smtp://news:***@mx.example.com:587",
        transport=transport,
        mailboxes=lambda: list(mailboxes),
        no_mailbox="SENDQUEUE_FEEDBACK_IMAP is not set",
        sender_mailbox=lambda sender: (sender_boxes or {})[sender.id],
        public_url=public_url,
        public_url_target="https://mail.example.com/healthz",
    )


def test_every_part_in_order_with_what_answered() -> None:
    store = InMemoryTaskStore()
    store.add_sender(Sender(id="s1", email="a@example.com", transport="smtp://a:pw@mx.a.example"))
    store.add_sender(Sender(id="s2", email="b@example.com"))  # the mailer's: no line of its own
    scheduler = FakeScheduler(FakeClock())
    parts = _parts(
        store,
        transports={"smtp://a:pw@mx.a.example": _Probed(_ok("AUTH as a"))},
        mailboxes=[_Probed(_ok("3 messages"), name="imap://fb@imap.example.com:993/INBOX")],
        public_url=_Probed(_ok("GET .../healthz: 200")),
        scheduler=scheduler,
    )

    results = SetupCheck(parts).run(timeout=3)

    assert [(r.part, r.target, r.status, r.detail) for r in results] == [
        ("task store", "memory", "ok", "answered: 2 senders, last change #0"),
        ("scheduler", "fake", "ok", "answered"),
        ("mailer", "smtp://news:***@mx.example.com:587", "ok", "signed in"),
        ("sender a@example.com", "smtp://a:***@mx.a.example", "ok", "AUTH as a"),
        ("feedback mailbox", "imap://fb@imap.example.com:993/INBOX", "ok", "3 messages"),
        ("public URL", "https://mail.example.com/healthz", "ok", "GET .../healthz: 200"),
    ]
    assert not any(r.failed for r in results)
    assert scheduler.get(CHECK_SCHEDULE) is None  # looked up, never made


def test_a_failure_a_part_that_cannot_be_tried_and_unset_parts() -> None:
    parts = _parts(
        InMemoryTaskStore(),
        mailer=_Probed(_raises(TransientMailError("SMTP mx:587 AUTH failed: 535 bad\n  login"))),
        mailboxes=[_Probed(_raises(NotChecked("no credentials here")), name="imap://x@h:1/I")],
    )

    results = {r.part: r for r in SetupCheck(parts).run()}

    assert results["mailer"].status == "failed"
    assert results["mailer"].detail == "SMTP mx:587 AUTH failed: 535 bad login"  # one line
    assert results["feedback mailbox"].status == "not checked"
    assert results["feedback mailbox"].detail == "no credentials here"
    assert results["public URL"].status == "not checked"
    assert results["public URL"].detail == "SENDQUEUE_PUBLIC_URL is not set"
    assert [r.part for r in SetupCheck(parts).run() if r.failed] == ["mailer"]


def test_a_mailer_without_a_probe_is_not_checked() -> None:
    results = SetupCheck(_parts(InMemoryTaskStore(), mailer=RecordingMailer())).run()
    mailer = next(r for r in results if r.part == "mailer")
    assert (mailer.status, mailer.detail) == (
        "not checked",
        "RecordingMailer cannot be tried without sending",
    )


def test_a_dead_store_fails_and_its_senders_are_not_checked_but_the_rest_is_tried() -> None:
    store = InMemoryTaskStore()
    store.set_available(False)
    mailer = _Probed(_ok("signed in"))

    results = SetupCheck(_parts(store, mailer=mailer)).run()

    assert [(r.part, r.status) for r in results][:4] == [
        ("task store", "failed"),
        ("scheduler", "ok"),
        ("mailer", "ok"),
        ("senders", "not checked"),
    ]
    assert mailer.timeouts == [10.0]


def test_no_secret_reaches_a_detail() -> None:
    store = InMemoryTaskStore()
    transport = "smtp://a:s%40nder-pw@mx.a.example"
    store.add_sender(Sender(id="s1", email="a@example.com", transport=transport))
    leaky = _Probed(_raises(InfrastructureError("login s@nder-pw refused; key k3y-Secret-1")))
    parts = _parts(
        store,
        mailer=_Probed(_raises(RuntimeError("driver said: password mailer-pw is wrong"))),
        transports={transport: leaky},
    )

    results = SetupCheck(parts, secrets={"mailer-pw", "k3y-Secret-1", ""}).run()

    text = " ".join(r.detail + r.target for r in results)
    assert "mailer-pw" not in text and "s@nder-pw" not in text and "k3y-Secret-1" not in text
    details = {r.part: r.detail for r in results}
    assert details["mailer"] == "RuntimeError: driver said: password *** is wrong"
    assert details["sender a@example.com"] == "login *** refused; key ***"


def test_a_sender_with_oauth_is_checked_and_its_grant_masked() -> None:
    store = InMemoryTaskStore()
    grant = OAuthGrant(
        "https://login.example.com/token", "app", "rt-Secret-1", client_secret="cs-Secret-2"
    )
    store.add_sender(Sender(id="s1", email="a@example.com", oauth=grant))
    leaky = _Probed(_raises(InfrastructureError("token rt-Secret-1 refused for cs-Secret-2")))

    results = SetupCheck(_parts(store, transports={"s1": leaky})).run()

    sender = next(r for r in results if r.part == "sender a@example.com")
    assert (sender.target, sender.status) == ("the configured mailer, with oauth", "failed")
    assert sender.detail == "token *** refused for ***"


def test_each_sender_mailbox_is_tried_and_its_password_masked() -> None:
    store = InMemoryTaskStore()
    store.add_sender(Sender(id="s1", email="a@example.com", imap="imaps://a:box-Pw1@imap.a.test"))
    store.add_sender(Sender(id="s2", email="b@example.com", imap="imaps://b:box-Pw2@imap.b.test"))
    store.add_sender(Sender(id="s3", email="c@example.com"))  # no mailbox: no line
    boxes: dict[str, FeedbackSource] = {
        "s1": _Probed(_ok("signed in as a, INBOX: 3 messages")),
        "s2": _Probed(_raises(InfrastructureError("LOGIN b box-Pw2 refused"))),
    }

    results = SetupCheck(_parts(store, sender_boxes=boxes)).run()

    lines = {r.part: r for r in results if r.part.startswith("mailbox of")}
    assert set(lines) == {"mailbox of a@example.com", "mailbox of b@example.com"}
    ok, failed = lines["mailbox of a@example.com"], lines["mailbox of b@example.com"]
    assert (ok.status, ok.target) == ("ok", "imaps://a:***@imap.a.test")
    assert (failed.status, failed.detail) == ("failed", "LOGIN b *** refused")
    assert not any(r.part == "sender c@example.com" for r in results)


def test_the_parts_are_tried_at_once() -> None:
    # Each probe waits for the other: tried one after the other, the barrier would break.
    barrier = threading.Barrier(2, timeout=5)

    def meet(_timeout: float) -> str:
        barrier.wait()
        return "met"

    parts = _parts(InMemoryTaskStore(), mailer=_Probed(meet), public_url=_Probed(meet))

    results = {r.part: r for r in SetupCheck(parts).run()}

    assert results["mailer"].detail == results["public URL"].detail == "met"


@pytest.mark.parametrize("timeout", [0.5, 30.0])
def test_the_timeout_reaches_every_probe(timeout: float) -> None:
    mailer, url = _Probed(_ok("a")), _Probed(_ok("b"))
    SetupCheck(_parts(InMemoryTaskStore(), mailer=mailer, public_url=url)).run(timeout)
    assert mailer.timeouts == url.timeouts == [timeout]


def test_a_long_detail_is_cut() -> None:
    parts = _parts(InMemoryTaskStore(), mailer=_Probed(_raises(InfrastructureError("x" * 2000))))
    detail = next(r.detail for r in SetupCheck(parts).run() if r.part == "mailer")
    assert len(detail) == 500 and detail.endswith("...")


def test_results_as_json_objects() -> None:
    store = InMemoryTaskStore()
    [first, *_] = SetupCheck(_parts(store)).run()
    assert first.as_dict() == {
        "part": "task store",
        "target": "memory",
        "status": "ok",
        "detail": "answered: 0 senders, last change #0",
    }
    assert replace(first, status="failed").failed


class _ProbedScheduler(FakeScheduler):
    """A layer that can be tried itself (as EventBridge's schedule group is)."""

    def probe(self, timeout: float) -> str:
        raise NotChecked("no AWS credentials in this environment")


def test_a_layer_with_a_probe_is_tried_with_it() -> None:
    parts = _parts(InMemoryTaskStore(), scheduler=_ProbedScheduler(FakeClock()))
    scheduler = next(r for r in SetupCheck(parts).run() if r.part == "scheduler")
    assert (scheduler.status, scheduler.detail) == (
        "not checked",
        "no AWS credentials in this environment",
    )


def test_a_public_client_s_grant_leaves_every_detail_readable() -> None:
    """A grant without a client secret (a public client) masks nothing more than its token."""
    store = InMemoryTaskStore()
    grant = OAuthGrant("https://login.example.com/token", "app", "rt-Secret-1")
    store.add_sender(Sender(id="s1", email="a@example.com", oauth=grant))
    leaky = _Probed(_raises(InfrastructureError("token rt-Secret-1 refused")))

    results = SetupCheck(_parts(store, transports={"s1": leaky})).run()

    details = {r.part: r.detail for r in results}
    assert details["sender a@example.com"] == "token *** refused"
    assert all("***" not in r.detail for r in results if r.part != "sender a@example.com")
