"""The feedback service: what a bounce, a complaint, a reply or an unsubscribe does to the
task it is about, to the suppression list and to the address's other Pending emails; and the
signed task tokens (unsubscribe links, VERP addresses) the feedback is matched with."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import (
    SOFT_BOUNCE_LIMIT,
    Feedback,
    FeedbackKind,
    Proof,
    task_id_from_message_id,
)
from sendqueue.domain.lifecycle import CampaignState, StopOnReply, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Task, task_id
from sendqueue.domain.reports import parse_feedback
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.domain.tokens import (
    TokenPurpose,
    sign_task,
    verify_task,
    verp_address,
    verp_task,
)
from sendqueue.services.feedback.effects import REPLIED_REASON, FeedbackService
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task
from tests.support.app import T0, fake_app, open_policy

SECRET = "s" * 40
K = FeedbackKind


class World:
    """A store with campaigns whose tasks are sent (Finished) or still Pending."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.store = InMemoryTaskStore()
        self.deleted: list[str] = []
        self.service = FeedbackService(
            self.store,
            self.store,
            self.store,
            self.clock,
            senders=self.store,
            delete_schedules=self.deleted.extend,
        )

    def campaign(
        self,
        cid: str,
        *,
        from_addr: str = "Sales <sales@example.com>",
        stop_on_reply: StopOnReply = StopOnReply.SENDER,
    ) -> str:
        campaign = Campaign(
            id=cid,
            name=cid,
            policy=open_policy(),
            from_addr=from_addr,
            state=CampaignState.ACTIVE,
            stop_on_reply=stop_on_reply,
        )
        self.store.create_campaign(campaign, [])
        return cid

    def task(
        self, cid: str, position: int, email: str, *, sent: bool, sender: str | None = None
    ) -> Task:
        """Task ``position`` of ``cid`` to ``email``, from ``sender`` (an id in ``SENDERS``;
        None: the campaign's From)."""
        task = replace(
            bare_task(cid, position, T0 + timedelta(minutes=position)),
            email=email,
            sender_id=sender,
            sender=SENDERS[sender] if sender else None,
        )
        self.store.insert_tasks([task], at=T0)
        if sent:
            self.store.transition(task.id, TaskState.PENDING, TaskState.RUNNING, at=T0)
            done = self.store.transition(
                task.id,
                TaskState.RUNNING,
                TaskState.FINISHED,
                at=T0,
                changes={"sent_at": T0, "outcome": TaskOutcome.ACCEPTED, "outcome_at": T0},
            )
            assert done is not None
            return done
        return task

    def state(self, tid: str) -> Task:
        task = self.store.get_task(tid)
        assert task is not None
        return task


C1, C2, C3 = "c00000000000a", "c00000000000b", "c00000000000c"
SA, SB = "s00000000000a", "s00000000000b"
SENDERS = {SA: "a@example.com", SB: "b@example.com"}


@pytest.fixture
def world() -> World:
    return World()


def test_a_hard_bounce_sets_the_outcome_suppresses_and_cancels_every_pending_email(
    world: World,
) -> None:
    world.campaign(C1)
    world.campaign(C2, from_addr="other@example.org")
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    later = world.task(C1, 1, "ann@example.com", sent=False)
    elsewhere = world.task(C2, 0, "ann@example.com", sent=False)
    bystander = world.task(C1, 2, "bob@example.com", sent=False)

    applied = world.service.apply(
        Feedback(K.HARD_BOUNCE, T0, task_id=sent.id, detail="5.1.1 user unknown")
    )

    assert applied.outcome_set and applied.suppressed
    assert set(applied.cancelled) == {later.id, elsewhere.id}
    bounced = world.state(sent.id)
    assert (bounced.outcome, bounced.outcome_detail) == (TaskOutcome.BOUNCED, "5.1.1 user unknown")
    for tid in (later.id, elsewhere.id):
        assert world.state(tid).state is TaskState.CANCELLED
        assert world.state(tid).reason == "suppressed: bounced"
    assert world.state(bystander.id).state is TaskState.PENDING
    entry = world.store.suppressed(["ann@example.com"])["ann@example.com"]
    assert (entry.reason, entry.task_id) == (SuppressionReason.BOUNCED, sent.id)
    assert sorted(world.deleted) == sorted(f"sq-{t}.0" for t in (later.id, elsewhere.id))
    # the change log says what happened, the outcome as a Finished -> Finished entry
    notes = [(e.task_id, e.from_state, e.to_state, e.note) for e in world.store.changes_after(0)]
    assert (sent.id, "Finished", "Finished", "outcome: bounced") in notes


