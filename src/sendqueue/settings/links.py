"""The settings of the unsubscribe links: the public URL, the signing key (or the
AWS Secrets Manager secret that holds it) and the mailto: alternative. A base of
:class:`sendqueue.settings.Settings`, read with the same ``SENDQUEUE_`` prefix; kept apart so
that each settings module stays readable."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.unsubscribe import UnsubscribeLinks

from .checks import (
    MAKE_SECRET,
    check_bare_address,
    check_public_url,
    check_secret_key,
    check_secret_key_arn,
)
from .web import WebServerSettings

__all__ = ["LinkSettings"]


class LinkSettings(WebServerSettings):
    """``SENDQUEUE_PUBLIC_URL``, ``SENDQUEUE_SECRET_KEY`` or ``SENDQUEUE_SECRET_KEY_ARN``, and
    ``SENDQUEUE_UNSUBSCRIBE_MAILBOX``; :meth:`_require_unsubscribe_links` is production's rule
    for the processes that send mail or serve the unsubscribe routes."""

    public_url: str | None = Field(
        None,
        description="base of the one-click unsubscribe links in every email, e.g. "
        "https://mail.example.com (https:// and required in production); its host is answered",
    )
    secret_key: SecretStr | None = Field(
        None,
        description="signs the unsubscribe links, VERP addresses and Message-IDs (HMAC over the "
        "task id): 32+ characters, python -c 'import secrets; print(secrets.token_hex(32))'; "
        "changing it breaks the links already sent",
    )
    secret_key_arn: str | None = Field(
        None,
        description="instead of SENDQUEUE_SECRET_KEY: ARN of an AWS Secrets Manager secret "
        "whose text is the key, read once when the process starts (the SAM template's way)",
    )
    unsubscribe_mailbox: str | None = Field(
        None,
        description="address of the List-Unsubscribe mailto: alternative (a bare address, e.g. "
        "unsubscribe@example.com); unset: the https link only",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return check_public_url(value, "SENDQUEUE_PUBLIC_URL")

    @field_validator("secret_key")
    @classmethod
    def _secret_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        check_secret_key(value.get_secret_value(), "SENDQUEUE_SECRET_KEY")
        return value

    @field_validator("secret_key_arn")
    @classmethod
    def _secret_key_arn(cls, value: str | None) -> str | None:
        return check_secret_key_arn(value, "SENDQUEUE_SECRET_KEY_ARN")

    @model_validator(mode="before")
    @classmethod
    def _read_secret_key(cls, data: Any) -> Any:
        """SENDQUEUE_SECRET_KEY_ARN: the key is the secret's text, read here, once, so that
        every check on SENDQUEUE_SECRET_KEY applies to it (the key never sits in the
        environment). Setting both would leave two keys to drift apart: refused."""
        if not isinstance(data, dict):
            return data
        arn = check_secret_key_arn(data.get("secret_key_arn"), "SENDQUEUE_SECRET_KEY_ARN")
        if arn is None:
            return data
        if data.get("secret_key"):
            raise ValueError(
                "set SENDQUEUE_SECRET_KEY or SENDQUEUE_SECRET_KEY_ARN, not both (two places to "
                "keep one key in)"
            )
        try:
            from sendqueue.adapters.secretsmanager import read_secret  # boto3, the aws extra
        except ImportError:
            raise ValueError(
                "SENDQUEUE_SECRET_KEY_ARN needs boto3: pip install 'sendqueue[aws]'"
            ) from None
        try:
            key = read_secret(arn)
        except InvalidField as exc:
            raise ValueError(f"SENDQUEUE_SECRET_KEY_ARN: {exc.reason}") from None
        check_secret_key(key, "SENDQUEUE_SECRET_KEY_ARN (the secret's text)")
        return {**data, "secret_key": key}

    @field_validator("unsubscribe_mailbox")
    @classmethod
    def _unsubscribe_mailbox(cls, value: str | None) -> str | None:
        return check_bare_address(value, "SENDQUEUE_UNSUBSCRIBE_MAILBOX")

    @property
    def unsubscribe_links(self) -> UnsubscribeLinks | None:
        """How the unsubscribe links are made; None unless both SENDQUEUE_PUBLIC_URL and
        SENDQUEUE_SECRET_KEY are set (then no email carries List-Unsubscribe)."""
        if self.public_url is None or self.secret_key is None:
            return None
        return UnsubscribeLinks(
            self.public_url, self.secret_key.get_secret_value(), self.unsubscribe_mailbox
        )

    def _require_unsubscribe_links(self) -> None:
        """Production mail carries the one-click unsubscribe link (RFC 8058), over HTTPS."""
        missing = [
            name
            for name, value in (
                ("SENDQUEUE_PUBLIC_URL", self.public_url),
                ("SENDQUEUE_SECRET_KEY", self.secret_key),
            )
            if value is None
        ]
        if missing:
            raise ValueError(
                f"{' and '.join(missing)} required when SENDQUEUE_ENVIRONMENT=production: every "
                "email carries a one-click unsubscribe link (PUBLIC_URL/u/<token>, signed with "
                f"the secret key); make a key with: {MAKE_SECRET} (or keep it in AWS Secrets "
                "Manager and name the secret in SENDQUEUE_SECRET_KEY_ARN)"
            )
        if self.public_url is not None and not self.public_url.startswith("https://"):
            raise ValueError(
                "SENDQUEUE_PUBLIC_URL: must be an https:// URL when "
                "SENDQUEUE_ENVIRONMENT=production (mail providers POST the unsubscribe there)"
            )
