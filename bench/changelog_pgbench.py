"""Benchmark 8's question with writers that cost no client CPU: pgbench as the writers.

Benchmark 8 runs its writers as Python threads on the machine's two cores, beside PostgreSQL:
without the lock they are short of CPU (the store's ``transition`` costs about 0.5 ms of
Python a call), so its ratio says as much about the client's CPU as about the lock. Here
``pgbench`` (C, a fraction of that CPU) runs the same shape of write, one statement a
transaction: a compare-and-set UPDATE of one task row and its change-log INSERT, with and
without the old global advisory lock taken between them, as bench 8's anchor does.
Each transaction flips a random task between Pending and Running (the id function and its
horizon are the store's own: the change log's column default).

    python -m bench.changelog_pgbench [--clients 8] [--seconds 20] [--repeats 3] [--tasks 4000]

Needs ``pgbench`` (PostgreSQL's client package) on PATH or under /usr/lib/postgresql/*/bin.
A measurement beside bench 8, not a target of its own (docs/performance-history.md).
"""

from __future__ import annotations

import argparse
import glob
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.changelog import _CID, OLD_LOCK_KEY, prepare
from bench.common import postgres_database, summarize

#: One transaction: flip a random task's state, log it; ``{lock}`` is the old global lock.
_SCRIPT = """\\set i random(0, {last})
WITH moved AS (UPDATE tasks SET state = CASE state WHEN 'Pending' THEN 'Running' ELSE 'Pending'
  END, updated_at = now() WHERE id = '{cid}-' || :i RETURNING campaign_id, id, state),
{lock}logged AS (INSERT INTO change_log (campaign_id, task_id, from_state, to_state, at, note)
  SELECT campaign_id, id, NULL, state, now(), NULL FROM {source})
SELECT id FROM moved;
"""
_LOCK = (
    f"locked AS (SELECT campaign_id, id, state, pg_advisory_xact_lock({OLD_LOCK_KEY})"
    " FROM moved),\n"
)


def pgbench() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        raise SystemExit("pgbench not found: install PostgreSQL's client package")
    return found


def _libpq(url: str) -> str:
    """The SQLAlchemy URL of a bench database as a libpq URI."""
    return re.sub(r"^postgresql\+\w+://", "postgresql://", url)


def run_once(*, locked: bool, clients: int, seconds: int, tasks: int) -> float:
    """Transactions per second of one pgbench run on a fresh database."""
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        prepare(url, tasks)
        script = Path(tmp) / "flip.sql"
        script.write_text(
            _SCRIPT.format(
                last=tasks - 1,
                cid=_CID,
                lock=_LOCK if locked else "",
                source="locked" if locked else "moved",
            )
        )
        done = subprocess.run(
            [pgbench(), "-n", "-f", str(script), "-c", str(clients), "-j", "2",
             "-T", str(seconds), "-M", "prepared", _libpq(url)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"pgbench failed: {done.stderr.strip()}")
        match = re.search(r"tps = ([\d.]+)", done.stdout)
        if match is None:
            raise SystemExit(f"pgbench printed no tps: {done.stdout.strip()}")
        return float(match.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tasks", type=int, default=4000)
    args = p.parse_args()
    rates: dict[bool, list[float]] = {True: [], False: []}
    for n in range(args.repeats):
        for locked in (True, False) if n % 2 == 0 else (False, True):
            rate = run_once(
                locked=locked, clients=args.clients, seconds=args.seconds, tasks=args.tasks
            )
            rates[locked].append(rate)
            print(f"repeat {n + 1}: {'global lock' if locked else 'no lock'}: {rate:,.0f} tx/s")
    before, after = summarize(rates[True]), summarize(rates[False])
    print(f"global lock: median {before.median:,.0f} tx/s ({before.min:,.0f}-{before.max:,.0f})")
    print(f"no lock: median {after.median:,.0f} tx/s ({after.min:,.0f}-{after.max:,.0f})")
    print(f"ratio of medians: {after.median / before.median:.2f}x")


if __name__ == "__main__":
    main()
