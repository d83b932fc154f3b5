"""The SAM template (deploy/aws/template.yaml): cfn-lint passes, aws-sam-translator transforms it
offline, and what it declares agrees with the code that runs under it.

The transform runs with a boto3 session built from dummy values (no credentials are looked up,
no call is made) and an empty managed-policy map (the template names no managed policy; SAM
adds AWSLambdaBasicExecutionRole by ARN). CodeUri is replaced by an S3 URI first, as `sam
deploy` does when it uploads the bundle.

Intrinsic functions are evaluated by a small resolver below for one set of parameter values,
so that an ARN built with !Sub and one from !GetAtt can be compared as the strings CloudFormation
would produce.
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Any, Literal

import boto3
import pytest
from cfnlint.api import lint_file
from cfnlint.config import ManualArgs
from cfnlint.decode import decode_str
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator

from sendqueue import lambda_handlers
from sendqueue.adapters.dynamodb.table import table_definition
from sendqueue.services.config import ServiceConfig
from sendqueue.settings import LambdaControlSettings, LambdaSettings, Settings
from tests.support.aws import moto_secret
from tests.support.eventbridge_player import FakeContext

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "aws" / "template.yaml"
SOURCES = ROOT / "src" / "sendqueue" / "adapters"

STACK = "sq-test"
REGION = "eu-central-1"
ACCOUNT = "123456789012"
PSEUDO = {
    "AWS::StackName": STACK,
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}
PUBLIC_URL = "https://mail.example.com"
PARAMETERS = {"SenderAddress": "news@example.com", "PublicUrl": PUBLIC_URL}
HANDLERS = {
    "SendFunction": "sendqueue.lambda_handlers.send_handler",
    "ProvisionFunction": "sendqueue.lambda_handlers.provision_handler",
    "ReconcileFunction": "sendqueue.lambda_handlers.reconcile_handler",
    "FeedbackFunction": "sendqueue.lambda_handlers.feedback_handler",
    "WebhooksFunction": "sendqueue.lambda_handlers.webhooks_handler",
}
#: What the mailer is with the default parameters: SES in the stack's region, naming the
#: configuration set the stack makes (its bounces and complaints reach the feedback function).
MAILER = f"ses:{REGION}?configuration_set={STACK}-FeedbackConfigurationSet"


# -- loading and transforming ------------------------------------------------------------------
def _sam() -> dict[str, Any]:
    template, errors = decode_str(TEMPLATE.read_text(encoding="utf-8"))
    assert not errors, [str(e) for e in errors]
    assert template is not None
    plain: dict[str, Any] = json.loads(json.dumps(template))  # cfn-lint's nodes to plain dicts
    return plain


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return _sam()


def _transform(sam: dict[str, Any], parameters: dict[str, str]) -> dict[str, Any]:
    template = copy.deepcopy(sam)
    template["Globals"]["Function"]["CodeUri"] = "s3://deploy-bucket/sendqueue-aws.zip"
    session = boto3.session.Session(
        region_name=REGION, aws_access_key_id="offline", aws_secret_access_key="offline"
    )
    translator = Translator({}, Parser(), boto_session=session)
    out: dict[str, Any] = translator.translate(
        template, parameters, get_managed_policy_map=lambda: {}
    )
    return out


@pytest.fixture(scope="module")
def cfn(sam: dict[str, Any]) -> dict[str, Any]:
    return _transform(sam, PARAMETERS)


class Resolver:
    """Evaluates Ref, Fn::GetAtt, Fn::Sub, Fn::Join, Fn::If (with Fn::Equals / Fn::Not
    conditions) to strings, for one stack. Lambda functions resolve to real ARNs; other
    resources to recognisable placeholders."""

    def __init__(self, template: dict[str, Any], parameters: dict[str, str]) -> None:
        self.resources: dict[str, Any] = template["Resources"]
        self.values = dict(PSEUDO)
        for name, spec in template.get("Parameters", {}).items():
            self.values[name] = str(parameters.get(name, spec.get("Default", "")))
        self.conditions: dict[str, Any] = template.get("Conditions", {})

    def ref(self, name: str) -> str:
        if name in self.values:
            return self.values[name]
        resource = self.resources[name]
        kind, props = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::Lambda::Function":
            function_name: str = self(props["FunctionName"])
            return function_name
        if kind == "AWS::Scheduler::ScheduleGroup":
            group_name: str = self(props["Name"])
            return group_name
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{STACK}-{name}"
        if kind == "AWS::SecretsManager::Secret":  # its ARN, with the suffix AWS appends
            return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbC123"
        return f"{STACK}-{name}"

    def get_att(self, name: str, attribute: str) -> str:
        kind = self.resources[name]["Type"]
        if attribute == "Arn" and kind == "AWS::Lambda::Function":
            return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.ref(name)}"
        if attribute == "Arn" and kind == "AWS::SQS::Queue":
            return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{STACK}-{name}"
        if attribute == "Arn" and kind == "AWS::DynamoDB::Table":
            return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{STACK}-{name}"
        if attribute == "Arn" and kind == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{STACK}-{name}"
        return f"{STACK}-{name}.{attribute}"

    def condition(self, name: str) -> bool:
        return self._bool(self.conditions[name])

    def _bool(self, expr: Any) -> bool:
        if "Fn::Not" in expr:
            return not self._bool(expr["Fn::Not"][0])
        if "Fn::Equals" in expr:
            left, right = expr["Fn::Equals"]
            return str(self(left)) == str(self(right))
        if "Fn::Or" in expr:
            return any(self._bool(e) for e in expr["Fn::Or"])
        if "Fn::And" in expr:
            return all(self._bool(e) for e in expr["Fn::And"])
        if "Condition" in expr:
            return self.condition(expr["Condition"])
        raise AssertionError(f"condition the resolver does not know: {expr}")

    def _sub(self, text: str, names: dict[str, Any]) -> str:
        def one(match: re.Match[str]) -> str:
            key = match.group(1)
            if key in names:
                return str(self(names[key]))
            if "." in key and key.split(".", 1)[0] in self.resources:
                return self.get_att(*key.split(".", 1))
            return self.ref(key)

        return re.sub(r"\$\{([^}!]+)\}", one, text)

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self(v) for v in value]
        if not isinstance(value, dict):
            return value
        if set(value) == {"Ref"}:
            return self.ref(value["Ref"])
        if set(value) == {"Fn::GetAtt"}:
            target = value["Fn::GetAtt"]
            name, attribute = target if isinstance(target, list) else target.split(".", 1)
            return self.get_att(name, attribute)
        if set(value) == {"Fn::Sub"}:
            sub = value["Fn::Sub"]
            text, names = (sub, {}) if isinstance(sub, str) else sub
            return self._sub(text, names)
        if set(value) == {"Fn::Join"}:
            separator, parts = value["Fn::Join"]
            return separator.join(str(self(p)) for p in parts)
        if set(value) == {"Fn::If"}:
            name, yes, no = value["Fn::If"]
            return self(yes if self.condition(name) else no)
        return {k: self(v) for k, v in value.items()}


def _of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _statements(role: dict[str, Any], resolve: Resolver) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in role["Properties"].get("Policies", []):
        for statement in resolve(policy["PolicyDocument"])["Statement"]:
            out.append(statement)
    return out


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _grants(statements: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Every (action, resource) pair the Allow statements give."""
    pairs: set[tuple[str, str]] = set()
    for statement in statements:
        assert statement["Effect"] == "Allow", statement
        assert "NotAction" not in statement and "NotResource" not in statement, statement
        for action in _listed(statement["Action"]):
            for resource in _listed(statement["Resource"]):
                pairs.add((action, resource))
    return pairs


