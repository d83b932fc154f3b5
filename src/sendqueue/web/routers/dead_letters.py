"""``/api/dead-letters``: invocations the execution layer gave up on, and redriving them."""

from __future__ import annotations

from fastapi import APIRouter

from sendqueue.services.reading.views import DeadLetterView
from sendqueue.web.deps import DeadLettersDep
from sendqueue.web.schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    DeadLetterList,
    Redriven,
    error_responses,
)

__all__ = ["router"]

router = APIRouter(prefix="/api/dead-letters", tags=["dead letters"])


@router.get("", responses=error_responses(*READ_ERRORS))
def dead_letters(dead_letters: DeadLettersDep) -> DeadLetterList:
    """Invocations the execution layer gave up on, oldest first."""
    return DeadLetterList(dead_letters=[DeadLetterView.of(d) for d in dead_letters.letters()])


@router.post("/redrive", responses=error_responses(*WRITE_ERRORS))
def redrive_all(dead_letters: DeadLettersDep) -> Redriven:
    """Turn every dead letter back into a schedule due now (those redriven meanwhile skipped),
    each relayed to the change log first (its ``dead_letter`` webhook event)."""
    report = dead_letters.redrive_all()
    return Redriven(
        redriven=report.redriven,
        schedules=report.schedules,
        skipped=report.skipped,
        failed_again=report.failed_again,
    )


@router.post("/{letter_id}/redrive", responses=error_responses(*WRITE_ERRORS, 404))
def redrive_one(letter_id: str, dead_letters: DeadLettersDep) -> Redriven:
    """Turn one dead letter back into a schedule due now, relayed to the change log first (its
    ``dead_letter`` webhook event)."""
    schedule = dead_letters.redrive(letter_id)
    return Redriven(redriven=[letter_id], schedules=[schedule.name])
