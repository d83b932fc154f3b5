"""``sendqueue suppression``: the global list of addresses never to send to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sendqueue.cli.common import JsonOpt, container, handle_errors, out, print_json
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.domain.wording import plural
from sendqueue.services.feedback.suppression import MAX_PAGE, to_csv
from sendqueue.services.reading.views import SuppressionView

__all__ = ["suppression_app"]

suppression_app = typer.Typer(
    help="The suppression list: addresses never sent to (compared case-insensitively).",
    no_args_is_help=True,
)

_REASONS = ", ".join(r.value for r in SuppressionReason)


@suppression_app.command("list")
@handle_errors
def suppression_list(
    limit: Annotated[int, typer.Option("--limit", help="At most this many (0 = all).")] = 100,
    after: Annotated[
        str | None, typer.Option("--after", help="Cursor: the address to start after.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Suppressed addresses in address order."""
    if limit < 0:
        raise InvalidField("limit", limit, "must be 0 (all) or more")
    rows: list[SuppressionView] = []
    with container() as c:
        total = c.suppression.count()
        cursor = after
        while True:
            page = min(MAX_PAGE, limit - len(rows)) if limit else MAX_PAGE
            batch = c.suppression.page(after=cursor, limit=page)
            rows.extend(SuppressionView.of(e) for e in batch)
            if len(batch) < page or (limit and len(rows) >= limit):
                break
            cursor = batch[-1].email
    if as_json:
        print_json([r.as_json() for r in rows])
        return
    table = Table(
        title=f"{len(rows)} of {plural(total, 'suppressed address', 'suppressed addresses')}"
    )
    for col in ("email", "reason", "task", "at"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.email, r.reason, r.task_id or "", r.at)
    out.print(table)


@suppression_app.command("add")
@handle_errors
def suppression_add(
    email: Annotated[str, typer.Argument(help="The address to suppress.")],
    reason: Annotated[str, typer.Option("--reason", help=f"One of {_REASONS}.")] = "manual",
    as_json: JsonOpt = False,
) -> None:
    """Suppress an address (one listed already keeps its first entry)."""
    with container() as c:
        added = c.suppression.add(email, reason)
    view = SuppressionView.of(added.entry)
    if as_json:
        print_json({**view.as_json(), "new": added.new})
        return
    if added.new:
        out.print(f"suppressed {view.email} ({view.reason})", markup=False)
    else:
        out.print(f"{view.email} was suppressed already ({view.reason}, {view.at})", markup=False)


@suppression_app.command("remove")
@handle_errors
def suppression_remove(
    email: Annotated[str, typer.Argument(help="The address to take off the list.")],
) -> None:
    """Take an address off the list (its cancelled emails stay cancelled)."""
    with container() as c:
        key = c.suppression.remove(email)
    out.print(f"removed {key} from the suppression list", markup=False)


@suppression_app.command("import")
@handle_errors
def suppression_import(
    file: Annotated[
        Path, typer.Argument(help="CSV with an 'email' column; optional 'reason', 'task_id', 'at'.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Suppress every address of a CSV file: all rows, or none if any row is bad (the file is
    read twice: checked whole, then written in chunks)."""
    with container() as c:
        imported = c.suppression.import_file(file)
    if as_json:
        print_json({"rows": imported.rows, "added": imported.added, "kept": imported.kept})
        return
    out.print(
        f"imported {plural(imported.rows, 'row')}: {imported.added} added, "
        f"{imported.kept} listed already",
        markup=False,
    )


@suppression_app.command("export")
@handle_errors
def suppression_export(
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write the CSV here [default: stdout].")
    ] = None,
) -> None:
    """The whole list as CSV (email, reason, task_id, at): what ``import`` reads back."""
    with container() as c:
        lines = to_csv(c.suppression.all())
        if out_file is None:
            sys.stdout.writelines(lines)
            return
        try:
            with out_file.open("w", encoding="utf-8", newline="") as handle:
                handle.writelines(lines)
        except OSError as exc:
            raise InvalidField("out", str(out_file), f"cannot write it: {exc}") from exc
