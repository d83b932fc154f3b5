"""docs/settings.md, rendered from :class:`sendqueue.settings.Settings`: every ``SENDQUEUE_``
variable with its default and its meaning (the field's description and bounds), in groups.

``python -m sendqueue.settings.reference --write`` rewrites the file; without ``--write`` it
prints the page. ``tests/unit/test_settings_reference.py`` fails while the file differs, so a
new setting reaches the page by rerunning the command. A setting that no group names lands in
"Other settings" until a group below names it.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import annotated_types
from pydantic.fields import FieldInfo

from . import Settings

__all__ = ["COMMAND", "GROUPS", "PAGE", "Group", "main", "render"]

#: The page this module writes, relative to the repository root.
PAGE = Path("docs/settings.md")
COMMAND = "python -m sendqueue.settings.reference --write"


@dataclass(frozen=True)
class Group:
    """A section of the page: the fields it names (``name``) or whose names start with a
    prefix (``prefix_``), in that order."""

    title: str
    intro: str
    fields: tuple[str, ...]


GROUPS: tuple[Group, ...] = (
    Group(
        "Where it runs",
        "The task store, the execution layer and the mailer. The defaults are the embedded "
        "default: two SQLite files and a Maildir outbox in the working directory.",
        (
            "environment",
            "database_url",
            "scheduler_url",
            "execution",
            "mailer",
            "transport_hosts",
            "default_from",
            "default_timezone",
        ),
    ),
    Group(
        "Unsubscribe links, bounces and feedback",
        "What real outreach needs besides a mailer (see [deliverability.md](deliverability.md)).",
        (
            "public_url",
            "secret_key",
            "secret_key_arn",
            "unsubscribe_mailbox",
            "unsubscribe_rate",
            "bounce_address",
            "feedback_",
            "trusted_authserv",
            "sender_mailbox_authserv",
            "suppress_replies",
        ),
    ),
    Group(
        "Web UI, API and access",
        "`sendqueue serve`: the token, the host names it answers, the proxies it trusts, its "
        "request limits and the live page's intervals (see [operations.md](operations.md)).",
        (
            "api_token",
            "allowed_hosts",
            "forwarded_allow_ips",
            "auth_",
            "http_",
            "stream_lag_threshold",
            "ui_",
        ),
    ),
    Group(
        "Sending, retries and recovery",
        "How the worker sends, retries and catches up, and how the reconciler repairs (see "
        "[guarantees.md](guarantees.md)).",
        (
            "worker_concurrency",
            "max_attempts",
            "retry_backoff",
            "auto_pause_after",
            "max_lateness",
            "space_late_sends",
            "follow_up_linger",
            "stale_after",
            "stale_policy",
            "reconcile_",
            "provision_concurrency",
            "provision_chunk",
        ),
    ),
    Group(
        "Alarms",
        "Who hears of a dead letter or a campaign paused by failures.",
        ("alarm_",),
    ),
    Group(
        "Execution layers",
        "The embedded and procrastinate layers' own timing.",
        ("scheduler_retry_backoff", "scheduler_lease", "poll_interval"),
    ),
    Group(
        "Input limits",
        "The largest imports and templates accepted (see [operations.md](operations.md), "
        '"Request limits").',
        (
            "max_upload_bytes",
            "max_json_body_bytes",
            "max_recipients",
            "max_template_bytes",
            "max_html_template_bytes",
            "max_rendered_",
            "template_",
        ),
    ),
    Group(
        "AWS: SENDQUEUE_EXECUTION=eventbridge",
        "Set on every function by the SAM template (see [deploy-aws.md](deploy-aws.md)).",
        (
            "schedule_group",
            "send_function_arn",
            "scheduler_role_arn",
            "provision_function_arn",
            "dead_letter_queue_",
        ),
    ),
)

_OTHER = Group("Other settings", "Settings no group above names yet.", ())

_HEADER = f"""\
# Settings

