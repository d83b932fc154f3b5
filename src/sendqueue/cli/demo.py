"""``sendqueue demo``: a sample campaign that sends within seconds, watched live."""

from __future__ import annotations

import socket
import threading
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from sendqueue.bootstrap import Container
from sendqueue.cli.common import container, handle_errors, install_signals, out
from sendqueue.cli.render import print_provision, provision_with_progress
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.wording import plural
from sendqueue.runtime import run_worker
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import redact_url

__all__ = ["demo_cmd"]


@handle_errors
def demo_cmd(
    count: Annotated[int, typer.Option("--count", help="Emails in the demo campaign.")] = 24,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between sends.")] = 5.0,
    ui: Annotated[
        bool,
        typer.Option(
            "--ui/--no-ui",
            help="Serve the web UI with the worker embedded (--no-ui: a live table in the "
            "terminal, exiting when every email is sent).",
        ),
    ] = True,
    port: Annotated[
        int, typer.Option("--port", help="Web UI port on 127.0.0.1 (taken: any free one).")
    ] = 8000,
) -> None:
    """Create a sample campaign that sends within seconds, then watch it deliver live."""
    if not 1 <= count <= 1000:
        raise InvalidField("count", count, "between 1 and 1000")
    if not 0.5 <= interval <= 3600:
        raise InvalidField("interval", interval, "between 0.5 and 3600 seconds")
    with container() as c:
        now = c.clock.now()
        policy = demo_policy(now, c.settings.default_timezone, count, interval)
        created = c.campaign_import.create(
            name=f"Demo {now.astimezone(policy.zone):%Y-%m-%d %H:%M}",
            recipients=demo_csv(count),
            policy=policy,
            from_addr="sendqueue demo <demo@example.com>",
            templates=Templates(
                subject="Hello {{ name }}, greetings to {{ city }}",
                body="Hi {{ name }},\n\nthis is email from the sendqueue demo.\n",
            ),
        )
        cid = created.campaign.id
        out.print(
            f"demo campaign [bold]{cid}[/]: {plural(count, 'email')}, one every {interval:g}s"
        )
        out.print(f"policy: {policy.describe()}", markup=False)
        out.print(
            f"mailer: {redact_url(c.settings.mailer)}  store: {redact_url(c.settings.database_url)}"
        )
        report = provision_with_progress(c, cid, None, 90.0)
        print_provision(report)
        if ui:
            _demo_ui(c, cid, port)
            return
        stop = threading.Event()
        install_signals(stop)
        worker = threading.Thread(
            target=run_worker, args=(c, stop), kwargs={"reconcile_at_start": False}, daemon=True
        )
        worker.start()
        try:
            with Live(_demo_table(c, cid), console=out, refresh_per_second=4) as live:
                while not stop.wait(0.5):
                    live.update(_demo_table(c, cid))
                    if c.queries.campaign_of(cid).state is CampaignState.COMPLETED:
                        break
        finally:
            stop.set()
            worker.join(timeout=60)
        counts = c.queries.campaign(cid).counts
        out.print(
            f"done: {counts[TaskState.FINISHED]} sent, {counts[TaskState.FAILED]} failed. "
            f"Messages are in {c.settings.mailer.removeprefix('maildir:')}/new"
        )


def _free_port(preferred: int) -> int:
    """``preferred`` if it can be bound on loopback, else 0 (any free port)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return 0
    return preferred


def _demo_ui(c: Container, cid: str, port: int) -> None:
    from sendqueue.web.app import create_app, run_server

    web = create_app(c, start_worker=True)

    def started(url: str) -> None:
        out.print(f"\nsendqueue is serving {url}", markup=False)
        out.print(f"watch the demo live: [bold]{url}campaigns/{cid}[/]")
        out.print("press Ctrl-C to stop")

    run_server(web, host="127.0.0.1", port=_free_port(port), on_started=started)


def _demo_table(c: Container, cid: str) -> Table:
    listing = c.queries.tasks(cid, limit=1000)
    campaign, counts = listing.campaign, c.queries.campaign(cid).counts
    table = Table(
        title=f"campaign {cid}: {campaign.state.value}  "
        + "  ".join(f"{s.value} {counts[s]}" for s in TaskState)
    )
    for col in ("#", "email", "state", "send at (local)", "sent at", "late (s)"):
        table.add_column(col)
    zone = campaign.policy.zone
    for t in listing.tasks:
        late = f"{(t.sent_at - t.send_at).total_seconds():.2f}" if t.sent_at else ""
        table.add_row(
            str(t.position),
            t.email,
            t.state.value,
            t.send_at.astimezone(zone).strftime("%H:%M:%S"),
            t.sent_at.astimezone(zone).strftime("%H:%M:%S.%f")[:-3] if t.sent_at else "",
            late,
        )
    return table
