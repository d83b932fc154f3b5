"""What routes get from the app: the container, the stream broker, background provisioning and
the timeline cache.

``create_app`` puts them on ``app.state``; routes (the API's and the pages') take them as
``Annotated`` dependencies::

    @router.get("/campaigns/{campaign_id}")
    def page(campaign_id: str, c: ContainerDep, request: Request) -> HTMLResponse: ...

``request.state.csrf_token`` holds the CSRF token a page puts into its forms and its
``<meta name="csrf-token">`` (set by :class:`sendqueue.web.middleware.csrf.CsrfMiddleware`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Annotated

from fastapi import Depends, Request

from sendqueue.bootstrap import Container
from sendqueue.domain.wording import plural
from sendqueue.web.queries import TimelineCache
from sendqueue.web.stream import ChangeBroker

__all__ = [
    "BackgroundProvisioning",
    "BrokerDep",
    "ContainerDep",
    "ProvisioningDep",
    "TimelinesDep",
    "get_broker",
    "get_container",
    "get_provisioning",
    "get_timelines",
]

log = logging.getLogger(__name__)


class BackgroundProvisioning:
    """Runs ``provisioner.provision`` in a thread per request, so the API answers at once.

    The threads are daemons: a server that stops mid-way leaves the campaign provisioning with
    its checkpoint, and the next run (or the reconciler) continues from there. A failure is
    logged; the campaign stays in provisioning until then.
    """

    def __init__(self, container: Container) -> None:
        self._container = container
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}

    def start(self, campaign_id: str) -> bool:
        """Start provisioning ``campaign_id`` unless this process is at it already."""
        with self._lock:
            running = self._threads.get(campaign_id)
            if running is not None and running.is_alive():
                return False
            thread = threading.Thread(
                target=self._run,
                args=(campaign_id,),
                name=f"sendqueue-provision-{campaign_id}",
                daemon=True,
            )
            self._threads[campaign_id] = thread
        thread.start()
        return True

    def _run(self, campaign_id: str) -> None:
        try:
            report = self._container.provisioner.provision(campaign_id)
        except Exception:
            log.exception(
                "provisioning %s failed; it stays in provisioning until it is run again or the "
                "reconciler resumes it",
                campaign_id,
            )
            return
        finally:
            with self._lock:
                if self._threads.get(campaign_id) is threading.current_thread():
                    del self._threads[campaign_id]
        if report.status == "done":
            log.info(
                "provisioned %s: %s, %s in %.1f s",
                campaign_id,
                plural(report.tasks_created, "task"),
                plural(report.schedules_created, "schedule"),
                report.seconds,
            )
        else:
            log.warning(
                "provisioning %s ended %s: %s", campaign_id, report.status, report.errors[:3]
            )

    def running(self) -> list[str]:
        with self._lock:
            return [cid for cid, t in self._threads.items() if t.is_alive()]

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the running threads (shutdown)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def get_container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


def get_broker(request: Request) -> ChangeBroker:
    broker: ChangeBroker = request.app.state.broker
    return broker


def get_provisioning(request: Request) -> BackgroundProvisioning:
    runner: BackgroundProvisioning = request.app.state.provisioning
    return runner


def get_timelines(request: Request) -> TimelineCache:
    """The app's cache of campaign timelines, shared by the API and the pages."""
    cache: TimelineCache = request.app.state.timelines
    return cache


ContainerDep = Annotated[Container, Depends(get_container)]
BrokerDep = Annotated[ChangeBroker, Depends(get_broker)]
ProvisioningDep = Annotated[BackgroundProvisioning, Depends(get_provisioning)]
TimelinesDep = Annotated[TimelineCache, Depends(get_timelines)]