def _function_role(cfn: dict[str, Any], function: str) -> dict[str, Any]:
    role = cfn["Resources"][function]["Properties"]["Role"]
    assert set(role) == {"Fn::GetAtt"}, role
    role_name = role["Fn::GetAtt"][0]
    found: dict[str, Any] = cfn["Resources"][role_name]
    return found


# -- cfn-lint and the transform -------------------------------------------------------------------
def test_cfn_lint_finds_nothing() -> None:
    """Errors, warnings and the informational check for retention policies on stateful
    resources, in a few regions (the Scheduler and every resource type exist in each)."""
    matches = lint_file(
        TEMPLATE,
        config=ManualArgs(
            regions=["us-east-1", "eu-central-1", "eu-west-1", "ap-southeast-2"],
            include_checks=["I3011"],
        ),
    )
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


@pytest.mark.parametrize(
    ("original", "broken", "rule"),
    [
        # a plain CloudFormation resource
        ("ComparisonOperator: GreaterThanOrEqualToThreshold", "ComparisonOperator: Above", "E3030"),
        # a SAM function, checked after cfn-lint's own transform
        ("Timeout: 900\n", "Timeout: 90000\n", "E3034"),
    ],
    ids=["alarm", "function"],
)
def test_cfn_lint_catches_a_broken_template(
    tmp_path: Path, original: str, broken: str, rule: str
) -> None:
    """The lint test above can fail: the same template with one bad value does."""
    text = TEMPLATE.read_text(encoding="utf-8")
    assert original in text
    path = tmp_path / "template.yaml"
    path.write_text(text.replace(original, broken, 1), encoding="utf-8")
    matches = lint_file(path, config=ManualArgs(regions=["us-east-1"]))
    assert {m.rule.id for m in matches} == {rule}


