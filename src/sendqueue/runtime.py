"""Running a worker process: the dispatcher, the send workers, the periodic reconciler, the
periodic poll of the feedback mailbox (when one is configured) and the webhook deliveries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sendqueue.bootstrap import Container
from sendqueue.domain.unsubscribe import UNSUBSCRIBE_URL_PLACEHOLDER
from sendqueue.services.feedback.poll import PollReport
from sendqueue.services.scheduling.reconciler import ReconcileReport

__all__ = ["announce_unsubscribe_links", "run_worker"]

log = logging.getLogger(__name__)


def announce_unsubscribe_links(app: Container) -> None:
    """Say at worker start whether emails carry the one-click unsubscribe link (production
    always does; development only with SENDQUEUE_PUBLIC_URL and SENDQUEUE_SECRET_KEY)."""
    links = app.config.unsubscribe
    if links is None:
        log.warning(
            "unsubscribe links off: emails carry no List-Unsubscribe header and no footer, "
            "{{ unsubscribe_url }} stays %s (set SENDQUEUE_PUBLIC_URL and SENDQUEUE_SECRET_KEY)",
            UNSUBSCRIBE_URL_PLACEHOLDER,
        )
    else:
        log.info("unsubscribe links: %s/u/<token>", links.public_url)


def run_worker(
    app: Container,
    stop: threading.Event,
    *,
    reconcile_interval: float | None = None,
    reconcile_at_start: bool = True,
    on_reconcile: Callable[[ReconcileReport], None] | None = None,
    feedback_interval: float | None = None,
    on_feedback: Callable[[PollReport], None] | None = None,
) -> None:
    """Re-plan the emails missed while no worker ran, then dispatch due schedules and reconcile
    periodically until ``stop`` is set.

    The dispatcher runs in this thread; the reconciler in a daemon thread that sleeps on
    ``stop`` so shutdown is immediate. In-flight sends finish before this returns. With a
    feedback mailbox configured, another daemon thread polls it every ``feedback_interval``
    seconds (SENDQUEUE_FEEDBACK_INTERVAL), the first time at start. Webhook deliveries run in
    their own daemon thread (:func:`_start_webhook_loop`), never on the send path.
    """
    interval = reconcile_interval or app.settings.reconcile_interval
    feedback = _start_feedback_loop(
        app, stop, feedback_interval or app.config.feedback_interval, on_feedback
    )
    webhooks = _start_webhook_loop(app, stop)
    dispatcher = app.dispatcher
    announce_unsubscribe_links(app)
    # Before the first missed schedule fires: emails missed while no worker ran are moved to
    # the next free slots, not sent late in a burst (docs/guarantees.md); one line per
    # campaign says how many and names the outage.
    try:
        app.recovery.after_start()
    except Exception:  # the worker still starts; it re-plans each overdue task it meets
        log.exception("the catch-up re-plan at start failed")
    if dispatcher.runs_reconciler:
        if reconcile_interval is not None:
            log.warning("the execution layer schedules the reconciler itself: interval ignored")
        try:
            dispatcher.run(app.invoke, stop)
        finally:
            stop.set()
            _join(feedback)
            _join(webhooks)
        return

    def reconcile_loop() -> None:
        wait = 0.0 if reconcile_at_start else interval
        while not stop.wait(wait):
            try:
                report = app.reconciler.run()
                if on_reconcile is not None:
                    on_reconcile(report)
            except Exception:  # a failed pass must not kill the worker; the next one retries
                log.exception("reconciler pass failed")
            wait = interval

    thread = threading.Thread(target=reconcile_loop, name="reconciler", daemon=True)
    thread.start()
    try:
        dispatcher.run(app.invoke, stop)
    finally:
        stop.set()
        thread.join(timeout=30)
        _join(feedback)
        _join(webhooks)


def _start_feedback_loop(
    app: Container,
    stop: threading.Event,
    interval: float,
    on_feedback: Callable[[PollReport], None] | None,
) -> threading.Thread | None:
    """Poll the feedback mailboxes every ``interval`` seconds in a daemon thread that sleeps
    on ``stop``; None when there is none: no feedback mailbox and no store of senders to read
    theirs from (each pass reads the senders, so one given a mailbox later is polled then)."""
    poller = app.feedback_poller
    if not poller.configured:
        return None

    def feedback_loop() -> None:
        while not stop.is_set():
            try:
                report = poller.poll()
                if on_feedback is not None:
                    on_feedback(report)
            except Exception:  # a failed pass must not kill the worker; the next one retries
                log.exception("feedback poll failed")
            if stop.wait(interval):
                break

    thread = threading.Thread(target=feedback_loop, name="feedback-poll", daemon=True)
    thread.start()
    return thread


def _start_webhook_loop(app: Container, stop: threading.Event) -> threading.Thread:
    """Deliver webhook events in a daemon thread: a pass every SENDQUEUE_WEBHOOK_POLL_INTERVAL
    seconds, at once again while a pass read a full batch (a backlog drains at full speed).
    Each endpoint is held under its store lease during its pass, so several workers share the
    endpoints and never deliver one endpoint's events out of order."""
    delivery = app.webhook_delivery
    interval = app.settings.webhook_poll_interval

    def webhook_loop() -> None:
        while not stop.is_set():
            wait = interval
            try:
                if delivery.run_pass(stop).full:
                    wait = 0.0
            except Exception:  # a failed pass must not kill the worker; the next one retries
                log.exception("webhook delivery pass failed")
            if stop.wait(wait):
                break

    thread = threading.Thread(target=webhook_loop, name="webhooks", daemon=True)
    thread.start()
    return thread


def _join(thread: threading.Thread | None) -> None:
    if thread is not None:
        thread.join(timeout=30)
