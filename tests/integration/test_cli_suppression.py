"""``sendqueue suppression`` end to end on the embedded default (SQLite files in a temp dir),
and what a suppressed address does to a campaign provisioned from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tests.integration.test_cli import cli, run

__all__ = ["cli"]  # the fixture, shared with test_cli


def test_add_list_remove(cli: CliRunner) -> None:
    code, out, err = run(cli, "suppression", "add", "Ada@Example.com", "--reason", "bounced")
    assert code == 0, err
    assert "suppressed ada@example.com (bounced)" in out
    code, out, _ = run(cli, "suppression", "add", "ADA@example.com", "--json")
    again = json.loads(out)
    assert (again["email"], again["reason"], again["new"]) == ("ada@example.com", "bounced", False)
    assert run(cli, "suppression", "add", "grace@example.com")[0] == 0

    code, out, _ = run(cli, "suppression", "list", "--json")
    listed = json.loads(out)
    assert [(e["email"], e["reason"], e["task_id"]) for e in listed] == [
        ("ada@example.com", "bounced", None),
        ("grace@example.com", "manual", None),
    ]
    assert set(listed[0]) == {"email", "reason", "task_id", "at"}
    code, out, _ = run(cli, "suppression", "list", "--limit", "1", "--json")
    assert [e["email"] for e in json.loads(out)] == ["ada@example.com"]
    code, out, _ = run(cli, "suppression", "list")
    assert code == 0 and "2 of 2 suppressed" in out and "grace@example.com" in out

    code, out, _ = run(cli, "suppression", "remove", "Grace@example.com")
    assert code == 0 and "removed grace@example.com" in out
    code, _, err = run(cli, "suppression", "remove", "grace@example.com")
    assert code == 1 and "not found" in err


def test_bad_input_names_the_field(cli: CliRunner) -> None:
    code, _, err = run(cli, "suppression", "add", "not-an-address")
    assert code == 2 and err.startswith("error: email:")
    code, _, err = run(cli, "suppression", "add", "a@example.com", "--reason", "spam")
    assert code == 2 and err.startswith("error: reason:")
    code, _, err = run(cli, "suppression", "list", "--limit", "-1")
    assert code == 2 and err.startswith("error: limit:")
    code, _, err = run(cli, "suppression", "import", "missing.csv")
    assert code == 2 and err.startswith("error: file:")


def test_import_is_all_or_nothing_and_export_reads_back(cli: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "email,reason\nok@example.com,bounced\nnope,manual\nb@example.com,spam\n", "utf-8"
    )
    code, _, err = run(cli, "suppression", "import", str(bad))
    assert code == 2
    assert "row 3: email:" in err and "row 4: reason:" in err
    assert json.loads(run(cli, "suppression", "list", "--json")[1]) == []

    good = tmp_path / "good.csv"
    good.write_text("email,reason\nOK@example.com,bounced\nb@example.com,\n", "utf-8")
    code, out, _ = run(cli, "suppression", "import", str(good), "--json")
    assert code == 0 and json.loads(out) == {"rows": 2, "added": 2, "kept": 0}

    code, out, _ = run(cli, "suppression", "export")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "email,reason,task_id,at"
    assert [line.split(",")[:2] for line in lines[1:]] == [
        ["b@example.com", "manual"],
        ["ok@example.com", "bounced"],
    ]
    target = tmp_path / "out.csv"
    assert run(cli, "suppression", "export", "--out", str(target))[0] == 0
    assert target.read_text("utf-8") == out
    code, out, _ = run(cli, "suppression", "import", str(target), "--json")
    assert json.loads(out) == {"rows": 2, "added": 0, "kept": 2}


def test_formula_cells_are_exported_quoted_and_import_back(cli: CliRunner, tmp_path: Path) -> None:
    assert run(cli, "suppression", "add", "--", "-x@example.com")[0] == 0  # not an option
    assert run(cli, "suppression", "add", "'=y@example.com")[0] == 0
    target = tmp_path / "out.csv"
    assert run(cli, "suppression", "export", "--out", str(target))[0] == 0
    lines = target.read_text("utf-8").splitlines()
    assert [line.split(",")[0] for line in lines[1:]] == ["''=y@example.com", "'-x@example.com"]
    assert run(cli, "suppression", "remove", "--", "-x@example.com")[0] == 0
    code, out, _ = run(cli, "suppression", "import", str(target), "--json")
    assert code == 0 and json.loads(out) == {"rows": 2, "added": 1, "kept": 1}
    listed = json.loads(run(cli, "suppression", "list", "--json")[1])
    assert [e["email"] for e in listed] == ["'=y@example.com", "-x@example.com"]


def test_a_file_that_is_not_utf8_imports_nothing(cli: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"email\n" + b"".join(b"u%d@example.com\n" % i for i in range(50)) + b"\xe9\n")
    code, _, err = run(cli, "suppression", "import", str(bad))
    assert code == 2 and err.startswith("error: file: not UTF-8: invalid byte 0xe9")
    assert json.loads(run(cli, "suppression", "list", "--json")[1]) == []


def test_a_suppressed_recipient_is_cancelled_at_provisioning(
    cli: CliRunner, tmp_path: Path
) -> None:
    assert run(cli, "suppression", "add", "GRACE@example.com", "--reason", "unsubscribed")[0] == 0
    (tmp_path / "p.csv").write_text(
        "email,name,subject,body\nada@example.com,Ada,Hi,Hello\ngrace@example.com,Grace,Hi,Hello\n",
        encoding="utf-8",
    )
    code, out, err = run(
        cli, "campaign", "create", "--name", "S", "--recipients", "p.csv",
        "--from", "news@example.com", "--start", "2030-01-07T09:00", "--json",
    )  # fmt: skip
    assert code == 0, err
    cid = json.loads(out)["id"]
    code, out, _ = run(cli, "campaign", "provision", cid, "--json")
    report = json.loads(out)
    assert (report["status"], report["schedules_created"], report["suppressed"]) == ("done", 1, 1)
    code, out, _ = run(cli, "campaign", "tasks", cid, "--json")
    assert [(t["email"], t["state"], t["reason"]) for t in json.loads(out)] == [
        ("ada@example.com", "Pending", None),
        ("grace@example.com", "Cancelled", "suppressed: unsubscribed"),
    ]
    code, out, _ = run(cli, "campaign", "show", cid, "--json")
    assert json.loads(out)["suppressed"] == 1
    code, out, _ = run(cli, "campaign", "show", cid)
    assert "suppressed: 1" in out
    code, out, _ = run(cli, "campaign", "tasks", cid)
    assert "suppressed: unsubscribed" in out
