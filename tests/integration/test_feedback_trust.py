"""Feedback an outsider forges, read from a real Dovecot by the real poller and parser.

The outsider can only mail the feedback mailbox (its address is in every Reply-To and, without
VERP, every Return-Path). It received one email of the campaign itself, so it knows its own
signed Message-ID and can guess the unsigned shape of everybody else's. Without
SENDQUEUE_BOUNCE_ADDRESS (no VERP), nothing it sends may stop or suppress anyone else; a reply
that cites a recipient's own signed Message-ID, or one whose From a trusted server
authenticated, still stops that recipient's emails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.feedback import UNVERIFIED_REPLY
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.services.templates.render import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import LENIENT_LATENESS, T0, open_policy
from tests.support.feedback_mail import arf_report, dsn_report, message
from tests.support.mailservers import Dovecot

SECRET = "feedback-trust-test-key-0123456789abcdef"
TRUSTED = "mx.receiver.example"
SENDER = "News <news@shop.example>"
ATTACKER, VICTIM = "attacker@example.org", "victim@example.net"


@dataclass
class World:
    """A sent campaign (the attacker's and the victim's emails) and a follow-up campaign whose
    email to the victim is still Pending."""

    app: Container
    store: SqlTaskStore
    dovecot: Dovecot
    sent: str
    later: str

    def task(self, task_id: str) -> tuple[TaskState, TaskOutcome | None, str | None]:
        task = self.store.get_task(task_id)
        assert task is not None
        return task.state, task.outcome, task.reason

    @property
    def attacker_id(self) -> str:
        task = self.store.get_task(f"{self.sent}-0")
        assert task is not None and task.message_id is not None
        return task.message_id

    def deliver(self, headers: dict[str, str], body: str = "hello") -> None:
        self.dovecot.deliver(message(headers, body))


def _app(store: SqlTaskStore, dovecot: Dovecot, **extra: object) -> Container:
    clock = FakeClock(T0)
    settings = Settings(
        _env_file=None,
        secret_key=SECRET,
        feedback_imap=dovecot.url,
        trusted_authserv=TRUSTED,
        max_lateness=LENIENT_LATENESS,
        space_late_sends=False,
        **extra,  # type: ignore[arg-type]
    )
    return bootstrap(
        settings,
        clock=clock,
        store=store,
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
    )


@pytest.fixture
def world(dovecot: Dovecot, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[World]:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    extra = getattr(request, "param", {})
    app = _app(store, dovecot, **extra)
    try:
        rows = f"email,name,subject\n{ATTACKER},A,Hi\n{VICTIM},V,Hi\n".encode()
        sent = app.campaign_import.create(
            name="sent",
            recipients=rows,
            policy=open_policy(),
            from_addr=SENDER,
            templates=Templates(body="Hello"),
        ).campaign.id
        assert app.provisioner.provision(sent).status == "done"
        clock, scheduler = app.clock, app.scheduler
        assert isinstance(clock, FakeClock) and isinstance(scheduler, FakeScheduler)
        clock.advance(hours=1)
        assert scheduler.fire_due(app.invoke) == 2
        later = app.campaign_import.create(
            name="later",
            recipients=f"email,name,subject\n{VICTIM},V,Again\n".encode(),
            policy=open_policy(clock.now() + timedelta(days=3)),
            from_addr=SENDER,
            templates=Templates(body="Hello again"),
        ).campaign.id
        assert app.provisioner.provision(later).status == "done"
        yield World(app, store, dovecot, sent, later)
    finally:
        app.close()


def _untouched(world: World) -> None:
    """The victim's Pending email still Pending, its sent one still accepted, nobody listed."""
    assert world.task(f"{world.later}-0") == (TaskState.PENDING, None, None)
    assert world.task(f"{world.sent}-1")[:2] == (TaskState.FINISHED, TaskOutcome.ACCEPTED)
    assert world.store.list_suppressions() == []


@pytest.mark.parametrize("world", [{"suppress_replies": True}], indirect=True)
def test_a_forged_from_only_reply_changes_nothing_and_is_noted_as_unverified(
    world: World,
) -> None:
    world.deliver(
        {"From": f"V <{VICTIM}>", "To": SENDER, "Subject": "Re: Hi", "Message-ID": "<f1@x>"}
    )
    report = world.app.feedback_poller.poll()
    assert (report.messages, report.replies, report.unverified) == (1, 0, 1)
    _untouched(world)
    noted = world.store.get_task(f"{world.sent}-1")
    assert noted is not None and noted.outcome_detail is not None
    assert noted.outcome_detail.startswith(f"{UNVERIFIED_REPLY} from {VICTIM}: Re: Hi")


