"""What :mod:`bench.fleet` runs and watches from outside: a fleet of real ``sendqueue worker``
processes, and the CPU and PostgreSQL connections they use while a row is measured.

- :class:`Fleet` starts ``python -m sendqueue.cli worker`` (the ``sendqueue`` command's entry
  point) N times with the SENDQUEUE_* environment, as a deployment runs it. Each worker names
  its PostgreSQL connections through libpq's ``PGAPPNAME``, so ``pg_stat_activity`` tells them
  apart. Leaving the block stops every worker (SIGTERM, then SIGKILL after a grace period).
- :class:`Usage` samples, every ``interval`` seconds: the machine's CPU (``/proc/stat``), each
  worker's CPU time (``/proc/PID/stat``), the database's backends per application name and
  their CPU time (``pg_stat_activity``; the server runs on this machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.common import ROOT

__all__ = ["Fleet", "Usage", "machine_ticks", "process_cpu_seconds", "sigterm_exits"]

_TICK = os.sysconf("SC_CLK_TCK")
#: The line ``sendqueue worker`` logs once its container is built, before it dispatches.
READY_LINE = "worker started"


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already in user
    return total - idle, total


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit in the main thread meanwhile, so the ``finally`` blocks that
    stop the workers (and drop the database) run when the bench itself is terminated."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Fleet:
    """``workers`` worker processes with ``env`` (SENDQUEUE_* settings); logs under ``home``.

    Worker ``i`` is named ``{name}-{i}``: its log file and its PostgreSQL application name.
    """

    def __init__(self, workers: int, env: dict[str, str], home: Path, name: str) -> None:
        self.names = [f"{name}-{i}" for i in range(1, workers + 1)]
        self.env = env
        self.home = home
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Fleet:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        try:
            for name in self.names:
                env = {**self.env, "PGAPPNAME": name, "PYTHONPATH": path}
                with open(self._log(name), "wb") as log:  # the child keeps its own descriptor
                    self.procs[name] = subprocess.Popen(
                        [sys.executable, "-m", "sendqueue.cli", "worker"],
                        env=env,
                        cwd=self.home,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _log(self, name: str) -> Path:
        return self.home / f"{name}.log"

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def check(self) -> None:
        """Raise, with the end of its log, when a worker has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self._log(name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {name} exited ({proc.returncode}):\n{tail}")

    def wait_ready(self, timeout: float) -> float:
        """Wait until every worker has logged that it started; returns the epoch time then."""
        deadline = time.monotonic() + timeout
        waiting = set(self.names)
        while waiting:
            self.check()
            waiting = {n for n in waiting if READY_LINE not in self._log(n).read_text("utf-8")}
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"workers not started after {timeout:g} s: {sorted(waiting)}")
            if waiting:
                time.sleep(0.05)
        return time.time()

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every worker (in-flight sends finish), SIGKILL one still running after
        ``grace`` seconds; wait for all."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class Usage:
    """CPU and connections while a row runs (see the module docstring).

    ``workers``: name -> pid (the name is also the application name of its connections).
    ``database``: the PostgreSQL database whose backends are counted (None: no PostgreSQL).
    """

    def __init__(
        self,
        workers: dict[str, int],
        database: str | None,
        admin_url: str,
        interval: float = 0.25,
    ) -> None:
        self.workers = workers
        self.database = database
        self.admin_url = admin_url
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="usage", daemon=True)
        self._conn_max: dict[str, int] = dict.fromkeys(workers, 0)
        self._conn_total_max = 0
        self._backend_cpu: dict[int, tuple[float, float]] = {}  # pid -> (first, last) seen
        self._errors: list[str] = []

    def start(self) -> Usage:
        self._cpu0 = {name: process_cpu_seconds(pid) or 0.0 for name, pid in self.workers.items()}
        self._machine0 = machine_ticks()
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _sample(self) -> None:
        conn: Any = None
        if self.database is not None:
            import psycopg

            try:
                conn = psycopg.connect(
                    self.admin_url, autocommit=True, connect_timeout=5, application_name="fleet"
                )
            except psycopg.Error as exc:
                self._errors.append(str(exc))
        try:
            while True:
                if conn is not None:
                    self._backends(conn)
                if self._stop.wait(self.interval):
                    break
            if conn is not None:
                self._backends(conn)  # once more at the end: the last CPU readings
        finally:
            if conn is not None:
                conn.close()

    def _backends(self, conn: Any) -> None:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s",
            (self.database,),
        ).fetchall()
        counts: dict[str, int] = {}
        for pid, app in rows:
            counts[app] = counts.get(app, 0) + 1
            cpu = process_cpu_seconds(pid)
            if cpu is not None:
                first = self._backend_cpu.get(pid, (cpu, cpu))[0]
                self._backend_cpu[pid] = (first, cpu)
        total = 0
        for name in self.workers:
            total += counts.get(name, 0)
            self._conn_max[name] = max(self._conn_max[name], counts.get(name, 0))
        self._conn_total_max = max(self._conn_total_max, total)

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the figures since :meth:`start`."""
        wall = time.monotonic() - self._t0
        busy1, total1 = machine_ticks()
        cpu = {
            name: (process_cpu_seconds(pid) or self._cpu0[name]) - self._cpu0[name]
            for name, pid in self.workers.items()
        }
        self._stop.set()
        self._thread.join(30)
        busy0, total0 = self._machine0
        cores = os.cpu_count() or 1
        out: dict[str, Any] = {
            "wall_s": wall,
            "cores": cores,
            # share of every core's time that was busy (all processes on the machine)
            "machine_busy_percent": 100.0 * (busy1 - busy0) / max(1, total1 - total0),
            "worker_cpu_s": cpu,
            "worker_cpu_percent_of_one_core": {n: 100.0 * c / wall for n, c in cpu.items()},
            "load_average": list(os.getloadavg()),
        }
        if self.database is not None:
            out["postgres_cpu_s"] = sum(b - a for a, b in self._backend_cpu.values())
            out["connections_max"] = dict(self._conn_max)
            out["connections_peak_total"] = self._conn_total_max
        if self._errors:
            out["errors"] = self._errors
        return out
