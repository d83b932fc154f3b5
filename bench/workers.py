"""More worker processes beside a benchmark's child (``--workers N`` of throughput, dispatch).

Each extra process runs ``python -m MODULE ARGS`` and speaks a line protocol on its stdin and
stdout: it prints ``ready`` once set up (imports, bootstrap, connections), starts on the line
``go``, stops on the line ``stop`` and then prints one JSON line. Starting them all on ``go``
keeps their start-up time out of the measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from bench.common import ROOT

__all__ = ["ExtraWorkers", "extra_workers", "wait_for_line"]


def wait_for_line(stream: IO[str], expected: str) -> None:
    """Block until ``expected`` is read from ``stream`` (the parent's go / stop)."""
    for line in stream:
        if line.strip() == expected:
            return
    raise RuntimeError(f"the parent closed the pipe before {expected!r}")


class ExtraWorkers:
    def __init__(self, procs: list[subprocess.Popen[str]], errs: list[IO[str]]) -> None:
        self.procs = procs
        self.errs = errs

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def stop(self, timeout: float = 120) -> list[dict[str, Any]]:
        """Stop every process; returns each one's JSON line."""
        results = []
        for proc in self.procs:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write("stop\n")
                proc.stdin.flush()
        for proc, errs in zip(self.procs, self.errs, strict=True):
            out, _ = proc.communicate(timeout=timeout)
            errs.seek(0)
            err = errs.read()
            lines = [line for line in out.splitlines() if line.strip()]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"an extra worker failed ({proc.returncode}): {err[-2000:]}")
            results.append(json.loads(lines[-1]))
        return results


@contextlib.contextmanager
def extra_workers(module: str, args: list[str], count: int) -> Iterator[ExtraWorkers]:
    """``count`` extra processes, each set up (``ready``) before this yields."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs: list[subprocess.Popen[str]] = []
    # stderr into files: a chatty process must never block on a full pipe
    errs: list[IO[str]] = []
    files = contextlib.ExitStack()
    try:
        for _ in range(count):
            # closed by ``files``
            errs.append(files.enter_context(tempfile.TemporaryFile(mode="w+")))  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", module, *args],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errs[-1],
                    text=True,
                )
            )
        for proc, err_file in zip(procs, errs, strict=True):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                err_file.seek(0)
                err = err_file.read()
                raise RuntimeError(f"an extra worker did not start: {line!r} {err[-2000:]}")
        yield ExtraWorkers(procs, errs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        files.close()
