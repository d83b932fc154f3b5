"""Red team (issue 14): feedback an outsider can forge. The bounce address is public (every
email's Return-Path), and a recipient reads its own task id in its email's Message-ID
(``<c...-N@domain>``), so the ids of the other recipients of the campaign are known too. With
SENDQUEUE_BOUNCE_ADDRESS set, a genuine DSN reaches the mailbox through the signed VERP
address; one that names no genuine VERP address must not suppress anybody."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.reports import parse_feedback
from sendqueue.domain.tokens import TokenPurpose, sign_task
from sendqueue.services.feedback.effects import Applied
from sendqueue.services.templates.render import Templates
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import fake_app, open_policy

SECRET = "forgery-test-secret-key-0123456789abcdef"
BOUNCES = "bounces@mail.example.com"


def _forged_dsn(victim_task: str, victim: str) -> bytes:
    """A Postfix-shaped DSN, mailed by anyone to the bare bounce address (no VERP token)."""
    return (
        "From: MAILER-DAEMON@evil.example\r\n"
        f"To: {BOUNCES}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
        "--b\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
        "--b\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.evil.example\r\n\r\n"
        f"Final-Recipient: rfc822; {victim}\r\nAction: failed\r\nStatus: 5.1.1\r\n"
        "Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
        "--b\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"X-Sendqueue-Task: {victim_task}\r\nMessage-ID: <{victim_task}@example.com>\r\n"
        "--b--\r\n"
    ).encode()


def test_a_dsn_without_a_genuine_verp_address_suppresses_nobody_when_verp_is_set() -> None:
    mailer = RecordingMailer()
    app = fake_app(
        mailer=mailer,
        bounce_address=BOUNCES,
        secret_key=SECRET,
        public_url="https://mail.example.com",
    )
    created = app.campaign_import.create(
        name="t",
        recipients=b"email,name,subject\nattacker@example.org,A,Hi\nvictim@example.org,V,Hi\n",
        policy=open_policy(),
        from_addr="News <news@example.com>",
        templates=Templates(body="Hello"),
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    clock, scheduler = app.clock, app.scheduler
    assert isinstance(clock, FakeClock) and isinstance(scheduler, FakeScheduler)
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)
    # what the attacker reads: its own signed Message-ID; the others' ids it can only guess
    assert mailer.sent[0].message_id == message_id_for(f"{cid}-0", "example.com", SECRET)
    # The victim's follow-up in a second campaign of the same list, still Pending.
    follow_up = app.campaign_import.create(
        name="follow-up",
        recipients=b"email,name,subject\nvictim@example.org,V,Again\n",
        policy=open_policy(clock.now() + timedelta(days=3)),
        from_addr="News <news@example.com>",
        templates=Templates(body="Hello again"),
    )
    assert app.provisioner.provision(follow_up.campaign.id).status == "done"

    items = parse_feedback(
        _forged_dsn(f"{cid}-1", "victim@example.org"),
        received_at=clock.now(),
        key="inbox:1:1",
        bounce_address=BOUNCES,
        secret=SECRET,
    )
    for item in items:
        app.feedback.apply(item)

    victim = app.store.get_task(f"{cid}-1")
    assert victim is not None
    assert victim.outcome is TaskOutcome.ACCEPTED
    assert app.suppressions.suppressed(["victim@example.org"]) == {}
    [pending] = app.store.list_tasks(follow_up.campaign.id, limit=10)
    assert pending.state is TaskState.PENDING


# --- proofs an outsider tries to bend (a red-team pass over the proof rules) ---------------

TRUSTED = "mx.receiver.example"
ATTACKER, VICTIM = "attacker@example.net", "victim@example.net"
OURS = "news@shop.example"


@dataclass
class _World:
    app: Container
    sent: str
    later: str

    def feed(self, headers: list[tuple[str, str]], body: str = "hello") -> list[Applied]:
        raw = "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n" + body + "\r\n"
        items = parse_feedback(
            raw.encode(),
            received_at=self.app.clock.now(),
            key="inbox:1:1",
            secret=SECRET,
            trusted_authserv=(TRUSTED,),
        )
        return [self.app.feedback.apply(item) for item in items]

    def victim_untouched(self) -> None:
        sent = self.app.store.get_task(f"{self.sent}-1")
        assert sent is not None and sent.outcome is TaskOutcome.ACCEPTED
        [pending] = self.app.store.list_tasks(self.later, limit=10)
        assert pending.state is TaskState.PENDING
        assert self.app.suppressions.suppressed([VICTIM]) == {}


@pytest.fixture
def world() -> _World:
    app = fake_app(
        secret_key=SECRET,
        public_url="https://mail.shop.example",
        trusted_authserv=TRUSTED,
        suppress_replies=True,
    )
    sent = app.campaign_import.create(
        name="t",
        recipients=f"email,name,subject\n{ATTACKER},A,Hi\n{VICTIM},V,Hi\n".encode(),
        policy=open_policy(),
        from_addr=f"News <{OURS}>",
        templates=Templates(body="Hello"),
    ).campaign.id
    assert app.provisioner.provision(sent).status == "done"
    clock, scheduler = app.clock, app.scheduler
    assert isinstance(clock, FakeClock) and isinstance(scheduler, FakeScheduler)
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)
    later = app.campaign_import.create(
        name="later",
        recipients=f"email,name,subject\n{VICTIM},V,Again\n".encode(),
        policy=open_policy(clock.now() + timedelta(days=3)),
        from_addr=f"News <{OURS}>",
        templates=Templates(body="Again"),
    ).campaign.id
    assert app.provisioner.provision(later).status == "done"
    return _World(app, sent, later)


def _passes(domain: str) -> str:
    return f"{TRUSTED}; dkim=pass header.d={domain} header.s=s1; dmarc=pass header.from={domain}"


def test_an_encoded_word_in_the_from_never_names_another_sender(world: _World) -> None:
    # decoded, the display name reads "victim@example.net (": the address is the attacker's,
    # and the attacker's own domain is the one that passed
    world.feed(
        [
            ("Authentication-Results", _passes("example.net")),
            ("From", "=?utf-8?q?victim=40example.net_=28?= <attacker@example.net>"),
            ("To", OURS),
            ("Subject", "hello"),
        ]
    )
    world.victim_untouched()


def test_an_encoded_word_in_an_authentication_results_value_injects_no_result(
    world: _World,
) -> None:
    local = "=?utf-8?q?x=3B_dkim=3Dpass_header.d=3Dexample.net_header.s=3D?="
    genuine = (
        f"{TRUSTED}; spf=pass smtp.mailfrom={local}@evil.example; dkim=none;"
        " dmarc=fail (policy=none) header.from=example.net"
    )
    [applied] = world.feed(
        [("Authentication-Results", genuine), ("From", VICTIM), ("To", OURS), ("Subject", "hi")]
    )
    assert applied.unverified
    world.victim_untouched()


def test_an_unreadable_header_of_a_trusted_server_does_not_promote_a_forged_one(
    world: _World,
) -> None:
    bogus = "; ".join(
        f"dkim=fail header.d=e{i}.example header.s=s{i} header.b=" + "x" * 80 for i in range(60)
    )
    for genuine in (
        f"{TRUSTED}; spf=pass smtp.mailfrom=a@evil.example; {bogus}",  # too long to read
        f"{TRUSTED}; spf=pass smtp.helo=[192.0.2.1]",  # authres cannot parse it
    ):
        [applied] = world.feed(
            [
                ("Authentication-Results", genuine),
                ("Authentication-Results", _passes("example.net")),  # forged, below it
                ("From", VICTIM),
                ("To", OURS),
                ("Subject", "hi"),
            ]
        )
        assert applied.unverified
    world.victim_untouched()


def test_a_signed_message_written_to_someone_else_is_no_reply_when_mailed_again(
    world: _World,
) -> None:
    headers = [
        ("Authentication-Results", _passes("example.net")),
        ("From", VICTIM),
        ("Subject", "Re: lunch?"),
    ]
    [replayed] = world.feed([*headers, ("To", ATTACKER)])  # once sent to the attacker
    assert replayed.unverified
    world.victim_untouched()
    [written_to_us] = world.feed([*headers, ("To", "x@else.example"), ("Cc", f"N <{OURS}>")])
    assert written_to_us.cancelled and written_to_us.ignored is None


def test_a_mailed_unsubscribe_token_speaks_for_its_email_from_any_address(
    world: _World,
) -> None:
    token = sign_task(f"{world.sent}-1", SECRET, TokenPurpose.UNSUBSCRIBE)
    [applied] = world.feed(
        [("From", "victim.alias@example.org"), ("Subject", f"unsubscribe {token}")]
    )
    assert applied.suppressed and applied.ignored is None
    assert VICTIM in world.app.suppressions.suppressed([VICTIM])


def test_the_first_unverified_note_is_kept(world: _World) -> None:
    world.feed([("From", VICTIM), ("Subject", "please remove me")])
    world.feed([("From", VICTIM), ("Subject", "all good, keep sending")])
    noted = world.app.store.get_task(f"{world.sent}-1")
    assert noted is not None and noted.outcome is TaskOutcome.ACCEPTED
    assert noted.outcome_detail == f"unverified reply from {VICTIM}: please remove me"
