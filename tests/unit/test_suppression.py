"""The suppression list: the compared form of an address, insert-or-keep, the service's CSV
import and export, and what provisioning and the send worker do with a suppressed address."""

from __future__ import annotations

import csv
from datetime import timedelta

import pytest
from email_validator import validate_email
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import InvalidField, InvalidInput, NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.domain.suppression import (
    Suppression,
    SuppressionReason,
    key_of_normalized,
    suppressed_reason,
    suppression_key,
)
from sendqueue.services.feedback.suppression import parse_csv, to_csv
from sendqueue.services.reading.views import campaign_dict
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy
from tests.support.faults import CrashAfter, StoreCrash

R = SuppressionReason

# --- the compared form ------------------------------------------------------------------------

_LOCAL = st.text("abcxyzABCXYZ0189_+-äöüéÄÖÜÉ", min_size=1, max_size=12)
_LABEL = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=10
)
_ADDRESS = st.builds(
    lambda local, labels, tld: f"{local}@{'.'.join(labels)}.{tld}",
    _LOCAL,
    st.lists(_LABEL, min_size=1, max_size=3),
    st.sampled_from(["com", "DE", "Example", "org"]),
)


@given(_ADDRESS)
def test_the_key_is_the_validated_address_case_folded_and_ignores_case(address: str) -> None:
    key = suppression_key(address)
    assert key == validate_email(address, check_deliverability=False).normalized.casefold()
    assert suppression_key(address.upper()) == key
    assert suppression_key(address.swapcase()) == key
    assert suppression_key(f"  {address}\t") == key
    assert suppression_key(key) == key  # idempotent: a key is its own key


@given(_ADDRESS)
def test_a_stored_recipient_address_keys_without_validating_again(address: str) -> None:
    # What the import keeps is email-validator's normalised form; the fast key must agree.
    normalized = validate_email(address, check_deliverability=False).normalized
    assert key_of_normalized(normalized) == suppression_key(normalized)


@pytest.mark.parametrize(
    ("listed", "recipient"),
    [
        ("ΟΔΟΣ.ΕΝΑ@example.com", "οδος.ενα@example.com"),  # noqa: RUF001
        ("STRASSE@example.com", "straße@example.com"),
    ],
)
def test_case_variants_that_lower_keeps_apart_are_one_address(listed: str, recipient: str) -> None:
    # lower() spells the final sigma of the first two ways; casefold() gives one key
    normalized = validate_email(recipient, check_deliverability=False).normalized
    assert suppression_key(listed) == key_of_normalized(normalized)


@pytest.mark.parametrize(
    "value",
    ["", "   ", "no-at-sign", "a@", "@example.com", "Jane <jane@example.com>", "<a@example.com>",
     "a@example.com, b@example.com", "a\n@example.com", "a@exa mple.com", "a@-bad.com", None, 7],
)  # fmt: skip
def test_a_bad_address_is_an_invalid_field_naming_it(value: object) -> None:
    with pytest.raises(InvalidField) as info:
        suppression_key(value, field="email")
    assert info.value.field == "email"


def test_reasons_parse_in_any_case_and_refuse_others_naming_the_field() -> None:
    assert R.parse(" Bounced ") is R.BOUNCED
    with pytest.raises(InvalidField) as info:
        R.parse("spam")
    assert (info.value.field, "unsubscribed" in info.value.reason) == ("reason", True)
    assert suppressed_reason(R.COMPLAINED) == "suppressed: complained"


# --- insert-or-keep ---------------------------------------------------------------------------

_ENTRY = st.builds(
    lambda email, reason, minute: Suppression(email, reason, None, T0 + timedelta(minutes=minute)),
    st.sampled_from(["a@example.com", "b@example.com", "c@example.com", "d@example.com"]),
    st.sampled_from(list(R)),
    st.integers(0, 100),
)


@settings(max_examples=200)
@given(st.lists(st.lists(_ENTRY, max_size=5), max_size=6))
def test_an_address_keeps_its_first_entry_and_each_counts_once(
    calls: list[list[Suppression]],
) -> None:
    store = InMemoryTaskStore()
    first: dict[str, Suppression] = {}
    for entries in calls:
        new = {e.email for e in entries} - first.keys()
        for e in entries:
            first.setdefault(e.email, e)
        assert store.suppress(entries) == len(new)
    assert (
        store.suppressed(["a@example.com", "b@example.com", "c@example.com", "d@example.com"])
        == first
    )
    assert [e.email for e in store.list_suppressions(limit=10)] == sorted(first)