def test_feedback_applied_twice_has_the_effect_of_once(world: World) -> None:
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    world.task(C1, 1, "ann@example.com", sent=False)
    item = Feedback(K.COMPLAINT, T0, task_id=sent.id, detail="abuse", key="box:1:7")
    first = world.service.apply(item)
    log_size = world.store.last_change_id()
    second = world.service.apply(item)
    assert first.outcome_set and first.suppressed and len(first.cancelled) == 1
    assert (second.outcome_set, second.suppressed, second.cancelled) == (False, False, ())
    assert world.store.last_change_id() == log_size


def test_a_bounce_known_only_by_address_lands_on_the_newest_sent_email(world: World) -> None:
    world.campaign(C1)
    world.task(C1, 0, "ann@example.com", sent=True)
    newest = world.task(C1, 5, "ann@example.com", sent=True)
    applied = world.service.apply(Feedback(K.HARD_BOUNCE, T0, recipient="ANN@Example.com"))
    assert applied.task_id == newest.id
    assert world.state(newest.id).outcome is TaskOutcome.BOUNCED


def test_soft_bounces_suppress_only_at_the_limit_within_the_window(world: World) -> None:
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    pending = world.task(C1, 1, "ann@example.com", sent=False)
    # an old one, outside the 7 days, does not count
    old = Feedback(K.SOFT_BOUNCE, T0 - timedelta(days=8), task_id=sent.id, key="m0")
    assert not world.service.apply(old).suppressed
    for i in range(1, SOFT_BOUNCE_LIMIT):
        item = Feedback(K.SOFT_BOUNCE, T0 + timedelta(hours=i), task_id=sent.id, key=f"m{i}")
        applied = world.service.apply(item)
        assert not applied.suppressed and not applied.outcome_set
        # the same message again is counted once
        assert not world.service.apply(item).suppressed
    assert world.state(pending.id).state is TaskState.PENDING
    last = Feedback(K.SOFT_BOUNCE, T0 + timedelta(days=1), task_id=sent.id, key="last")
    applied = world.service.apply(last)
    assert applied.suppressed and applied.cancelled == (pending.id,)
    assert world.state(sent.id).outcome is TaskOutcome.ACCEPTED  # a soft bounce is no outcome


def test_an_unsubscribe_cancels_pending_emails_in_every_campaign(world: World) -> None:
    world.campaign(C1)
    world.campaign(C2, from_addr="x@example.net")
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    other = world.task(C2, 0, "ann@example.com", sent=False)
    applied = world.service.apply(Feedback(K.UNSUBSCRIBE, T0, task_id=sent.id))
    assert applied.cancelled == (other.id,)
    assert world.state(other.id).reason == "suppressed: unsubscribed"
    assert world.state(sent.id).outcome is TaskOutcome.UNSUBSCRIBED


@pytest.mark.parametrize(
    ("scope", "cancelled_in"),
    [
        (StopOnReply.SENDER, {C1, C2}),
        (StopOnReply.CAMPAIGN, {C1}),
        (StopOnReply.OFF, set()),
    ],
)
def test_a_reply_cancels_the_pending_emails_in_its_scope(
    world: World, scope: StopOnReply, cancelled_in: set[str]
) -> None:
    world.campaign(C1, stop_on_reply=scope)
    world.campaign(C2, from_addr="SALES@example.com")  # the same mailbox, spelled otherwise
    world.campaign(C3, from_addr="support@example.com")
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    pending = {c: world.task(c, 1, "ann@example.com", sent=False) for c in (C1, C2, C3)}
    applied = world.service.apply(Feedback(K.REPLY, T0, task_id=sent.id, detail="Re: hi"))
    assert applied.outcome_set and not applied.suppressed
    assert {world.state(t).campaign_id for t in applied.cancelled} == cancelled_in
    for cid, task in pending.items():
        state = world.state(task.id)
        if cid in cancelled_in:
            assert (state.state, state.reason) == (TaskState.CANCELLED, REPLIED_REASON)
        else:
            assert state.state is TaskState.PENDING
    assert world.state(sent.id).outcome is TaskOutcome.REPLIED
    assert world.store.suppressed(["ann@example.com"]) == {}


