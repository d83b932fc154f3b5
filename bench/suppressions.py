"""Peak memory and time of a big suppression-list import (benchmark 13): the CLI's
``sendqueue suppression import FILE`` and ``POST /api/suppressions/import`` through the web
server (uvicorn on 127.0.0.1, as ``sendqueue serve`` runs it; the upload streamed by an httpx
client in the same process, 64 KiB at a time), both into the embedded SQLite store.

Each measurement runs in a child interpreter (``python -m bench.suppressions MODE CSV HOME``) so
its peak RSS (VmHWM) is its own. The target: 150 MB for 1M rows, scaled from two sizes as
:mod:`bench.imports` scales the campaign import (``peak(n) = base + n * per_row``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.common import peak_rss_mb, run_child
from bench.imports import scale_to_million

__all__ = ["MODES", "TARGET_MB_PER_MILLION", "run", "write_csv"]

TARGET_MB_PER_MILLION = 150.0
MODES = ("cli", "api")
_MAX_BYTES = 200 * 1024 * 1024


def write_csv(path: Path, rows: int) -> int:
    """A suppression CSV of ``rows`` distinct addresses (32 bytes a row)."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write("email,reason\n")
        for i in range(rows):
            fh.write(f"user{i:07d}@example.com,bounced\n")
    return path.stat().st_size


def _env(home: Path) -> dict[str, str]:
    return {
        "SENDQUEUE_DATABASE_URL": f"sqlite:///{home / 'store.db'}",
        "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{home / 'scheduler.db'}",
        "SENDQUEUE_MAILER": f"maildir:{home / 'outbox'}",
        "SENDQUEUE_MAX_UPLOAD_BYTES": str(_MAX_BYTES),
    }


def _cli(csv_path: Path, home: Path) -> int:
    from sendqueue.cli.root import main

    os.environ.update(_env(home))
    sys.argv = ["sendqueue", "suppression", "import", str(csv_path), "--json"]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings

    with closing(bootstrap(Settings(_env_file=None))) as c:
        return c.suppression.count()


def _api(csv_path: Path, home: Path) -> int:
    import httpx

    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings
    from sendqueue.web.app import build_server, create_app

    os.environ.update(_env(home))
    with closing(bootstrap(Settings(_env_file=None))) as c:
        server = build_server(create_app(c), host="127.0.0.1", port=0)
        thread = threading.Thread(target=server.run, name="bench-uvicorn", daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            with (
                httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=3600) as client,
                csv_path.open("rb") as fh,
            ):
                response = client.post(
                    "/api/suppressions/import", files={"file": ("s.csv", fh, "text/csv")}
                )
            if response.status_code != 200:
                raise RuntimeError(f"import: {response.status_code} {response.text[:500]}")
        finally:
            server.should_exit = True
            thread.join(20)
        return c.suppression.count()


def _child(mode: str, csv_path: Path, home: Path) -> dict[str, Any]:
    start = time.perf_counter()
    count = _cli(csv_path, home) if mode == "cli" else _api(csv_path, home)
    return {
        "mode": mode,
        "count": count,
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak_rss_mb(),
    }


def run(sizes: tuple[int, int] = (50_000, 200_000)) -> dict[str, Any]:
    """Both modes at two sizes; the peak scaled to 1M rows and checked against the target."""
    out: dict[str, Any] = {"target_mb_per_million": TARGET_MB_PER_MILLION, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for n in sizes:
            files[n] = Path(tmp) / f"s{n}.csv"
            write_csv(files[n], n)
        for mode in MODES:
            figures = {}
            for n in sizes:
                home = Path(tmp) / f"{mode}-{n}"
                home.mkdir()
                figures[n] = run_child("bench.suppressions", mode, str(files[n]), str(home))
                if figures[n]["count"] != n:
                    raise RuntimeError(f"{mode} imported {figures[n]['count']} of {n} rows")
            peak, seconds = scale_to_million(sizes, figures[sizes[0]], figures[sizes[1]])
            out["modes"][mode] = {
                "runs": {str(n): f for n, f in figures.items()},
                "peak_mb_at_1m": round(peak, 1),
                "seconds_at_1m": round(seconds, 1),
                "pass": peak <= TARGET_MB_PER_MILLION,
            }
    out["sizes"] = list(sizes)
    out["targets"] = [
        {
            "name": f"suppression import peak RSS per 1M rows ({mode}, scaled from "
            f"{sizes[0]:,} and {sizes[1]:,} rows)",
            "value": figures["peak_mb_at_1m"],
            "limit": TARGET_MB_PER_MILLION,
            "unit": "MB",
            "passed": figures["pass"],
        }
        for mode, figures in out["modes"].items()
    ]
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4:
        print(json.dumps(_child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))))
    else:
        sizes = tuple(int(x) for x in sys.argv[1:3]) if len(sys.argv) == 3 else (50_000, 200_000)
        print(json.dumps(run((sizes[0], sizes[1])), indent=2))