# --- the service ------------------------------------------------------------------------------


def test_add_keeps_the_first_entry_and_remove_needs_a_listed_address() -> None:
    app = fake_app()
    added = app.suppression.add("Jane.Doe@Example.COM", "bounced", task_id="c1-4")
    assert added.new and added.entry == Suppression("jane.doe@example.com", R.BOUNCED, "c1-4", T0)
    again = app.suppression.add("JANE.DOE@example.com")
    assert (again.new, again.entry.reason) == (False, R.BOUNCED)
    assert app.suppression.get("jane.doe@EXAMPLE.com") == added.entry
    assert app.suppression.remove("Jane.Doe@example.com") == "jane.doe@example.com"
    with pytest.raises(NotFound):
        app.suppression.remove("jane.doe@example.com")
    with pytest.raises(InvalidField) as info:
        app.suppression.add("jane@example.com", "spam")
    assert info.value.field == "reason"
    with pytest.raises(InvalidField) as info:
        app.suppression.page(limit=0)
    assert info.value.field == "limit"


def test_import_reports_every_bad_row_and_imports_nothing() -> None:
    app = fake_app()
    text = "email,reason\nok@example.com,bounced\nnot-an-address,manual\nb@example.com,spam\n"
    with pytest.raises(InvalidInput) as info:
        app.suppression.import_csv(text)
    assert [(p.row, p.field) for p in info.value.errors] == [(3, "email"), (4, "reason")]
    assert app.suppression.count() == 0


def test_a_task_id_longer_than_the_stores_keep_is_a_bad_row() -> None:
    app = fake_app()
    text = f"email,task_id\nok@example.com,t-1\nb@example.com,{'x' * 201}\n"
    with pytest.raises(InvalidInput) as info:
        app.suppression.import_csv(text)
    assert [(p.row, p.field) for p in info.value.errors] == [(3, "task_id")]
    assert app.suppression.count() == 0


def test_import_needs_an_email_column() -> None:
    with pytest.raises(InvalidField) as info:
        parse_csv("address,reason\na@example.com,manual\n", now=T0)
    assert info.value.field == "file"
    with pytest.raises(InvalidField):
        parse_csv("\n\n", now=T0)


def test_export_then_import_round_trips() -> None:
    app = fake_app()
    text = (
        "\ufeffEmail,Reason,other\n"
        "B@example.com,Bounced,x\n"
        "a@example.com,,y\n"
        "\n"
        "b@example.com,complained,z\n"  # repeated: the first row wins
    )
    imported = app.suppression.import_csv(text)
    assert (imported.rows, imported.added, imported.kept) == (3, 2, 1)
    exported = "".join(to_csv(app.suppression.all(page=1)))
    assert exported == (
        "email,reason,task_id,at\n"
        "a@example.com,manual,,2026-12-01T08:00:00Z\n"
        "b@example.com,bounced,,2026-12-01T08:00:00Z\n"
    )
    other = fake_app(clock=FakeClock(T0 + timedelta(days=3)))
    assert other.suppression.import_csv(exported).added == 2
    assert list(other.suppression.all()) == list(app.suppression.all())


def test_what_the_csv_module_cannot_read_is_an_invalid_field_with_its_row() -> None:
    # A lone CR is a line break (schemathesis found it a 500 before newline=""):
    with pytest.raises(InvalidField) as info:
        parse_csv("\rN", now=T0)
    assert (info.value.field, info.value.reason) == ("file", "no email column in the header row")
    # a cell past the csv module's field limit in the second record; the limit is
    # process-wide and a recipient import raises it, so pin the default (128 KiB) here
    limit = csv.field_size_limit(131_072)
    try:
        with pytest.raises(InvalidField) as info:
            parse_csv("email\n" + "a" * 200_000 + "\n", now=T0)
    finally:
        csv.field_size_limit(limit)
    assert (info.value.field, info.value.row) == ("file", 2)
    assert info.value.reason.startswith("malformed CSV (field larger than field limit")


def test_a_cell_within_a_raised_csv_limit_is_still_a_bad_row_naming_it() -> None:
    limit = csv.field_size_limit(10_000_000)  # as after a recipient import in this process
    try:
        with pytest.raises(InvalidInput) as info:
            parse_csv("email\n" + "a" * 200_000 + "\n", now=T0)
    finally:
        csv.field_size_limit(limit)
    assert [(p.row, p.field) for p in info.value.errors] == [(2, "email")]


