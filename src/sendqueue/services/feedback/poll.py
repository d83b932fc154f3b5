"""Polling the feedback mailboxes: every message read once, parsed, applied.

:meth:`FeedbackPoller.poll` makes one pass over the configured mailboxes
(:class:`~sendqueue.ports.FeedbackSource`). For each mailbox it:

- takes the store lease ``feedback:<mailbox name>`` (renewed after every batch, and within
  one whenever half its time has gone), so two pollers (two worker processes, a worker and
  ``sendqueue feedback poll``) never read one mailbox at once; a mailbox whose lease another
  poller holds is skipped this pass;
- fetches the messages after the saved cursor (:meth:`FeedbackCursors.feedback_cursor`: the
  mailbox's UIDVALIDITY and highest UID processed), in batches, each handed over by the
  source one message at a time: a message is parsed, applied and let go before the next is
  read, so a batch of large messages is never held at once;
- parses each message into feedback (DSNs, ARF complaints, replies; nothing for any other
  message, which is left alone) and applies each piece with
  :meth:`~sendqueue.services.feedback.effects.FeedbackService.apply`; a message its parser fails on
  (it raised, or the isolated parser ran out of its time budget or died) is skipped: one
  WARNING line naming it, counted in ``skipped``, and the messages behind it still read;
- saves the cursor after each batch.

Skipped messages are not read again (the cursor moves past them): a message that stalls or
breaks the parser would do so at every pass and hold back every message behind it.

A crash between applying a batch and saving its cursor applies the batch again at the next
pass: every effect is idempotent (an outcome is written once, the list keeps its first entry, a
cancel is a compare-and-set, and a transient bounce is kept once per message key), so that is
harmless. A new UIDVALIDITY (the mailbox was re-created) starts from its first message, for the
same reason: feedback is keyed by the message's content (:func:`content_key`), not its UID, so
a transient bounce read again under new UIDs is not counted again.

Besides the feedback mailbox, every pass reads the senders' own mailboxes as the store has them
then (``mailboxes``, :meth:`~sendqueue.services.feedback.mailboxes.SenderMailboxes.current`);
feedback
read from one carries its sender (``Feedback.mailbox_sender``). One mailbox failing (a bad
login, an unreachable host, a timeout) is reported and the pass goes on with the others. Each
pass over a mailbox is kept (:meth:`FeedbackCursors.record_mailbox_pass`): when, how many
messages, and its error with the credentials masked, or none.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Protocol, runtime_checkable

from sendqueue.domain.errors import Conflict, FeedbackParseFailed, FeedbackUnavailable
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.ports import Clock, FeedbackCursors, FeedbackMessage, FeedbackSource, Leases
from sendqueue.services.config import ServiceConfig
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.feedback.mailboxes import PolledMailbox, mask_secrets

__all__ = [
    "BATCH",
    "ClosableFeedbackParser",
    "FeedbackParser",
    "FeedbackPoller",
    "PollReport",
    "content_key",
    "lease_name",
]

log = logging.getLogger(__name__)

#: Messages fetched (and their cursor saved) at a time.
BATCH = 200

_COUNTER = {
    FeedbackKind.HARD_BOUNCE: "bounces",
    FeedbackKind.SOFT_BOUNCE: "soft_bounces",
    FeedbackKind.COMPLAINT: "complaints",
    FeedbackKind.REPLY: "replies",
    FeedbackKind.UNSUBSCRIBE: "unsubscribes",
    FeedbackKind.AUTO_REPLY: "auto_replies",
}


class FeedbackParser(Protocol):
    """:func:`sendqueue.domain.reports.parse_feedback`'s signature: the feedback in one raw
    message (an empty list: not feedback). Any exception skips the message, except
    :class:`~sendqueue.domain.errors.FeedbackUnavailable` (the parser cannot run at all),
    which ends the mailbox's pass before its cursor moves."""

    def __call__(
        self,
        raw: bytes,
        *,
        received_at: datetime,
        key: str | None = None,
        bounce_address: str | None = None,
        secret: str | None = None,
        trusted_authserv: Collection[str] = (),
    ) -> list[Feedback]: ...


@runtime_checkable
class ClosableFeedbackParser(FeedbackParser, Protocol):
    """A parser holding something to release (the isolated parser's process):
    :meth:`FeedbackPoller.close` closes it."""

    def close(self) -> None: ...


