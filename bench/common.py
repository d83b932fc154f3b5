"""What every benchmark shares: summaries, machine facts, child processes, the SMTP sink and
throwaway PostgreSQL databases.

A figure is a :class:`Summary` of repeated measurements (median, min, max, every value). Ratios
are taken between the medians of one run, where the baseline and sendqueue ran alternately on
the same machine, so a busy machine slows both.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import secrets
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "Summary",
    "cpu_seconds",
    "free_port",
    "machine_facts",
    "peak_rss_mb",
    "percentile",
    "postgres_database",
    "postgres_skip_reason",
    "run_child",
    "smtp_sink",
    "summarize",
]

ROOT = Path(__file__).resolve().parents[1]

#: The server's admin database; each benchmark makes (and drops) its own database next to it.
POSTGRES_ADMIN_URL = os.environ.get(
    "SENDQUEUE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass(frozen=True)
class Summary:
    """Repeated measurements of one figure."""

    median: float
    min: float
    max: float
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "values": list(self.values),
        }


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("nothing measured")
    return Summary(statistics.median(values), min(values), max(values), tuple(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, -(-round(q * len(ordered) * 1_000_000) // 1_000_000))
    return ordered[min(len(ordered), rank) - 1]


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_facts() -> dict[str, Any]:
    """What the figures depend on, taken when the run starts."""
    import sqlalchemy

    facts: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "load_average_at_start": list(os.getloadavg()),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with contextlib.suppress(ImportError):
        import apscheduler

        facts["apscheduler"] = apscheduler.__version__
    with contextlib.suppress(Exception):
        facts["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return facts


def run_child(module: str, *args: str, timeout: float = 900) -> dict[str, Any]:
    """Run ``python -m module args`` in a fresh interpreter; its last stdout line is JSON.

    A child per measurement gives each one a clean heap, so its ``ru_maxrss`` is its own peak.
    """
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{module} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def peak_rss_mb() -> float:
    """This process's peak resident set size, in MB.

    VmHWM, not ``ru_maxrss``: Linux carries the RSS a process had when it forked across
    ``execve`` into ``ru_maxrss``, so a child started by a large parent would report at least
    the parent's size. VmHWM belongs to the new program's memory alone.
    """
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_usage() -> dict[str, float]:
    """This process's CPU seconds and peak RSS (MB), for a child's JSON line."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak_rss_mb()}


# -- the SMTP sink ------------------------------------------------------------------------------


@contextlib.contextmanager
def smtp_sink() -> Iterator[int]:
    """An aiosmtpd server in its own process that accepts every message; yields its port.

    Its own process, so the sink's work does not compete with the sender for one GIL: the
    baseline loop and sendqueue both send into this same process.
    """
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.sink", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the SMTP sink did not start: {line!r}")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


# -- PostgreSQL -----------------------------------------------------------------------------------


def postgres_skip_reason() -> str | None:
    """Why the PostgreSQL benchmarks cannot run here, or None when the server answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {str(exc).strip()}"
    return None


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database for one measurement (dropped afterwards); yields its SQLAlchemy URL."""
    import psycopg

    name = f"sq_bench_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def alternate(rounds: int, *runs: Callable[[int], None]) -> None:
    """Call every run once per round, the order flipped every other round, so neither side
    always goes first (warm caches, a burst of load from elsewhere)."""
    for n in range(rounds):
        order = runs if n % 2 == 0 else tuple(reversed(runs))
        for run in order:
            run(n)