@pytest.mark.parametrize(
    "parameters",
    [
        PARAMETERS,
        {
            **PARAMETERS,
            "SesRegion": "eu-west-1",
            "SesConfigurationSet": "tracking",
            "AlarmEmail": "ops@example.com",
            "SendConcurrencyLimit": "20",
            "StalePolicy": "fail",
        },
    ],
    ids=["defaults", "every-option"],
)
def test_sam_translator_transforms_it(sam: dict[str, Any], parameters: dict[str, str]) -> None:
    out = _transform(sam, parameters)
    assert "Transform" not in out
    functions = _of_type(out, "AWS::Lambda::Function")
    # The alarm relay exists only with AlarmWebhook (its condition; tests/aws/test_alarm_relay.py).
    handlers = {**HANDLERS, "AlarmWebhookFunction": "sendqueue.lambda_handlers.alarm_handler"}
    assert set(functions) == set(handlers)
    assert functions["AlarmWebhookFunction"]["Condition"] == "HasAlarmWebhook"
    # The feedback function only where SES sends (tests/aws/test_feedback_template.py).
    assert functions["FeedbackFunction"]["Condition"] == "HasFeedback"
    for name, function in functions.items():
        props = function["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Code"] == {"S3Bucket": "deploy-bucket", "S3Key": "sendqueue-aws.zip"}
        assert props["Handler"] == handlers[name]
        assert props["Timeout"] <= 900


# -- the Scheduler's execution role ------------------------------------------------------------
def test_the_execution_role_may_invoke_only_the_send_function(cfn: dict[str, Any]) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    env = cfn["Resources"]["SendFunction"]["Properties"]["Environment"]["Variables"]
    # The role the adapter puts into every schedule's Target, found the way the code finds it.
    role_arn = resolve(env["SENDQUEUE_SCHEDULER_ROLE_ARN"])
    roles = {
        name: role
        for name, role in _of_type(cfn, "AWS::IAM::Role").items()
        if resolve.get_att(name, "Arn") == role_arn
    }
    assert len(roles) == 1, role_arn
    (role,) = roles.values()

    trust = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "scheduler.amazonaws.com"}]
    assert role["Properties"].get("ManagedPolicyArns", []) == []

    send_arn = resolve.get_att("SendFunction", "Arn")
    dlq_arn = resolve.get_att("DeadLetterQueue", "Arn")
    assert resolve(env["SENDQUEUE_SEND_FUNCTION_ARN"]) == send_arn
    assert _grants(_statements(role, resolve)) == {
        ("lambda:InvokeFunction", send_arn),
        ("sqs:SendMessage", dlq_arn),
    }
    # The reconcile schedule has a role of its own.
    for schedule in _of_type(cfn, "AWS::Scheduler::Schedule").values():
        assert resolve(schedule["Properties"]["Target"]["RoleArn"]) != role_arn


def test_every_function_gets_the_same_schedule_settings(cfn: dict[str, Any]) -> None:
    """Provisioning, retries and the reconciler all create schedules: each must target the send
    function, as the same role, in the same group, dead-lettering to the same queue."""
    resolve = Resolver(cfn, PARAMETERS)
    envs = [
        resolve(f["Properties"]["Environment"]["Variables"])
        for f in _of_type(cfn, "AWS::Lambda::Function").values()
    ]
    keys = (
        "SENDQUEUE_DATABASE_URL",
        "SENDQUEUE_EXECUTION",
        "SENDQUEUE_SCHEDULE_GROUP",
        "SENDQUEUE_SEND_FUNCTION_ARN",
        "SENDQUEUE_SCHEDULER_ROLE_ARN",
        "SENDQUEUE_DEAD_LETTER_QUEUE_URL",
        "SENDQUEUE_DEAD_LETTER_QUEUE_ARN",
        "SENDQUEUE_MAILER",
    )
    assert len({tuple(env[k] for k in keys) for env in envs}) == 1
    env = envs[0]
    assert env["SENDQUEUE_ENVIRONMENT"] == "production"
    assert env["SENDQUEUE_EXECUTION"] == "eventbridge"
    assert env["SENDQUEUE_DATABASE_URL"] == f"dynamodb://{resolve.ref('TasksTable')}"
    assert env["SENDQUEUE_SCHEDULE_GROUP"] == resolve.ref("ScheduleGroup")
    assert env["SENDQUEUE_DEAD_LETTER_QUEUE_URL"] == resolve.ref("DeadLetterQueue")
    assert env["SENDQUEUE_DEAD_LETTER_QUEUE_ARN"] == resolve.get_att("DeadLetterQueue", "Arn")
    assert env["SENDQUEUE_MAILER"] == MAILER
    assert env["SENDQUEUE_DEFAULT_FROM"] == "news@example.com"
    assert "SENDQUEUE_API_TOKEN" not in env  # the web UI runs elsewhere


