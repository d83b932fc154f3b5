"""What the alarm tells a person: dead letters and auto-paused campaigns, and the digest email.

Pure: the alarm adapters (:mod:`sendqueue.adapters.alarm`, :mod:`sendqueue.adapters.alarm_mail`)
decide when to send; this module decides what the email says. A :class:`Digest` gathers the
alarms that one email reports; it keeps the first ``max_items`` in full and only counts the
rest, so a storm of dead letters cannot grow a process's memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from sendqueue.domain.models import DeadLetter
from sendqueue.domain.wording import plural

__all__ = [
    "AUTO_PAUSE_PREFIX",
    "AlarmItem",
    "AutoPause",
    "Digest",
    "auto_pause_reason",
    "is_auto_paused",
]

#: How the state reason of a campaign paused by the send worker begins (the web banner and the
#: alarm tell these apart from pauses a person made).
AUTO_PAUSE_PREFIX = "auto-paused after "


def auto_pause_reason(failures: int, error: str) -> str:
    """The state reason the send worker gives a campaign it pauses after ``failures``."""
    failed = plural(failures, "failed send")
    return f"{AUTO_PAUSE_PREFIX}{failed} in a row; last error: {error[:300]}"


def is_auto_paused(reason: str | None) -> bool:
    """Whether a paused campaign's state reason says the send worker paused it."""
    return reason is not None and reason.startswith(AUTO_PAUSE_PREFIX)


@dataclass(frozen=True)
class AutoPause:
    """The send worker paused a campaign after too many failed sends in a row."""

    campaign_id: str
    campaign_name: str
    reason: str
    paused_at: datetime


#: One thing the alarm is raised for.
AlarmItem = DeadLetter | AutoPause


@dataclass
class Digest:
    """The alarms one email reports, oldest first: the first ``max_items`` in full, then counts."""

    max_items: int = 20
    items: list[AlarmItem] = field(default_factory=list)
    dead_letters: int = 0
    auto_pauses: int = 0

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError("a digest lists at least one item")

    def __len__(self) -> int:
        return self.dead_letters + self.auto_pauses

    def add(self, item: AlarmItem) -> None:
        if isinstance(item, DeadLetter):
            self.dead_letters += 1
        else:
            self.auto_pauses += 1
        if len(self.items) < self.max_items:
            self.items.append(item)

    def merge(self, later: Digest) -> Digest:
        """This digest followed by ``later`` (a send failed: nothing held back is lost)."""
        merged = Digest(self.max_items, list(self.items))
        merged.dead_letters = self.dead_letters + later.dead_letters
        merged.auto_pauses = self.auto_pauses + later.auto_pauses
        merged.items.extend(later.items[: max(0, self.max_items - len(self.items))])
        return merged

    def subject(self) -> str:
        parts = []
        if self.dead_letters:
            parts.append(plural(self.dead_letters, "dead letter"))
        if self.auto_pauses:
            parts.append(plural(self.auto_pauses, "campaign auto-paused", "campaigns auto-paused"))
        return f"[sendqueue] alarm: {', '.join(parts) or 'nothing'}"

    def text(self, *, interval: float, early: bool = False) -> str:
        """The email's body: what happened, item by item, and what to do about it."""
        minutes = f"{interval / 60:g} minute{'s' if interval != 60 else ''}"
        lines = [f"sendqueue raised {plural(len(self), 'alarm')}:", ""]
        if self.dead_letters:
            lines.append(f"- {plural(self.dead_letters, 'dead letter')}")
        if self.auto_pauses:
            lines.append(
                f"- {plural(self.auto_pauses, 'campaign auto-paused', 'campaigns auto-paused')}"
            )
        lines.append("")
        if len(self) > 1:
            lines += [
                f"At most one alarm email goes out per {minutes}; this one also lists what was "
                "held back since the last one.",
                "",
            ]
        if early:
            lines += [
                "Sent before the interval ended because the process that held these alarms is "
                "stopping.",
                "",
            ]
        for n, item in enumerate(self.items, 1):
            first, *rest = _lines(item)
            lines += [f"{n}. {first}", *(f"   {line}" for line in rest)]
        if len(self) > len(self.items):
            lines.append(f"... and {len(self) - len(self.items)} more not listed here.")
        lines += [
            "",
            "Dead letters: inspect with `sendqueue dlq list` or the web UI's Dead letters page,",
            "then `sendqueue dlq redrive` once the cause is fixed.",
            "Auto-paused campaigns: fix the cause, then `sendqueue campaign resume ID`.",
        ]
        return "\n".join(lines) + "\n"


def _lines(item: AlarmItem) -> list[str]:
    if isinstance(item, DeadLetter):
        return [
            f"Dead letter {item.id} at {item.failed_at.isoformat()}: schedule "
            f"{item.schedule_name} (group {item.group}) gave up after "
            f"{plural(item.attempts, 'attempt')}",
            f"payload {json.dumps(dict(item.payload), sort_keys=True)}",
            f"error: {_one_line(item.error)}",
        ]
    return [
        f"Campaign {item.campaign_id} ({_one_line(item.campaign_name)}) paused at "
        f"{item.paused_at.isoformat()}",
        f"reason: {_one_line(item.reason)}",
    ]


def _one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
