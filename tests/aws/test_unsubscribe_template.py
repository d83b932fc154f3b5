"""The template's unsubscribe links (issue 14): the ``PublicUrl`` parameter, the key in Secrets
Manager (``SecretKeyArn``, or a secret the stack makes), which only the send function and
OperatorPolicy may read, and what reaches the send function and ``sendqueue serve``.

Transformed offline and resolved as in test_template.py; the send function's email on moto is
in test_unsubscribe_function.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from sendqueue.domain.tokens import MIN_SECRET_LENGTH
from sendqueue.settings import Settings
from sendqueue.settings.checks import check_public_url, check_secret_key_arn
from tests.aws.test_template import (
    ACCOUNT,
    HANDLERS,
    PARAMETERS,
    PUBLIC_URL,
    REGION,
    Resolver,
    _environment,
    _function_role,
    _grants,
    _of_type,
    _statements,
    _transform,
    sam,  # noqa: F401 - the module-scoped fixture
    secret_actions,
)

#: A secret's full ARN as AWS gives it (the name, then "-" and six characters).
OWN_SECRET = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:mail/unsubscribe-key-Xy12Zw"
GIVEN = {**PARAMETERS, "SecretKeyArn": OWN_SECRET}


def _matches(parameter: dict[str, Any], value: str) -> bool:
    """Whether CloudFormation takes ``value`` for the parameter (its pattern, whole)."""
    return re.fullmatch(parameter["AllowedPattern"], value) is not None


def _public_url_accepted(value: str) -> bool:
    """Whether a production process takes ``value`` as SENDQUEUE_PUBLIC_URL."""
    try:
        checked = check_public_url(value, "SENDQUEUE_PUBLIC_URL")
    except ValueError:
        return False
    return checked is not None and checked.startswith("https://")


@pytest.mark.parametrize(
    "value",
    [
        "https://mail.example.com",
        "https://mail.example.com/",
        "https://example.com/mail",
        "https://mail.example.com:8443/news/",
        "http://mail.example.com",  # production needs https
        "",
        "mail.example.com",
        "https://user@mail.example.com",
        "https://mail.example.com/?list=1",
        "https://mail.example.com/#top",
        "https://mail.example.com/a b",
        "https://-bad-.example.com",
        "https://mail..example.com",
        "https://mail.example.com:port",
        "https://mail.example.com:99999",  # no such port
        "https://mail.example.com/a>b",  # ">" ends the <link> of List-Unsubscribe
        'https://mail.example.com/a"b',  # '"' ends the href of the footer's link
    ],
)
def test_the_public_url_parameter_takes_what_production_takes(
    sam: dict[str, Any],  # noqa: F811
    value: str,
) -> None:
    """A value the stack accepts is one the send function's cold start accepts, and a value it
    refuses would have failed every invocation: the deploy refuses it instead."""
    parameter = sam["Parameters"]["PublicUrl"]
    assert "Default" not in parameter  # required: production mail carries the link
    assert _matches(parameter, value) is _public_url_accepted(value)


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("", True),  # the stack makes the secret
        (OWN_SECRET, True),
        (f"arn:aws-us-gov:secretsmanager:us-gov-west-1:{ACCOUNT}:secret:k-AbCdEf", True),
        # a partial ARN (no suffix) reads the secret but matches no IAM resource
        (f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:mail/unsubscribe-key", False),
        ("mail/unsubscribe-key", False),
        (f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/key-AbCdEf", False),
    ],
)
def test_the_secret_key_arn_parameter_is_a_full_secret_arn(
    sam: dict[str, Any],  # noqa: F811
    value: str,
    accepted: bool,
) -> None:
    parameter = sam["Parameters"]["SecretKeyArn"]
    assert parameter["Default"] == ""
    assert _matches(parameter, value) is accepted
    if accepted and value:
        assert check_secret_key_arn(value, "SENDQUEUE_SECRET_KEY_ARN") == value


def test_the_stack_makes_a_kept_secret_when_none_is_given(sam: dict[str, Any]) -> None:  # noqa: F811
    out = _transform(sam, PARAMETERS)
    resolve = Resolver(out, PARAMETERS)
    assert resolve.condition("MakesSecretKey")
    [(name, secret)] = _of_type(out, "AWS::SecretsManager::Secret").items()
    assert secret["Condition"] == "MakesSecretKey"
    # Kept when the stack goes or the resource is replaced: emails sent keep working links.
    assert (secret["DeletionPolicy"], secret["UpdateReplacePolicy"]) == ("Retain", "Retain")
    generated = secret["Properties"]["GenerateSecretString"]
    assert generated["PasswordLength"] >= MIN_SECRET_LENGTH
    assert generated["ExcludePunctuation"] is True  # pastes into a shell and a .env as it is
    assert "SecretString" not in secret["Properties"]  # never written into the template
    arn = resolve.ref(name)
    assert _environment(out, "SendFunction", PARAMETERS)["SENDQUEUE_SECRET_KEY_ARN"] == arn
    assert resolve(out["Outputs"]["SecretKeyArn"]["Value"]) == arn

    given = _transform(sam, GIVEN)
    resolve = Resolver(given, GIVEN)
    assert not resolve.condition("MakesSecretKey")  # the stack makes none
    assert _environment(given, "SendFunction", GIVEN)["SENDQUEUE_SECRET_KEY_ARN"] == OWN_SECRET
    assert resolve(given["Outputs"]["SecretKeyArn"]["Value"]) == OWN_SECRET


@pytest.mark.parametrize("parameters", [PARAMETERS, GIVEN], ids=["made", "given"])
def test_only_the_send_function_and_the_operators_may_read_the_secret(
    sam: dict[str, Any],  # noqa: F811
    parameters: dict[str, str],
) -> None:
    out = _transform(sam, parameters)
    resolve = Resolver(out, parameters)
    secret = resolve(out["Outputs"]["SecretKeyArn"]["Value"])
    assert secret_actions() == {"secretsmanager:GetSecretValue"}
    for function in HANDLERS:
        env = _environment(out, function, parameters)
        reads = {
            (action, resource)
            for action, resource in _grants(_statements(_function_role(out, function), resolve))
            if action.startswith("secretsmanager:")
        }
        if function == "SendFunction":
            assert reads == {("secretsmanager:GetSecretValue", secret)}  # that one secret
            assert env["SENDQUEUE_SECRET_KEY_ARN"] == secret
            assert env["SENDQUEUE_PUBLIC_URL"] == PUBLIC_URL
        else:
            assert reads == set(), function
            assert "SENDQUEUE_SECRET_KEY_ARN" not in env and "SENDQUEUE_SECRET_KEY" not in env
    # `sendqueue serve` checks the links with the same key.
    (policy,) = _of_type(out, "AWS::IAM::ManagedPolicy").values()
    grants = _grants(resolve(policy["Properties"]["PolicyDocument"])["Statement"])
    assert {g for g in grants if g[0].startswith("secretsmanager:")} == {
        ("secretsmanager:GetSecretValue", secret)
    }
    # And neither the secret nor the grant spreads to the roles the schedules run as.
    for name, role in _of_type(out, "AWS::IAM::Role").items():
        if not name.endswith("FunctionRole"):
            assert all(
                a.split(":")[0] != "secretsmanager" for a, _ in _grants(_statements(role, resolve))
            )


def test_the_serve_environment_names_the_public_url_and_the_secret(
    sam: dict[str, Any],  # noqa: F811
) -> None:
    """The line `sendqueue serve` is started with gives it the same links settings as the send
    function, and every variable in it is a setting."""
    for parameters in (PARAMETERS, GIVEN):
        out = _transform(sam, parameters)
        resolve = Resolver(out, parameters)
        line = resolve(out["Outputs"]["ServeEnvironment"]["Value"])
        variables = dict(item.split("=", 1) for item in line.split(" "))
        send = _environment(out, "SendFunction", parameters)
        for name in ("SENDQUEUE_PUBLIC_URL", "SENDQUEUE_SECRET_KEY_ARN"):
            assert variables[name] == send[name], name
        fields = {f"SENDQUEUE_{name.upper()}" for name in Settings.model_fields}
        assert {v for v in variables if v.startswith("SENDQUEUE_")} <= fields