def test_a_forged_reply_citing_a_guessed_or_a_borrowed_message_id_changes_nothing(
    world: World,
) -> None:
    guessed = f"<{world.sent}-1@shop.example>"  # the victim's id as it would be unsigned
    world.deliver(
        {"From": VICTIM, "To": SENDER, "Subject": "Re: Hi", "In-Reply-To": guessed}, "stop"
    )
    # the attacker's own genuine id, sent from the victim's address
    world.deliver(
        {"From": VICTIM, "To": SENDER, "Subject": "Re: Hi", "In-Reply-To": world.attacker_id}
    )
    report = world.app.feedback_poller.poll()
    assert (report.messages, report.replies, report.unverified) == (2, 0, 2)
    _untouched(world)
    assert world.task(f"{world.sent}-0")[1] is TaskOutcome.ACCEPTED


def test_a_reply_citing_its_own_signed_message_id_is_applied(world: World) -> None:
    victim = world.store.get_task(f"{world.sent}-1")
    assert victim is not None and victim.message_id is not None
    world.deliver(
        {"From": VICTIM, "To": SENDER, "Subject": "Re: Hi", "In-Reply-To": victim.message_id}
    )
    report = world.app.feedback_poller.poll()
    assert (report.replies, report.unverified) == (1, 0)
    assert world.task(f"{world.sent}-1")[1] is TaskOutcome.REPLIED
    assert world.task(f"{world.later}-0") == (TaskState.CANCELLED, None, "replied")


def _authenticated(server: str, domain: str) -> str:
    return (
        f"{server}; dkim=pass header.i=@{domain} header.s=s1 header.b=AbCd;"
        f" spf=pass smtp.mailfrom={domain}; dmarc=pass (p=REJECT) header.from={domain}"
    )


def test_a_reply_that_a_trusted_server_authenticated_is_applied_others_are_not(
    world: World,
) -> None:
    domain = VICTIM.rpartition("@")[2]
    untrusted = {
        "Authentication-Results": _authenticated("mx.attacker.example", domain),
        "From": VICTIM,
        "To": SENDER,
        "Subject": "Re: Hi (untrusted server)",
    }
    wrong_domain = {
        "Authentication-Results": _authenticated(TRUSTED, "example.org"),
        "From": VICTIM,
        "To": SENDER,
        "Subject": "Re: Hi (another domain passed)",
    }
    world.deliver(untrusted)
    world.deliver(wrong_domain)
    report = world.app.feedback_poller.poll()
    assert (report.replies, report.unverified) == (0, 2)
    _untouched(world)

    genuine = {
        "Authentication-Results": _authenticated(TRUSTED, domain),
        "From": f"Victim <{VICTIM}>",
        "To": SENDER,
        "Subject": "Re: Hi",
    }
    world.deliver(genuine)
    report = world.app.feedback_poller.poll()
    assert (report.replies, report.unverified) == (1, 0)
    assert world.task(f"{world.later}-0") == (TaskState.CANCELLED, None, "replied")
    assert world.task(f"{world.sent}-1")[1] is TaskOutcome.REPLIED


def test_forged_dsns_and_arf_reports_without_verp_change_nothing(world: World) -> None:
    guessed = f"<{world.sent}-1@shop.example>"
    world.dovecot.deliver(dsn_report(VICTIM, guessed, sender=SENDER))
    world.dovecot.deliver(dsn_report("never-mailed@example.com", "<x@y.example>", sender=SENDER))
    world.dovecot.deliver(arf_report("ceo@competitor.example", guessed, sender=SENDER))
    # the attacker's own genuine id, naming the victim as the one that bounced or complained
    world.dovecot.deliver(dsn_report(VICTIM, world.attacker_id, sender=SENDER))
    world.dovecot.deliver(arf_report(VICTIM, world.attacker_id, sender=SENDER))
    report = world.app.feedback_poller.poll()
    assert report.messages == 5
    assert (report.bounces, report.complaints) == (0, 0)
    _untouched(world)
    assert world.task(f"{world.sent}-0")[1] is TaskOutcome.ACCEPTED


def test_a_genuine_dsn_without_verp_is_proven_by_its_signed_message_id(world: World) -> None:
    victim = world.store.get_task(f"{world.sent}-1")
    assert victim is not None and victim.message_id is not None
    world.dovecot.deliver(dsn_report(VICTIM, victim.message_id, sender=SENDER))
    report = world.app.feedback_poller.poll()
    assert report.bounces == 1
    assert world.task(f"{world.sent}-1")[1] is TaskOutcome.BOUNCED
    assert world.task(f"{world.later}-0") == (
        TaskState.CANCELLED,
        None,
        "suppressed: bounced",
    )
