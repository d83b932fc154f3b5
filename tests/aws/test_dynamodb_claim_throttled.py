"""DynamoDB: a claim whose transaction is throttled (or hits a TransactionConflict) once reads
the task again and claims it while the rule allows, as ``transition`` does; it answers TAKEN
only when someone else took the task (else the worker would skip a task nobody claimed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.adapters.dynamodb.client import Retry
from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.domain.lifecycle import CampaignState, TaskState
from tests.contract.store_backends import T0, with_tasks
from tests.contract.test_send_claim import LATER
from tests.support.aws import dynamodb_backend


def test_a_throttled_claim_is_tried_again(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    opened = dynamodb_backend(request, tmp_path).open()
    assert isinstance(opened, DynamoDbTaskStore)
    store = opened
    with_tasks(store, count=1)
    store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    store.set_campaign_state("c1", {CampaignState.PROVISIONING}, CampaignState.ACTIVE, at=T0)
    task = store.get_task("c1-0")
    assert task is not None
    real = store._transact
    calls = []

    def throttled_once(items):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise Retry([{"Code": "ThrottlingError"}, {"Code": "None"}])
        return real(items)

    store._transact = throttled_once  # type: ignore[method-assign]
    got = store.claim_for_send(task.id, token=task.token, at=LATER, due_by=LATER, not_before=T0)
    current = store.get_task(task.id)
    assert current is not None
    assert got.claimed, f"refused {got.refused} while the task is {current.state.value}"
    assert current.state is TaskState.RUNNING
