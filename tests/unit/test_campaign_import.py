"""Creating a campaign: whole or not at all, stored as a draft."""

from __future__ import annotations

import pytest

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import Step
from sendqueue.services.importing.recipients import Templates
from tests.support.app import csv_bytes, fake_app


def test_create_validates_everything_and_creates_nothing_on_error() -> None:
    app = fake_app()
    bad = b"email,name,subject,body\nok@example.com,A,s,b\nnot-an-address,B,s,b\n"
    with pytest.raises(InvalidInput) as info:
        app.campaign_import.create(name="x", recipients=bad, policy=SendingPolicy())
    assert info.value.errors[0].row == 3 and info.value.errors[0].field == "email"
    with pytest.raises(InvalidField, match="name"):
        app.campaign_import.create(name="  ", recipients=csv_bytes(1), policy=SendingPolicy())
    with pytest.raises(InvalidField, match="from"):
        app.campaign_import.create(
            name="x", recipients=csv_bytes(1), policy=SendingPolicy(), from_addr="nobody"
        )
    with pytest.raises(InvalidField, match="reply_to"):
        app.campaign_import.create(
            name="x", recipients=csv_bytes(1), policy=SendingPolicy(), reply_to="a@b\nBcc: x@y.com"
        )
    assert app.store.list_campaigns() == []


def test_create_stores_a_draft_with_normalised_sender() -> None:
    app = fake_app()
    created = app.campaign_import.create(
        name=" Launch ",
        recipients=csv_bytes(3),
        policy=SendingPolicy(),
        from_addr="Team <TEAM@Example.com>",
    )
    campaign = created.campaign
    assert (campaign.name, campaign.state, campaign.recipient_count) == (
        "Launch",
        CampaignState.DRAFT,
        3,
    )
    assert campaign.from_addr == "Team <TEAM@example.com>"
    assert app.store.count_tasks(campaign.id)[TaskState.PENDING] == 0


def test_a_campaign_from_templates_keeps_them_as_its_first_step() -> None:
    app = fake_app()
    rows = b"email,name\na@example.com,Ann\n"
    created = app.campaign_import.create(
        name="x",
        recipients=rows,
        policy=SendingPolicy(),
        templates=Templates(subject="Hi {{ name }}", body="Dear {{ name }}\n", html="  "),
    )
    stored = app.store.get_campaign(created.campaign.id)
    assert stored.steps == (Step(1, "Hi {{ name }}", "Dear {{ name }}\n", None, None),)


def test_a_campaign_whose_rows_carry_their_text_has_no_stored_step() -> None:
    app = fake_app()
    created = app.campaign_import.create(name="x", recipients=csv_bytes(2), policy=SendingPolicy())
    assert app.store.get_campaign(created.campaign.id).steps == ()
