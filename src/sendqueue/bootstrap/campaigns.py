"""The composition root's part for campaigns: the capacity planner and the re-planner, built
once and given to every service that books or moves sends (the campaign controls, provisioning,
the send worker, the reconciler), and the campaign services by use: creating one (the import),
its preview, its controls. Apart from :mod:`sendqueue.bootstrap` only to keep each module
short; the container's properties of the same names are the way in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sendqueue.services.campaigns.controls import CampaignControls
from sendqueue.services.campaigns.creation import CampaignImport
from sendqueue.services.campaigns.preview import CampaignPreviews
from sendqueue.services.importing.recipients import ImportLimits
from sendqueue.services.planning.capacity import CapacityPlanner
from sendqueue.services.planning.recovery import Recovery
from sendqueue.services.planning.replanning import Replanner
from sendqueue.services.scheduling.provisioning import Provisioner
from sendqueue.services.scheduling.reconciler import Reconciler
from sendqueue.services.sending.worker import SendWorker
from sendqueue.services.sequences.away import AwayDates
from sendqueue.services.sequences.editing import SequenceEditor
from sendqueue.services.sequences.first import FollowUpsFirst
from sendqueue.services.sequences.followups import FollowUps
from sendqueue.services.sequences.render import StepRenderer

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = [
    "away_dates",
    "campaign_controls",
    "campaign_import",
    "campaign_previews",
    "capacity",
    "followups",
    "provisioner",
    "reconciler",
    "recovery",
    "replanner",
    "sequence_editor",
    "worker",
]


def capacity(c: Container) -> CapacityPlanner:
    return CapacityPlanner(c.stores.tasks, c.stores.senders)


def replanner(c: Container) -> Replanner:
    return Replanner(c.stores.tasks, c.writer, c.clock, c.layer_config, capacity=c.capacity)


def _step_renderer() -> StepRenderer:
    """A later step is held to the import's limits, as step 1 was."""
    limits = ImportLimits()
    return StepRenderer(
        limits.templates,
        max_subject_chars=limits.max_subject_chars,
        max_body_chars=limits.max_field_chars,
    )


def followups(c: Container) -> FollowUps:
    first = FollowUpsFirst(c.stores.tasks, c.replanner, c.capacity, c.writer, c.clock)
    return FollowUps(
        c.store,
        c.suppressions,
        c.replanner,
        c.writer,
        _step_renderer(),
        first,
        c.stores.feedback,
    )


def sequence_editor(c: Container) -> SequenceEditor:
    return SequenceEditor(c.store, c.clock, c.replanner, c.followups, _step_renderer())


def away_dates(c: Container) -> AwayDates:
    return AwayDates(c.stores.tasks, c.replanner, c.capacity, c.writer, c.clock)


def recovery(c: Container) -> Recovery:
    return Recovery(c.stores.tasks, c.replanner, c.clock, c.layer_config)


def campaign_import(c: Container) -> CampaignImport:
    return CampaignImport(c.stores.tasks, c.clock, c.layer_config, senders=c.senders)


def campaign_previews(c: Container) -> CampaignPreviews:
    return CampaignPreviews(c.stores.tasks, c.capacity, c.clock)


def campaign_controls(c: Container) -> CampaignControls:
    """The controls; a campaign that starts provisioning drops its cached previews."""
    return CampaignControls(
        c.stores.tasks,
        c.writer,
        c.clock,
        replanner=c.replanner,
        capacity=c.capacity,
        on_provisioning=c.campaign_previews.forget,
    )


def provisioner(c: Container) -> Provisioner:
    return Provisioner(
        c.stores.tasks,
        c.scheduler,
        c.writer,
        c.clock,
        c.config,
        suppressions=c.suppressions,
        capacity=c.capacity,
    )


def worker(c: Container) -> SendWorker:
    return SendWorker(
        c.stores.tasks,
        c.mailer,
        c.writer,
        c.campaign_controls,
        c.clock,
        c.layer_config,
        replanner=c.replanner,
        capacity=c.capacity,
        recovery=c.recovery,
        senders=c.senders,
        events=c.events,
        alarm=c.alarm,
        mailer_for=c.mailer_for,
        followups=c.followups,
        follow_up_linger=_follow_up_linger(c),
    )


def _follow_up_linger(c: Container) -> float | None:
    """None (inline) on the eventbridge layer, whose Lambda may be frozen between
    invocations, and when set to 0; else the setting."""
    linger = c.settings.follow_up_linger
    return None if c.settings.execution == "eventbridge" or linger == 0 else linger


def reconciler(c: Container) -> Reconciler:
    return Reconciler(
        c.stores.tasks,
        c.scheduler,
        c.writer,
        c.campaign_controls,
        c.provisioner,
        c.clock,
        c.config,
        replanner=c.replanner,
        capacity=c.capacity,
        recovery=c.recovery,
        events=c.events,
        followups=c.followups,
    )
