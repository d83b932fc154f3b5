"""domain.addresses: domains in IDNA 2008 (UTS 46), never Python's IDNA 2003 codec.

IDNA 2003 maps ``ß`` to ``ss`` and the final sigma ``ς`` (U+03C2) to U+03C3: ``x@faß.de`` would
be delivered to ``x@fass.de``, someone else's domain. IDNA 2008 keeps both letters.
"""

from __future__ import annotations

import pytest

from sendqueue.domain.addresses import message_id_for, normalize_sender, parse_mailbox
from sendqueue.domain.errors import InvalidField

#: (as written, its IDNA 2008 A-label form); Python's codec gives fass.de and xn--nxasmq6b.gr.
IDNA_2008 = [
    ("faß.de", "xn--fa-hia.de"),
    ("βόλος.gr", "xn--nxasmm1c.gr"),
]


@pytest.mark.parametrize(("domain", "encoded"), IDNA_2008)
def test_parse_mailbox_encodes_the_domain_with_idna_2008(domain: str, encoded: str) -> None:
    mailbox = parse_mailbox("to_addr", f"Jane <x@{domain}>")

    assert mailbox.domain == encoded
    assert mailbox.addr_spec == f"x@{encoded}"


@pytest.mark.parametrize(("domain", "encoded"), IDNA_2008)
def test_normalize_sender_keeps_the_domain_as_written(domain: str, encoded: str) -> None:
    assert normalize_sender(f"x@{domain}", "from") == f"x@{domain}"
    assert normalize_sender(f"News <x@{domain}>", "reply_to") == f"News <x@{domain}>"
    # and what it keeps is sent to that domain
    assert parse_mailbox("from_addr", normalize_sender(f"x@{domain}", "from")).domain == encoded


@pytest.mark.parametrize(("domain", "encoded"), IDNA_2008)
def test_message_id_for_uses_the_idna_2008_domain(domain: str, encoded: str) -> None:
    assert message_id_for("t-1", f"News <x@{domain}>") == f"<t-1@{encoded}>"


def test_uts46_maps_case_and_width_as_email_validator_does() -> None:
    assert parse_mailbox("to_addr", "x@Bücher.Example").domain == "xn--bcher-kva.example"
    fullwidth = "x@\uff42\u00fc\uff43her.example"  # fullwidth b and c
    assert parse_mailbox("to_addr", fullwidth).domain == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "domain",
    [
        "a\u200db.de",  # ZERO WIDTH JOINER outside its allowed context
        "ä_b.de",  # an underscore is not a letter, digit or hyphen
        "-ä.de",  # a label may not start with a hyphen
        "\u0308a.de",  # a label may not start with a combining mark
    ],
)
def test_labels_idna_2008_refuses_are_an_invalid_field_naming_it(domain: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_mailbox("to_addr", f"x@{domain}")

    assert refused.value.field == "to_addr"
    assert "IDNA 2008" in refused.value.reason

    with pytest.raises(InvalidField) as refused:
        normalize_sender(f"News <x@{domain}>", "reply_to")
    assert refused.value.field == "reply_to"


@pytest.mark.parametrize(
    "domain",
    ["exa mple.com", "example..com", "-example.com", "a" * 64 + ".com", "example.com."],
)
def test_ascii_domains_are_checked_as_before(domain: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_mailbox("to_addr", f"x@{domain}")
    assert refused.value.field == "to_addr"


def test_ascii_domains_are_kept_as_written() -> None:
    assert parse_mailbox("to_addr", "x@Mail.Example.COM").domain == "Mail.Example.COM"
    assert parse_mailbox("to_addr", "x@[192.0.2.1]").domain == "[192.0.2.1]"