def test_a_reply_does_not_reach_into_a_finished_campaign_of_the_sender(world: World) -> None:
    world.campaign(C1)
    world.campaign(C2)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    world.task(C2, 0, "ann@example.com", sent=False)
    world.store.set_campaign_state(C2, {CampaignState.ACTIVE}, CampaignState.CANCELLED, at=T0)
    assert world.service.apply(Feedback(K.REPLY, T0, task_id=sent.id)).cancelled == ()


def test_a_reply_without_headers_counts_only_from_an_address_with_pending_emails(
    world: World,
) -> None:
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    world.task(C1, 1, "bob@example.com", sent=True)
    pending = world.task(C1, 2, "ann@example.com", sent=False)
    stranger = world.service.apply(Feedback(K.REPLY, T0, recipient="bob@example.com"))
    assert stranger.ignored and world.state(f"{C1}-1").outcome is TaskOutcome.ACCEPTED
    applied = world.service.apply(Feedback(K.REPLY, T0, recipient="Ann@example.com"))
    assert applied.task_id == sent.id and applied.cancelled == (pending.id,)


def test_a_reply_naming_another_recipients_email_speaks_only_for_its_own_address(
    world: World,
) -> None:
    world.campaign(C1)
    victim_sent = world.task(C1, 0, "vic@example.com", sent=True)
    victim_next = world.task(C1, 1, "vic@example.com", sent=False)
    forger_sent = world.task(C1, 2, "eve@example.com", sent=True)
    forger_next = world.task(C1, 3, "eve@example.com", sent=False)
    forged = Feedback(K.REPLY, T0, task_id=victim_sent.id, recipient="eve@example.com")
    applied = world.service.apply(forged)
    assert world.state(victim_sent.id).outcome is TaskOutcome.ACCEPTED
    assert world.state(victim_next.id).state is TaskState.PENDING
    # it counts as the forger's own reply (an address with Pending emails)
    assert applied.task_id == forger_sent.id and applied.cancelled == (forger_next.id,)


def test_sender_scope_spares_a_campaign_that_opted_out(world: World) -> None:
    world.campaign(C1)
    world.campaign(C2, stop_on_reply=StopOnReply.OFF)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    spared = world.task(C2, 0, "ann@example.com", sent=False)
    assert world.service.apply(Feedback(K.REPLY, T0, task_id=sent.id)).cancelled == ()
    assert world.state(spared.id).state is TaskState.PENDING


def test_sender_scope_cancels_only_the_emails_of_the_mailbox_that_sent_the_answered_one(
    world: World,
) -> None:
    # Campaigns made with --sender and no --from share the default From: the scope follows
    # each email's own sender, not its campaign's From.
    world.campaign(C1, from_addr="news@example.com")  # sender A
    world.campaign(C2, from_addr="news@example.com")  # sender B
    world.campaign(C3, from_addr="B <b@example.com>")  # no senders: B's address as its From
    world.task(C1, 0, "ann@example.com", sent=True, sender=SA)
    answered = world.task(C2, 0, "ann@example.com", sent=True, sender=SB)
    from_a = world.task(C1, 1, "ann@example.com", sent=False, sender=SA)
    from_b = world.task(C2, 1, "ann@example.com", sent=False, sender=SB)
    from_b_address = world.task(C3, 1, "ann@example.com", sent=False)
    applied = world.service.apply(Feedback(K.REPLY, T0, task_id=answered.id))
    assert set(applied.cancelled) == {from_b.id, from_b_address.id}
    assert world.state(from_b.id).reason == REPLIED_REASON
    assert world.state(from_a.id).state is TaskState.PENDING
    # A reply to A's email (a campaign From shared with B) now cancels A's only.
    assert world.service.apply(Feedback(K.REPLY, T0, task_id=f"{C1}-0")).cancelled == (from_a.id,)


