"""``sendqueue check``: every configured part of the set-up tried for real, one result each.

The parts, in the order they are reported:

- the task store: opened as every command opens it, then one cheap read (the last change's id)
  and the list of senders;
- the execution layer: its :class:`~sendqueue.ports.Probe` when it has one (EventBridge: the
  schedule group), else one cheap read (``get`` of a schedule name that is never created);
- the mailer, and every sender with a transport or an OAuth sign-in of its own: signed in and
  out, no mail sent;
- the feedback mailbox, and every sender's own mailbox: signed in, the folder opened
  read-only;
- the public URL: one GET of the health route.

A part that is not configured, or cannot be tried from here, is ``not checked`` with the reason;
only ``failed`` fails the check. The parts after the store are tried in parallel, each bounded by
the timeout, so a dead host costs one timeout, not one per part. Every detail is one line, and
any secret the check was given (passwords, keys, tokens) is replaced by ``***`` in it: a
driver's error text is shown, but never a password it might quote.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Literal
from urllib.parse import unquote, urlsplit

from sendqueue.domain.errors import NotChecked, SendqueueError
from sendqueue.domain.senders import Sender, masked_transport
from sendqueue.domain.wording import plural
from sendqueue.ports import ChangeLog, FeedbackSource, Mailer, Probe, Scheduler, SenderStore

__all__ = ["CHECK_SCHEDULE", "CheckResult", "CheckedParts", "SetupCheck", "url_secrets"]

#: The schedule name the execution layer is asked for (and never has).
CHECK_SCHEDULE = "sendqueue-check"
#: Parts tried at once.
_CONCURRENCY = 8
#: The longest detail kept (a driver's error can run to pages).
_MAX_DETAIL = 500

Status = Literal["ok", "failed", "not checked"]


@dataclass(frozen=True)
class CheckResult:
    """One part's outcome: ``part`` (what it is), ``target`` (where, masked), ``status`` and
    ``detail`` (what answered, or why not; one line)."""

    part: str
    target: str
    status: Status
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def as_dict(self) -> dict[str, str]:
        return {
            "part": self.part,
            "target": self.target,
            "status": self.status,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class CheckedParts:
    """What a check tries, as the composition root opens it. Each part is a callable, so that
    opening it is tried (and fails) within its own line. ``*_target`` say where each part is,
    without secrets; ``no_mailbox`` and a ``public_url`` string say why that part is not
    configured."""

    store: Callable[[], ChangeLog]
    store_target: str
    senders: Callable[[], SenderStore]
    scheduler: Callable[[], Scheduler]
    scheduler_target: str
    mailer: Callable[[], Mailer]
    mailer_target: str
    transport: Callable[[Sender], Mailer]
    mailboxes: Callable[[], Sequence[FeedbackSource]]
    no_mailbox: str
    sender_mailbox: Callable[[Sender], FeedbackSource]
    public_url: Probe | str
    public_url_target: str


def url_secrets(url: str | None) -> set[str]:
    """The password of ``url`` as written and percent-decoded (empty when it has none)."""
    if not url:
        return set()
    try:
        password = urlsplit(url).password
    except ValueError:
        return set()
    return {password, unquote(password)} if password else set()


_Job = tuple[str, str, Callable[[], str]]


class SetupCheck:
    """See the module docstring. ``secrets`` are masked in every detail (with the passwords of
    the senders' transports, which the check reads from the store)."""

    def __init__(self, parts: CheckedParts, *, secrets: Collection[str] = ()) -> None:
        self._parts = parts
        self._secrets = {s for s in secrets if s}

    def run(self, timeout: float = 10.0) -> list[CheckResult]:
        """Try every part; each network step waits at most ``timeout`` seconds."""
        store, senders = self._store()
        p = self._parts
        entries: list[_Job | CheckResult] = [
            ("scheduler", p.scheduler_target, lambda: self._scheduler(timeout)),
            ("mailer", p.mailer_target, lambda: _probe(p.mailer(), timeout)),
            *self._sender_jobs(senders, timeout),
            *self._mailbox_jobs(timeout),
            *self._sender_mailbox_jobs(senders, timeout),
        ]
        if isinstance(p.public_url, str):
            entries.append(CheckResult("public URL", "", "not checked", p.public_url))
        else:
            url = p.public_url
            entries.append(("public URL", p.public_url_target, lambda: url.probe(timeout)))
        with ThreadPoolExecutor(max_workers=_CONCURRENCY) as pool:
            futures = [
                entry if isinstance(entry, CheckResult) else pool.submit(self._one, *entry)
                for entry in entries
            ]
            tried = [f if isinstance(f, CheckResult) else f.result() for f in futures]
        return [store, *tried]

    # -- the parts -------------------------------------------------------------------------

    def _store(self) -> tuple[CheckResult, list[Sender] | None]:
        """The store's result, and each sender with a transport, a mailbox or an OAuth sign-in
        of its own (None when the store could not be read)."""
        p = self._parts
        found: list[Sender] = []

        def read() -> str:
            last = p.store().last_change_id()
            senders = p.senders().list_senders()
            found.extend(s for s in senders if s.transport or s.oauth or s.imap)
            return f"answered: {plural(len(senders), 'sender')}, last change #{last}"

        result = self._one("task store", p.store_target, read)
        if result.status != "ok":
            return result, None
        for sender in found:
            self._secrets |= url_secrets(sender.transport) | url_secrets(sender.imap)
            if sender.oauth is not None:
                grant = sender.oauth
                self._secrets |= {s for s in (grant.refresh_token, grant.client_secret) if s}
        return result, found

    def _scheduler(self, timeout: float) -> str:
        scheduler = self._parts.scheduler()
        if isinstance(scheduler, Probe):
            return scheduler.probe(timeout)
        scheduler.get(CHECK_SCHEDULE)
        return "answered"

    def _mailbox_jobs(self, timeout: float) -> list[_Job | CheckResult]:
        p = self._parts
        try:
            boxes = list(p.mailboxes())
        except SendqueueError as exc:
            return [CheckResult("feedback mailbox", "", "failed", self._clean(str(exc)))]
        if not boxes:
            return [CheckResult("feedback mailbox", "", "not checked", p.no_mailbox)]
        return [("feedback mailbox", box.name, partial(_probe, box, timeout)) for box in boxes]

    def _sender_jobs(
        self, senders: list[Sender] | None, timeout: float
    ) -> list[_Job | CheckResult]:
        if senders is None:
            reason = "their transports are in the task store, which did not answer"
            return [CheckResult("senders", "", "not checked", reason)]
        return [
            (
                f"sender {s.email}",
                masked_transport(s.transport) or "the configured mailer, with oauth",
                partial(self._transport, s, timeout),
            )
            for s in senders
            if s.transport or s.oauth
        ]

    def _sender_mailbox_jobs(
        self, senders: list[Sender] | None, timeout: float
    ) -> list[_Job | CheckResult]:
        """Each sender's own mailbox: signed in, the folder opened read-only, as the feedback
        mailbox is (a store that did not answer is said once, by the senders' line)."""
        return [
            (
                f"mailbox of {s.email}",
                masked_transport(s.imap) or "",
                partial(self._box, s, timeout),
            )
            for s in senders or ()
            if s.imap
        ]

    def _box(self, sender: Sender, timeout: float) -> str:
        return _probe(self._parts.sender_mailbox(sender), timeout)

    def _transport(self, sender: Sender, timeout: float) -> str:
        return _probe(self._parts.transport(sender), timeout)

    # -- one part --------------------------------------------------------------------------

    def _one(self, part: str, target: str, attempt: Callable[[], str]) -> CheckResult:
        try:
            return CheckResult(part, target, "ok", self._clean(attempt()))
        except NotChecked as exc:
            return CheckResult(part, target, "not checked", self._clean(str(exc)))
        except SendqueueError as exc:
            return CheckResult(part, target, "failed", self._clean(str(exc)))
        except Exception as exc:
            # A driver's error that escaped its adapter: still one line for this part, never a
            # traceback that hides the parts after it.
            return CheckResult(part, target, "failed", self._clean(f"{type(exc).__name__}: {exc}"))

    def _clean(self, text: str) -> str:
        text = " ".join(text.split())
        # longest first, so a password that contains another secret is masked whole
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


def _probe(part: object, timeout: float) -> str:
    if isinstance(part, Probe):
        return part.probe(timeout)
    raise NotChecked(f"{type(part).__name__} cannot be tried without sending")
