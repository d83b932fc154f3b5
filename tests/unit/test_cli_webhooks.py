"""``sendqueue webhook`` through the real command line (Typer's CliRunner) on SQLite files: the
secret printed by add and rotate-secret only, bad options exit 2 naming the field and store
nothing, every subcommand's ``--json``, and the delivery log a page at a time."""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.cli import app
from sendqueue.domain.webhooks import DeliveryRecord
from sendqueue.ports.webhooks import WebhookStore
from tests.unit.test_cli_senders import cli, run

__all__ = ["cli"]  # the fixture


def run_json(cli: CliRunner, *args: str) -> Any:
    result = cli.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_add_prints_the_secret_once_and_the_rest_masks_it(cli: CliRunner) -> None:
    made = run_json(
        cli, "webhook", "add", "--url", "http://hooks.example.com/in", "--event", "email.sent"
    )
    secret = made["signing_secret"]
    assert secret.startswith("whsec_") and made["id"].startswith("wh_")
    for args in (("webhook", "list"), ("webhook", "show", made["id"])):
        code, out, _ = run(cli, *args)
        assert code == 0 and secret not in out and secret[6:] not in out
    listed = run_json(cli, "webhook", "list")
    assert [(w["id"], w["event_types"]) for w in listed] == [(made["id"], ["email.sent"])]
    rotated = run_json(cli, "webhook", "rotate-secret", made["id"])
    assert rotated["signing_secret"] not in (secret, None)
    updated = run_json(cli, "webhook", "update", made["id"], "--all-events", "--disable")
    assert updated["event_types"] == [] and updated["enabled"] is False
    assert run_json(cli, "webhook", "deliveries", made["id"]) == {"deliveries": [], "next": None}
    assert run_json(cli, "webhook", "remove", made["id"]) == {"removed": made["id"]}
    code, _, err = run(cli, "webhook", "show", made["id"])
    assert code != 0 and made["id"] in err


def test_bad_options_name_the_field_and_store_nothing(cli: CliRunner) -> None:
    for args, field in (
        (("--url", "ftp://x.example.com"), "url"),
        (("--url", "http://x.example.com", "--event", "email.nope"), "events"),
        (("--url", "http://x.example.com", "--campaign", "c0123456789ab"), "campaigns"),
    ):
        code, _, err = run(cli, "webhook", "add", *args)
        assert code == 2 and f"{field}:" in err
    assert run_json(cli, "webhook", "list") == []
    made = run_json(cli, "webhook", "add", "--url", "http://hooks.example.com/in")
    for both, field in (
        (["--event", "email.sent", "--all-events"], "events"),
        (["--campaign", "c0123456789ab", "--all-campaigns", "--disable"], "campaigns"),
    ):
        code, _, err = run(cli, "webhook", "update", made["id"], *both)
        assert code == 2 and f"{field}:" in err, err
    assert run_json(cli, "webhook", "show", made["id"])["enabled"] is True
    for limit in ("0", "-1", "1001"):
        code, _, err = run(cli, "webhook", "deliveries", made["id"], "--limit", limit)
        assert code == 2 and "--limit" in err, err
    code, _, err = run(cli, "webhook", "redeliver", made["id"], "evt_99")
    assert code == 2 and "events:" in err
    code, _, err = run(cli, "webhook", "redeliver", made["id"], "--failed-since", "yesterday")
    assert code == 2 and "failed_since:" in err


def test_deliveries_page_with_before_and_print_the_next_command(
    cli: CliRunner, tmp_path: Path
) -> None:
    made = run_json(cli, "webhook", "add", "--url", "http://hooks.example.com/in")
    hook = made["id"]
    log = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        at = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
        cast(WebhookStore, log).record_deliveries(
            [DeliveryRecord(hook, f"evt_{n}", "email.sent", at, 1, 9, 200) for n in range(5)]
        )
    finally:
        log.close()
    seen: list[str] = []
    args = ["webhook", "deliveries", hook, "--limit", "2"]
    for _ in range(3):
        code, out, err = run(cli, *args)
        assert code == 0, err
        seen += re.findall(r"evt_\d+", out)
        follow = [line for line in out.splitlines() if line.startswith("older attempts: ")]
        if not follow:
            break
        command = shlex.split(follow[0].removeprefix("older attempts: "))
        assert command[:1] == ["sendqueue"] and out.rstrip().endswith(follow[0])
        args = command[1:]
    assert seen == ["evt_4", "evt_3", "evt_2", "evt_1", "evt_0"] and not follow
    first = run_json(cli, "webhook", "deliveries", hook, "--limit", "3")
    assert [d["event_id"] for d in first["deliveries"]] == ["evt_4", "evt_3", "evt_2"]
    rest = run_json(cli, "webhook", "deliveries", hook, "--before", first["next"])
    assert [d["event_id"] for d in rest["deliveries"]] == ["evt_1", "evt_0"]
    assert rest["next"] is None
    code, _, err = run(cli, "webhook", "deliveries", hook, "--before", "evt_3")
    assert code == 2 and "before:" in err
    # the next command reads the same settings file
    (tmp_path / "my settings.env").write_text("SENDQUEUE_DEFAULT_TIMEZONE=UTC\n")
    code, out, _ = run(
        cli, "--config", "my settings.env", "webhook", "deliveries", hook, "--limit", "2"
    )
    assert code == 0 and "older attempts: sendqueue --config 'my settings.env' webhook " in out
