"""Editing a running sequence on fakes and a fake clock: a step's text changed while some of
its emails are sent and others Pending, a step added to a completed campaign, bad templates
refused with nothing changed."""

from __future__ import annotations

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import Conflict, IllegalTransition, InvalidField
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Task, expected_schedule_name, task_id
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.ports import OutgoingMessage
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, fake_app, open_policy

ROWS = b"email,name,city\na@example.com,Ann,Oslo\nb@example.com,Ben,Rome\n"

STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts, {{ name }}?\n", None, parse_delay("1d")),
    Step(3, "Last note from {{ city }}", "Bye\n", "<p>Bye</p>", parse_delay("2h")),
)


def _create(app: Container, steps: tuple[Step, ...] = STEPS) -> str:
    created = app.campaign_import.create(
        name="seq", recipients=ROWS, policy=open_policy(), from_addr="n@example.com", steps=steps
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _scheduler(app: Container) -> FakeScheduler:
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    return scheduler


def _fire(app: Container) -> int:
    return _scheduler(app).fire_due(app.invoke)


def _task(app: Container, cid: str, position: int, step: int) -> Task:
    task = app.store.get_task(task_id(cid, position, step))
    assert task is not None
    return task


def _sent(app: Container, to: str) -> list[OutgoingMessage]:
    mailer = app.mailer
    assert isinstance(mailer, RecordingMailer)
    return [m for m in mailer.sent if m.to_addr == to]


def test_editing_step_2_re_renders_its_pending_emails_and_keeps_the_sent_ones() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    assert _fire(app) == 2
    # Ben's step 2 misses its firing: Pending while Ann's goes out
    assert _scheduler(app).lose(expected_schedule_name(_task(app, cid, 1, 2)))
    clock.advance(days=1)
    assert _fire(app) == 1
    ann_before = _task(app, cid, 0, 2)
    ben_before = _task(app, cid, 1, 2)
    assert (ann_before.state, ben_before.state) == (TaskState.FINISHED, TaskState.PENDING)

    done = app.sequence_editor.update_step(
        cid, 2, subject="Still there, {{ name }}?", text="New words for {{ city }}\n"
    )

    assert (done.rerendered, done.cancelled) == (1, 0)
    assert done.step == Step(
        2, "Still there, {{ name }}?", "New words for {{ city }}\n", None, parse_delay("1d")
    )
    assert app.store.get_campaign(cid).steps == (STEPS[0], done.step, STEPS[2])
    ben = _task(app, cid, 1, 2)
    assert (ben.subject, ben.text) == ("Still there, Ben?", "New words for Rome\n")
    assert (ben.token, ben.send_at, ben.state) == (ben_before.token, ben_before.send_at, ben.state)
    assert _task(app, cid, 0, 2) == ann_before  # sent: its snapshot stays
    assert _sent(app, "a@example.com")[1].text == "Any thoughts, Ann?\n"
    notes = [e.note for e in app.store.changes_after(0, campaign_id=cid, limit=100)]
    assert notes.count("re-rendered: step 2 edited") == 1

    app.reconciler.run()  # Ben's lost schedule is made again, with the task's token
    assert _fire(app) == 1
    ben_mail = _sent(app, "b@example.com")[1]
    assert (ben_mail.subject, ben_mail.text) == ("Still there, Ben?", "New words for Rome\n")


def test_editing_step_1_re_renders_it_before_it_goes_out() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)

    done = app.sequence_editor.update_step(cid, 1, html="<p>Hi {{ name }}</p>")

    assert done.rerendered == 2
    assert _task(app, cid, 0, 1).html == "<p>Hi Ann</p>"
    assert _task(app, cid, 0, 1).subject == "Hello Ann"  # what was not given is kept
    clock.advance(hours=1)
    _fire(app)
    assert _sent(app, "b@example.com")[0].html == "<p>Hi Ben</p>"


def test_a_later_step_made_from_a_stale_campaign_is_made_as_edited() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    _fire(app)
    stale = app.store.get_campaign(cid)  # as a worker read it before the edit
    app.sequence_editor.update_step(cid, 3, text="Edited bye, {{ name }}\n")
    second = _task(app, cid, 0, 2)
    app.store.transition(second.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now())
    app.store.transition(
        second.id, TaskState.RUNNING, TaskState.FINISHED, at=clock.now(),
        changes={"sent_at": clock.now()},
    )  # fmt: skip
    sent = _task(app, cid, 0, 2)

    made = app.followups.after_sent(stale, sent, sent_at=clock.now())

    assert made is not None and made.text == "Edited bye, Ann\n"


