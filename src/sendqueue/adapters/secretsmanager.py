"""A secret's value from AWS Secrets Manager (the secret key of the Lambda functions).

:func:`read_secret` makes one ``GetSecretValue`` call with boto3's usual credential chain, in
the region the ARN names, and returns the secret's text. Settings call it once when they are
built, which in a Lambda function is once per execution environment (its cold start), so the
key never sits in a function's configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from sendqueue.domain.errors import InvalidField

if TYPE_CHECKING:
    from mypy_boto3_secretsmanager import SecretsManagerClient

__all__ = ["read_secret"]


def read_secret(arn: str, *, client: SecretsManagerClient | None = None) -> str:
    """The text (``SecretString``, surrounding blanks removed) of the secret ``arn`` names.

    Raises InvalidField (field ``secret_arn``, the reason naming the AWS error code, never the
    value) when Secrets Manager refuses (no such secret, access denied, a KMS key the caller
    may not use), cannot be reached, or the secret is binary or empty.
    """
    own = client is None
    if client is None:
        import boto3  # the aws extra; imported only when a secret is read

        client = boto3.client("secretsmanager", region_name=arn.split(":")[3])
    try:
        answer = client.get_secret_value(SecretId=arn)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise InvalidField(
            "secret_arn", arn, f"Secrets Manager refused to read it ({code})"
        ) from None
    except BotoCoreError as exc:
        raise InvalidField("secret_arn", arn, f"Secrets Manager unreachable ({exc})") from None
    finally:
        if own:
            client.close()
    text = answer.get("SecretString")
    if text is None:
        raise InvalidField("secret_arn", arn, "a binary secret; store the key as a secret string")
    if not text.strip():
        raise InvalidField("secret_arn", arn, "the secret is empty")
    return text.strip()