@dataclass
class PollReport:
    """What one pass did. ``messages`` were read; each piece of feedback in them is counted
    by kind when applied (``bounces`` are permanent, ``soft_bounces`` transient), or in
    ``ignored`` when it was about nothing sendqueue sent or proved nothing (``unverified``
    counts the replies among those, noted on their email); ``not_feedback`` messages held
    none; ``skipped`` ones were not parsed (the parser failed, ran out of time or died).
    ``busy`` names the mailboxes another poller was reading, ``errors`` those that failed."""

    mailboxes: int = 0
    messages: int = 0
    bounces: int = 0
    soft_bounces: int = 0
    complaints: int = 0
    replies: int = 0
    unsubscribes: int = 0
    auto_replies: int = 0
    not_feedback: int = 0
    ignored: int = 0
    unverified: int = 0
    skipped: int = 0
    busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def content_key(mailbox: str, raw: bytes) -> str:
    """The identity of a message in ``mailbox`` that survives a new UIDVALIDITY (which numbers
    the same messages anew): ``mailbox:sha256:<first 32 hex digits of its bytes' digest>``."""
    return f"{mailbox}:sha256:{hashlib.sha256(raw).hexdigest()[:32]}"


def lease_name(mailbox: str) -> str:
    """The store lease that one poller of ``mailbox`` holds at a time."""
    return f"feedback:{mailbox}"