def test_a_step_added_to_a_completed_campaign_reaches_those_who_finished_without_an_answer() -> (
    None
):
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    clock.advance(hours=1)
    _fire(app)
    first = _task(app, cid, 0, 1)
    app.feedback.apply(Feedback(FeedbackKind.REPLY, clock.now(), task_id=first.id, detail="hi"))
    clock.advance(days=2)
    _fire(app)
    clock.advance(days=1)
    _fire(app)
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert _task(app, cid, 1, 3).state is TaskState.FINISHED

    added = app.sequence_editor.add_step(cid, text="One more, {{ name }}\n", after="1h")

    assert (added.made, added.reopened) == (1, True)
    assert added.step == Step(4, None, "One more, {{ name }}\n", None, parse_delay("1h"))
    assert app.store.get_campaign(cid).steps == (*STEPS, added.step)
    assert app.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert app.store.get_task(task_id(cid, 0, 4)) is None  # Ann answered
    fourth = _task(app, cid, 1, 4)
    assert fourth.state is TaskState.PENDING and fourth.text == "One more, Ben\n"
    clock.advance(hours=2)
    assert _fire(app) == 1
    mail = _sent(app, "b@example.com")
    assert mail[3].subject == "Re: Hello Ben"
    assert mail[3].headers["In-Reply-To"] == _task(app, cid, 1, 3).message_id
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_a_step_nobody_gets_leaves_a_completed_campaign_completed() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, STEPS[:1])
    clock.advance(hours=1)
    _fire(app)
    for position in (0, 1):
        task = _task(app, cid, position, 1)
        app.feedback.apply(Feedback(FeedbackKind.REPLY, clock.now(), task_id=task.id))
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    last = app.store.last_change_id()

    added = app.sequence_editor.add_step(cid, text="Hello again\n", after="2d", new_thread=True)

    assert (added.made, added.reopened) == (0, False)
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
    assert app.store.changes_after(last, campaign_id=cid) == []  # no reopen, no 2nd completion
    assert len(app.store.get_campaign(cid).steps) == 2


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"number": 2, "text": "Hi {{ missing }}\n"}, "steps[2].text"),
        ({"number": 2, "subject": "{{ 1 / 0 }}"}, "steps[2].subject"),
        ({"number": 3, "html": "<p>{{ </p>"}, "steps[3].html"),
        ({"number": 1, "subject": None}, "steps[1].subject"),
        ({"number": 2, "text": "   "}, "steps[2].text"),
        ({"number": 4, "text": "x\n"}, "number"),
    ],
)
def test_a_bad_update_is_refused_naming_the_field_and_nothing_changes(
    edit: dict[str, object], field: str
) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    before = app.store.list_tasks(cid, limit=100)
    number = edit.pop("number")
    assert isinstance(number, int)

    with pytest.raises(InvalidField) as info:
        app.sequence_editor.update_step(cid, number, **edit)  # type: ignore[arg-type]

    assert info.value.field == field
    assert app.store.get_campaign(cid).steps == STEPS
    assert app.store.list_tasks(cid, limit=100) == before


@pytest.mark.parametrize(
    ("add", "field"),
    [
        ({"text": "{{ nope }}\n", "after": "1d"}, "steps[4].text"),
        ({"text": "x\n", "subject": "{% if %}", "after": "1d"}, "steps[4].subject"),
        ({"text": "x\n", "after": "0d"}, "steps[4].after"),
        ({"text": "x\n", "after": "3"}, "steps[4].after"),
        ({"text": "", "after": "1d"}, "steps[4].text"),
    ],
)
def test_a_bad_step_is_not_added(add: dict[str, str], field: str) -> None:
    app = fake_app()
    cid = _create(app)

    with pytest.raises(InvalidField) as info:
        app.sequence_editor.add_step(cid, **add)  # type: ignore[arg-type]

    assert info.value.field == field
    assert app.store.get_campaign(cid).steps == STEPS


def test_an_eleventh_step_is_refused() -> None:
    app = fake_app()
    steps = (STEPS[0], *(Step(k, None, "x\n", None, parse_delay("1d")) for k in range(2, 11)))
    cid = _create(app, steps)
    with pytest.raises(InvalidField) as info:
        app.sequence_editor.add_step(cid, text="x\n", after="1d")
    assert info.value.field == "steps"


def test_a_cancelled_campaign_or_a_finished_step_is_not_edited() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app, STEPS[:2])
    clock.advance(hours=1)
    _fire(app)
    with pytest.raises(IllegalTransition):  # every step-1 email is sent
        app.sequence_editor.update_step(cid, 1, text="Too late\n")
    app.campaign_controls.cancel(cid)
    with pytest.raises(IllegalTransition):
        app.sequence_editor.update_step(cid, 2, text="Too late\n")
    with pytest.raises(IllegalTransition):
        app.sequence_editor.add_step(cid, text="Too late\n", after="1d")
    assert app.store.get_campaign(cid).steps == STEPS[:2]