<!-- Generated from the Settings class (src/sendqueue/settings/*.py) by
`{COMMAND}`: edit the Field descriptions there, not this file. -->

Every setting is an environment variable, or a line of the settings file every command reads
(`sendqueue --config PATH`, or `SENDQUEUE_CONFIG`; else `./sendqueue.env`, else `./.env`; see
[setup.md](setup.md)); the environment overrides the file. The values are checked when a
process starts, and a refused one stops it with a message naming the variable. Unset means the
feature is off unless its line says otherwise.
"""

_FOOTER = """\
## What is refused

Besides each line's own bounds: an unknown timezone or database scheme; a mailer URL that is
neither `maildir:`, `smtp://` nor `ses:`; `SENDQUEUE_EXECUTION=procrastinate` without a
PostgreSQL store; `SENDQUEUE_EXECUTION=eventbridge` without each of its five variables (all
missing ones are named) or with a SQLite store; a password sent over `security=none` to a
host that is not loopback (in `SENDQUEUE_MAILER` and `SENDQUEUE_FEEDBACK_IMAP` as in a
sender's own transport and mailbox); a URL whose user or password holds a raw `/`, `?` or
`#` (percent-encode it); `SENDQUEUE_BOUNCE_ADDRESS` or `SENDQUEUE_FEEDBACK_IMAP` without
`SENDQUEUE_SECRET_KEY`; and, with `SENDQUEUE_ENVIRONMENT=production`, the Maildir outbox (it
delivers nothing, nor does a sender's `maildir:` transport), a missing API token (except in
the Lambda functions, which serve no UI), and, in a process that sends, a missing public URL
or secret key or a public URL that is not `https://`.
"""

_VARIABLE = re.compile(r"\bSENDQUEUE_[A-Z0-9_]+\b")


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern) if pattern.endswith("_") else name == pattern


def _grouped(names: Sequence[str]) -> list[tuple[Group, list[str]]]:
    """Each group with its fields, in the group's order; unnamed fields go to "Other"."""
    taken: set[str] = set()
    sections: list[tuple[Group, list[str]]] = []
    for group in GROUPS:
        members: list[str] = []
        for pattern in group.fields:
            for name in names:
                if name not in taken and _matches(name, pattern):
                    members.append(name)
                    taken.add(name)
        sections.append((group, members))
    rest = [name for name in names if name not in taken]
    if rest:
        sections.append((_OTHER, rest))
    return [(group, members) for group, members in sections if members]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _default(info: FieldInfo) -> str:
    value = info.default
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    return f"`{value}`"


def _bounds(info: FieldInfo) -> str:
    """The field's numeric bounds as words, e.g. "1 to 86400", "more than 0"."""
    low = high = ""
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            low = _number(typing.cast(float, item.ge))
        elif isinstance(item, annotated_types.Gt):
            low = f"more than {_number(typing.cast(float, item.gt))}"
        elif isinstance(item, annotated_types.Le):
            high = _number(typing.cast(float, item.le))
    if low and high:
        return f"{low} to {high}" if not low.startswith("more") else f"{low}, at most {high}"
    if low:
        return low if low.startswith("more") else f"at least {low}"
    return f"at most {high}" if high else ""


def _choices(info: FieldInfo) -> str:
    if typing.get_origin(info.annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in typing.get_args(info.annotation))
    return ""


def _cell(text: str) -> str:
    """Table-safe text: pipes escaped, variable names as code."""
    return _VARIABLE.sub(lambda m: f"`{m.group(0)}`", text.replace("|", "\\|"))


def _meaning(info: FieldInfo) -> str:
    text = _cell((info.description or "").strip())
    allowed = "; ".join(part for part in (_choices(info), _bounds(info)) if part)
    if allowed:
        text = f"{text}; {allowed}" if text else allowed
    return text


def _table(prefix: str, names: Iterable[str]) -> list[str]:
    fields = Settings.model_fields
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name in names:
        info = fields[name]
        lines.append(f"| `{prefix}{name.upper()}` | {_default(info)} | {_meaning(info)} |")
    return lines


def render() -> str:
    """The whole page, as docs/settings.md holds it."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    sections = _grouped(list(Settings.model_fields))
    lines = [_HEADER]
    for group, names in sections:
        lines.append(f"## {group.title}\n")
        lines.append(f"{_cell(group.intro)}\n")
        lines.extend(_table(prefix, names))
        lines.append("")
    lines.append(_FOOTER)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sendqueue.settings.reference",
        description="Print docs/settings.md as the Settings class renders it.",
    )
    parser.add_argument(
        "--write", action="store_true", help=f"write it to {PAGE} (from the repository root)"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page, encoding="utf-8")
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
