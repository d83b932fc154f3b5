"""The Maildir outbox: every sent message becomes one file in ``DIR/new``, the embedded default.

Nothing is delivered anywhere; the outbox is for development, demos and tests, and any mail
reader (``mutt -f DIR``) or script can look at what would have gone out. Files are written the
Maildir way (into ``tmp``, then moved to ``new``), so a reader never sees half a message.
"""

from __future__ import annotations

import mailbox
import os
import threading
from pathlib import Path

from sendqueue.adapters.mail.mime import bare_envelope_sender, build_message
from sendqueue.domain.errors import InvalidField, PermanentMailError, TransientMailError
from sendqueue.ports import OutgoingMessage

__all__ = ["MaildirMailer"]

# mailbox.Maildir numbers its temporary files with a class-wide counter that it increments
# without a lock, so two threads (or two MaildirMailers on one directory) could pick the same
# name and fail with ExternalClashError. One lock for all instances keeps the counter sane.
_ADD_LOCK = threading.Lock()


class MaildirMailer:
    """Writes messages to a Maildir outbox. Implements :class:`~sendqueue.ports.Mailer`.

    The directory, its parents and ``cur``, ``new``, ``tmp`` are created when missing. ``send``
    returns the message's Message-ID; a file system error raises TransientMailError, a message
    that cannot be built PermanentMailError. Thread-safe.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            # mailbox.Maildir(create=True) makes cur/new/tmp only when the directory itself is
            # missing, and no parents: an existing empty directory would fail at the first add.
            for sub in ("tmp", "new", "cur"):
                (self.path / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
            self._box = mailbox.Maildir(self.path, factory=None, create=False)
        except OSError as exc:
            raise TransientMailError(f"Maildir outbox {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"MaildirMailer({str(self.path)!r})"

    def send(self, message: OutgoingMessage) -> str:
        try:
            mime = build_message(message)
            sender = (
                bare_envelope_sender(message.envelope_from)
                if message.envelope_from is not None
                else None
            )
        except InvalidField as exc:
            raise PermanentMailError(f"message not written, it is invalid: {exc}") from exc
        # mailbox turns every "\n" into os.linesep; CRLF input would end up as "\r\r\n".
        data = mime.as_bytes(policy=mime.policy.clone(linesep="\n"))
        if sender is not None:
            # The envelope sender, recorded as a delivering MTA does (RFC 5321 4.4).
            data = f"Return-Path: <{sender}>\n".encode() + data
        try:
            with _ADD_LOCK:
                self._box.add(data)
        except (OSError, mailbox.Error) as exc:
            raise TransientMailError(f"Maildir outbox {self.path}: {exc}") from exc
        return message.message_id

    def probe(self, timeout: float) -> str:
        """The outbox's folders are there and writable (see :class:`~sendqueue.ports.Probe`);
        ``timeout`` is unused, nothing here waits on a network."""
        missing = [
            sub for sub in ("tmp", "new") if not os.access(self.path / sub, os.W_OK | os.X_OK)
        ]
        if missing:
            raise TransientMailError(
                f"Maildir outbox {self.path}: {', '.join(missing)} is missing or not writable"
            )
        return f"Maildir outbox {self.path} is writable (it delivers nothing)"

    def close(self) -> None:
        """Nothing to release: each message is a file written and closed in ``send``."""
