"""The Mailer on Amazon SES (the sesv2 API, raw MIME).

The message is built by :func:`~sendqueue.adapters.mail.mime.build_message`, exactly as for
SMTP, and sent raw, so the Message-ID derived from the task id, the Date and the extra headers
are the ones every other mailer writes. ``send`` returns that Message-ID (SES's own id is logged).

Errors: throttling, quota and service failures (and connection errors) are transient; a
rejected message, an unverified sender, a paused account and invalid parameters are permanent,
because sending the same message again will get the same answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from sendqueue.adapters.mail.mime import build_message, envelope_of
from sendqueue.adapters.mail.url import SesUrl, parse_mailer_url
from sendqueue.domain.errors import (
    InvalidField,
    NotChecked,
    PermanentMailError,
    TransientMailError,
)
from sendqueue.ports import OutgoingMessage

if TYPE_CHECKING:
    from mypy_boto3_sesv2 import SESV2Client

__all__ = ["PERMANENT_CODES", "SesMailer"]

log = logging.getLogger(__name__)

#: SES error codes that no retry can fix. Everything else is treated as transient.
PERMANENT_CODES = frozenset(
    {
        "MessageRejected",
        "MailFromDomainNotVerifiedException",
        "AccountSuspendedException",
        "SendingPausedException",
        "BadRequestException",
        "NotFoundException",
        "InvalidParameterValue",
        "ValidationException",
        "AccessDeniedException",
    }
)


class SesMailer:
    """:class:`~sendqueue.ports.Mailer` on SES; see the module docstring.

    ``configuration_set`` names an SES configuration set (event publishing, IP pools).
    """

    def __init__(self, client: SESV2Client, *, configuration_set: str | None = None) -> None:
        self._client = client
        self._configuration_set = configuration_set

    @classmethod
    def from_url(cls, url: str) -> SesMailer:
        """``ses:`` (the region of the environment), ``ses:REGION`` or
        ``ses:REGION?configuration_set=NAME``; credentials come from boto3's usual chain."""
        import boto3  # the aws extra; imported only when SES is configured

        parsed = parse_mailer_url(url)
        if not isinstance(parsed, SesUrl):
            raise InvalidField("mailer", url, "expected ses:REGION, e.g. ses:eu-west-1")
        client = boto3.client("sesv2", region_name=parsed.region)
        return cls(client, configuration_set=parsed.configuration_set)

    def send(self, message: OutgoingMessage) -> str:
        try:
            mime = build_message(message)
        except InvalidField as exc:
            raise PermanentMailError(f"message not sent, it is invalid: {exc}") from exc
        args: dict[str, object] = {
            # the bare address the From header holds (SES checks it against its identities)
            "FromEmailAddress": envelope_of(mime)[0],
            "Destination": {"ToAddresses": [message.to_addr]},
            "Content": {"Raw": {"Data": mime.as_bytes()}},
        }
        if self._configuration_set:
            args["ConfigurationSetName"] = self._configuration_set
        try:
            answer = self._client.send_email(**args)  # type: ignore[arg-type]
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            text = f"SES refused {message.message_id}: {code}: {exc}"
            if code in PERMANENT_CODES:
                raise PermanentMailError(text) from exc
            raise TransientMailError(text) from exc
        except BotoCoreError as exc:
            raise TransientMailError(f"SES unreachable for {message.message_id}: {exc}") from exc
        log.debug("SES accepted %s as %s", message.message_id, answer.get("MessageId"))
        return message.message_id

    def probe(self, timeout: float) -> str:
        """One cheap read (ListEmailIdentities, one item; no mail sent), see
        :class:`~sendqueue.ports.Probe`: NotChecked without AWS credentials here. The client's
        own timeouts apply (boto3 fixes them when the client is made)."""
        try:
            self._client.list_email_identities(PageSize=1)
        except NoCredentialsError as exc:
            raise NotChecked("no AWS credentials in this environment") from exc
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            error = PermanentMailError if code in PERMANENT_CODES else TransientMailError
            raise error(f"SES refused ListEmailIdentities: {code}: {exc}") from exc
        except BotoCoreError as exc:
            raise TransientMailError(f"SES unreachable: {exc}") from exc
        return f"SES answered in {self._client.meta.region_name}"

    def close(self) -> None:
        self._client.close()