def test_the_mailer_url_carries_the_ses_options(sam: dict[str, Any]) -> None:
    parameters = {**PARAMETERS, "SesRegion": "eu-west-1", "SesConfigurationSet": "tracking"}
    out = _transform(sam, parameters)
    resolve = Resolver(out, parameters)
    env = resolve(out["Resources"]["SendFunction"]["Properties"]["Environment"]["Variables"])
    assert env["SENDQUEUE_MAILER"] == "ses:eu-west-1?configuration_set=tracking"
    grants = _grants(_statements(_function_role(out, "SendFunction"), resolve))
    assert {r for a, r in grants if a == "ses:SendEmail"} == {
        f"arn:aws:ses:eu-west-1:{ACCOUNT}:identity/*",
        f"arn:aws:ses:eu-west-1:{ACCOUNT}:configuration-set/*",
    }


# -- two retry layers, one queue -----------------------------------------------------------------
def test_the_send_function_retries_twice_then_dead_letters(cfn: dict[str, Any]) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    configs = [
        c["Properties"]
        for c in _of_type(cfn, "AWS::Lambda::EventInvokeConfig").values()
        if c["Properties"]["FunctionName"] == {"Ref": "SendFunction"}
    ]
    assert len(configs) == 1
    (config,) = configs
    assert config["MaximumRetryAttempts"] == 2
    assert config["Qualifier"] == "$LATEST"  # the schedules invoke the unqualified ARN
    destination = resolve(config["DestinationConfig"]["OnFailure"]["Destination"])
    assert destination == resolve.get_att("DeadLetterQueue", "Arn")
    # The function's role may write the on-failure record to the queue (SAM adds it).
    grants = _grants(_statements(_function_role(cfn, "SendFunction"), resolve))
    assert ("sqs:SendMessage", destination) in grants


def test_the_dead_letter_queue_has_an_alarm_on_its_depth(cfn: dict[str, Any]) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    queue = resolve.get_att("DeadLetterQueue", "QueueName")
    topic = resolve.ref("AlarmTopic")
    alarms = [
        a["Properties"]
        for a in _of_type(cfn, "AWS::CloudWatch::Alarm").values()
        if a["Properties"]["Namespace"] == "AWS/SQS"
        and resolve(a["Properties"]["Dimensions"]) == [{"Name": "QueueName", "Value": queue}]
    ]
    assert len(alarms) == 1
    (alarm,) = alarms
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert resolve(alarm["Dimensions"]) == [{"Name": "QueueName", "Value": queue}]
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert resolve(alarm["AlarmActions"]) == [topic]
    assert _of_type(cfn, "AWS::SNS::Topic")


def test_the_alarm_email_subscription_is_optional(sam: dict[str, Any]) -> None:
    resolve = Resolver(_transform(sam, PARAMETERS), PARAMETERS)
    assert not resolve.condition("HasAlarmEmail")
    with_email = {**PARAMETERS, "AlarmEmail": "ops@example.com"}
    out = _transform(sam, with_email)
    resolve = Resolver(out, with_email)
    assert resolve.condition("HasAlarmEmail")
    subscriptions = _of_type(out, "AWS::SNS::Subscription").values()
    (subscription,) = [s for s in subscriptions if s["Properties"]["Protocol"] == "email"]
    assert subscription["Condition"] == "HasAlarmEmail"
    assert resolve(subscription["Properties"]) == {
        "TopicArn": resolve.ref("AlarmTopic"),
        "Protocol": "email",
        "Endpoint": "ops@example.com",
    }


# -- the reconcile schedule -----------------------------------------------------------------------
def test_the_reconciler_runs_every_30_minutes_outside_the_sends_group(cfn: dict[str, Any]) -> None:
    schedules = _of_type(cfn, "AWS::Scheduler::Schedule")
    assert set(schedules) == {"ReconcileSchedule", "WebhooksSchedule"}
    _check_own_schedule(cfn, schedules["ReconcileSchedule"], "ReconcileFunction", 30)


