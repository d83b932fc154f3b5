"""The long-running commands and the reconciler: ``worker``, ``serve`` and ``reconcile``."""

from __future__ import annotations

import ipaddress
import logging
import threading
from typing import Annotated

import typer

from sendqueue.bootstrap.checks import execution_target
from sendqueue.cli.common import (
    JsonOpt,
    container,
    err,
    fail,
    handle_errors,
    install_signals,
    log,
    out,
    print_json,
)
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.wording import plural
from sendqueue.runtime import run_worker
from sendqueue.settings import redact_url

__all__ = ["reconcile_cmd", "serve_cmd", "worker_cmd"]


@handle_errors
def reconcile_cmd(as_json: JsonOpt = False) -> None:
    """One reconciler pass: repair drift between the store and the execution layer."""
    with container() as c:
        report = c.reconciler.run()
    if as_json:
        print_json(report.as_dict())
        return
    if not report.ran:
        out.print("another reconciler pass is running; nothing done")
        return
    checked = plural(report.campaigns_checked, "campaign")
    out.print(f"checked {checked} and {plural(report.schedules_checked, 'schedule')}")
    out.print(report.repairs_text())
    if report.skipped_in_flight:
        out.print(
            f"left {report.skipped_in_flight} alone: in flight or changed since read, not drift"
        )
    for e in report.errors:
        err.print(f"  {e}", markup=False)


@handle_errors
def worker_cmd(
    reconcile_interval: Annotated[
        float | None,
        typer.Option(
            "--reconcile-interval",
            help="Seconds between passes [default: SENDQUEUE_RECONCILE_INTERVAL]",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics of this process on /metrics at this port.",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            help="Address the metrics endpoint listens on (it has no token: keep it private).",
        ),
    ] = "127.0.0.1",
) -> None:
    """Run the dispatcher, the send workers and the periodic reconciler until SIGTERM/SIGINT."""
    logging.getLogger("sendqueue").setLevel(logging.INFO)
    stop = threading.Event()
    install_signals(stop)
    with container() as c:
        # Under eventbridge there is no dispatcher to run (Lambda is it): this refuses with
        # the reason before anything is logged as started.
        c.dispatcher  # noqa: B018
        metrics = None
        if metrics_port is not None:
            try:
                metrics = c.serve_metrics(metrics_port, metrics_host)
            except OSError as exc:
                raise InvalidField("--metrics-port", metrics_port, f"cannot listen: {exc}") from exc
            log.info("metrics on http://%s:%d/metrics", metrics_host, metrics.port)
        log.info(
            "worker started: store %s, scheduler %s, mailer %s",
            redact_url(c.settings.database_url),
            execution_target(c.settings),
            redact_url(c.settings.mailer),
        )
        try:
            run_worker(c, stop, reconcile_interval=reconcile_interval)
        finally:
            if metrics is not None:
                metrics.close()
    log.info("worker stopped")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@handle_errors
def serve_cmd(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (not loopback: needs a token).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on (0: any free one).")
    ] = 8000,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker",
            help="Only the web app; run `sendqueue worker` to send the emails. Implied under "
            "SENDQUEUE_EXECUTION=eventbridge (the send Lambda function sends them).",
        ),
    ] = False,
    reconcile_interval: Annotated[
        float | None,
        typer.Option(
            "--reconcile-interval",
            help="Seconds between reconciler passes [default: SENDQUEUE_RECONCILE_INTERVAL]",
        ),
    ] = None,
) -> None:
    """Run the web UI and the HTTP API, with the worker embedded unless --no-worker."""
    if not 0 <= port <= 65535:
        raise InvalidField("port", port, "between 0 and 65535")
    logging.getLogger("sendqueue").setLevel(logging.INFO)
    with container() as c:
        if c.settings.api_token is None and not _is_loopback(host):
            fail(
                2,
                f"refusing to serve on {host} without SENDQUEUE_API_TOKEN: anyone who can reach "
                "it could read and send your campaigns; set a token (16+ characters) or use "
                "--host 127.0.0.1",
            )
        from sendqueue.web.app import create_app, run_server

        # Under eventbridge the send Lambda function is the worker: serve implies --no-worker and
        # says so (refusing would only make every AWS user type a flag that changes nothing).
        in_lambda = c.settings.execution == "eventbridge"
        if in_lambda and not no_worker:
            log.info(
                "SENDQUEUE_EXECUTION=eventbridge: no worker in this process (as with "
                "--no-worker); EventBridge Scheduler invokes the send Lambda function"
            )
        start_worker = not (no_worker or in_lambda)
        # The address it binds is answered as a Host; 0.0.0.0 and :: are no name to answer.
        wildcard = host.strip("[]") in {"0.0.0.0", "::", ""}
        bound = () if wildcard else (host,)
        if wildcard and not c.settings.allowed_host_names:
            err.print(
                f"warning: listening on {host}, but only requests for 127.0.0.1, localhost "
                "and [::1] are answered (400 for any other Host): set SENDQUEUE_ALLOWED_HOSTS "
                "to the names clients use, e.g. SENDQUEUE_ALLOWED_HOSTS=mail.example.com",
                markup=False,
                soft_wrap=True,
            )
        web = create_app(
            c, start_worker=start_worker, reconcile_interval=reconcile_interval, extra_hosts=bound
        )
        if in_lambda:
            worker = "the send Lambda function"
        else:
            worker = "embedded" if start_worker else "off (run `sendqueue worker`)"

        def started(url: str) -> None:
            out.print(f"sendqueue is serving {url}  (worker: {worker})", markup=False)
            if c.settings.api_token is not None:
                out.print("log in with SENDQUEUE_API_TOKEN, or send it as a Bearer token")

        log.info(
            "serving: store %s, scheduler %s, mailer %s",
            redact_url(c.settings.database_url),
            execution_target(c.settings),
            redact_url(c.settings.mailer),
        )
        run_server(web, host=host, port=port, on_started=started)
    log.info("server stopped")