def test_a_pending_email_whose_row_the_new_template_fails_for_is_cancelled() -> None:
    app = fake_app()
    rows = b"email,name,n\na@example.com,Ann,2\nb@example.com,Ben,0\n"
    steps = (Step(1, "Hi {{ name }}", "x\n", None, None),)
    cid = app.campaign_import.create(
        name="s", recipients=rows, policy=open_policy(), steps=steps
    ).campaign.id
    app.provisioner.provision(cid)

    done = app.sequence_editor.update_step(cid, 1, text="{{ 10 // (n | int) }}\n")

    assert (done.rerendered, done.cancelled) == (1, 1)
    assert _task(app, cid, 0, 1).text == "5\n"
    ben = _task(app, cid, 1, 1)
    assert ben.state is TaskState.CANCELLED
    assert ben.reason is not None and "template failed" in ben.reason


def test_an_unchanged_update_changes_nothing() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    before = app.store.get_campaign(cid)
    clock.advance(minutes=5)
    done = app.sequence_editor.update_step(cid, 2, text=STEPS[1].text)
    assert (done.rerendered, done.cancelled, done.step) == (0, 0, STEPS[1])
    assert app.store.get_campaign(cid).updated_at == before.updated_at


def test_an_edit_that_loses_to_another_is_applied_to_the_steps_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = fake_app()
    cid = _create(app)
    store = app.store
    real = store.get_campaign
    raced: list[bool] = []

    def racing(campaign_id: str) -> Campaign:
        read = real(campaign_id)
        if not raced:  # another editor changes step 3 between this edit's read and its write
            raced.append(True)
            app.sequence_editor.update_step(cid, 3, text="Edited elsewhere\n")
        return read

    monkeypatch.setattr(store, "get_campaign", racing)
    app.sequence_editor.update_step(cid, 2, text="Edited here\n")

    steps = store.get_campaign(cid).steps
    assert (steps[1].text, steps[2].text) == ("Edited here\n", "Edited elsewhere\n")


def test_an_edit_that_keeps_losing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    app = fake_app()
    cid = _create(app)
    monkeypatch.setattr(app.store, "replace_steps", lambda *a, **k: False)
    with pytest.raises(Conflict):
        app.sequence_editor.add_step(cid, text="x\n", after="1d")


def test_step_1_keeps_what_a_rows_own_cell_gave_it() -> None:
    app = fake_app()
    rows = b"email,name,subject\na@example.com,Ann,\nb@example.com,Ben,My own subject\n"
    steps = (Step(1, "Hi {{ name }}", "Text {{ name }}\n", None, None),)
    cid = app.campaign_import.create(
        name="s", recipients=rows, policy=open_policy(), steps=steps
    ).campaign.id
    app.provisioner.provision(cid)
    assert _task(app, cid, 1, 1).subject == "My own subject"

    done = app.sequence_editor.update_step(
        cid, 1, subject="Hey {{ name }}", text="New {{ name }}\n"
    )

    assert done.rerendered == 2
    ann, ben = _task(app, cid, 0, 1), _task(app, cid, 1, 1)
    assert (ann.subject, ann.text) == ("Hey Ann", "New Ann\n")
    assert (ben.subject, ben.text) == ("My own subject", "New Ben\n")
    app.sequence_editor.update_step(cid, 1, subject="Hello {{ name }}")  # a second edit
    assert _task(app, cid, 0, 1).subject == "Hello Ann"
    assert _task(app, cid, 1, 1).subject == "My own subject"


# Each under the 64 KB a subject and body may hold together, the two past it (Jinja comments:
# they render short, so only the source's size is wrong).
LONG_SUBJECT = "{#" + "s" * 40_000 + "#}Last"
LONG_TEXT = "{#" + "t" * 30_000 + "#}Bye\n"


def test_parts_that_pass_alone_but_not_together_are_refused_naming_the_text() -> None:
    app = fake_app()
    cid = _create(app)

    with pytest.raises(InvalidField) as info:
        app.sequence_editor.update_step(cid, 3, subject=LONG_SUBJECT, text=LONG_TEXT)
    assert info.value.field == "steps[3].text"
    with pytest.raises(InvalidField) as info:
        app.sequence_editor.add_step(cid, subject=LONG_SUBJECT, text=LONG_TEXT, after="1d")
    assert info.value.field == "steps[4].text"
    assert app.store.get_campaign(cid).steps == STEPS


def test_a_stored_step_that_no_longer_compiles_ends_the_sequence_with_its_reason() -> None:
    # a step stored under a larger SENDQUEUE_MAX_TEMPLATE_BYTES than the worker's now
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = _create(app)
    too_big = Step(2, LONG_SUBJECT, LONG_TEXT, None, parse_delay("1d"))
    assert app.store.replace_steps(cid, STEPS, (STEPS[0], too_big, STEPS[2]), at=T0)
    clock.advance(hours=1)

    assert _fire(app) == 2  # step 1 goes out; the next step cannot be made from its templates

    step_2 = _task(app, cid, 0, 2)
    assert step_2.state is TaskState.CANCELLED
    assert step_2.reason is not None and "step 2: template failed" in step_2.reason
    assert app.reconciler.run() is not None
    assert app.store.get_campaign(cid).state is CampaignState.COMPLETED
