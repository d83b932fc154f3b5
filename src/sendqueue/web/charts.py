"""The charts of the pages, laid out on the server: the stacked progress bar and the bar chart
of planned and done emails per day. ``static/common.js`` draws the very same shapes from the
same numbers when a page updates live; keep both in step (the browser tests compare them).

The senders page's chart of each sender's usage against its cap (:func:`usage_chart`) uses the
day chart's geometry and is drawn on the server only: that page is not live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sendqueue.domain.wording import plural

__all__ = [
    "ChartBar",
    "DayChart",
    "Segment",
    "UsageBar",
    "UsageChart",
    "day_chart",
    "progress_segments",
    "usage_chart",
]


@dataclass(frozen=True)
class Segment:
    """One coloured part of a progress bar (x and width in a 0..1000 viewBox)."""

    state: str
    x: int
    width: int


def progress_segments(counts: Mapping[str, int], total: int) -> list[Segment]:
    """The stacked progress bar: Finished, Failed, Cancelled, then Running (common.js agrees)."""
    segments: list[Segment] = []
    x = 0
    for state in ("Finished", "Failed", "Cancelled", "Running"):
        width = counts.get(state, 0) * 1000 // total if total > 0 else 0
        segments.append(Segment(state, x, width))
        x += width
    return segments


# Geometry of the day chart, in SVG user units. common.js (sq.drawDayChart) draws the very same
# chart from the same rows; keep both in step (the browser tests compare them).
CHART_MAX_BARS = 60
CHART_SLOT = 32
CHART_BAR = 22
CHART_LEFT = 44
CHART_RIGHT = 8
CHART_TOP = 12
CHART_PLOT = 120
CHART_BOTTOM = 28


@dataclass(frozen=True)
class ChartBar:
    x: int
    label_x: int
    label: str
    title: str
    planned_y: int
    planned_h: int
    done_y: int
    done_h: int


@dataclass(frozen=True)
class DayChart:
    """A bar chart of planned and done emails per day, ready for the template."""

    width: int
    height: int
    baseline: int
    left: int
    top: int
    label_y: int
    axis_end: int
    bar_width: int
    peak: int
    bars: list[ChartBar]
    planned: int
    done: int

    @property
    def summary(self) -> str:
        return f"{self.planned} planned and {self.done} sent over {plural(len(self.bars), 'bar')}"


def day_chart(rows: Sequence[Mapping[str, Any]]) -> DayChart:
    """Lay out ``rows`` (``day``, ``planned``, ``done``). More than CHART_MAX_BARS days are
    summed into buckets of consecutive days, so the chart stays readable for long campaigns."""
    buckets: list[tuple[str, str, int, int]] = []
    size = max(1, -(-len(rows) // CHART_MAX_BARS))
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        first, last = str(chunk[0]["day"]), str(chunk[-1]["day"])
        buckets.append(
            (
                first,
                last,
                sum(int(r["planned"]) for r in chunk),
                sum(int(r["done"]) for r in chunk),
            )
        )
    peak = max([1, *(max(b[2], b[3]) for b in buckets)])
    baseline = CHART_TOP + CHART_PLOT
    bars: list[ChartBar] = []
    for i, (first, last, planned, done) in enumerate(buckets):
        x = CHART_LEFT + i * CHART_SLOT + (CHART_SLOT - CHART_BAR) // 2
        planned_h = planned * CHART_PLOT // peak
        done_h = done * CHART_PLOT // peak
        span = first if first == last else f"{first} to {last}"
        bars.append(
            ChartBar(
                x=x,
                label_x=x + CHART_BAR // 2,
                label=first[5:],
                title=f"{span}: {planned} planned, {done} sent",
                planned_y=baseline - planned_h,
                planned_h=planned_h,
                done_y=baseline - done_h,
                done_h=done_h,
            )
        )
    return DayChart(
        width=CHART_LEFT + len(buckets) * CHART_SLOT + CHART_RIGHT,
        height=CHART_TOP + CHART_PLOT + CHART_BOTTOM,
        baseline=baseline,
        left=CHART_LEFT,
        top=CHART_TOP,
        label_y=CHART_TOP + CHART_PLOT + CHART_BOTTOM - 10,
        axis_end=CHART_LEFT + len(buckets) * CHART_SLOT,
        bar_width=CHART_BAR,
        peak=peak,
        bars=bars,
        planned=sum(b[2] for b in buckets),
        done=sum(b[3] for b in buckets),
    )


@dataclass(frozen=True)
class UsageBar:
    """One day of a sender: sent (bottom) and planned (stacked on it), and the cap's mark."""

    x: int
    label_x: int
    label: str
    title: str
    sent_y: int
    sent_h: int
    planned_y: int
    planned_h: int
    cap_y: int


@dataclass(frozen=True)
class UsageChart:
    """A sender's planned and sent emails per local day against the day's cap."""

    width: int
    height: int
    baseline: int
    left: int
    top: int
    label_y: int
    axis_end: int
    bar_width: int
    peak: int
    bars: list[UsageBar]
    planned: int
    sent: int
    cap: int
    """The days' caps added up."""

    @property
    def summary(self) -> str:
        return (
            f"{self.planned} planned and {self.sent} sent over {plural(len(self.bars), 'day')}, "
            f"of {self.cap} the caps allow"
        )


def usage_chart(rows: Sequence[Mapping[str, Any]]) -> UsageChart:
    """Lay out a sender's ``rows`` (``date``, ``planned``, ``sent``, ``cap``), one bar a day
    (at most CHART_MAX_BARS days): the scale reaches the highest cap or day, whichever is more,
    so the cap's mark is always on the chart."""
    days = list(rows)[:CHART_MAX_BARS]
    peak = max([1, *(max(int(r["cap"]), int(r["planned"]) + int(r["sent"])) for r in days)])
    baseline = CHART_TOP + CHART_PLOT
    bars: list[UsageBar] = []
    for i, r in enumerate(days):
        planned, sent, cap = int(r["planned"]), int(r["sent"]), int(r["cap"])
        x = CHART_LEFT + i * CHART_SLOT + (CHART_SLOT - CHART_BAR) // 2
        sent_h = sent * CHART_PLOT // peak
        planned_h = (planned + sent) * CHART_PLOT // peak - sent_h
        day = str(r["date"])
        free = max(0, cap - planned - sent)
        bars.append(
            UsageBar(
                x=x,
                label_x=x + CHART_BAR // 2,
                label=day[5:],
                title=f"{day}: {planned} planned, {sent} sent, cap {cap} ({free} free)",
                sent_y=baseline - sent_h,
                sent_h=sent_h,
                planned_y=baseline - sent_h - planned_h,
                planned_h=planned_h,
                cap_y=baseline - cap * CHART_PLOT // peak,
            )
        )
    return UsageChart(
        width=CHART_LEFT + len(bars) * CHART_SLOT + CHART_RIGHT,
        height=CHART_TOP + CHART_PLOT + CHART_BOTTOM,
        baseline=baseline,
        left=CHART_LEFT,
        top=CHART_TOP,
        label_y=CHART_TOP + CHART_PLOT + CHART_BOTTOM - 10,
        axis_end=CHART_LEFT + len(bars) * CHART_SLOT,
        bar_width=CHART_BAR,
        peak=peak,
        bars=bars,
        planned=sum(int(r["planned"]) for r in days),
        sent=sum(int(r["sent"]) for r in days),
        cap=sum(int(r["cap"]) for r in days),
    )
