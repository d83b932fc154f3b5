"""Webhook delivery (benchmark 15), measured as its targets are stated:

- "1,000 events a second to a local receiver, with end-to-end lag p99 at most 1 s, while the
  send-throughput benchmark runs";
- "a 10-minute backlog drains at at least 5x the rate at which it was made".

Every scenario runs on the embedded default (one SQLite store file shared by its processes)
with one endpoint, delivered to the lean receiver (:mod:`bench.webhook_receiver`: a process on
127.0.0.1 that checks every delivery's Standard Webhooks signature, answers 204 on a kept-alive
connection and logs each arrival) by a worker process's own delivery loop (``run_worker``, as
``sendqueue worker`` runs it; its poll interval ``poll``). An event's lag is its first arrival
minus its change's time; every event must arrive, once or more, in the order made, validly
signed. One run, side by side:

1. **receivers alone**: requests a second each receiver answers, one at a time on one
   connection (as ordered delivery sends them), the lean one and ``ThreadingHTTPServer``;
2. **sends alone**: benchmark 4's send worker (``bench.throughput``, ``emails`` due emails into
   the SMTP sink, ``concurrency`` threads, its own fresh store): emails a second;
3. **lag alone**: a worker with nothing to send delivers while this process cancels Pending
   tasks one by one (one transaction, one ``email.cancelled`` each) at ``rate`` a second for
   ``seconds``;
4. **lag with sends**: benchmark 4's send worker on this scenario's store, its delivery loop
   delivering while it sends; its ``email.sent`` events are real events of the window, and this
   process tops them up with cancellations to ``rate`` a second (it tails the change log to
   count them). The window is the send run, from ``go`` to the last email sent: the send
   throughput with webhooks is the same measure as (2). The same run once more with no
   endpoint (the events made, none delivered) splits what the sends lose between the events'
   writes and their deliveries;
5. **backlog** (:mod:`bench.webhook_backlog`): ``backlog_seconds`` of events at ``rate`` a second
   (600,000), drained by a worker with nothing to send.

Targets: (4)'s p99 <= 1 s with nothing lost at the stated rate; (5) >= 5x the making rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import webhook_backlog
from bench.common import run_child, smtp_sink
from bench.fleetproc import machine_ticks
from bench.webhook_receiver import ceiling, receiver
from bench.webhook_setup import (
    Child,
    cancel,
    child_env,
    open_app,
    pending_tasks,
    report,
    wait_cursor,
)

__all__ = ["LAG_TARGET", "POLL", "run"]

#: The lag's p99 at the stated rate, in seconds.
LAG_TARGET = 1.0
#: The delivery loop's poll interval in every scenario (SENDQUEUE_WEBHOOK_POLL_INTERVAL; the
#: product's default is 0.5 s, whose wait alone can take half the lag's target).
POLL = 0.05
#: How often the event maker counts the sends' events (seconds).
_TAIL_EVERY = 0.02


def _make_events(
    app: Any, pool: list[str], rate: float, first: int, t0: float, until: Callable[[], bool]
) -> dict[str, Any]:
    """Cancel tasks of ``pool`` so that the events made since ``t0`` (``email.sent`` ones seen
    in the change log after ``first``, and these) keep to ``rate`` a second, until ``until()``."""
    from sendqueue.domain.webhooks import EventType, event_of

    tasks = iter(pool)
    sent = cancelled = 0
    tail, next_tail, exhausted = first, 0.0, False
    while not until():
        now = time.perf_counter()
        if now >= next_tail:
            while page := app.store.changes_after(tail, limit=1000):
                tail = page[-1].id
                events = (event_of(entry) for entry in page)
                sent += sum(1 for e in events if e is not None and e.type is EventType.EMAIL_SENT)
            next_tail = now + _TAIL_EVERY
        if sent + cancelled < rate * (now - t0) and not exhausted:
            task = next(tasks, None)
            if task is None:
                exhausted = True
                continue
            cancel(app, task)
            cancelled += 1
            continue
        wake = min(next_tail, t0 + (sent + cancelled + 1) / rate)
        time.sleep(max(0.0, wake - time.perf_counter()))
    return {"cancelled": cancelled, "sent_counted": sent, "pool_exhausted": exhausted}


def _lag(
    *, rate: float, seconds: float, poll: float, emails: int = 0, concurrency: int = 4,
    smtp_port: int = 0, deliver: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Scenario 3 (``emails`` 0) or 4: the events made, what arrived, and the send figures.
    ``deliver`` False: the same events made beside the sends, with no endpoint (what the
    events' writes alone cost the sends)."""
    with tempfile.TemporaryDirectory(prefix="bench-webhooks-lag-") as tmp:
        home = Path(tmp)
        store = home / "store.db"
        app = open_app(store, home)
        try:
            # enough cancels for a window of sends at 150 emails/s or more
            window = max(seconds, emails / 150) * 1.5 if emails else seconds
            pool = pending_tasks(app, int(rate * window) + 100, "clag000000000")
            url = f"sqlite:///{store}"
            args = ["bench.webhook_setup", "deliver", url]
            if emails:
                args = ["bench.throughput", "sendqueue", str(smtp_port), str(emails),
                        str(concurrency), "--store", url, "--handshake"]  # fmt: skip
            child = Child(args, child_env(poll))
            try:
                child.expect("ready", 600)
                with contextlib.ExitStack() as stack:
                    endpoint, log = None, home / "nothing-received.log"
                    if deliver:
                        created = app.webhooks.add("http://127.0.0.1:9/hook")
                        endpoint = created.endpoint.id
                        port, log, _ = stack.enter_context(receiver(home, created.secret))
                        app.webhooks.update(endpoint, url=f"http://127.0.0.1:{port}/hook")
                    run = _window(app, child, pool, rate, seconds, emails)
                    run["caught_up"] = endpoint is None or wait_cursor(
                        app, endpoint, run["end"], 120
                    )
                    run["worker_cpu_s"] = child.stop()["cpu_s"]
            finally:
                child.kill()
            seen = report(app, run.pop("first"), run.pop("end"), log)
        finally:
            app.close()
    sends = run.pop("sends")
    out = {"rate": rate, "made_per_s": seen["events"] / run["window_s"], **run}
    out.update((k, v) for k, v in seen.items() if deliver or k in ("events", "by_type"))
    out.pop("last_arrival", None)
    if emails:
        out["sends"] = {"emails": emails, "per_second": sends["per_second"],
                        "seconds": sends["seconds"], "cpu_s": sends["cpu_s"]}  # fmt: skip
    return out


