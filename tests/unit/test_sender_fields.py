"""sender.name, sender.email and sender.signature: rendered as placeholders at import, filled
in with the email's own sender when it is sent (domain.sender_fields, services.templates)."""

from __future__ import annotations

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.sender_fields import SenderFields, fill_sender
from sendqueue.domain.senders import Sender
from sendqueue.services.importing.recipients import parse_recipients
from sendqueue.services.templates.render import Templates, compile_templates

TEMPLATES = Templates(
    subject="News from {{ sender.name }} ({{ sender.signature }})",
    body="Hi {{ name }}\n-- \n{{ sender.signature }}\nWrite to {{ sender.email }}\n",
    html="<p>From {{ sender.name }}</p>{{ sender.signature }}",
)


def _rendered() -> tuple[str, str, str | None]:
    data = b"email,name\njane@example.org,Jane\n"
    (r,) = parse_recipients(data, templates=TEMPLATES).recipients
    return r.subject, r.text, r.html


def test_each_part_gets_the_sender_in_its_own_form() -> None:
    sender = Sender(
        id="s1", email="bob@example.com", name="Bob & Co <Sales>",
        signature_text="Bob\nBob & Co, Sales",
    )  # fmt: skip

    parts = fill_sender(*_rendered(), SenderFields.of_sender(sender))

    assert parts.subject == "News from Bob & Co <Sales> (Bob Bob & Co, Sales)"
    assert parts.text == "Hi Jane\n-- \nBob\nBob & Co, Sales\nWrite to bob@example.com\n"
    assert parts.html == ("<p>From Bob &amp; Co &lt;Sales&gt;</p>Bob<br>\nBob &amp; Co, Sales")


def test_an_html_signature_goes_into_the_html_part_as_it_is() -> None:
    sender = Sender(
        id="s1", email="bob@example.com", signature_text="Bob", signature_html="<b>Bob</b>"
    )

    parts = fill_sender(*_rendered(), SenderFields.of_sender(sender))

    assert parts.html == "<p>From </p><b>Bob</b>"
    assert "Bob\nWrite to" in parts.text


def test_a_campaign_without_senders_gives_its_from_and_no_signature() -> None:
    fields = SenderFields.of_from('"Doe, John" <john@example.org>')

    parts = fill_sender(*_rendered(), fields)

    assert (fields.name, fields.email) == ("Doe, John", "john@example.org")
    assert parts.subject == "News from Doe, John ()"
    assert parts.text.endswith("-- \n\nWrite to john@example.org\n")


def test_a_value_holding_a_placeholder_is_not_filled_in_again() -> None:
    fields = SenderFields("[[sendqueue:sender.email]]", "a@example.com")

    assert fill_sender("{x}", "[[sendqueue:sender.name]]", None, fields).text == (
        "[[sendqueue:sender.email]]"
    )


@pytest.mark.parametrize(
    ("part", "source"),
    [
        ("subject", "{{ sender.name|upper }}"),
        ("body", "{{ sender.title }}"),
        ("html", "{% if sender.signature %}x{% endif %}"),
        ("body", "{{ sender }}"),
        ("body", "{% set s = sender.name %}{{ s }}"),
    ],
)
def test_any_other_use_of_sender_is_refused_naming_the_part(part: str, source: str) -> None:
    with pytest.raises(InvalidField) as info:
        compile_templates(Templates(**{part: source}))

    assert info.value.field == part
    assert "{{ sender.name }}" in info.value.reason


def test_a_column_named_sender_does_not_hide_the_sender() -> None:
    data = b"email,sender\njane@example.org,col\n"
    templates = Templates(subject="{{ sender.name }}/{{ row['sender'] }}", body="b")

    (r,) = parse_recipients(data, templates=templates).recipients

    assert fill_sender(r.subject, r.text, None, SenderFields("Bob", "b@x.org")).subject == (
        "Bob/col"
    )
