"""Fuzzing the two parsers that take anything a user can type: the recipients importer (CSV
bytes, and the API's JSON rows) and the sending policy (``SendingPolicy.from_dict`` and the
``parse_*`` helpers).

The properties:

- **No crash.** The only exceptions are the domain's answers to bad input: InvalidField,
  InvalidInput and NoSendingDay.
- **No partial write.** Every input goes through ``CampaignImport.create`` onto a real SQLite
  store: afterwards the store holds either one more whole campaign (with exactly the
  recipients the import returned) or nothing new at all.

Hypothesis runs a bounded number of examples here (``EXAMPLES``; more with
``SENDQUEUE_FUZZ_EXAMPLES=N``). :func:`test_atheris_bounded_run` also runs this module as a
coverage-guided libFuzzer target (atheris) for a few seconds (``SENDQUEUE_FUZZ_SECONDS``, 5 by
default). The dev extra installs atheris where it has wheels (CPython on Linux x86_64); without
it the test skips locally and fails in CI (``SENDQUEUE_REQUIRE_SERVICES=1``)::

    python -m tests.reliability.test_fuzz -max_total_time=60
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import InvalidField, InvalidInput, NoSendingDay
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import (
    SendingPolicy,
    load_timezone,
    parse_date,
    parse_start,
    parse_weekdays,
    parse_window,
)
from sendqueue.services.importing.recipients import ImportLimits, Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from tests.conftest import missing

ALLOWED = (InvalidField, InvalidInput, NoSendingDay)
EXAMPLES = int(os.environ.get("SENDQUEUE_FUZZ_EXAMPLES", "300"))
ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)

#: Small limits, so the fuzzer reaches every "too large" path with small inputs.
LIMITS = ImportLimits(
    max_bytes=4096, max_rows=20, max_field_chars=300, max_subject_chars=120, max_columns=8
)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# -- the store ----------------------------------------------------------------------------------


class Store:
    """A container on a real SQLite store, and row counts straight from its file."""

    def __init__(self, home: Path) -> None:
        self.path = home / "store.db"
        self.container: Container = bootstrap(
            Settings(
                _env_file=None,
                database_url=f"sqlite:///{self.path}",
                scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
                mailer=f"maildir:{home / 'outbox'}",
                default_timezone="UTC",
            ),
            clock=FakeClock(T0),
        )
        self.container.store.list_campaigns()  # creates the schema

    def counts(self) -> tuple[int, int, int, int]:
        conn = sqlite3.connect(self.path)
        try:
            return tuple(
                conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("campaigns", "recipients", "tasks", "change_log")
            )
        finally:
            conn.close()

    def recipients_of(self, campaign_id: str) -> int:
        conn = sqlite3.connect(self.path)
        try:
            row = conn.execute(
                "SELECT count(*) FROM recipients WHERE campaign_id = ?", (campaign_id,)
            ).fetchone()
        finally:
            conn.close()
        return int(row[0])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(tmp_path_factory.mktemp("fuzz"))
    yield s
    s.container.close()


def whole_or_nothing(store: Store, create: Any) -> None:
    """Run ``create()``: it either stores one whole campaign or raises an allowed error and
    stores nothing."""
    before = store.counts()
    try:
        created = create()
    except ALLOWED:
        assert store.counts() == before
        return
    campaigns, recipients, tasks, changes = store.counts()
    n = created.imported.count
    assert n >= 1
    assert (campaigns, recipients, tasks) == (before[0] + 1, before[1] + n, before[2])
    assert changes == before[3]
    assert store.recipients_of(created.campaign.id) == created.campaign.recipient_count == n


# -- strategies -----------------------------------------------------------------------------------

TOKENS = [
    "email", "Email", "name", "subject", "body", "html", "row", "x", "", " ", ",", '"', '""',
    "a@example.com", "A@Example.com", "jörg@münchen.de", "用户@例子.广告", "bad@", "@x.com",
    "a@[192.0.2.1]", "\r", "\n", "\r\n", "\t", "\x00", "\x0b", "\u2028", "\u0085", "\ufeff",
    "{{ name }}", "{{ x }}", "{{", "{% for %}", "é", "😀", "a" * 70, "Bcc: e@example.net",
]  # fmt: skip
TEMPLATES = st.none() | st.sampled_from(
    [
        "Hi {{ name }}", "{{ x }}", "{{ missing }}", "{{ 1/0 }}", "{{ row['x'] }}",
        "{{ ''.__class__.__mro__ }}", "{% if %}", "{{ email|upper }}", "{{ 'a' * 500 }}",
        "Hi\r\nBcc: e@example.net", "{{ name }}\u2028", "",
    ]
) | st.text(max_size=20)  # fmt: skip


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    cell = st.sampled_from(TOKENS) | st.text(max_size=12)
    rows = draw(st.lists(st.lists(cell, min_size=0, max_size=7), max_size=8))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    quote = draw(st.booleans())

    def render(value: str) -> str:
        return '"' + value.replace('"', '""') + '"' if quote else value

    text = newline.join(",".join(render(c) for c in row) for row in rows)
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252"]))
    return text.encode(encoding, errors="replace")


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=15)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
ROWS = st.lists(
    st.dictionaries(
        st.sampled_from(["email", "name", "subject", "body", "html", "Email", "", "x", "row"]),
        st.sampled_from(TOKENS) | JSON_SCALARS | st.lists(JSON_SCALARS, max_size=2),
        max_size=6,
    )
    | JSON_SCALARS,
    max_size=6,
)
POLICY_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "timezone": st.sampled_from(
        ["UTC", "Europe/Berlin", "Pacific/Kiritimati", "Etc/GMT+12", "Asia/Kathmandu", "",
         " UTC", "../etc/passwd", "Europe/Berlin\x00", "America/St_Johns", "Europe", "Etc/",
         "x" * 300, "zone1970.tab"]
    ) | JSON_VALUES,
    "per_day": st.integers(-3, 10_003) | JSON_VALUES,
    "weekdays": st.sampled_from(["mon-fri", "sat-mon", "sun", "", "-", "mon--fri", "x"])
    | st.lists(st.sampled_from(["mon", "tue", "sun", "xx", "monday"]), max_size=4)
    | JSON_VALUES,
    "windows": st.lists(
        st.sampled_from(
            ["09:00-17:00", "00:00-24:00", "24:00-24:00", "23:00-01:00", "9:5-10:00",
             "10:00-10:00", "00:00-00:01", "23:59-24:00", "12:00-13:00", "99:99-100:00"]
        ),
        max_size=3,
    ) | st.sampled_from(["09:00-12:00,13:00-17:00", "09:00-17:00"]) | JSON_VALUES,
    "start": st.sampled_from(
        ["9999-12-31T23:59:59", "9999-12-31T10:00", "9999-12-31T23:00-05:00",
         "0001-01-01T00:00+05:00", "0001-01-01", "2026-13-01", "2026-12-01T09:00Z",
         "2026-03-29T02:30", "9999-06-01T10:00", "20261201"]
    ) | st.datetimes(timezones=st.none() | st.just(UTC)).map(datetime.isoformat) | JSON_VALUES,
    "skip_dates": st.lists(
        st.sampled_from(["2026-12-24", "9999-12-31", "0001-01-01", "2026-02-30", "x"])
        | st.dates().map(date.isoformat),
        max_size=4,
    ) | JSON_VALUES,
    "jitter_seconds": st.integers(-3, 90_000) | JSON_VALUES,
    "seed": st.integers() | JSON_VALUES,
    "per-day": JSON_VALUES,
}  # fmt: skip
POLICIES = st.fixed_dictionaries({}, optional=POLICY_FIELDS)


# -- the importer ---------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=600) | csv_files(), subject=TEMPLATES, body=TEMPLATES)
def test_csv_bytes_make_a_whole_campaign_or_nothing(
    store: Store, data: bytes, subject: str | None, body: str | None
) -> None:
    whole_or_nothing(
        store,
        lambda: store.container.campaign_import.create(
            name="fuzz",
            recipients=data,
            policy=SendingPolicy(timezone="UTC"),
            templates=Templates(subject=subject, body=body),
            limits=LIMITS,
        ),
    )


@FUZZ
@given(rows=ROWS, subject=TEMPLATES, body=TEMPLATES, html=TEMPLATES)
def test_json_rows_make_a_whole_campaign_or_nothing(
    store: Store, rows: Any, subject: str | None, body: str | None, html: str | None
) -> None:
    whole_or_nothing(
        store,
        lambda: store.container.campaign_import.create_from_rows(
            name="fuzz",
            rows=rows,
            policy=SendingPolicy(timezone="UTC"),
            templates=Templates(subject=subject, body=body, html=html),
            limits=LIMITS,
        ),
    )


# -- the policy -----------------------------------------------------------------------------------


@FUZZ
@given(data=POLICIES | st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4))
def test_policies_are_refused_by_field_or_make_a_whole_campaign(
    store: Store, data: dict[str, Any]
) -> None:
    try:
        policy = SendingPolicy.from_dict(data)
    except ALLOWED:
        return
    # a valid policy reads back to itself (compared as JSON: a start in a DST gap compares
    # unequal across tzinfos by Python's rules, though the instant is the same), and plans or
    # says why not
    assert SendingPolicy.from_dict(policy.to_dict()).to_dict() == policy.to_dict()
    whole_or_nothing(
        store,
        lambda: store.container.campaign_import.create_from_rows(
            name="fuzz",
            rows=[{"email": f"r{i}@example.com"} for i in range(3)],
            policy=policy,
            templates=Templates(subject="s", body="b"),
        ),
    )


@FUZZ
@given(
    text=st.text(max_size=40),
    zone=st.text(max_size=20) | st.sampled_from(["UTC", "Asia/Tokyo"]),
)
def test_parse_helpers_answer_any_text_with_a_field_error(text: str, zone: str) -> None:
    for parse in (parse_window, parse_weekdays, parse_date, load_timezone):
        with contextlib.suppress(InvalidField):
            parse(text)
    try:
        start = parse_start(text, zone)
    except InvalidField:
        return
    # a parsed start either makes a policy that can plan, or is refused by field
    try:
        policy = SendingPolicy(timezone="UTC", start=start, weekdays=frozenset(range(7)))
        plan(policy, 2, now=T0)
    except ALLOWED:
        pass


@FUZZ
@given(value=JSON_VALUES)
def test_parse_helpers_answer_any_json_value_with_a_field_error(value: Any) -> None:
    for parse in (parse_window, parse_weekdays, parse_date, load_timezone):
        with contextlib.suppress(InvalidField):
            parse(value)
    with contextlib.suppress(InvalidField):
        parse_start(value, "UTC")


# -- atheris -------------------------------------------------------------------------------------


def test_atheris_bounded_run(tmp_path: Path) -> None:
    """A few seconds of coverage-guided fuzzing (libFuzzer via atheris) of both parsers."""
    if importlib.util.find_spec("atheris") is None:
        # The dev extra installs it where wheels exist (CPython on Linux x86_64): CI must run
        # this, not skip it.
        missing("atheris is not installed (pip install atheris; Linux x86_64 CPython wheels)")
    seconds = os.environ.get("SENDQUEUE_FUZZ_SECONDS", "5")
    result = subprocess.run(
        [sys.executable, "-c", ATHERIS_MAIN, f"-max_total_time={seconds}",
         "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/"],
        cwd=ROOT, capture_output=True, text=True, timeout=float(seconds) + 120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    done = re.search(r"Done (\d+) runs", result.stderr)
    assert done is not None and int(done.group(1)) > 0, result.stderr[-2000:]


def atheris_target(data: bytes) -> None:
    """One libFuzzer input: the first byte picks the parser, the rest is its input."""
    if not data:
        return
    mode, rest = data[0] % 4, data[1:]
    try:
        if mode == 0:
            from sendqueue.services.importing.recipients import parse_recipients

            parse_recipients(
                rest, templates=Templates(subject="Hi {{ name }}", body="b"), limits=LIMITS
            )
        elif mode == 1:
            from sendqueue.services.importing.rows import parse_recipient_rows

            rows = json.loads(rest.decode("utf-8", "replace"))
            parse_recipient_rows(rows, templates=Templates(subject="s", body="b"), limits=LIMITS)
        elif mode == 2:
            policy_data = json.loads(rest.decode("utf-8", "replace"))
            if isinstance(policy_data, dict):
                policy = SendingPolicy.from_dict(policy_data)
                plan(policy, 3, now=T0)
        else:
            text = rest.decode("utf-8", "replace")
            for parse in (parse_window, parse_weekdays, parse_date, load_timezone):
                with contextlib.suppress(InvalidField):
                    parse(text)
            parse_start(text, "Europe/Berlin")
    except (*ALLOWED, json.JSONDecodeError, RecursionError):
        pass


#: The libFuzzer entry point: only sendqueue's own modules are instrumented (all of
#: SQLAlchemy and pydantic would take minutes), so they are imported inside the hook.
ATHERIS_MAIN = """
import sys
import atheris
with atheris.instrument_imports(include=["sendqueue"]):
    from tests.reliability.test_fuzz import atheris_target
atheris.Setup(sys.argv, atheris_target)
atheris.Fuzz()
"""

if __name__ == "__main__":
    # This module's own imports ran uninstrumented: start again through ATHERIS_MAIN.
    os.execv(sys.executable, [sys.executable, "-c", ATHERIS_MAIN, *sys.argv[1:]])
