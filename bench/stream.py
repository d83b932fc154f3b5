"""Benchmark 6: the live stream under 100 concurrent clients.

A server process runs the web app (``create_app`` under uvicorn, as ``sendqueue serve`` does,
with the production stream settings). ``clients`` SSE clients (asyncio, httpx, in this
process) follow one campaign's event stream. A writer process then changes ``changes`` tasks
of that campaign (Pending -> Cancelled, one transaction each, evenly over ``seconds``), as a
worker in another process would. Delivery latency is the time a client parsed an event minus
the change's own timestamp; the server's CPU is read from /proc over the same window.

Child entry points: ``python -m bench.stream serve|write ...``.

The idle row (:func:`run_idle`, ``python -m bench.stream idle CAMPAIGNS SECONDS``): one SSE
client on each of ``campaigns`` campaigns, nothing written; the server's CPU over ``seconds``
is what the open streams cost by themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import ROOT, percentile, summarize

__all__ = ["TARGET_P95_S", "run", "run_idle"]

TARGET_P95_S = 0.05


def _settings(home: Path) -> Any:
    from sendqueue.settings import Settings

    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
    )


def prepare(home: Path, tasks: int, campaigns: int = 1) -> list[str]:
    """``campaigns`` provisioned campaigns of ``tasks`` tasks whose sends are a month away
    (nothing sends by itself)."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.policy import SendingPolicy, Window
    from sendqueue.services.campaigns.demo import demo_csv
    from sendqueue.services.importing.recipients import Templates

    app = bootstrap(_settings(home))
    ids: list[str] = []
    try:
        for _ in range(campaigns):
            created = app.campaign_import.create(
                name="stream",
                recipients=demo_csv(tasks),
                policy=SendingPolicy(
                    timezone="UTC",
                    per_day=10_000,
                    weekdays=frozenset(range(7)),
                    windows=(Window(0, 1440),),
                    start=datetime.now(UTC) + timedelta(days=30),
                ),
                templates=Templates(subject="Hello {{ name }}", body="Hi"),
            )
            cid = created.campaign.id
            if app.provisioner.provision(cid).status != "done":
                raise AssertionError("provisioning failed")
            ids.append(cid)
        return ids
    finally:
        app.close()


def serve(home: Path) -> None:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.web.app import create_app, run_server

    app = bootstrap(_settings(home))
    run_server(
        create_app(app),
        host="127.0.0.1",
        port=0,
        on_started=lambda url: print(url, flush=True),
    )
    app.close()


def write(home: Path, campaign_id: str, changes: int, seconds: float) -> None:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.lifecycle import TaskState

    app = bootstrap(_settings(home))
    started = time.monotonic()
    for n in range(changes):
        delay = started + seconds * n / changes - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        app.store.transition(
            f"{campaign_id}-{n}", TaskState.PENDING, TaskState.CANCELLED, at=datetime.now(UTC)
        )
    app.close()
    print(json.dumps({"seconds": time.monotonic() - started}))


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


async def _client(
    url: str, campaign_id: str, changes: int, ready: asyncio.Event, out: list[float]
) -> None:
    import httpx

    got = 0
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=120.0)) as client,
        client.stream("GET", f"{url}api/campaigns/{campaign_id}/events") as response,
    ):
        if response.status_code != 200:
            raise AssertionError(f"stream refused: {response.status_code}")
        event: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if not ready.is_set() and "id" in event:
                    ready.set()  # the first frame: this client is subscribed
                if event.get("event") == "change":
                    data = json.loads(event["data"])
                    if data["task_id"] and data["to"] == "Cancelled":
                        at = datetime.fromisoformat(data["at"].replace("Z", "+00:00"))
                        out.append(time.time() - at.timestamp())
                        got += 1
                        if got >= changes:
                            return
                event = {}
                continue
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


