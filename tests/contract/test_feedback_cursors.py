"""The FeedbackCursors contract (sendqueue.ports.FeedbackCursors: each feedback mailbox's
position and passes), run against every backend of :mod:`tests.contract.store_backends`, through
the port :class:`~sendqueue.ports.Stores` hands out.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendqueue.domain.feedback import MailboxState
from sendqueue.ports import FeedbackCursors, Stores
from tests.contract.store_backends import T0, Backend, backend, is_utc

__all__ = ["backend"]  # the fixture: every backend's store


@pytest.fixture
def store(backend: Backend) -> FeedbackCursors:
    return Stores.of(backend.handle()).cursors


# --- cursors ----------------------------------------------------------------------------------


def test_a_feedback_cursor_only_moves_forward_within_one_uidvalidity(
    store: FeedbackCursors,
) -> None:
    box = "imap://bounces@mail.example.com:993/INBOX"
    assert store.feedback_cursor(box) is None
    store.save_feedback_cursor(box, 7, 100)
    assert store.feedback_cursor(box) == (7, 100)
    store.save_feedback_cursor(box, 7, 90)  # an older poller finishing late
    assert store.feedback_cursor(box) == (7, 100)
    store.save_feedback_cursor(box, 7, 100)
    assert store.feedback_cursor(box) == (7, 100)
    store.save_feedback_cursor(box, 7, 150)
    assert store.feedback_cursor(box) == (7, 150)
    # The mailbox was rebuilt: another UIDVALIDITY replaces the position, lower UID or not.
    store.save_feedback_cursor(box, 9, 3)
    assert store.feedback_cursor(box) == (9, 3)
    store.save_feedback_cursor(box, 7, 500)
    assert store.feedback_cursor(box) == (7, 500)
    # Mailboxes are separate; UIDs past 32 bits are kept whole.
    other = "imap://replies@mail.example.com:993/INBOX"
    assert store.feedback_cursor(other) is None
    store.save_feedback_cursor(other, 2**32 - 1, 2**40)
    assert store.feedback_cursor(other) == (2**32 - 1, 2**40)
    assert store.feedback_cursor(box) == (7, 500)


# --- mailbox states ---------------------------------------------------------------------------


def test_a_mailbox_pass_is_kept_counted_and_its_error_cleared(store: FeedbackCursors) -> None:
    box = "sender:s0123456789ab:imap://a@127.0.0.1:143/INBOX"
    assert store.mailbox_states([box]) == {}
    # A first pass that failed: its state, and still no cursor.
    store.record_mailbox_pass(box, at=T0, messages=0, error="connecting failed: refused")
    assert store.mailbox_states([box]) == {
        box: MailboxState(box, T0, 0, "connecting failed: refused")
    }
    assert store.feedback_cursor(box) is None
    # A position saved, then a pass that read 3: the error is cleared, the count added up.
    store.save_feedback_cursor(box, 7, 30)
    later = T0 + timedelta(minutes=1)
    store.record_mailbox_pass(box, at=later, messages=3, error=None)
    got = store.mailbox_states([box, "never-polled"])
    assert got == {box: MailboxState(box, later, 3, None)}
    polled = got[box].polled_at
    assert polled is not None and is_utc(polled)
    store.record_mailbox_pass(box, at=later + timedelta(minutes=1), messages=2, error=None)
    assert store.mailbox_states([box])[box].messages_read == 5
    # The state never moves the position, and the position keeps the state.
    assert store.feedback_cursor(box) == (7, 30)
    store.save_feedback_cursor(box, 7, 40)
    store.save_feedback_cursor(box, 8, 1)
    assert store.feedback_cursor(box) == (8, 1)
    assert store.mailbox_states([box])[box].messages_read == 5
    # An error again keeps the count; mailboxes are separate.
    store.record_mailbox_pass(box, at=later, messages=0, error="timed out after 30s")
    other = "imap://bounces@127.0.0.1:143/INBOX"
    store.record_mailbox_pass(other, at=T0, messages=1, error=None)
    assert store.mailbox_states([box, other]) == {
        box: MailboxState(box, later, 5, "timed out after 30s"),
        other: MailboxState(other, T0, 1, None),
    }
    assert store.mailbox_states([]) == {}


def test_a_cursor_alone_has_no_mailbox_state(store: FeedbackCursors) -> None:
    store.save_feedback_cursor("box", 7, 1)
    assert store.mailbox_states(["box"]) == {}