def _check_own_schedule(
    cfn: dict[str, Any], schedule: dict[str, Any], function: str, minutes: int
) -> None:
    """A schedule of the stack's own: every ``minutes``, outside the sends' group, as a role
    that may invoke ``function`` and nothing else."""
    resolve = Resolver(cfn, PARAMETERS)
    props = resolve(schedule["Properties"])
    assert props["ScheduleExpression"] == (
        f"rate({minutes} minutes)" if minutes > 1 else "rate(1 minute)"
    )
    assert props["Target"]["Arn"] == resolve.get_att(function, "Arn")
    # Not in the dedicated group: the reconciler reads everything there as a send schedule.
    assert props.get("GroupName", "default") != resolve.ref("ScheduleGroup")
    role = cfn["Resources"][schedule["Properties"]["Target"]["RoleArn"]["Fn::GetAtt"][0]]
    assert _grants(_statements(role, resolve)) == {
        ("lambda:InvokeFunction", resolve.get_att(function, "Arn"))
    }


def test_webhooks_run_every_minute_and_dead_letter_failed_runs(cfn: dict[str, Any]) -> None:
    schedules = _of_type(cfn, "AWS::Scheduler::Schedule")
    _check_own_schedule(cfn, schedules["WebhooksSchedule"], "WebhooksFunction", 1)
    resolve = Resolver(cfn, PARAMETERS)
    (config,) = (
        c
        for c in _of_type(cfn, "AWS::Lambda::EventInvokeConfig").values()
        if resolve(c["Properties"]["FunctionName"]) == resolve.ref("WebhooksFunction")
    )
    destination = resolve(config["Properties"]["DestinationConfig"]["OnFailure"]["Destination"])
    assert destination == resolve.get_att("WebhooksDeadLetterQueue", "Arn")
    assert destination != resolve.get_att("DeadLetterQueue", "Arn")