def test_an_import_with_a_bad_time_names_the_row() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_csv("email,at\na@example.com,yesterday\n", now=T0)
    assert [(p.row, p.field) for p in info.value.errors] == [(2, "at")]


# --- provisioning -----------------------------------------------------------------------------


def _create(app: Container, count: int) -> str:
    return app.campaign_import.create(
        name="s", recipients=csv_bytes(count), policy=open_policy(), from_addr="n@example.com"
    ).campaign.id


def _schedules(app: Container, cid: str) -> set[str]:
    return {s.name for s in app.scheduler.list(schedule_group(cid), limit=10_000)}


def test_a_suppressed_recipient_is_created_cancelled_with_no_schedule() -> None:
    app = fake_app()
    app.suppression.add("USER1@example.com", "unsubscribed")
    app.suppression.add("user3@example.com", "bounced")
    cid = _create(app, 5)
    report = app.provisioner.provision(cid)
    assert (report.status, report.tasks_created, report.schedules_created) == ("done", 5, 3)
    assert report.suppressed == 2
    tasks = app.store.list_tasks(cid)
    assert [(t.state, t.reason) for t in tasks] == [
        (TaskState.PENDING, None),
        (TaskState.CANCELLED, "suppressed: unsubscribed"),
        (TaskState.PENDING, None),
        (TaskState.CANCELLED, "suppressed: bounced"),
        (TaskState.PENDING, None),
    ]
    assert _schedules(app, cid) == {
        expected_schedule_name(t) for t in tasks if t.state is TaskState.PENDING
    }
    assert campaign_dict(app.store, app.store.get_campaign(cid))["suppressed"] == 2


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_crashed_provisioning_resumes_with_the_same_cancelled_tasks(n: int) -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    scheduler = FakeScheduler(clock)
    crashing = fake_app(
        clock=clock, store=CrashAfter(store, "insert_tasks", n), scheduler=scheduler
    )
    for i in range(0, 2500, 7):
        crashing.suppression.add(f"user{i}@example.com", "complained")
    cid = _create(crashing, 2500)
    with pytest.raises(StoreCrash):
        crashing.provisioner.provision(cid)
    clock.advance(seconds=61)  # the crashed run's lease expires
    fresh = fake_app(clock=clock, store=store, scheduler=scheduler)
    report = fresh.provisioner.provision(cid)
    assert report.status == "done"
    suppressed = set(range(0, 2500, 7))
    tasks = store.list_tasks(cid, limit=5000)
    assert len(tasks) == 2500
    assert {t.position for t in tasks if t.state is TaskState.CANCELLED} == suppressed
    assert all(t.reason == "suppressed: complained" for t in tasks if t.position in suppressed)
    assert _schedules(fresh, cid) == {
        expected_schedule_name(t) for t in tasks if t.state is TaskState.PENDING
    }
    assert report.suppressed == len(suppressed)


def test_a_campaign_whose_every_recipient_is_suppressed_completes() -> None:
    app = fake_app()
    for i in range(3):
        app.suppression.add(f"user{i}@example.com")
    cid = _create(app, 3)
    assert app.provisioner.provision(cid).schedules_created == 0
    # at once: no schedule will fire to complete it, and the reconciler may be 30 min away
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


# --- the send worker --------------------------------------------------------------------------


def test_an_address_suppressed_after_provisioning_is_cancelled_not_sent() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer)
    cid = _create(app, 3)
    app.provisioner.provision(cid)
    app.suppression.add("User1@Example.com", "replied")
    clock.advance(days=1)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(app.invoke)
    assert sorted(m.to_addr for m in mailer.sent) == ["user0@example.com", "user2@example.com"]
    task = app.store.get_task(f"{cid}-1")
    assert task is not None
    assert (task.state, task.reason, task.attempts) == (
        TaskState.CANCELLED,
        "suppressed: replied",
        0,
    )
    notes = [e.note for e in app.store.changes_after(0, campaign_id=cid) if e.task_id == task.id]
    assert notes[-1] == "suppressed: replied"
    # Nothing was left to send: the campaign completed with its last invocation.
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_a_suppressed_task_already_changed_by_someone_else_is_left_alone() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, 1)
    app.provisioner.provision(cid)
    task = app.store.list_tasks(cid)[0]
    app.suppression.add("user0@example.com")
    app.campaign_controls.cancel_task(task.id)
    app.worker.send({"kind": "send", "task_id": task.id, "token": task.token})
    stored = app.store.get_task(task.id)
    assert stored is not None and (stored.state, stored.reason) == (TaskState.CANCELLED, None)
