"""The campaign services by use, wired once in the composition root: one capacity planner and
one re-planner serve the controls, provisioning, the send worker and the reconciler, and the
send path loads nothing of creating or previewing a campaign."""

from __future__ import annotations

import subprocess
import sys

from tests.support.app import csv_bytes, fake_app, open_policy

SEND_PATH = (
    "sendqueue.services.sending.worker",
    "sendqueue.services.scheduling.reconciler",
    "sendqueue.services.scheduling.provisioning",
    "sendqueue.services.campaigns.controls",
)
NOT_ON_THE_SEND_PATH = (
    "sendqueue.services.campaigns.creation",
    "sendqueue.services.importing.csv_source",
    "sendqueue.services.importing.rows",
    "sendqueue.services.importing.stream",
    "sendqueue.services.importing.recipients",
    "sendqueue.services.campaigns.preview",
)


def test_the_send_path_loads_nothing_of_the_import_or_the_previews() -> None:
    # In a child: this process has imported everything already.
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in SEND_PATH)
        + f"print(sorted(set({NOT_ON_THE_SEND_PATH!r}) & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_one_capacity_planner_and_one_replanner_serve_every_service() -> None:
    app = fake_app()
    capacity, replanner = app.capacity, app.replanner

    assert app.worker._capacity is capacity
    assert app.worker._replanner is replanner
    assert app.worker._recovery is app.recovery
    assert app.reconciler._capacity is capacity
    assert app.reconciler._replanner is replanner
    assert app.reconciler._recovery is app.recovery
    assert app.provisioner._capacity is capacity
    assert app.campaign_controls._capacity is capacity
    assert app.campaign_controls._replanner is replanner
    assert app.recovery._replanner is replanner
    assert replanner._capacity is capacity
    assert app.campaign_previews._capacity is capacity
    assert app.worker._campaigns is app.campaign_controls
    assert app.reconciler._campaigns is app.campaign_controls


def test_starting_provisioning_drops_the_campaigns_cached_previews() -> None:
    app = fake_app()
    kept = app.campaign_import.create(
        name="kept", recipients=csv_bytes(3), policy=open_policy()
    ).campaign.id
    started = app.campaign_import.create(
        name="started", recipients=csv_bytes(3), policy=open_policy()
    ).campaign.id
    app.campaign_previews.preview_summary(kept)
    app.campaign_previews.preview_summary(started)

    app.campaign_controls.start_provisioning(started)

    cached = {key[0] for key in app.campaign_previews._previews}
    assert cached == {kept}
