"""The capacity planner's inner loop and the state it walks. Pure, no I/O.

:func:`~sendqueue.domain.capacity.plan_with_senders` sets this up and reads the result; this
module places the sends. It is written for speed (docs/performance.md, "Capacity planning"):

- Every instant is an int of milliseconds since the epoch. The only datetimes made are the
  sends' (made once per slot start, which the senders taking it share).
- The grid is :func:`~sendqueue.domain.planner.plan`'s, day by day as ints
  (``planner._grid_ms``), each slot with the end of its real interval, so "the snapped instant
  is still inside the window" is one comparison.
- Local days (the campaign's, each sender's) come from a table of ``[start, end)`` stretches
  per zone (:mod:`~sendqueue.domain.capacity_clock`), shared by everything in that zone and
  looked up by bisection once per day, not an ``astimezone`` per send.
- A zone's lanes (the recipients waiting for one sender) form a ring. A lane in the ring
  always has room on its sender's day: a full sender dozes (out of every ring) until its turn,
  an event at the first instant whose slot start is on its next day. A lane is granted a
  budget of sends (``min(room, recipients left)``, or 1 when its sender serves several zones)
  and counts it down, one number per send; the sender's room is counted when it runs out.
- ``stop`` in :func:`walk` is the first instant at which something must be looked at outside
  the hot loop (a new day, an interval's end, an event, the campaign's day possibly full): the
  loop itself checks one comparison per grid slot.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from .capacity_clock import Instants, Near, ZoneDays
from .errors import NoSendingDay
from .planner import PLANNING_HORIZON_DAYS, _Grid
from .policy import SendingPolicy

if TYPE_CHECKING:
    from .capacity import SenderBook

__all__: list[str] = []  # internal to sendqueue.domain.capacity

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS_DAY = 86_400_000
_ONE_MS = timedelta(milliseconds=1)
#: Later than any instant a plan can reach, in ms (date.max is about 2.5e14 ms).
NEVER = 1 << 62
_HORIZON_MS = PLANNING_HORIZON_DAYS * _MS_DAY


class Sender:
    """A sender while a plan runs: its room on its current local day (as of the last count of
    its lanes' budgets), where that day ends, and the lanes it serves (one per zone)."""

    __slots__ = (
        "book", "day", "day_end", "days", "gap", "lanes", "ng", "ready", "room", "room0", "slots",
        "undo",
    )  # fmt: skip

    def __init__(self, book: SenderBook | None, days: ZoneDays | None) -> None:
        self.book = book
        self.days = days
        self.ready = -NEVER  # a mixed zone skips it before this instant (a slot it was refused)
        self.undo: list[tuple[date, int | None, bool]] = []  # (day, its count, new sending)
        self.day = 0  # the ordinal of the current day
        self.lanes: list[tuple[Zone, Lane]] = []
        if book is None:  # the campaign's own From: no cap, no gap, no day
            self.gap = 1
            self.slots: dict[int, int] = {}
            self.day_end = self.room = self.room0 = NEVER
        else:
            self.gap = book.sender.min_gap_seconds * 1000
            self.slots = book.slots
            self.day_end = -NEVER
            self.room = self.room0 = 0
        # the snapped instant is t // ng * ng: the next slot start at or after t, in one
        # floor division and a product
        self.ng = -self.gap

    @property
    def turn(self) -> int:
        """The first instant whose next slot start lies at or past the end of the current day:
        from it on, the sender sends on a later day."""
        gap = self.gap
        return (-(-self.day_end // gap) - 1) * gap + 1

    def enter(self, at: int) -> None:
        """Move on to the local day of ``at`` (never an earlier one); its lanes are counted."""
        assert self.book is not None
        assert self.days is not None
        _, self.day_end, ordinal = self.days.find(at)
        if ordinal == self.day:
            return  # another piece of the same day (an offset change)
        self.flush()
        self.day = ordinal
        day = date.fromordinal(ordinal)
        # the ramp counts the days flushed before this one: the plan's own earlier days
        self.room = self.room0 = self.book.cap_on(day) - self.book.per_day.get(day, 0)

    def doze(self) -> None:
        """Its day is full: every lane of it, in every zone, out of the ring until its turn."""
        for zone, lane in self.lanes:
            if lane.awake:
                zone.unlink(lane)

    def flush(self) -> None:
        """Write the sends of the current day into the book, which counts it as a sending day
        (undone if the plan fails)."""
        used = self.room0 - self.room
        if used and self.book is not None:
            per_day = self.book.per_day
            day = date.fromordinal(self.day)
            before = per_day.get(day)
            self.undo.append((day, before, self.book.hold(day)))
            per_day[day] = (before or 0) + used
            self.room0 = self.room

    def undo_plan(self) -> None:
        """Take a failed plan's day counts out of the book again."""
        if self.book is not None:
            per_day = self.book.per_day
            for day, before, held in reversed(self.undo):
                if held:
                    self.book.unhold(day)
                if before is None:
                    per_day.pop(day, None)
                else:
                    per_day[day] = before


class Lane:
    """The recipients of one zone waiting for one sender: how many are left, and the send
    instants given to them so far (datetimes, made as they are taken), in recipient order.
    The lanes of a zone form a ring (``next``, ``prev``; ``awake`` while in it): following a
    link is cheaper than an index that wraps around."""

    __slots__ = (
        "awake", "budget", "granted", "left", "next", "placed", "prev", "push", "rank", "sender",
    )  # fmt: skip

    def __init__(self, sender: Sender, rank: int, size: int) -> None:
        self.sender = sender
        self.rank = rank
        self.left = size
        self.placed: list[datetime] = []
        self.push = self.placed.append  # bound once: the hot loop calls it for every send
        self.next = self.prev = self
        self.awake = True
        self.budget = self.granted = 0

    def grant(self) -> None:
        """A new budget: as many sends as the sender's day and the lane allow, counted down
        without touching the sender; 1 when the sender serves other zones too (its room is
        then counted at every send, before another lane of it can send), unless it has no cap
        (the campaign's own From)."""
        sender = self.sender
        sole = len(sender.lanes) <= 1 or sender.book is None
        self.budget = self.granted = max(1, min(sender.room, self.left)) if sole else 1

    def count(self) -> None:
        """Take the sends made on the budget so far off the sender's room and the lane."""
        used = self.granted - self.budget
        self.sender.room -= used
        self.left -= used
        self.granted = self.budget


class Campaign:
    """The campaign's sends per local day of its timezone (ordinal -> count); the current
    day's count is kept apart (a local of the hot loop) while instants stay in it."""

    __slots__ = ("days", "end", "entry", "lent", "ordinal", "per_day", "placed", "since", "used")

    def __init__(self, days: ZoneDays, per_day: int, used: dict[int, int]) -> None:
        self.days = days
        self.per_day = per_day
        self.used = used
        self.ordinal = 0
        self.end = -NEVER  # of the current day's stretch
        self.entry = 0  # the day's count when it was entered
        self.lent = 0  # sends in the hot loop's count that belong to a later day (admit)
        self.placed = 0  # sends placed on the days before the current one
        self.since = (-1, 0)  # (sends placed, a slot after): progress, for the horizon

    def move(self, t: int, count: int) -> int:
        """Store ``count`` as the current day's, move to ``t``'s day, return its count."""
        if self.ordinal:
            self.used[self.ordinal] = count - self.lent
            self.placed += count - self.entry
        self.lent = 0
        _, self.end, self.ordinal = self.days.find(t)
        self.entry = self.used.get(self.ordinal, 0)
        return self.entry

    def admit(self, at: int, near: Near) -> bool:
        """Whether a send at ``at`` fits, when it lies past the current day's stretch or the
        campaign has booked sends to keep away from. A send on a later day is counted there,
        and lent to the hot loop's count (which adds it) until the day moves on."""
        if near and near(at):
            return False
        if at < self.end:
            return True
        ordinal = self.days.find(at)[2]
        if ordinal == self.ordinal:  # the same day, past an offset change
            return True
        if self.used.get(ordinal, 0) >= self.per_day:
            return False
        self.used[ordinal] = self.used.get(ordinal, 0) + 1
        self.lent += 1
        return True


class Zone:
    """One recipient zone: its grid (walked day by day), and its lanes, the ring from ``cur``
    on (stale while the ring is empty). ``events`` holds one entry per lane with recipients
    left: its sender's turn (see Sender.turn), when the sender moves on to its next day and a
    dozing lane may wake."""

    __slots__ = (
        "base", "cur", "ends", "events", "grid", "j", "nring", "slots", "uniform", "waiting",
    )  # fmt: skip

    def __init__(self, grid: Iterator[tuple[int, _Grid, int]], lanes: list[Lane]) -> None:
        self.grid = grid
        for before, after in zip(lanes, lanes[1:] + lanes[:1], strict=True):
            before.next, after.prev = after, before
        self.cur = lanes[0]
        self.nring = self.waiting = len(lanes)
        # a sender's first turn comes at once: its first day is the one of its first slot
        self.events = [(-NEVER, lane.rank, lane) for lane in lanes if lane.sender.book]
        heapq.heapify(self.events)
        for lane in lanes:
            lane.grant()
            lane.sender.lanes.append((self, lane))
        # every lane a sender with one and the same gap: consecutive slots snap to one slot
        # start, and a slot that one of them cannot take for its window's end, none can
        self.uniform = len({lane.sender.gap for lane in lanes}) == 1 and all(
            lane.sender.book is not None for lane in lanes
        )
        base, day, first = next(grid)
        self.base, self.slots, self.ends, self.j = base, day.slots, day.ends, first

    @property
    def next_at(self) -> int:
        return self.base + self.slots[self.j]

    def alarm(self) -> int:
        """When the next event is due (NEVER: none)."""
        return self.events[0][0] if self.events else NEVER

    def unlink(self, lane: Lane) -> None:
        """Take ``lane`` out of the ring (its own links stay, so a walk can go on from it)."""
        lane.awake = False
        self.nring -= 1
        lane.prev.next, lane.next.prev = lane.next, lane.prev
        if self.cur is lane:
            self.cur = lane.next

    def relink(self, lane: Lane) -> None:
        """Put a dozing ``lane`` back, last in the rotation (just before ``cur``)."""
        lane.awake = True
        cur = self.cur
        if not self.nring:
            lane.next = lane.prev = self.cur = lane
        else:
            lane.prev, lane.next = cur.prev, cur
            cur.prev.next = cur.prev = lane
        self.nring += 1

    def spent(self, lane: Lane, cur: Lane) -> int:
        """``lane`` used up its budget (``cur``: the hot loop's): it is counted and leaves
        when it has no recipient left, its sender dozes when its day is full, else it gets a
        new budget. 0: nothing else changed (a sender serving several zones gets here at
        every send); 1: the ring changed; -1: the zone has nobody waiting any more."""
        lane.count()
        sender = lane.sender
        if lane.left and sender.room > 0:
            lane.grant()
            return 0
        self.cur = cur
        if not lane.left:
            self.waiting -= 1
            if lane.awake:
                self.unlink(lane)
        if sender.room <= 0:
            sender.doze()
        return 1 if self.waiting else -1

    def turns(self, t: int) -> None:
        """The events due at ``t``: each sender moves on to the day of its next slot start,
        and its lane here wakes or dozes by that day's room."""
        events = self.events
        while events and events[0][0] <= t:
            lane = heapq.heappop(events)[2]
            if not lane.left:
                continue
            sender = lane.sender
            at = t // sender.ng * sender.ng
            if at >= sender.day_end:
                if lane.awake:
                    lane.count()  # a sole sender's budget is this lane's (others count at once)
                sender.enter(at)
            if sender.room > 0:
                if not lane.awake:
                    self.relink(lane)
                lane.grant()
            elif lane.awake:
                sender.doze()
            heapq.heappush(events, (sender.turn, lane.rank, lane))

    def soonest(self, lane: Lane, nring: int, alarm: int) -> int:
        """The first instant any lane could take a slot, after no lane took one: each lane's
        ``ready`` bounds it, and so does the next event. The grid is jumped there, rather
        than every lane tried at every slot in between."""
        soonest = alarm
        for _ in range(nring):
            soonest = min(soonest, lane.sender.ready)
            lane = lane.next
        return soonest


class _Pass:
    """What :func:`walk` carries from one pass of its hot loop to the next: where it is on the
    grid, the ring as the hot loop sees it, the campaign's count of the current day, and the
    next instant it must stop at. A pass reads these into locals and writes them back."""

    __slots__ = (
        "alarm", "at", "base", "c_end", "c_used", "cur", "ends", "fast_end", "iv_end", "j",
        "made", "ng", "nring", "skip", "slots", "step", "stop", "t", "when",
    )  # fmt: skip

    def __init__(self, z: Zone, c: Campaign, near: Near, limit: int) -> None:
        self.base, self.slots, self.ends, self.j = z.base, z.slots, z.ends, z.j
        self.cur, self.nring = z.cur, z.nring
        self.ng = z.cur.sender.ng  # the one gap of a uniform zone
        self.step = timedelta(milliseconds=-self.ng)
        self.c_end = c.end
        self.c_used = c.used.get(c.ordinal, 0) + c.lent if c.ordinal else 0
        self.fast_end = -NEVER if near else c.end  # below it: on the campaign's day, no check
        self.alarm = z.alarm()
        self.iv_end = self.base + self.ends[self.j]  # the end of the slot's real interval
        self.skip = 0  # an instant before which no lane can take a slot: jumped to
        self.t = self.at = -NEVER
        self.when, self.made = _EPOCH, 0  # a datetime (uniform: of the slot start taken), its ms
        self.stop = self.next_stop(limit, c.per_day)

    def next_stop(self, limit: int, per_day: int) -> int:
        """:func:`_stop` of where the walk is."""
        return _stop(
            limit, self.alarm, self.c_end, self.iv_end, per_day - self.c_used, self.nring,
            self.j, self.slots, self.base,
        )  # fmt: skip


def walk(
    z: Zone, c: Campaign, limit: int, near: Near, clock: Instants, policy: SendingPolicy
) -> bool:
    """Give zone ``z``'s grid slots up to ``limit`` (ms, inclusive) to its waiting recipients;
    False when none is left waiting.

    The hot loop of the capacity planner: it runs once per grid slot, so what it touches is a
    local or a slot attribute and every instant an int. A slot goes to the first lane of the
    ring, from ``cur`` on, whose sender's next slot start is still inside the slot's interval
    and free, and fits the campaign's day; ``cur`` then moves past it. A lane in the ring
    always has room on its sender's day: a full sender dozes (out of every ring) until its
    turn, an event at which its next day begins.

    It comes twice. Where every lane's sender has the same gap (``z.uniform``, the usual case)
    consecutive slots snap to the same slot start, so the snapped instant, its window check
    and its datetime are worked out once per slot start, not once per lane tried
    (:func:`_uniform_pass`); otherwise once per lane (:func:`_mixed_pass`). The two loops
    differ in that alone. Between passes, one thing that is due is seen to at a time.
    """
    w = _Pass(z, c, near, limit)
    run = _uniform_pass if z.uniform else _mixed_pass
    while True:
        ended = run(w, z, c, near, clock)
        if ended is None:
            return False
        if ended:
            _next_day(w, z, c, limit, policy)
        elif w.t > limit:
            z.base, z.slots, z.ends, z.j, z.cur = w.base, w.slots, w.ends, w.j, w.cur
            c.used[c.ordinal] = w.c_used - c.lent
            return True
        else:
            _due(w, z, c, near, limit)


def _uniform_pass(w: _Pass, z: Zone, c: Campaign, near: Near, clock: Instants) -> bool | None:
    """The slots from ``w.j`` up to ``w.stop`` of a zone whose senders share one gap. True:
    the day's grid is used up; False: stopped at ``w.t``; None: nobody is waiting any more.

    The campaign's count is not kept per send here: every slot this loop looks at is taken,
    but for one it breaks at (a window's end) and at most one that no lane could take
    (``miss``), so the count follows from the slots passed."""
    base, slots, j, stop, iv_end, t = w.base, w.slots, w.j, w.stop, w.iv_end, w.t
    cur, fast_end, alarm = w.cur, w.fast_end, w.alarm
    at, when, made, ng, step = w.at, w.when, w.made, w.ng, w.step
    gap = -ng
    first, miss, ended = j, 0, False
    for j in range(j, len(slots)):  # noqa: B020 - j goes on where the last pass stopped
        t = base + slots[j]
        if t >= stop:
            break
        if t > at:  # a new slot start (the same for every lane)
            at = t // ng * ng
            if at >= iv_end:  # none can take this slot, nor a later one of its window
                w.skip, stop = iv_end, t
                at = -NEVER  # not taken: the next pass makes its slot afresh
                break
            # mostly the next slot start: a datetime plus a ready timedelta is cheaper
            when = when + step if at - made == gap else clock(at)
            made = at
        lane = cur
        while True:
            sender = lane.sender
            if at not in sender.slots and (at < fast_end or c.admit(at, near)):
                lane.push(when)
                sender.slots[at] = 1
                cur = lane.next
                lane.budget -= 1
                if not lane.budget and (changed := z.spent(lane, cur)):
                    if changed < 0:
                        z.j = j + 1
                        c.used[c.ordinal] = w.c_used + j + 1 - first - c.lent
                        return None
                    cur, w.nring, alarm = z.cur, z.nring, z.alarm()
                    stop = t  # the ring changed
                break
            lane = lane.next
            if lane is cur:
                # every lane refused `at` (a taken slot, the campaign's day, its booked
                # sends): so they do every slot up to it
                w.skip, stop, miss = min(at + 1, alarm), t, 1
                break
    else:
        j = len(slots)
        ended = True
    w.c_used += j - first - miss
    w.j, w.stop, w.t, w.cur, w.alarm = j, stop, t, cur, alarm
    w.at, w.when, w.made = at, when, made
    return ended


def _mixed_pass(w: _Pass, z: Zone, c: Campaign, near: Near, clock: Instants) -> bool | None:
    """:func:`_uniform_pass` for a zone whose senders' gaps differ: each lane tried snaps the
    slot to its own sender's slot start, and a sender refused a slot start is skipped until
    it (``ready``)."""
    base, slots, j, stop, iv_end, t = w.base, w.slots, w.j, w.stop, w.iv_end, w.t
    cur, fast_end, alarm, nring, c_used = w.cur, w.fast_end, w.alarm, w.nring, w.c_used
    ended = False
    for j in range(j, len(slots)):  # noqa: B020 - j goes on where the last pass stopped
        t = base + slots[j]
        if t >= stop:
            break
        lane = cur
        while True:
            sender = lane.sender
            if t >= sender.ready:
                ng = sender.ng
                at = t // ng * ng
                if at >= iv_end:
                    pass  # past this slot's window, for this sender's gap
                elif at not in sender.slots and (at < fast_end or c.admit(at, near)):
                    lane.push(clock(at))
                    sender.slots[at] = 1
                    c_used += 1
                    cur = lane.next
                    lane.budget -= 1
                    if not lane.budget and (changed := z.spent(lane, cur)):
                        if changed < 0:
                            z.j = j + 1
                            c.used[c.ordinal] = c_used - c.lent
                            return None
                        cur, nring, alarm = z.cur, z.nring, z.alarm()
                        stop = t
                    break
                else:
                    sender.ready = at + 1  # refused: so is every slot up to it
            lane = lane.next
            if lane is cur:
                soonest = z.soonest(lane, nring, alarm)
                if soonest > t + 1:
                    w.skip, stop = soonest, t
                break
    else:
        ended = True
    w.j, w.stop, w.t, w.cur, w.alarm, w.nring, w.c_used = j, stop, t, cur, alarm, nring, c_used
    return ended


def _next_day(w: _Pass, z: Zone, c: Campaign, limit: int, policy: SendingPolicy) -> None:
    """The day's grid is used up: on to the zone's next sending day. NoSendingDay when no
    recipient got a slot for the whole horizon."""
    base, day, j = next(z.grid)
    w.base, w.slots, w.ends, w.j = base, day.slots, day.ends, j
    w.iv_end = base + day.ends[j]
    w.skip = 0
    placed = c.placed + w.c_used - c.entry
    if placed != c.since[0]:
        c.since = (placed, base + day.slots[j])
    elif base + day.slots[j] - c.since[1] > _HORIZON_MS:
        raise NoSendingDay(_no_slot_reason(policy, c.since[1]))
    w.stop = w.next_stop(limit, c.per_day)


def _due(w: _Pass, z: Zone, c: Campaign, near: Near, limit: int) -> None:
    """Something is due at slot ``w.j`` (instant ``w.t``): see to one thing, the first of a
    jump, the next event, the campaign's next day, its day being full, every lane dozing and
    the slot's interval ending; the walk then goes on from slot ``w.j``."""
    t, base, slots = w.t, w.base, w.slots
    if w.skip:
        w.j = bisect_left(slots, w.skip - base, w.j)
        w.skip = 0
        if w.j < len(slots):
            w.iv_end = base + w.ends[w.j]
    elif t >= w.alarm:
        z.cur = w.cur
        z.turns(t)
        w.cur, w.nring, w.alarm = z.cur, z.nring, z.alarm()
    elif t >= w.c_end:
        w.c_used = c.move(t, w.c_used)
        w.c_end = c.end
        w.fast_end = -NEVER if near else c.end
    elif w.c_used >= c.per_day:
        w.j = bisect_left(slots, w.c_end - base, w.j)  # the campaign's day is full: to its end
    elif not w.nring:
        w.skip = w.alarm  # every lane dozes: on to the next event
    elif t >= w.iv_end:
        w.iv_end = base + w.ends[w.j]
    w.stop = t if w.skip else w.next_stop(limit, c.per_day)


def _stop(
    limit: int,
    alarm: int,
    c_end: int,
    iv_end: int,
    room: int,
    nring: int,
    j: int,
    slots: list[int],
    base: int,
) -> int:
    """The first instant the hot loop must break at: the limit, a waking, the campaign's day
    or the interval ending, or the slot by which the campaign's day could be full (``room``
    more sends); at once when it may be full already or every lane sleeps."""
    if room <= 0 or not nring:
        return -NEVER
    stop = min(limit + 1, alarm, c_end, iv_end)
    if j + room < len(slots):
        stop = min(stop, base + slots[j + room])
    return stop


def _no_slot_reason(policy: SendingPolicy, since: int) -> str:
    """Why no recipient got a slot for the whole horizon, and what to change."""
    last = (_EPOCH + timedelta(milliseconds=since)).date()
    return (
        f"no sender slot inside the windows for {PLANNING_HORIZON_DAYS} days after {last}: "
        f"the senders' minimum gaps never line up with the windows "
        f"({', '.join(map(str, policy.windows))}); shorten min_gap_seconds or widen the windows"
    )


def undo(senders: Iterable[Sender], lanes: Iterable[Lane]) -> None:
    """Take a failed plan's sends out of the books again."""
    for lane in lanes:
        slots = lane.sender.slots
        for at in lane.placed:
            slots.pop((at - _EPOCH) // _ONE_MS, None)
    for sender in senders:
        sender.undo_plan()