async def _measure(
    url: str, home: Path, campaign_id: str, clients: int, changes: int, seconds: float,
    server_pid: int,
) -> dict[str, Any]:  # fmt: skip
    latencies: list[list[float]] = [[] for _ in range(clients)]
    readies = [asyncio.Event() for _ in range(clients)]
    tasks = [
        asyncio.create_task(_client(url, campaign_id, changes, readies[i], latencies[i]))
        for i in range(clients)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
    await asyncio.sleep(0.5)
    cpu = _cpu_of(server_pid)
    started = time.monotonic()
    writer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.stream",
        "write",
        str(home),
        campaign_id,
        str(changes),
        str(seconds),
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    await asyncio.wait_for(asyncio.gather(*tasks), seconds + 120)
    elapsed = time.monotonic() - started
    cpu = _cpu_of(server_pid) - cpu
    await writer.communicate()
    flat = [x for per in latencies for x in per]
    return {
        "deliveries": len(flat),
        "p50_s": percentile(flat, 0.5),
        "p95_s": percentile(flat, 0.95),
        "max_s": max(flat),
        "server_cpu_s": cpu,
        "server_cpu_percent_of_one_core": 100 * cpu / elapsed,
        "window_s": elapsed,
    }


@contextlib.contextmanager
def _server(home: Path) -> Iterator[tuple[str, int]]:
    """A ``create_app`` server over ``home`` in its own process: its URL and pid."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.stream", "serve", str(home)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the server did not start: {url!r}")
        yield url, server.pid
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()


def run(*, clients: int, changes: int, seconds: float, repeats: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="sq-bench-stream-") as tmp:
            home = Path(tmp)
            (cid,) = prepare(home, changes)
            with _server(home) as (url, pid):
                runs.append(asyncio.run(_measure(url, home, cid, clients, changes, seconds, pid)))
    p95 = summarize([r["p95_s"] for r in runs])
    return {
        "clients": clients,
        "changes": changes,
        "write_seconds": seconds,
        "repeats": repeats,
        "deliveries": [r["deliveries"] for r in runs],
        "p50_s": summarize([r["p50_s"] for r in runs]).as_dict(),
        "p95_s": p95.as_dict(),
        "max_s": summarize([r["max_s"] for r in runs]).as_dict(),
        "server_cpu_s": summarize([r["server_cpu_s"] for r in runs]).as_dict(),
        "server_cpu_percent_of_one_core": summarize(
            [r["server_cpu_percent_of_one_core"] for r in runs]
        ).as_dict(),
        "targets": [
            {
                "name": f"stream p95 <= {TARGET_P95_S * 1000:g} ms with {clients} clients",
                "value": p95.median,
                "limit": TARGET_P95_S,
                "unit": "s",
                "passed": p95.median <= TARGET_P95_S,
            }
        ],
    }


async def _idle_client(url: str, campaign_id: str, ready: asyncio.Event) -> None:
    import httpx

    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client,
        client.stream("GET", f"{url}api/campaigns/{campaign_id}/events") as response,
    ):
        if response.status_code != 200:
            raise AssertionError(f"stream refused: {response.status_code}")
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                ready.set()  # the first frame: this client is subscribed


async def _measure_idle(url: str, ids: list[str], seconds: float, pid: int) -> dict[str, Any]:
    readies = [asyncio.Event() for _ in ids]
    tasks = [
        asyncio.create_task(_idle_client(url, c, r)) for c, r in zip(ids, readies, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    await asyncio.sleep(1.0)
    cpu, started = _cpu_of(pid), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, elapsed = _cpu_of(pid) - cpu, time.monotonic() - started
    failed = [t for t in tasks if t.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        raise AssertionError(f"{len(failed)} streams ended during the idle window")
    return {"server_cpu_s": cpu, "server_cpu_percent_of_one_core": 100 * cpu / elapsed}


def run_idle(*, campaigns: int, seconds: float, repeats: int) -> dict[str, Any]:
    """Server CPU with one idle SSE client on each of ``campaigns`` campaigns."""
    runs: list[dict[str, Any]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="sq-bench-stream-idle-") as tmp:
            home = Path(tmp)
            ids = prepare(home, 1, campaigns)
            with _server(home) as (url, pid):
                runs.append(asyncio.run(_measure_idle(url, ids, seconds, pid)))
    return {
        "campaigns": campaigns,
        "idle_seconds": seconds,
        "repeats": repeats,
        "server_cpu_s": summarize([r["server_cpu_s"] for r in runs]).as_dict(),
        "server_cpu_percent_of_one_core": summarize(
            [r["server_cpu_percent_of_one_core"] for r in runs]
        ).as_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stream")
    parser.add_argument("side", choices=["serve", "write", "idle"])
    parser.add_argument("home")
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    if args.side == "serve":
        serve(Path(args.home))
    elif args.side == "idle":  # here "home" is the number of campaigns
        (seconds,) = args.rest or ["20"]
        result = run_idle(campaigns=int(args.home), seconds=float(seconds), repeats=1)
        print(json.dumps(result, indent=2))
    else:
        campaign_id, changes, seconds = args.rest
        write(Path(args.home), campaign_id, int(changes), float(seconds))


if __name__ == "__main__":
    main()