class FeedbackPoller:
    """Reads the feedback mailboxes and applies what they hold (see the module docstring)."""

    def __init__(
        self,
        store: Leases,
        feedback_store: FeedbackCursors,
        service: FeedbackService,
        sources: Sequence[FeedbackSource],
        parse: FeedbackParser,
        clock: Clock,
        config: ServiceConfig,
        *,
        batch: int = BATCH,
        mailboxes: Callable[[], Sequence[PolledMailbox]] | None = None,
        source_secrets: Sequence[str] = (),
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self._store = store
        self._cursors = feedback_store
        self._service = service
        self._sources = tuple(sources)
        self._parse = parse
        self._clock = clock
        self._config = config
        self._batch = batch
        self._mailboxes = mailboxes
        #: What is masked out of the errors of ``sources`` (their passwords, as echoed).
        self._source_secrets = tuple(source_secrets)
        self._owner = f"feedback-{uuid.uuid4().hex[:12]}"

    @property
    def configured(self) -> bool:
        """Whether there may be a mailbox to poll: the feedback mailbox, or the senders' (read
        from the store at each pass)."""
        return bool(self._sources) or self._mailboxes is not None

    def poll(self) -> PollReport:
        """One pass over every mailbox. A mailbox that cannot be read is reported in
        ``errors`` and kept as its state (the others are still read); an unreachable store
        raises."""
        report = PollReport()
        secrets = self._source_secrets
        boxes = [PolledMailbox(s.name, s, secrets=secrets) for s in self._sources]
        if self._mailboxes is not None:
            boxes += self._mailboxes()
        for box in boxes:
            self._one(box, report)
        if report.messages:
            log.info("feedback poll: %s", report.as_dict())
        return report

    def _one(self, box: PolledMailbox, report: PollReport) -> None:
        """Read one mailbox, and keep its pass: when, how many messages, which error."""
        read = report.messages
        error: str | None = box.error
        if box.source is not None:
            try:
                if not self._mailbox(box, box.source, report):
                    return  # busy: another poller's pass is the one kept
            except (FeedbackUnavailable, Conflict) as exc:
                error = str(exc)
            finally:
                box.source.close()
        if error is not None:
            error = mask_secrets(error, box.secrets)
            report.errors.append(f"{box.key}: {error}")
            log.warning("feedback mailbox %s: %s", box.key, error)
        self._cursors.record_mailbox_pass(
            box.key, at=self._clock.now(), messages=report.messages - read, error=error
        )

    def close(self) -> None:
        """Close the sources and the parser (when it holds anything)."""
        for source in self._sources:
            source.close()
        if isinstance(self._parse, ClosableFeedbackParser):
            self._parse.close()

    # -- one mailbox ----------------------------------------------------------------------------

    def _lease(self, name: str) -> bool:
        return self._store.acquire_lease(
            lease_name(name),
            self._owner,
            ttl_seconds=self._config.feedback_lease_seconds,
            at=self._clock.now(),
        )

    def _mailbox(self, box: PolledMailbox, source: FeedbackSource, report: PollReport) -> bool:
        """Read the mailbox from its cursor on; False when another poller holds it."""
        name = box.key
        if not self._lease(name):
            report.busy.append(name)
            return False
        try:
            report.mailboxes += 1
            cursor = self._cursors.feedback_cursor(name)
            while True:
                uidvalidity, messages = source.fetch(cursor, limit=self._batch)
                if cursor is not None and cursor[0] != uidvalidity:
                    log.warning(
                        "feedback mailbox %s: UIDVALIDITY changed (%d -> %d), reading it again "
                        "from its first message",
                        name,
                        cursor[0],
                        uidvalidity,
                    )
                count, last = self._batch_of(box, messages, report)
                if last is not None:
                    self._cursors.save_feedback_cursor(name, uidvalidity, last)
                    cursor = (uidvalidity, last)
                elif cursor is None or cursor[0] != uidvalidity:
                    self._cursors.save_feedback_cursor(name, uidvalidity, 0)
                    cursor = (uidvalidity, 0)
                if count < self._batch:
                    return True
                self._renew(name)
        finally:
            self._store.release_lease(lease_name(name), self._owner)

    def _batch_of(
        self, box: PolledMailbox, messages: Iterator[FeedbackMessage], report: PollReport
    ) -> tuple[int, int | None]:
        """Parse and apply each message as the source hands it over (none is kept): how many
        there were and the last one's UID."""
        name = box.key
        count, last = 0, None
        renewed = self._clock.now()
        half = self._config.feedback_lease_seconds / 2
        for message in messages:
            self._message(message, box, report)
            count, last = count + 1, message.uid
            # A batch of messages that each take their whole parse budget can outlast the
            # lease: it is renewed within the batch too, once half its time has gone.
            if (self._clock.now() - renewed).total_seconds() > half:
                self._renew(name)
                renewed = self._clock.now()
        return count, last

    def _renew(self, name: str) -> None:
        if not self._lease(name):  # lost: another poller took over
            raise Conflict(f"the lease of {name} was taken over; stopping this pass")

    def _message(self, message: FeedbackMessage, box: PolledMailbox, report: PollReport) -> None:
        """Parse and apply one message. Its key (mailbox, UIDVALIDITY, UID) names it in the
        log; its content key (:func:`content_key`, not its UID) keys its feedback, so a
        re-created mailbox counts nothing twice."""
        report.messages += 1
        config = self._config
        # a sender's mailbox may be at another server, which keeps a header forged with the
        # feedback mailbox server's id: its own ids are trusted there
        trusted = (
            config.trusted_authserv if box.sender_id is None else config.sender_mailbox_authserv
        )
        try:
            items = self._parse(
                message.raw,
                received_at=self._clock.now(),
                key=content_key(box.key, message.raw),
                bounce_address=config.bounce_address,
                secret=config.secret_key,
                trusted_authserv=trusted,
            )
        except FeedbackUnavailable:
            raise  # the parser cannot run at all: the pass stops before its cursor moves
        except Exception as exc:  # one unparseable message must not block the mailbox behind it
            report.skipped += 1
            log.warning("feedback message %s skipped: %s", message.key, _why(exc))
            log.debug("feedback message %s: the parser's error", message.key, exc_info=True)
            return
        if not items:
            report.not_feedback += 1
            return
        for item in items:
            if box.sender_id is not None:  # read from a sender's own mailbox
                item = replace(item, mailbox_sender=box.sender_id)
            applied = self._service.apply(item)
            if applied.ignored is not None:
                report.ignored += 1
                report.unverified += applied.unverified
                log.info(
                    "feedback %s (%s) ignored: %s", message.key, item.kind.value, applied.ignored
                )
                continue
            counter = _COUNTER[item.kind]
            setattr(report, counter, getattr(report, counter) + 1)


def _why(exc: Exception) -> str:
    """One line on why a message was skipped (a parser's message may be long or multi-line)."""
    if isinstance(exc, FeedbackParseFailed):
        text = str(exc)
    else:
        text = f"the parser raised {type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:299] + "…"
