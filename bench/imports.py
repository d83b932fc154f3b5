"""Peak memory and time of a big recipients import: a CSV previewed and created through the
service (what the CLI and the API call), the CLI's ``campaign create``, and the API's upload.

Each measurement runs in a child interpreter (``python -m bench.imports MODE CSV HOME``) so its
peak RSS (VmHWM) is its own. The target is stated per million rows: 300 MB for 1M rows. The
default run imports fewer rows; the part of the peak that grows with rows is scaled to 1M from
two sizes (``peak(n) = base + n * per_row``), and the target applies to ``base + 1M * per_row``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.common import peak_rss_mb, run_child

__all__ = ["TARGET_MB_PER_MILLION", "run", "scale_to_million", "write_csv"]

TARGET_MB_PER_MILLION = 300.0
MODES = ("service-preview", "service-create", "cli-create", "api-preview", "api-create")
_POLICY = {"timezone": "UTC", "per_day": 10_000, "weekdays": "mon-sun", "windows": "00:00-24:00"}


def write_csv(path: Path, rows: int) -> int:
    """A recipients CSV of ``rows`` rows (about 31 bytes a row, like the issue's file)."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write("email,name\n")
        for i in range(rows):
            fh.write(f"user{i:07d}@example.com,User {i}\n")
    return path.stat().st_size


def _settings(home: Path) -> Any:
    from sendqueue.settings import Settings

    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        default_timezone="UTC",
    )


def _child(mode: str, csv_path: Path, home: Path) -> dict[str, Any]:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.planner import plan
    from sendqueue.domain.policy import SendingPolicy
    from sendqueue.services.importing.recipients import ImportLimits, Templates

    templates = Templates(subject="Hello {{ name }}", body="Hi {{ name }}, news for {{ email }}.")
    policy = SendingPolicy.from_dict({**_POLICY, "windows": [_POLICY["windows"]]})
    limits = ImportLimits(max_bytes=200 * 1024 * 1024, max_rows=2_000_000)
    start = time.perf_counter()
    count = 0
    if mode.startswith("service"):
        c = bootstrap(_settings(home))
        with closing(c):
            if mode == "service-preview":
                draft = c.campaign_import.validate(
                    name="big", recipients=csv_path, templates=templates, limits=limits
                )
                imported: Any = draft.imported  # main's ImportResult has no count
                n = getattr(imported, "count", None)
                count = len(
                    plan(policy, len(imported.recipients) if n is None else n, now=c.clock.now())
                )
            else:
                created = c.campaign_import.create(
                    name="big",
                    recipients=csv_path,
                    policy=policy,
                    templates=templates,
                    limits=limits,
                )
                count = created.campaign.recipient_count
    elif mode == "cli-create":
        from sendqueue.cli.root import main

        body = home / "body.txt"
        body.write_text(templates.body or "", encoding="utf-8")

        os.environ.update(
            SENDQUEUE_DATABASE_URL=f"sqlite:///{home / 'store.db'}",
            SENDQUEUE_SCHEDULER_URL=f"sqlite:///{home / 'scheduler.db'}",
            SENDQUEUE_MAILER=f"maildir:{home / 'outbox'}",
            SENDQUEUE_MAX_UPLOAD_BYTES=str(limits.max_bytes),
            SENDQUEUE_MAX_RECIPIENTS=str(limits.max_rows),
        )
        sys.argv = [
            "sendqueue",
            "campaign",
            "create",
            "--name",
            "big",
            "--recipients",
            str(csv_path),
            "--subject",
            "Hello {{ name }}",
            "--body-file",
            str(body),
            "--timezone",
            "UTC",
            "--per-day",
            "10000",
            "--weekdays",
            "mon-sun",
            "--json",
        ]
        try:
            main()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
    else:
        from fastapi.testclient import TestClient

        from sendqueue.web.app import create_app

        settings = _settings(home).model_copy(
            update={"max_upload_bytes": limits.max_bytes, "max_recipients": limits.max_rows}
        )
        c = bootstrap(settings)
        # A loopback Host: always allowed (SENDQUEUE_ALLOWED_HOSTS need not name "testserver").
        with closing(c), TestClient(create_app(c), base_url="http://127.0.0.1") as client:
            form = {
                "name": "big",
                "subject": templates.subject or "",
                "body": templates.body or "",
                "per_day": "10000",
                "weekdays": "mon-sun",
                "windows": "00:00-24:00",
                "timezone": "UTC",
            }
            path = "/api/campaigns/preview" if mode == "api-preview" else "/api/campaigns"
            with csv_path.open("rb") as fh:
                response = client.post(path, data=form, files={"file": ("r.csv", fh, "text/csv")})
            if response.status_code >= 300:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:500]}")
            data = response.json()
            count = data.get("count", data.get("recipients", 0))
    return {
        "mode": mode,
        "count": count,
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak_rss_mb(),
    }


def scale_to_million(
    sizes: tuple[int, int], small: dict[str, Any], large: dict[str, Any]
) -> tuple[float, float]:
    """Peak RSS (MB) and seconds at 1M rows from the runs at the two sizes: the peak as
    ``base + rows * per_row`` through both, the time in proportion to the larger run."""
    per_row = (large["peak_rss_mb"] - small["peak_rss_mb"]) / (sizes[1] - sizes[0])
    peak = small["peak_rss_mb"] + per_row * (1_000_000 - sizes[0])
    return peak, large["seconds"] * 1_000_000 / sizes[1]


def run(sizes: tuple[int, int] = (50_000, 200_000)) -> dict[str, Any]:
    """Every mode at two sizes; the peak scaled to 1M rows and checked against the target."""
    out: dict[str, Any] = {"target_mb_per_million": TARGET_MB_PER_MILLION, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for n in sizes:
            files[n] = Path(tmp) / f"r{n}.csv"
            write_csv(files[n], n)
        for mode in MODES:
            figures = {}
            for n in sizes:
                home = Path(tmp) / f"{mode}-{n}"
                home.mkdir()
                figures[n] = run_child("bench.imports", mode, str(files[n]), str(home))
            at_million, seconds = scale_to_million(sizes, figures[sizes[0]], figures[sizes[1]])
            out["modes"][mode] = {
                "runs": {str(n): f for n, f in figures.items()},
                "peak_mb_at_1m": round(at_million, 1),
                "seconds_at_1m": round(seconds, 1),
                "pass": at_million <= TARGET_MB_PER_MILLION,
            }
    out["sizes"] = list(sizes)
    out["targets"] = [
        {
            "name": f"import peak RSS per 1M rows ({mode}, scaled from {sizes[0]:,} and "
            f"{sizes[1]:,} rows)",
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