def _window(
    app: Any, child: Child, pool: list[str], rate: float, seconds: float, emails: int
) -> dict[str, Any]:
    """From ``go`` until ``seconds`` have passed (no sends) or the child has sent every email:
    the events made meanwhile (the change ids around them), the sends' figures, and how busy
    the machine was."""
    first = app.store.last_change_id()
    sends: dict[str, Any] = {}
    busy0, total0 = machine_ticks()
    t0 = time.perf_counter()
    child.say("go")

    def until() -> bool:
        if not emails:
            return time.perf_counter() - t0 >= seconds
        line = child.line(0)
        if line is not None:
            sends.update(json.loads(line))
        return bool(sends)

    maker = _make_events(app, pool, rate, first, t0, until)
    window = time.perf_counter() - t0
    busy1, total1 = machine_ticks()
    return {
        "first": first,
        "end": app.store.last_change_id(),
        "window_s": window,
        "machine_busy_percent": 100 * (busy1 - busy0) / max(total1 - total0, 1),
        "sends": sends,
        **maker,
    }


def _lag_target(lag: dict[str, Any], rate: float, poll: float) -> dict[str, Any]:
    held = (
        lag["lost"] == 0 and lag["in_order"] and lag["badly_signed"] == 0
        and lag["made_per_s"] >= 0.98 * rate
    )  # fmt: skip
    return {
        "name": f"webhooks at {rate:,.0f} events/s while the send benchmark runs: lag p99 <= "
        f"{LAG_TARGET:g} s, every event delivered in order (poll {poll:g} s)",
        "value": lag["lag_p99_s"],
        "limit": LAG_TARGET,
        "unit": "s",
        "passed": held and lag["lag_p99_s"] <= LAG_TARGET,
    }


def run(
    *, rate: float = 1_000.0, seconds: float = 10.0, backlog_seconds: int = 600,
    emails: int = 5_000, concurrency: int = 4, poll: float = POLL, requests: int = 20_000,
) -> dict[str, Any]:  # fmt: skip
    """Every scenario of the module docstring, in its order, in one run."""
    out: dict[str, Any] = {"poll_s": poll, "receivers": {}}
    with tempfile.TemporaryDirectory(prefix="bench-webhooks-receivers-") as tmp:
        for kind in ("lean", "threading"):
            out["receivers"][kind] = ceiling(Path(tmp), kind, requests)
    with smtp_sink() as port:
        alone = run_child("bench.throughput", "sendqueue", str(port), str(emails),
                          str(concurrency))  # fmt: skip
        out["sends_alone"] = {"emails": emails, "per_second": alone["per_second"],
                              "seconds": alone["seconds"], "cpu_s": alone["cpu_s"]}  # fmt: skip
        out["lag_alone"] = _lag(rate=rate, seconds=seconds, poll=poll)
        for name, deliver in (("sends_beside_events", False), ("lag_with_sends", True)):
            out[name] = _lag(
                rate=rate, seconds=seconds, poll=poll, emails=emails, concurrency=concurrency,
                smtp_port=port, deliver=deliver,
            )  # fmt: skip
    with_sends = out["lag_with_sends"]
    out["sends_ratio"] = with_sends["sends"]["per_second"] / alone["per_second"]
    out["sends_beside_events_ratio"] = (
        out["sends_beside_events"]["sends"]["per_second"] / alone["per_second"]
    )
    out["lag_p99_ratio"] = with_sends["lag_p99_s"] / out["lag_alone"]["lag_p99_s"]
    out["backlog"] = webhook_backlog.run(rate=int(rate), seconds=backlog_seconds, poll=poll)
    out["targets"] = [_lag_target(with_sends, rate, poll), out["backlog"].pop("target")]
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.webhooks", description=__doc__)
    p.add_argument("--rate", type=float, default=1_000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--backlog-seconds", type=int, default=600)
    p.add_argument("--emails", type=int, default=5_000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--poll", type=float, default=POLL)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--only", choices=["lag_alone", "lag_with_sends", "backlog"])
    a = p.parse_args()
    if a.only == "backlog":
        result = webhook_backlog.run(rate=int(a.rate), seconds=a.backlog_seconds, poll=a.poll)
    elif a.only:
        with smtp_sink() as port:
            emails = a.emails if a.only == "lag_with_sends" else 0
            result = _lag(rate=a.rate, seconds=a.seconds, poll=a.poll, emails=emails,
                          concurrency=a.concurrency, smtp_port=port)  # fmt: skip
    else:
        result = run(rate=a.rate, seconds=a.seconds, backlog_seconds=a.backlog_seconds,
                     emails=a.emails, concurrency=a.concurrency, poll=a.poll,
                     requests=a.requests)  # fmt: skip
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