def test_sender_scope_without_senders_still_follows_the_campaigns_from(world: World) -> None:
    world.campaign(C1)
    world.campaign(C2, from_addr="other@example.com")
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    same_from = world.task(C1, 1, "ann@example.com", sent=False)
    via_sender = world.task(C2, 1, "ann@example.com", sent=False, sender=SA)
    assert world.service.apply(Feedback(K.REPLY, T0, task_id=sent.id)).cancelled == (same_from.id,)
    assert world.state(via_sender.id).state is TaskState.PENDING


def test_an_authenticated_reply_in_a_senders_mailbox_answers_that_senders_email(
    world: World,
) -> None:
    world.campaign(C1, from_addr="news@example.com")
    world.campaign(C2, from_addr="news@example.com")
    from_b = world.task(C2, 0, "ann@example.com", sent=True, sender=SB)
    from_a = world.task(C1, 1, "ann@example.com", sent=True, sender=SA)  # the newest sent
    next_a = world.task(C1, 2, "ann@example.com", sent=False, sender=SA)
    next_b = world.task(C2, 3, "ann@example.com", sent=False, sender=SB)
    reply = Feedback(
        K.REPLY, T0, recipient="ann@example.com", proof=Proof.AUTHENTICATED, to=("b@example.com",)
    )
    # Read in the feedback mailbox: the newest email is A's, and B's address is not its.
    assert world.service.apply(reply).unverified
    applied = world.service.apply(replace(reply, mailbox_sender=SB))
    assert applied.task_id == from_b.id and applied.cancelled == (next_b.id,)
    assert world.state(from_b.id).outcome is TaskOutcome.REPLIED
    assert world.state(from_a.id).outcome is TaskOutcome.ACCEPTED
    assert world.state(next_a.id).state is TaskState.PENDING


def test_the_senders_own_message_in_the_thread_is_no_reply(world: World) -> None:
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    pending = world.task(C1, 1, "ann@example.com", sent=False)
    own = Feedback(K.REPLY, T0, task_id=sent.id, recipient="SALES@example.com")
    assert world.service.apply(own).ignored
    assert world.state(sent.id).outcome is TaskOutcome.ACCEPTED
    assert world.state(pending.id).state is TaskState.PENDING


def test_replies_suppress_when_configured(world: World) -> None:
    app = fake_app(store=world.store, clock=world.clock, suppress_replies=True)
    service = app.feedback
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    assert service.apply(Feedback(K.REPLY, T0, task_id=sent.id)).suppressed
    entry = world.store.suppressed(["ann@example.com"])["ann@example.com"]
    assert entry.reason is SuppressionReason.REPLIED


def test_the_last_pending_email_cancelled_completes_its_campaign(world: World) -> None:
    world.campaign(C1)
    sent = world.task(C1, 0, "ann@example.com", sent=True)
    world.task(C1, 1, "ann@example.com", sent=False)
    world.service.apply(Feedback(K.HARD_BOUNCE, T0, task_id=sent.id))
    assert world.store.campaign_state(C1) is CampaignState.COMPLETED


def test_feedback_about_nothing_sendqueue_knows_is_ignored(world: World) -> None:
    world.campaign(C1)
    unknown = world.service.apply(Feedback(K.HARD_BOUNCE, T0, task_id=task_id(C1, 99)))
    assert unknown.ignored and world.store.count_suppressions() == 0
    garbage = world.service.apply(Feedback(K.COMPLAINT, T0, recipient="not an address"))
    assert garbage.ignored and "recipient" in (garbage.ignored or "")


def test_a_bounce_for_an_unsent_address_still_suppresses_it(world: World) -> None:
    applied = world.service.apply(Feedback(K.HARD_BOUNCE, T0, recipient="zed@example.com"))
    assert applied.suppressed and applied.task_id is None and not applied.outcome_set


