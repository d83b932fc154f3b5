"""The Maildir outbox mailer, and the RecordingMailer fake shipped in sendqueue.testing."""

from __future__ import annotations

import mailbox
import shutil
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default
from pathlib import Path

import pytest

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.domain.addresses import message_id_for
from sendqueue.domain.errors import PermanentMailError, TransientMailError
from sendqueue.ports import Mailer, OutgoingMessage
from sendqueue.testing.mailer import RecordingMailer


def outgoing(n: int = 1, **changes: object) -> OutgoingMessage:
    fields: dict[str, object] = {
        "message_id": message_id_for(f"cabc-{n}", "example.com"),
        "from_addr": "News <news@example.com>",
        "to_addr": f"reader{n}@example.org",
        "to_name": "Zoë",
        "subject": f"Issue {n}",
        "text": "Hello\nsecond line\n",
        "date": datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC),
        "html": "<p>Hello</p>",
    }
    fields.update(changes)
    return OutgoingMessage(**fields)  # type: ignore[arg-type]


def parsed_files(outbox: Path) -> list[EmailMessage]:
    parser = BytesParser(policy=default)
    return [parser.parsebytes(p.read_bytes()) for p in sorted((outbox / "new").iterdir())]


def run_threads(count: int, work: Callable[[int], object]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(t: int) -> None:
        try:
            barrier.wait()
            work(t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return errors


# -- MaildirMailer ----------------------------------------------------------------------------


def test_message_lands_in_outbox_new_and_parses(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    mailer: Mailer = MaildirMailer(outbox)
    msg = outgoing()

    assert mailer.send(msg) == msg.message_id

    (parsed,) = parsed_files(outbox)
    assert str(parsed["Message-ID"]) == msg.message_id
    assert parsed["To"].addresses[0].display_name == "Zoë"
    assert parsed["To"].addresses[0].addr_spec == "reader1@example.org"
    assert str(parsed["Subject"]) == "Issue 1"
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    assert next(parsed.iter_parts()).get_content() == "Hello\nsecond line\n"
    assert list((outbox / "tmp").iterdir()) == []
    assert list((outbox / "cur").iterdir()) == []


def test_stored_file_uses_local_line_ends(tmp_path: Path) -> None:
    MaildirMailer(tmp_path).send(outgoing())

    (path,) = (tmp_path / "new").iterdir()
    assert b"\r" not in path.read_bytes()


def test_outbox_is_readable_with_the_stdlib_mailbox(tmp_path: Path) -> None:
    mailer = MaildirMailer(tmp_path / "box")
    for n in range(3):
        mailer.send(outgoing(n))

    box = mailbox.Maildir(tmp_path / "box", create=False)
    assert sorted(m["Message-ID"] for m in box) == sorted(outgoing(n).message_id for n in range(3))


def test_missing_parent_directories_are_created(tmp_path: Path) -> None:
    outbox = tmp_path / "a" / "b" / "outbox"

    MaildirMailer(outbox).send(outgoing())

    assert len(list((outbox / "new").iterdir())) == 1


def test_concurrent_sends_all_land_once(tmp_path: Path) -> None:
    # Two mailers on one directory as well: the stdlib's file naming is shared between them.
    mailers = [MaildirMailer(tmp_path), MaildirMailer(tmp_path)]
    threads, per_thread = 8, 10

    errors = run_threads(
        threads,
        lambda t: [mailers[t % 2].send(outgoing(t * 1000 + i)) for i in range(per_thread)],
    )

    assert errors == []
    ids = sorted(str(m["Message-ID"]) for m in parsed_files(tmp_path))
    expected = sorted(
        outgoing(t * 1000 + i).message_id for t in range(threads) for i in range(per_thread)
    )
    assert ids == expected


def test_file_system_failure_is_transient(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    mailer = MaildirMailer(outbox)
    shutil.rmtree(outbox)
    outbox.write_text("not a directory any more")

    with pytest.raises(TransientMailError, match="outbox"):
        mailer.send(outgoing())


def test_unusable_path_is_transient_at_construction(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")

    with pytest.raises(TransientMailError):
        MaildirMailer(blocker / "outbox")


def test_invalid_message_is_permanent_and_writes_nothing(tmp_path: Path) -> None:
    mailer = MaildirMailer(tmp_path)

    with pytest.raises(PermanentMailError, match="subject"):
        mailer.send(outgoing(subject="x\r\nBcc: victim@example.net"))

    assert list((tmp_path / "new").iterdir()) == []


def test_close_is_harmless_and_sending_goes_on(tmp_path: Path) -> None:
    mailer = MaildirMailer(tmp_path)
    mailer.close()

    mailer.send(outgoing())

    assert len(list((tmp_path / "new").iterdir())) == 1


# -- RecordingMailer --------------------------------------------------------------------------


def test_recording_mailer_records_and_returns_the_message_id() -> None:
    mailer: Mailer = RecordingMailer()
    msg = outgoing()

    assert mailer.send(msg) == msg.message_id
    assert isinstance(mailer, RecordingMailer)
    assert mailer.sent == [msg]
    assert mailer.sent_to("READER1@example.org") == [msg]


def test_fail_next_raises_queued_errors_in_order_then_succeeds() -> None:
    mailer = RecordingMailer()
    mailer.fail_next(TransientMailError("451 later"), PermanentMailError("550 no"))

    with pytest.raises(TransientMailError, match="451"):
        mailer.send(outgoing(1))
    with pytest.raises(PermanentMailError, match="550"):
        mailer.send(outgoing(2))
    mailer.send(outgoing(3))

    assert [m.to_addr for m in mailer.sent] == ["reader3@example.org"]
    assert [m.to_addr for m in mailer.attempts] == [f"reader{n}@example.org" for n in (1, 2, 3)]


def test_on_send_runs_first_and_its_exception_refuses_the_message() -> None:
    seen: list[str] = []

    def hook(msg: OutgoingMessage) -> None:
        seen.append(msg.to_addr)
        if msg.to_addr == "reader2@example.org":
            raise PermanentMailError("550 5.1.1 unknown user")

    mailer = RecordingMailer(on_send=hook)
    mailer.send(outgoing(1))
    with pytest.raises(PermanentMailError):
        mailer.send(outgoing(2))

    assert seen == ["reader1@example.org", "reader2@example.org"]
    assert [m.to_addr for m in mailer.sent] == ["reader1@example.org"]


def test_after_send_sees_the_message_already_recorded() -> None:
    recorded_then: list[int] = []
    mailer = RecordingMailer()
    mailer.after_send = lambda msg: recorded_then.append(len(mailer.sent))

    mailer.send(outgoing(1))
    mailer.fail_next(TransientMailError("421"))
    with pytest.raises(TransientMailError):
        mailer.send(outgoing(2))

    assert recorded_then == [1]  # not called for the refused send


def test_on_send_can_hold_a_send_until_released() -> None:
    release = threading.Event()
    entered = threading.Event()

    def hold(msg: OutgoingMessage) -> None:
        entered.set()
        release.wait(10)

    mailer = RecordingMailer(on_send=hold)
    sender = threading.Thread(target=mailer.send, args=(outgoing(),))
    sender.start()
    assert entered.wait(10)
    assert mailer.sent == []

    release.set()
    assert [m.message_id for m in mailer.wait_for(1, timeout=10)] == [outgoing().message_id]
    sender.join(10)


def test_wait_for_times_out_with_the_count() -> None:
    mailer = RecordingMailer()
    mailer.send(outgoing())

    with pytest.raises(TimeoutError, match="1 of 2"):
        mailer.wait_for(2, timeout=0.05)


def test_recording_mailer_is_thread_safe_and_clear_forgets() -> None:
    mailer = RecordingMailer()

    errors = run_threads(8, lambda t: [mailer.send(outgoing(t * 100 + i)) for i in range(50)])

    assert errors == []
    assert len({m.message_id for m in mailer.sent}) == 400
    mailer.fail_next(TransientMailError("x"))
    mailer.clear()
    mailer.send(outgoing())
    assert len(mailer.sent) == 1
    mailer.close()
    assert mailer.closed == 1


def test_the_envelope_sender_is_recorded_as_return_path(tmp_path: Path) -> None:
    verp = "bounces+cabc-1.0123456789abcdef0123456789abcdef@example.com"
    MaildirMailer(tmp_path).send(outgoing(envelope_from=verp))
    MaildirMailer(tmp_path / "plain").send(outgoing(2))
    (with_sender,) = parsed_files(tmp_path)
    assert with_sender["Return-Path"] == f"<{verp}>"
    assert str(with_sender["From"]) == "News <news@example.com>"
    (plain,) = parsed_files(tmp_path / "plain")
    assert "Return-Path" not in plain


def test_an_envelope_sender_with_a_line_break_is_permanent(tmp_path: Path) -> None:
    with pytest.raises(PermanentMailError, match="envelope_from"):
        MaildirMailer(tmp_path).send(outgoing(envelope_from="b@example.com\nBcc: x@y.example"))
    assert not any((tmp_path / "new").iterdir())
