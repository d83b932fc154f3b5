"""Benchmark 14, the feedback parser on hostile mail: how long ``parse_feedback`` takes on a
message an outsider made to be slow, one per shape of ``bench/hostile_mail.py``, beside an
ordinary message of the same size (a reply quoting a long text).

Anyone can mail the feedback mailbox, so a message that makes the parser slow stalls the
poller. Each shape is parsed ``repeats`` times, in this process, alternately with the control
message; each measurement parses the message twice, with the VERP settings (the bounce address
and secret) and without, and counts the slower of the two. Run:
``python -m bench.feedback_parse [--size BYTES] [--repeats N] [--shape NAME ...]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.common import alternate, summarize
from bench.hostile_mail import CONTROL, SHAPES, shape
from sendqueue.domain.reports import parse_feedback

__all__ = ["SIZE", "TARGET_S", "run"]

#: The message size of the target: a mailbox accepts far more, but 1 MiB is already 40 times
#: a large report.
SIZE = 1 << 20
#: The most one message of any shape may take to parse, in seconds.
TARGET_S = 0.5

_RECEIVED = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
_VERP = {"bounce_address": "bounces@mail.example.net", "secret": "bench-feedback-secret-0123456789"}


def _parse_seconds(raw: bytes) -> tuple[float, float, int]:
    """Wall and CPU seconds of the slower of the two parses, and the most items either read
    (without the VERP settings, a report naming no VERP address is believed)."""
    slowest, most = (0.0, 0.0), 0
    for settings in (_VERP, {}):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        items = parse_feedback(raw, received_at=_RECEIVED, key="bench:1:1", **settings)
        slowest = max(slowest, (time.perf_counter() - wall, time.process_time() - cpu))
        most = max(most, len(items))
    return slowest[0], slowest[1], most


def _size_label(size: int) -> str:
    return "1 MiB" if size == SIZE else f"{size:,} B"


def run(*, size: int = SIZE, repeats: int = 3, shapes: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every shape (or those named) and the control message, ``repeats`` times each."""
    names = [*(shapes or SHAPES), CONTROL]
    messages = {name: shape(name, size) for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    items: dict[str, int] = {}

    def measurer(name: str) -> Callable[[int], None]:
        def measure(_: int) -> None:
            wall, cpu, count = _parse_seconds(messages[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
            items[name] = count

        return measure

    for name in names[:-1]:
        alternate(repeats, measurer(name), measurer(CONTROL))
    medians = {name: summarize(walls[name]).median for name in names}
    figures = {
        name: {
            "bytes": len(messages[name]),
            "items": items[name],
            "seconds": summarize(walls[name]).as_dict(),
            "cpu_seconds": summarize(cpus[name]).as_dict(),
            "vs_control": medians[name] / medians[CONTROL],
        }
        for name in names
    }
    label = _size_label(size)
    targets = [
        {
            "name": f"feedback parse of a hostile {label} message at most {TARGET_S:g} s ({name})",
            "value": medians[name],
            "limit": TARGET_S,
            "unit": "s",
            "passed": medians[name] <= TARGET_S,
        }
        for name in names[:-1]
    ]
    return {"size": size, "repeats": repeats, "shapes": figures, "targets": targets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=SIZE, help="bytes per message (1 MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="repeatable")
    args = parser.parse_args()
    result = run(size=args.size, repeats=args.repeats, shapes=tuple(args.shape or ()))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