# -- the table ------------------------------------------------------------------------------------
def _by(items: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return {item[key]: item for item in items}


def test_the_table_is_the_one_the_store_creates(cfn: dict[str, Any]) -> None:
    (table,) = _of_type(cfn, "AWS::DynamoDB::Table").values()
    props = table["Properties"]
    want = table_definition("ignored")
    assert "TableName" not in props  # CloudFormation names it; the functions get it by !Ref
    assert props["BillingMode"] == want["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["KeySchema"] == want["KeySchema"]
    assert _by(props["AttributeDefinitions"], "AttributeName") == _by(
        want["AttributeDefinitions"], "AttributeName"
    )
    assert _by(props["GlobalSecondaryIndexes"], "IndexName") == _by(
        want["GlobalSecondaryIndexes"], "IndexName"
    )
    assert set(props) - {"SSESpecification"} == set(want) - {"TableName"} | {
        "PointInTimeRecoverySpecification"
    }
    assert table["DeletionPolicy"] == "Retain"


# -- handlers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("function", sorted(HANDLERS))
def test_each_handler_is_a_callable_in_the_package(cfn: dict[str, Any], function: str) -> None:
    handler = cfn["Resources"][function]["Properties"]["Handler"]
    module, _, attribute = handler.rpartition(".")
    assert callable(getattr(importlib.import_module(module), attribute))


# -- least privilege, against the calls the code makes ---------------------------------------------
def _source_text(source: Path) -> str:
    """The text of a module, or of every module of a package."""
    files = sorted(source.glob("*.py")) if source.is_dir() else [source]
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def _calls(source: Path, attribute: str) -> set[str]:
    """The boto3 client methods ``source`` (a module or a package) calls on ``self.<attribute>``."""
    return set(re.findall(rf"self\.{attribute}\.([a-z_]+)\(", _source_text(source)))


def _iam_actions(
    service: Literal["dynamodb", "scheduler", "secretsmanager", "sesv2", "sqs"],
    prefix: str,
    methods: set[str],
) -> set[str]:
    """The IAM actions of boto3 methods: the API operation's name (their names agree for
    DynamoDB, EventBridge Scheduler, Secrets Manager, SQS and SES v2)."""
    client = boto3.client(
        service,
        region_name=REGION,
        aws_access_key_id="offline",
        aws_secret_access_key="offline",
    )
    try:
        mapping = client.meta.method_to_api_mapping
        return {f"{prefix}:{mapping[m]}" for m in methods if m in mapping}
    finally:
        client.close()


#: Calls that the functions never make: the table (with its point-in-time recovery) and the
#: schedule group come from the template (``create_table`` is for tests and local runs);
#: BatchWriteItem only writes a new campaign's recipients (the web UI does that); Scan only
#: runs in ``sendqueue db upgrade`` (the address-key backfill), from the operator's machine.
TABLE_SETUP = {"create_table", "get_waiter", "update_continuous_backups", "close"}
OPERATOR_ONLY = {"batch_write_item", "scan"}
NOT_IN_FUNCTIONS = {*TABLE_SETUP, *OPERATOR_ONLY}
#: Transaction items: TransactWriteItems is authorised per item as the matching single action.
TRANSACT = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def _store_actions() -> set[str]:
    source = SOURCES / "dynamodb"
    calls = _calls(source, "_db") - NOT_IN_FUNCTIONS
    assert "transact_write_items" in calls
    actions = _iam_actions("dynamodb", "dynamodb", calls - {"transact_write_items"})
    kinds = set(re.findall(r'"(Put|Update|Delete|ConditionCheck)": \{', _source_text(source)))
    return actions | {TRANSACT[k] for k in kinds}


def secret_actions() -> set[str]:
    """What reading the unsubscribe links' key calls (the adapter's one client)."""
    calls = set(re.findall(r"client\.([a-z_]+)\(", _source_text(SOURCES / "secretsmanager.py")))
    return _iam_actions("secretsmanager", "secretsmanager", calls - {"close"})


def _scheduler_actions() -> set[str]:
    calls = _calls(SOURCES / "eventbridge" / "scheduler.py", "_client")
    calls -= {"create_schedule_group", "close"}  # the template creates the group
    calls -= PROBE_CALLS["scheduler"]  # the operator's `sendqueue check`, not a function's
    return _iam_actions("scheduler", "scheduler", calls)


def test_the_code_calls_what_the_policies_name() -> None:
    """The sets the policy tests below rely on are read from the adapters, so a new boto3 call
    without a matching grant fails here rather than as AccessDenied in production."""
    assert _store_actions() >= {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem"}
    assert _scheduler_actions() == {
        "scheduler:CreateSchedule",
        "scheduler:GetSchedule",
        "scheduler:DeleteSchedule",
        "scheduler:ListSchedules",
    }


#: What each function's work reaches: the send worker creates retry schedules and an auto-pause
#: deletes a campaign's schedules (listing them); provisioning only creates (and reads one back
#: after a conflict); the reconciler does everything.
SCHEDULER_NEEDS = {
    "SendFunction": {"CreateSchedule", "GetSchedule", "DeleteSchedule", "ListSchedules"},
    "ProvisionFunction": {"CreateSchedule", "GetSchedule"},
    "ReconcileFunction": {"CreateSchedule", "GetSchedule", "DeleteSchedule", "ListSchedules"},
    # the schedules of the Pending emails a bounce or a complaint cancels
    "FeedbackFunction": {"DeleteSchedule"},
    # webhooks read the change log and write endpoints and their log: no schedule
    "WebhooksFunction": set(),
}
LOGS = {"logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"}


@pytest.mark.parametrize("function", sorted(HANDLERS))
def test_each_function_may_do_what_its_code_calls_and_no_more(
    cfn: dict[str, Any], function: str
) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    role = _function_role(cfn, function)
    assert role["Properties"]["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"  # logs only
    ]
    grants = _grants(_statements(role, resolve))
    table = resolve.get_att("TasksTable", "Arn")
    group = resolve.ref("ScheduleGroup")
    in_group = f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{group}/*"
    scheduler_role = resolve.get_att("SchedulerExecutionRole", "Arn")
    own_arn = resolve.get_att(function, "Arn")

    # Items on the table itself; the indexes are only ever queried.
    want = {(a, table) for a in _store_actions()}
    want.add(("dynamodb:Query", f"{table}/index/*"))
    scheduler = {f"scheduler:{a}" for a in SCHEDULER_NEEDS[function]}
    assert scheduler <= _scheduler_actions()
    want |= {(a, in_group) for a in scheduler - {"scheduler:ListSchedules"}}
    if "scheduler:ListSchedules" in scheduler:
        want.add(("scheduler:ListSchedules", "*"))  # it has no resource-level permissions
    if "scheduler:CreateSchedule" in scheduler:  # a schedule is created with the role
        want.add(("iam:PassRole", scheduler_role))
    if function == "SendFunction":
        want.add(("sqs:SendMessage", resolve.get_att("DeadLetterQueue", "Arn")))
        # the key of the unsubscribe links: the one secret its environment names
        secret = _environment(cfn, function, PARAMETERS)["SENDQUEUE_SECRET_KEY_ARN"]
        want |= {(a, secret) for a in secret_actions()}
        want |= {
            ("ses:SendEmail", f"arn:aws:ses:{REGION}:{ACCOUNT}:{kind}/*")
            for kind in ("identity", "configuration-set")
        }
    if function == "FeedbackFunction":
        # Lambda's poller reads the feedback queue as the function's role, and no other queue.
        queue = resolve.get_att("FeedbackQueue", "Arn")
        want |= {
            (f"sqs:{a}", queue) for a in ("ReceiveMessage", "DeleteMessage", "GetQueueAttributes")
        }
    if function == "WebhooksFunction":
        # the delivery log is appended and pruned in batches; failed runs go to its own queue
        want.add(("dynamodb:BatchWriteItem", table))
        want.add(("sqs:SendMessage", resolve.get_att("WebhooksDeadLetterQueue", "Arn")))
        # the dead-letter relay peeks at the sends' dead-letter queue (the reads of
        # dead_letters(), which SQS authorises per single action) and deletes nothing
        dlq = resolve.get_att("DeadLetterQueue", "Arn")
        want |= {(f"sqs:{a}", dlq) for a in ("ReceiveMessage", "ChangeMessageVisibility")}
    if function == "ProvisionFunction":
        want.add(("lambda:InvokeFunction", own_arn))  # the continuation, and nothing else
    if function == "ReconcileFunction":
        # A resumed provisioning run is handed on to the provision function, and nothing else.
        provision_arn = resolve.get_att("ProvisionFunction", "Arn")
        want.add(("lambda:InvokeFunction", provision_arn))
        env = _environment(cfn, function, PARAMETERS)
        assert env["SENDQUEUE_PROVISION_FUNCTION_ARN"] == provision_arn
    assert grants == want

    # iam:PassRole only towards EventBridge Scheduler.
    for statement in _statements(role, resolve):
        if "iam:PassRole" in _listed(statement["Action"]):
            assert statement["Condition"] == {
                "StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}
            }


#: boto3 calls only `sendqueue check` makes (the adapters' probes), run by an operator with the
#: operator policy, never by a function.
PROBE_CALLS = {"scheduler": {"get_schedule_group"}, "ses": {"list_email_identities"}}


def test_ses_is_called_as_the_policy_says() -> None:
    calls = _calls(SOURCES / "mail" / "ses.py", "_client") - {"close"}
    assert _iam_actions("sesv2", "ses", calls - PROBE_CALLS["ses"]) == {"ses:SendEmail"}
    assert _iam_actions("sesv2", "ses", PROBE_CALLS["ses"]) == {"ses:ListEmailIdentities"}


def test_the_operator_policy_lets_check_probe_the_stack(cfn: dict[str, Any]) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    (policy,) = _of_type(cfn, "AWS::IAM::ManagedPolicy").values()
    actions = {a for a, _ in _grants(resolve(policy["Properties"]["PolicyDocument"])["Statement"])}
    probes = _iam_actions("scheduler", "scheduler", PROBE_CALLS["scheduler"])
    probes |= _iam_actions("sesv2", "ses", PROBE_CALLS["ses"])
    assert probes == {"scheduler:GetScheduleGroup", "ses:ListEmailIdentities"}
    assert probes <= actions


def test_the_operator_policy_covers_the_dead_letter_calls(cfn: dict[str, Any]) -> None:
    resolve = Resolver(cfn, PARAMETERS)
    (policy,) = _of_type(cfn, "AWS::IAM::ManagedPolicy").values()
    grants = _grants(resolve(policy["Properties"]["PolicyDocument"])["Statement"])
    dlq = resolve.get_att("DeadLetterQueue", "Arn")
    calls = _calls(SOURCES / "eventbridge" / "scheduler.py", "_sqs") - {"close"}
    # SQS authorises a batch call as its single action.
    actions = {a.removesuffix("Batch") for a in _iam_actions("sqs", "sqs", calls)}
    assert actions == {"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage"}
    assert {(a, dlq) for a in actions} <= grants
    table = resolve.get_att("TasksTable", "Arn")
    assert ("dynamodb:BatchWriteItem", table) in grants  # creating a campaign
    assert ("dynamodb:Scan", table) in grants  # db upgrade's backfill
    assert {(a, table) for a in _store_actions()} <= grants
    assert {a for a, r in grants if r == f"{table}/index/*"} == {"dynamodb:Query"}


# -- the environment is one the code accepts ---------------------------------------------------
def _environment(cfn: dict[str, Any], function: str, parameters: dict[str, str]) -> dict[str, str]:
    resolve = Resolver(cfn, parameters)
    env = resolve(cfn["Resources"][function]["Properties"]["Environment"]["Variables"])
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("function", sorted(HANDLERS))
def test_every_variable_names_a_setting(cfn: dict[str, Any], function: str) -> None:
    """A misspelt SENDQUEUE_ variable would be ignored silently (Settings ignore extras)."""
    env = _environment(cfn, function, PARAMETERS)
    fields = {f"SENDQUEUE_{name.upper()}" for name in Settings.model_fields}
    assert sorted(k for k in env if k.startswith("SENDQUEUE_") and k not in fields) == []


class _Built(Exception):
    """Raised in place of building the container: the settings a handler built it from."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("built")
        self.settings = settings


#: An event each handler takes far enough to build its container (and no further here).
_ANY_EVENT = {"taskId": "c1-0", "campaignId": "c1", "Records": []}


def function_environment(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``env`` the process's only SENDQUEUE_ variables, as in a function (no .env file)."""
    for name in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT / "deploy" / "aws")  # no .env file here
    logger = logging.getLogger("sendqueue")
    monkeypatch.setattr(logger, "level", logger.level)  # container() raises it to INFO


def cold_start_settings(
    cfn: dict[str, Any], function: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The settings ``function``'s handler (as the template names it) builds its container
    from on a cold start, in the environment ``env`` (:func:`function_environment`); raises
    what building them raises."""
    function_environment(env, monkeypatch)

    def record(settings: Settings) -> None:
        raise _Built(settings)

    monkeypatch.setattr(lambda_handlers, "bootstrap", record)
    module, _, name = cfn["Resources"][function]["Properties"]["Handler"].rpartition(".")
    assert module == lambda_handlers.__name__
    handler = getattr(lambda_handlers, name)
    lambda_handlers.use()
    try:
        with pytest.raises(_Built) as built:
            handler(_ANY_EVENT, FakeContext(f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:f", 1))
    finally:
        lambda_handlers.use()
    return built.value.settings


@pytest.mark.parametrize("function", sorted(HANDLERS))
def test_a_cold_start_accepts_each_functions_environment(
    cfn: dict[str, Any], function: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's container, built from the environment as a cold start builds it, takes the
    whole of it: a refusal here is every invocation failing in production. The send function
    reads the unsubscribe links' key from Secrets Manager (on moto); the others need none."""
    parameters = PARAMETERS
    key = secrets.token_hex(32)
    if function == "SendFunction":
        parameters = {**PARAMETERS, "SecretKeyArn": moto_secret(monkeypatch, key)}
    env = _environment(cfn, function, parameters)
    settings = cold_start_settings(cfn, function, env, monkeypatch)
    assert settings.environment == "production"
    assert settings.execution == "eventbridge"
    assert settings.database_url == env["SENDQUEUE_DATABASE_URL"]
    assert settings.mailer == MAILER
    assert settings.stale_policy == "retry"
    assert settings.alarm_webhook is None  # the empty default means none
    assert settings.api_token is None  # no web UI in a function, so no token
    if function == "SendFunction":
        assert type(settings) is LambdaSettings  # production needs the links
        assert settings.public_url == PUBLIC_URL
        assert settings.secret_key is not None and settings.secret_key.get_secret_value() == key
        assert key not in env.values()  # read at the cold start, never in the configuration
    else:
        assert type(settings) is LambdaControlSettings
        assert "SENDQUEUE_SECRET_KEY_ARN" not in env and settings.unsubscribe_links is None


def test_the_send_timeout_sits_between_the_provision_margin_and_stale(
    cfn: dict[str, Any], sam: dict[str, Any]
) -> None:
    """A killed send must not be retried while it may still run (timeout < stale_after), and a
    provisioning continuation delivered to the send function must have time to do something
    (timeout > the provisioner's margin, which it refuses to start under)."""
    timeout = cfn["Resources"]["SendFunction"]["Properties"]["Timeout"]
    stale = sam["Parameters"]["StaleAfterSeconds"]
    assert ServiceConfig().provision_margin < timeout < int(stale["MinValue"])
    assert int(stale["Default"]) == Settings.model_fields["stale_after"].default
    provision = cfn["Resources"]["ProvisionFunction"]["Properties"]["Timeout"]
    assert provision == 900  # Lambda's most; it stops provision_margin before it
    assert provision > 2 * ServiceConfig().provision_margin


def test_parameter_defaults_are_the_settings_defaults(sam: dict[str, Any]) -> None:
    parameters = sam["Parameters"]
    same = {
        "DefaultTimezone": "default_timezone",
        "StalePolicy": "stale_policy",
        "StaleAfterSeconds": "stale_after",
        "MaxAttempts": "max_attempts",
        "RetryBackoffSeconds": "retry_backoff",
        "AutoPauseAfter": "auto_pause_after",
        "ProvisionConcurrency": "provision_concurrency",
    }
    for parameter, field in same.items():
        default = Settings.model_fields[field].default
        assert type(default)(parameters[parameter]["Default"]) == default, parameter
    assert parameters["StalePolicy"]["AllowedValues"] == ["retry", "fail"]
    assert (
        parameters["ReconcileRateMinutes"]["Default"] * 60
        == Settings.model_fields["reconcile_interval"].default
    )
