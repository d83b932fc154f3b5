"""Moving an embedded deployment onto PostgreSQL: ``sendqueue db migrate-to URL``.

:func:`migrate_to` copies a SQLite task store (campaigns, recipients, tasks and the change log,
ids included, so a live UI resumes its stream where it was, the suppression list, the
feedback loop's soft bounces and mailbox positions, and the senders with their bookings, day
counts and sticky recipients) into an empty PostgreSQL task store, and
creates the schedules of the Pending tasks of active campaigns in the target's execution layer,
with the tasks' stored names and tokens. Overdue ones fire as soon as a target worker runs.

No send is lost or duplicated, because:

- The whole copy happens inside one write transaction on the source (SQLite ``BEGIN
  IMMEDIATE``): nothing in the source changes while it is read, and a source worker that is
  still running waits on the lock.
- It refuses to start while a send may be in flight: a Running task in the source (a worker is
  sending it, or died while sending it: stop the workers, then let ``sendqueue reconcile``
  resolve stale ones under the stale policy once ``SENDQUEUE_STALE_AFTER`` has passed), or a
  campaign still provisioning. An invocation that fired but has not claimed its task yet waits
  on the source's write lock and then finds its campaign paused (below): the send worker
  re-checks the campaign after its claim and gives the task back.
- In the same source transaction, after the target has committed, every active source campaign
  is paused with a reason naming the move, and the source's schedules are deleted afterwards: a
  forgotten source worker claims nothing (the send worker only sends for active campaigns, and
  re-checks after its claim). If the target copy fails, the source is left untouched.
- Each email is Pending in exactly one live deployment (the target), whose worker claims it
  with the usual conditional write.

The target must be empty (no campaign, no sender). Its schema is created or upgraded first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql

from sendqueue.adapters.sql import SqlTaskStore, schema
from sendqueue.adapters.sql.schema import WRITE, create_store_engine
from sendqueue.domain.errors import Conflict, InvalidField, StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import schedule_group
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, TaskStore
from sendqueue.services.planning.replanning import iter_tasks
from sendqueue.services.scheduling.schedules import ScheduleWriter

__all__ = ["COPIED_TABLES", "SENDER_TABLES", "MigrationReport", "migrate_to"]

log = logging.getLogger(__name__)

#: The task store's tables, in foreign-key order. Leases are not copied: they belong to the
#: processes of the old deployment.
COPIED_TABLES = (
    schema.campaigns,
    schema.recipients,
    schema.tasks,
    schema.change_log,
    schema.away_dates,
)

#: The sender store's tables (migration 0007), in foreign-key order, copied as they are into a
#: target that has no sender yet: a booking names its sender's id, and the day counts are the
#: bookings' own. The sticky recipients are insert-or-keep.
SENDER_TABLES = (schema.senders, schema.sender_days, schema.sender_bookings)


@dataclass
class MigrationReport:
    """What a migration copied and scheduled."""

    campaigns: int = 0
    recipients: int = 0
    tasks: int = 0
    changes: int = 0
    suppressions: int = 0
    soft_bounces: int = 0
    away_dates: int = 0
    """Recipients' return dates (out-of-office notices) copied."""
    feedback_cursors: int = 0
    senders: int = 0
    bookings: int = 0
    """Sender bookings (planned and sent) copied."""
    webhooks: int = 0
    """Webhook endpoints copied, with their secrets and cursors (change ids are copied as
    they are, so each resumes where it was); their delivery logs stay behind."""
    pending: int = 0
    schedules_created: int = 0
    schedule_errors: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    """Source campaigns paused so that the old deployment sends nothing more."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _rows(conn: sa.Connection, table: sa.Table, batch: int) -> Iterator[list[dict[str, Any]]]:
    order = list(table.primary_key.columns)
    result = conn.execution_options(yield_per=batch).execute(sa.select(table).order_by(*order))
    for part in result.partitions(batch):
        yield [dict(row._mapping) for row in part]


def _refuse_if_busy(conn: sa.Connection) -> None:
    running = conn.execute(
        sa.select(sa.func.count())
        .select_from(schema.tasks)
        .where(schema.tasks.c.state == TaskState.RUNNING.value)
    ).scalar_one()
    if running:
        raise Conflict(
            f"the source has {plural(running, 'Running task')}: a worker is sending, or died "
            "while sending. Stop every worker, then run `sendqueue reconcile` once "
            "SENDQUEUE_STALE_AFTER has passed (the stale policy decides their outcome), and "
            "migrate again"
        )
    provisioning = (
        conn.execute(
            sa.select(schema.campaigns.c.id).where(
                schema.campaigns.c.state == CampaignState.PROVISIONING.value
            )
        )
        .scalars()
        .all()
    )
    if provisioning:
        raise Conflict(
            f"{plural(len(provisioning), 'campaign')} still provisioning "
            f"({', '.join(sorted(provisioning))}): finish with `sendqueue campaign provision ID`, "
            "then migrate"
        )


def _copy(
    source: sa.Connection, target: sa.Connection, report: MigrationReport, batch: int
) -> None:
    existing = target.execute(sa.select(sa.func.count()).select_from(schema.campaigns))
    if existing.scalar_one():
        raise Conflict("the target database has campaigns already; migrate-to needs an empty one")
    senders = target.execute(sa.select(sa.func.count()).select_from(schema.senders))
    if senders.scalar_one():
        # Their ids or addresses could clash with the source's, and their day counts would not
        # be the copied bookings'.
        raise Conflict(
            "the target database has senders already; migrate-to needs an empty one "
            "(remove them there, or add them again after the move)"
        )
    counters = {
        "campaigns": "campaigns",
        "recipients": "recipients",
        "tasks": "tasks",
        "change_log": "changes",
        "away_dates": "away_dates",
    }
    for table in COPIED_TABLES:
        for rows in _rows(source, table, batch):
            target.execute(sa.insert(table), rows)
            name = counters[table.name]
            setattr(report, name, getattr(report, name) + len(rows))
    _copy_counters(source, target)
    report.suppressions = _copy_suppressions(source, target, batch)
    report.soft_bounces = _copy_soft_bounces(source, target, batch)
    report.feedback_cursors = _copy_feedback_cursors(source, target)
    report.senders, report.bookings = _copy_senders(source, target, batch)
    report.webhooks = _copy_webhooks(source, target)
    # Ids were copied as they were; new ids must exceed them (migration 0004's rebase).
    target.execute(sa.text("SELECT sq_change_log_rebase()"))


def _copy_suppressions(source: sa.Connection, target: sa.Connection, batch: int) -> int:
    """The suppression list, insert-or-keep: an address the target lists already keeps its
    entry. Returns how many were new there."""
    added = 0
    for rows in _rows(source, schema.suppressions, batch):
        insert = postgresql.insert(schema.suppressions).values(rows).on_conflict_do_nothing()
        added += len(target.execute(insert.returning(schema.suppressions.c.email)).all())
    return added


def _copy_soft_bounces(source: sa.Connection, target: sa.Connection, batch: int) -> int:
    """The transient bounces still counting towards a suppression, insert-or-keep (one per
    address and message either way); how many were new there."""
    table = schema.soft_bounces
    added = 0
    for rows in _rows(source, table, batch):
        insert = postgresql.insert(table).values(rows).on_conflict_do_nothing()
        added += len(target.execute(insert.returning(table.c.email)).all())
    return added


def _copy_webhooks(source: sa.Connection, target: sa.Connection) -> int:
    """The webhook endpoints, insert-or-keep by id; how many were new there."""
    table = schema.webhook_endpoints
    rows = [dict(row._mapping) for row in source.execute(sa.select(table))]
    if not rows:
        return 0
    insert = postgresql.insert(table).values(rows).on_conflict_do_nothing()
    return len(target.execute(insert.returning(table.c.id)).all())


def _copy_feedback_cursors(source: sa.Connection, target: sa.Connection) -> int:
    """Each feedback mailbox's position, so the target's poller does not read every message
    again: a position the target holds already is only moved forward (the store's rule), and
    one under another UIDVALIDITY is the target's own and stays. How many were written."""
    table = schema.feedback_cursors
    written = 0
    columns = (table.c.mailbox, table.c.uidvalidity, table.c.uid)
    for mailbox, uidvalidity, uid in source.execute(sa.select(*columns)).all():
        insert = postgresql.insert(table).values(mailbox=mailbox, uidvalidity=uidvalidity, uid=uid)
        upsert = insert.on_conflict_do_update(
            index_elements=[table.c.mailbox],
            set_={"uid": insert.excluded.uid},
            where=sa.and_(
                table.c.uidvalidity == insert.excluded.uidvalidity,
                table.c.uid < insert.excluded.uid,
            ),
        )
        written += len(target.execute(upsert.returning(table.c.mailbox)).all())
    return written


def _copy_senders(source: sa.Connection, target: sa.Connection, batch: int) -> tuple[int, int]:
    """The senders, their day counts and bookings (into a target without senders: see
    _copy), and the sticky recipients, insert-or-keep; how many senders and bookings."""
    copied: dict[str, int] = {}
    for table in SENDER_TABLES:
        copied[table.name] = 0
        for rows in _rows(source, table, batch):
            target.execute(sa.insert(table), rows)
            copied[table.name] += len(rows)
    contacts = schema.sender_contacts
    for rows in _rows(source, contacts, batch):
        target.execute(postgresql.insert(contacts).values(rows).on_conflict_do_nothing())
    return copied[schema.senders.name], copied[schema.sender_bookings.name]


def _copy_counters(source: sa.Connection, target: sa.Connection) -> None:
    """Counters too (the session generation), the higher value winning: a logout on the old
    store must not be undone by the move. A source from before migration 0002 has none."""
    if not sa.inspect(source).has_table(schema.counters.name):
        return
    for name, value in source.execute(sa.select(schema.counters)).all():
        insert = postgresql.insert(schema.counters).values(name=name, value=value)
        target.execute(
            insert.on_conflict_do_update(
                index_elements=[schema.counters.c.name],
                set_={"value": sa.func.greatest(schema.counters.c.value, insert.excluded.value)},
            )
        )


def _retire(conn: sa.Connection, clock: Clock, reason: str) -> list[str]:
    """Pause the source's active campaigns (logged like any pause), in the caller's
    transaction."""
    now = clock.now()
    active = (
        conn.execute(
            sa.select(schema.campaigns.c.id).where(
                schema.campaigns.c.state == CampaignState.ACTIVE.value
            )
        )
        .scalars()
        .all()
    )
    if not active:
        return []
    conn.execute(
        sa.update(schema.campaigns)
        .where(
            schema.campaigns.c.id.in_(active),
            schema.campaigns.c.state == CampaignState.ACTIVE.value,
        )
        .values(state=CampaignState.PAUSED.value, state_reason=reason, updated_at=now)
    )
    conn.execute(
        sa.insert(schema.change_log),
        [
            {
                "campaign_id": cid,
                "task_id": None,
                "from_state": CampaignState.ACTIVE.value,
                "to_state": CampaignState.PAUSED.value,
                "at": now,
                "note": reason,
            }
            for cid in active
        ],
    )
    return sorted(active)


def migrate_to(
    source_url: str,
    target: TaskStore,
    writer: ScheduleWriter,
    clock: Clock,
    *,
    target_label: str = "PostgreSQL",
    retire_group: Callable[[str], int] | None = None,
    batch: int = 5000,
) -> MigrationReport:
    """Copy the SQLite store at ``source_url`` into ``target`` and schedule its Pending tasks.

    ``writer`` creates schedules in the target's execution layer; ``retire_group`` deletes a
    group of schedules in the source's execution layer once the source is retired.
    ``target_label`` names the target in the reason recorded on the retired source campaigns
    (no password in it).
    Raises Conflict when it refuses (see the module docstring), InvalidField for a source that
    is not SQLite or a target that is not PostgreSQL, StoreUnavailable for database failures.
    """
    if not isinstance(target, SqlTaskStore) or target.engine.dialect.name != "postgresql":
        raise InvalidField("url", target_label, "migrate-to copies into a PostgreSQL database")
    source = create_store_engine(source_url)
    if source.dialect.name != "sqlite":
        source.dispose()
        raise InvalidField(
            "SENDQUEUE_DATABASE_URL", source_url, "migrate-to copies from a SQLite task store"
        )
    report = MigrationReport()
    reason = f"moved to {target_label} by `sendqueue db migrate-to`; this database is retired"
    copied = False
    try:
        with source.execution_options(**WRITE).begin() as src:
            _refuse_if_busy(src)
            with target.engine.begin() as dst:
                _copy(src, dst, report, batch)
            copied = True
            report.retired = _retire(src, clock, reason)
    except sa_exc.SQLAlchemyError as exc:
        if copied:
            raise StoreUnavailable(
                f"the data was copied to {target_label}, but pausing the source campaigns "
                f"failed ({exc}): do not start workers on the source again"
            ) from exc
        raise StoreUnavailable(f"migrate-to failed; nothing changed: {exc}") from exc
    finally:
        source.dispose()
    log.info("migrate-to copied %s", report.as_dict())
    for campaign in target.list_campaigns():
        if campaign.state is not CampaignState.ACTIVE:
            continue
        pending = list(iter_tasks(target, campaign.id, TaskState.PENDING))
        report.pending += len(pending)
        result = writer.ensure_many(pending)
        report.schedules_created += result.created
        report.schedule_errors.extend(f"{tid}: {err}" for tid, err in result.failed[:20])
    if retire_group is not None:
        for cid in report.retired:
            try:
                retire_group(schedule_group(cid))
            except Exception as exc:  # the paused campaigns send nothing anyway
                log.warning("deleting the old schedules of %s failed: %s", cid, exc)
    return report
