"""The root ``sendqueue`` app: the global options, and every command group mounted on it."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.logging import RichHandler

from sendqueue import __version__
from sendqueue.cli import (
    campaign,
    db,
    demo,
    dlq,
    feedback,
    plan,
    sender,
    setup,
    steps,
    suppression,
    task,
    webhook,
    worker,
)
from sendqueue.cli.common import err, out, use_config, widen_help

__all__ = ["app", "main"]

app = typer.Typer(
    name="sendqueue",
    help="Scheduled email campaigns: one durable task and one schedule per email.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(campaign.campaign_app, name="campaign")
campaign.campaign_app.add_typer(steps.step_app, name="step")
app.add_typer(task.task_app, name="task")
app.add_typer(dlq.dlq_app, name="dlq")
app.add_typer(sender.sender_app, name="sender")
app.add_typer(suppression.suppression_app, name="suppression")
app.add_typer(feedback.feedback_app, name="feedback")
app.add_typer(webhook.webhook_app, name="webhook")
app.add_typer(db.db_app, name="db")


def _print_version(value: bool) -> None:
    # An eager option's callback runs before Typer looks for a command, so it needs none.
    if value:
        out.print(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            envvar="SENDQUEUE_CONFIG",
            metavar="PATH",
            help="The settings file every command reads; the environment overrides it "
            "(default: ./sendqueue.env, else ./.env, when there).",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    use_config(ctx, config)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=False)],
    )


# The top-level commands, in the order the help lists them.
app.command("init")(setup.init_cmd)
app.command("check")(setup.check_cmd)
app.command("plan")(plan.plan_cmd)
app.command("reconcile")(worker.reconcile_cmd)
app.command("worker")(worker.worker_cmd)
app.command("serve")(worker.serve_cmd)
app.command("demo")(demo.demo_cmd)


def main() -> None:
    """Console entry point."""
    widen_help()
    app()
