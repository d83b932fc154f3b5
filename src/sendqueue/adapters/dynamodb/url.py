"""The ``dynamodb://`` store URL (no boto3 here: settings validate it without the aws extra)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from sendqueue.domain.errors import InvalidField

__all__ = ["DynamoDbUrl", "parse_dynamodb_url"]

_AWS_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_DYNAMODB_TABLE = re.compile(r"[a-zA-Z0-9_.\-]{3,255}")


@dataclass(frozen=True)
class DynamoDbUrl:
    """``dynamodb://TABLE?region=R&endpoint_url=U``, taken apart."""

    table: str
    region: str | None = None
    endpoint_url: str | None = None


def parse_dynamodb_url(url: str) -> DynamoDbUrl:
    """Take ``dynamodb://TABLE?region=REGION&endpoint_url=URL`` apart (both options optional:
    boto3's own chain supplies the region); raises ``InvalidField("SENDQUEUE_DATABASE_URL")``."""
    field = "SENDQUEUE_DATABASE_URL"
    parts = urlsplit(url)
    if parts.scheme != "dynamodb":
        raise InvalidField(field, url, "expected dynamodb://TABLE")
    if parts.path not in {"", "/"} or parts.fragment:
        raise InvalidField(field, url, "expected dynamodb://TABLE?region=REGION, nothing else")
    table = parts.netloc
    if not _DYNAMODB_TABLE.fullmatch(table):
        raise InvalidField(
            field, url, "the table name is 3 to 255 characters of letters, digits, '_', '-', '.'"
        )
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(options) - {"region", "endpoint_url"})
    if unknown:
        raise InvalidField(
            field, url, f"unknown parameter {unknown[0]!r}; use region, endpoint_url"
        )
    region = options.get("region", [""])[-1] or None
    if region is not None and not _AWS_REGION.fullmatch(region):
        raise InvalidField(
            field, url, f"region must be an AWS region like eu-west-1, got {region!r}"
        )
    endpoint = options.get("endpoint_url", [""])[-1] or None
    if endpoint is not None and urlsplit(endpoint).scheme not in {"http", "https"}:
        raise InvalidField(field, url, "endpoint_url must be an http:// or https:// URL")
    return DynamoDbUrl(table, region, endpoint)
