"""Follow-ups first: which first step gives its slot to a follow-up that would stall. Pure.

Provisioning books every recipient's step 1 ahead, so the first free slot after a follow-up's
earliest instant can lie past the whole list. A follow-up is *on time* when it goes out on the
local day of its earliest instant or on the next sending day (:func:`on_time_until`). When the
first free slot is later than that, the follow-up takes the slot of a Pending step-1 task of its
own campaign inside that span (:func:`first_step_to_displace`), and that task moves to the next
free slot.

Taking a slot changes no count the policy or a sender judges: the follow-up goes out at the very
instant the first step would have, from the same sender (and, in a local-time campaign, in the
same timezone, so inside the same windows). Per_day, the sender's cap on that day (warm-up
included), the gaps between sends and the windows are the same as before the swap; the first
step then takes a free slot as any moved email does. Another campaign's tasks are never taken.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from .followups import follow_up_earliest
from .lifecycle import TaskState
from .models import Task
from .policy import SendingPolicy
from .slots import in_policy
from .steps import parse_delay

__all__ = ["first_step_to_displace", "on_time_until"]

_TWO_DAYS = parse_delay("2d")


def on_time_until(policy: SendingPolicy, earliest: datetime, zone: str | None = None) -> datetime:
    """The instant before which a follow-up due at ``earliest`` is on time: the start of the
    second sending day after ``earliest``'s local date (read in ``zone``, else the policy's),
    so every slot of that date and of the next sending day is before it. Raises as
    :func:`~sendqueue.domain.followups.follow_up_earliest` does."""
    return follow_up_earliest(policy, earliest, _TWO_DAYS, zone)


def first_step_to_displace(
    follow_up: Task,
    candidates: Iterable[Task],
    *,
    earliest: datetime,
    until: datetime,
    policy: SendingPolicy,
) -> Task | None:
    """The task among ``candidates`` whose slot ``follow_up`` takes, or None.

    Eligible: a Pending step-1 task of the follow-up's campaign, due in ``[earliest, until)``,
    from the follow-up's sender (both None: the campaign's From), at an instant inside
    ``policy`` (the follow-up's: its recipient's windows in a local-time campaign). Of those,
    one on the earliest local day (in ``policy``'s timezone) is taken first, and on that day
    the newest recipient's (highest position): the list's order is kept as far as it can be."""
    zone = policy.zone
    best: Task | None = None
    best_key: tuple[int, int] = (0, 0)
    for task in candidates:
        if (
            task.step != 1
            or task.state is not TaskState.PENDING
            or task.campaign_id != follow_up.campaign_id
            or not earliest <= task.send_at < until
            or task.sender_id != follow_up.sender_id
        ):
            continue
        key = (-task.send_at.astimezone(zone).date().toordinal(), task.position)
        if (best is None or key > best_key) and in_policy(policy, task.send_at):
            best, best_key = task, key
    return best
