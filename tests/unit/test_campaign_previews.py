"""A campaign's preview: its plan from now, nothing written."""

from __future__ import annotations

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.policy import SendingPolicy
from tests.support.app import csv_bytes, fake_app


def test_preview_plans_from_now_without_writing() -> None:
    app = fake_app()
    cid = app.campaign_import.create(
        name="p", recipients=csv_bytes(5), policy=SendingPolicy(per_day=2)
    ).campaign.id
    pairs = app.campaign_previews.preview(cid)
    assert [r.email for r, _ in pairs] == [f"user{i}@example.com" for i in range(5)]
    assert app.store.count_tasks(cid)[TaskState.PENDING] == 0
    assert app.store.get_campaign(cid).state is CampaignState.DRAFT
