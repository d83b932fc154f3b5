"""``sendqueue webhook`` through the real command line (Typer's CliRunner) on SQLite files: the
secret printed by add and rotate-secret only, bad options exit 2 naming the field and store
nothing, every subcommand's ``--json``."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from sendqueue.cli import app
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
    assert run_json(cli, "webhook", "deliveries", made["id"]) == []
    assert run_json(cli, "webhook", "remove", made["id"]) == {"removed": made["id"]}
    code, _, err = run(cli, "webhook", "show", made["id"])
    assert code != 0 and made["id"] in err


def test_bad_options_name_the_field_and_store_nothing(cli: CliRunner) -> None:
    for args, field in (
        (("--url", "ftp://x.example.com"), "url"),
        (("--url", "http://x.example.com", "--event", "email.nope"), "events"),
    ):
        code, _, err = run(cli, "webhook", "add", *args)
        assert code == 2 and f"{field}:" in err
    assert run_json(cli, "webhook", "list") == []
    made = run_json(cli, "webhook", "add", "--url", "http://hooks.example.com/in")
    code, _, err = run(cli, "webhook", "redeliver", made["id"], "evt_99")
    assert code == 2 and "events:" in err
    code, _, err = run(cli, "webhook", "redeliver", made["id"], "--failed-since", "yesterday")
    assert code == 2 and "failed_since:" in err
