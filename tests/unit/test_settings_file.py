"""The settings file (settings/file.py): which file a command reads, values written so that
python-dotenv (pydantic-settings' reader) gives them back unchanged, the settings' own rules
naming the variable, and a private file that never replaces another by accident."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.settings.file import (
    check_settings,
    config_file,
    install_config,
    load_settings,
    read_config,
    render_config,
    staged_config,
)


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_the_file_read_is_the_given_one_else_sendqueue_env_else_dot_env(tmp_path: Path) -> None:
    assert config_file(None) is None
    Path(".env").write_text("SENDQUEUE_DEFAULT_TIMEZONE=Asia/Tokyo\n")
    assert config_file(None) == Path(".env")
    assert load_settings(config_file(None)).default_timezone == "Asia/Tokyo"
    Path("sendqueue.env").write_text("SENDQUEUE_DEFAULT_TIMEZONE=America/Lima\n")
    assert config_file(None) == Path("sendqueue.env")
    assert load_settings(config_file(None)).default_timezone == "America/Lima"
    other = tmp_path / "other.env"
    other.write_text("")
    assert config_file(str(other)) == other
    assert load_settings(config_file(str(other))).default_timezone == "Europe/Berlin"


def test_a_missing_given_file_is_an_error_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(InvalidField, match="no such file") as info:
        config_file(str(tmp_path / "nope.env"))
    assert info.value.field == "--config"
    with pytest.raises(InvalidField, match="a directory"):
        config_file(str(tmp_path))


def test_the_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    Path("sendqueue.env").write_text(
        "SENDQUEUE_DEFAULT_TIMEZONE='Asia/Tokyo'\nSENDQUEUE_MAX_ATTEMPTS=7\n"
    )
    monkeypatch.setenv("SENDQUEUE_DEFAULT_TIMEZONE", "America/Lima")
    settings = load_settings(Path("sendqueue.env"))
    assert (settings.default_timezone, settings.max_attempts) == ("America/Lima", 7)


@pytest.mark.parametrize(
    "value",
    [
        "smtp://news:p'a\"ss#w$rd\\x@smtp.example.com:587?security=starttls",
        "  spaces kept  ",
        "ends with a backslash \\",
        "'quoted'",
        "# not a comment",
        "Zoë <zoe@example.com>",
    ],
)
def test_a_value_is_read_back_as_written(value: str) -> None:
    text = render_config({"SENDQUEUE_DEFAULT_FROM": value}, ())
    Path("f.env").write_text(text)
    assert read_config(Path("f.env")) == {"SENDQUEUE_DEFAULT_FROM": value}
    assert load_settings(Path("f.env")).default_from == value


@pytest.mark.parametrize(
    ("value", "reason"), [("a${HOME}b", "%24"), ("a\nb", "line break"), ("a\rb", "line break")]
)
def test_a_value_dotenv_would_change_is_refused(value: str, reason: str) -> None:
    with pytest.raises(InvalidField, match=reason) as info:
        render_config({"SENDQUEUE_MAILER": value}, ())
    assert info.value.field == "SENDQUEUE_MAILER"


def test_each_value_has_its_comment_and_optional_ones_are_commented_out() -> None:
    text = render_config(
        {"SENDQUEUE_PUBLIC_URL": "https://mail.example.com"},
        ("SENDQUEUE_PUBLIC_URL", "SENDQUEUE_BOUNCE_ADDRESS", "SENDQUEUE_SUPPRESS_REPLIES"),
        header=("written by a test",),
    )
    lines = text.splitlines()
    assert lines[0] == "# written by a test"
    at = lines.index("SENDQUEUE_PUBLIC_URL='https://mail.example.com'")
    assert lines[at - 1].startswith(
        "# base of the one-click unsubscribe links in every email"
    )  # its description
    assert "# SENDQUEUE_BOUNCE_ADDRESS=" in lines
    assert "# SENDQUEUE_SUPPRESS_REPLIES='false'" in lines
    assert lines[lines.index("# SENDQUEUE_BOUNCE_ADDRESS=") - 1].startswith("# envelope sender")
    assert "# SENDQUEUE_PUBLIC_URL=" not in lines  # set, so not offered again
    Path("f.env").write_text(text)
    assert read_config(Path("f.env")) == {"SENDQUEUE_PUBLIC_URL": "https://mail.example.com"}


@pytest.mark.parametrize(
    ("values", "variable", "reason"),
    [
        ({"SENDQUEUE_PUBLIC_URL": "ftp://x"}, "SENDQUEUE_PUBLIC_URL", "expected the https://"),
        ({"SENDQUEUE_MAILER": "smtp://u:pw@mx.example.com?security=none"}, "SENDQUEUE_MAILER",
         "refusing to send a password unencrypted"),
        ({"SENDQUEUE_BOUNCE_ADDRESS": "bounces@example.com"}, "SENDQUEUE_BOUNCE_ADDRESS",
         "needs SENDQUEUE_SECRET_KEY"),
        ({"SENDQUEUE_ENVIRONMENT": "staging"}, "SENDQUEUE_ENVIRONMENT", "development"),
        ({"SENDQUEUE_ENVIRONMENT": "production"}, "SENDQUEUE_PUBLIC_URL", "required"),
        ({"SENDQUEUE_COLOUR": "blue"}, "SENDQUEUE_COLOUR", "no such setting"),
    ],
)  # fmt: skip
def test_the_settings_rules_name_the_variable(
    values: dict[str, str], variable: str, reason: str
) -> None:
    with pytest.raises(InvalidField, match=reason) as info:
        check_settings(values)
    assert info.value.field == variable
    assert "pw" not in str(info.value)


def test_the_values_are_checked_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDQUEUE_PUBLIC_URL", "not a url")
    Path(".env").write_text("SENDQUEUE_MAILER=nonsense\n")
    check_settings({"SENDQUEUE_DEFAULT_TIMEZONE": "Asia/Tokyo"})  # neither is read


def test_the_file_is_private_and_never_replaces_another_without_force(tmp_path: Path) -> None:
    target = tmp_path / "sendqueue.env"
    with staged_config(target, "A=1\n") as staged:
        assert stat.S_IMODE(staged.stat().st_mode) == 0o600
        install_config(staged, target, force=False)
    assert target.read_text() == "A=1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with staged_config(target, "A=2\n") as staged, pytest.raises(FileExistsError):
        install_config(staged, target, force=False)
    assert target.read_text() == "A=1\n"
    target.chmod(0o644)
    with staged_config(target, "A=3\n") as staged:
        install_config(staged, target, force=True)
    assert target.read_text() == "A=3\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sendqueue.env"]  # nothing left over
