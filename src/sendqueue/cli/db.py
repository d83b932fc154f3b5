"""``sendqueue db``: schema upgrades, backups and the move to PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sendqueue.bootstrap import (
    bootstrap,
    sql_store_of,
    upgrade_scheduler_schema,
    upgrade_store_schema,
)
from sendqueue.cli.common import JsonOpt, container, err, fail, handle_errors, out, print_json
from sendqueue.cli.common import settings as command_settings
from sendqueue.domain.errors import InvalidSettings
from sendqueue.domain.wording import plural
from sendqueue.settings import Settings, load_settings, redact_url

__all__ = ["db_app"]

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)


@db_app.command("upgrade")
@handle_errors
def db_upgrade() -> None:
    """Apply the schema migrations to SENDQUEUE_DATABASE_URL."""
    settings = command_settings()
    out.print(f"database at revision {upgrade_store_schema(settings)}")
    version = upgrade_scheduler_schema(settings)
    if version is not None:
        out.print(f"procrastinate schema at {version}")


@db_app.command("backup")
@handle_errors
def db_backup(
    path: Annotated[
        Path, typer.Argument(help="A new directory for store.db, scheduler.db and backup.json.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Online, consistent copy of the SQLite task store and the scheduler file (safe while
    workers run). For PostgreSQL it prints the pg_dump advice and exits 2."""
    from sendqueue.ops.backup import backup_sqlite, is_postgres, postgres_advice

    with container() as c:  # settings only: opens no store
        settings = c.settings
        now = c.clock.now()
    if is_postgres(settings.database_url):
        fail(2, postgres_advice(settings.database_url, str(path)))
    report = backup_sqlite(
        settings.database_url,
        settings.scheduler_url if settings.execution == "embedded" else None,
        path,
        now=now,
    )
    if as_json:
        print_json(report.as_dict())
        return
    for copied in (report.store, report.scheduler):
        if copied is not None:
            rows = ", ".join(f"{n} {k}" for k, n in copied.rows.items())
            out.print(
                f"{copied.source} -> {copied.target} ({copied.bytes} bytes; {rows})",
                markup=False,
            )
    out.print(
        f"backup complete in {report.directory}; to restore, put both files back with the "
        "workers stopped, then run `sendqueue reconcile`",
        markup=False,
    )


@db_app.command("migrate-to")
@handle_errors
def db_migrate_to(
    url: Annotated[
        str, typer.Argument(help="The empty PostgreSQL database: postgresql+psycopg://...")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Copy this SQLite deployment into PostgreSQL and schedule its pending emails there
    (procrastinate). Stop every worker first; see docs/deploy-postgres.md."""
    from sendqueue.ops.migrate_to import migrate_to

    with container() as source:
        try:
            settings = load_settings(
                Settings,
                **{
                    **source.settings.model_dump(),
                    "database_url": url,
                    "execution": "procrastinate",
                },
            )
        except InvalidSettings as exc:  # the URL argument stands for SENDQUEUE_DATABASE_URL
            raise InvalidSettings([f"invalid target: {p}" for p in exc.problems]) from None
        target = bootstrap(settings)
        try:
            report = migrate_to(
                source.settings.database_url,
                sql_store_of(target),
                target.writer,
                target.clock,
                target_label=redact_url(url),
                retire_group=source.writer.delete_group,
            )
        finally:
            target.close()
    if as_json:
        print_json(report.as_dict())
        return
    out.print(
        f"copied {plural(report.campaigns, 'campaign')}, {plural(report.tasks, 'email')}, "
        f"{plural(report.changes, 'change')}; {report.schedules_created} of "
        f"{plural(report.pending, 'pending email')} scheduled"
    )
    for error in report.schedule_errors:
        err.print(f"  not scheduled (the reconciler retries): {error}", markup=False)
    if report.retired:
        out.print(f"paused in the old database: {', '.join(report.retired)}")
    out.print(
        f"next: run the workers with SENDQUEUE_DATABASE_URL={redact_url(url)} "
        "SENDQUEUE_EXECUTION=procrastinate",
        markup=False,
    )