def test_feedback_names_a_task_or_an_address() -> None:
    with pytest.raises(InvalidField, match="task_id"):
        Feedback(K.REPLY, T0)


# --- tokens -----------------------------------------------------------------------------------

_TASK_IDS = st.builds(
    lambda c, n: task_id("c" + c, n),
    st.text("0123456789abcdef", min_size=12, max_size=12),
    st.integers(0, 10**9 - 1),
)


@settings(max_examples=300)
@given(_TASK_IDS, st.sampled_from(list(TokenPurpose)))
def test_a_token_verifies_for_its_purpose_only_and_in_any_case(
    tid: str, purpose: TokenPurpose
) -> None:
    token = sign_task(tid, SECRET, purpose)
    assert verify_task(token, SECRET, purpose) == tid
    assert verify_task(token.upper(), SECRET, purpose) == tid
    other = next(p for p in TokenPurpose if p is not purpose)
    assert verify_task(token, SECRET, other) is None
    assert verify_task(token, "t" * 40, purpose) is None


@settings(max_examples=300)
@given(_TASK_IDS, st.integers(0, 200), st.sampled_from("0123456789abcdef.-x"))
def test_an_altered_token_is_refused(tid: str, where: int, char: str) -> None:
    token = sign_task(tid, SECRET, TokenPurpose.UNSUBSCRIBE)
    where %= len(token)
    altered = token[:where] + char + token[where + 1 :]
    if altered != token:
        assert verify_task(altered, SECRET, TokenPurpose.UNSUBSCRIBE) is None


@given(st.text(max_size=120))
def test_any_text_is_refused_without_raising(text: str) -> None:
    assert verify_task(text, SECRET, TokenPurpose.UNSUBSCRIBE) is None


def test_a_short_secret_is_refused_naming_the_setting() -> None:
    with pytest.raises(InvalidField, match="secret_key"):
        sign_task(task_id(C1, 1), "short", TokenPurpose.BOUNCE)


def test_a_verp_address_carries_its_task_and_nothing_else_matches() -> None:
    tid = task_id(C1, 42)
    address = verp_address("bounces@mail.example.com", tid, SECRET)
    assert address.startswith("bounces+c00000000000a-42.") and address.endswith("@mail.example.com")
    assert verp_task(address, "bounces@mail.example.com", SECRET) == tid
    assert verp_task(f"<{address.upper()}>", "bounces@mail.example.com", SECRET) == tid
    assert verp_task(address, "bounces@other.example.com", SECRET) is None
    assert verp_task("bounces@mail.example.com", "bounces@mail.example.com", SECRET) is None
    with pytest.raises(InvalidField, match="bounce_address"):
        verp_address("no-at-sign", tid, SECRET)


def test_message_ids_sendqueue_made_give_their_task() -> None:
    assert task_id_from_message_id("<c0123456789ab-7@example.com>") == "c0123456789ab-7"
    assert task_id_from_message_id(" c0123456789ab-7@example.com ") == "c0123456789ab-7"
    assert task_id_from_message_id("<CAF=x@mail.gmail.com>") is None
    assert task_id_from_message_id("<c0123456789ab-7@a@b>") is None


@pytest.mark.parametrize("from_line", ["From: undisclosed-recipients:;", "From: nobody"])
def test_a_reply_from_no_address_does_not_speak_for_the_email_it_names(from_line: str) -> None:
    # A reply speaks for its own From only; one whose From holds no address must not fall back
    # to the recipient of the (guessable) Message-ID it names.
    world = World()
    world.campaign(C1)
    victim_sent = world.task(C1, 0, "vic@example.com", sent=True)
    victim_next = world.task(C1, 1, "vic@example.com", sent=False)
    raw = (
        f"{from_line}\nTo: sales@example.com\nSubject: Re: hello\n"
        f"In-Reply-To: <{victim_sent.id}@example.com>\nMessage-ID: <x1@evil.example>\n\nstop\n"
    ).encode()
    for item in parse_feedback(raw, received_at=T0):
        world.service.apply(item)
    assert world.state(victim_sent.id).outcome is TaskOutcome.ACCEPTED
    assert world.state(victim_next.id).state is TaskState.PENDING
