"""Refused settings as a person reads them: one plain sentence per problem, naming the variable.

pydantic's own text (``1 validation error for Settings``, a field name, ``[type=value_error]``
and a link to errors.pydantic.dev) speaks of fields and types. Every process that loads the
settings through :func:`load_settings` (the CLI's commands, ``serve``, the worker, the Lambda
functions, :func:`sendqueue.bootstrap.bootstrap`) raises
:class:`~sendqueue.domain.errors.InvalidSettings` with these sentences instead:

- a field's problem reads ``SENDQUEUE_<FIELD>: <what is wrong>``; a range names every limit of
  the field (``SENDQUEUE_FEEDBACK_INTERVAL: must be at least 1 and at most 86400``);
- a rule across fields (a model validator) already names its variables and is kept as it is.

No sentence quotes the value given: a refused SENDQUEUE_MAILER or SENDQUEUE_API_TOKEN must not
be printed back (pydantic is asked for the errors without their input).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from sendqueue.domain.errors import InvalidSettings

__all__ = ["load_settings", "settings_problems"]

M = TypeVar("M", bound=BaseModel)

#: pydantic's error types for a number out of its field's range.
_RANGE = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
#: What a value of the wrong type must be instead, by pydantic's error type.
_TYPE = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "int_type": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false (also 1/0, yes/no, on/off)",
    "bool_type": "must be true or false (also 1/0, yes/no, on/off)",
    "missing": "is required",
}
#: A range limit as words, by its name in the field's constraints and in pydantic's context.
_LIMITS = (("gt", "more than"), ("ge", "at least"), ("lt", "less than"), ("le", "at most"))
#: What pydantic puts before the message of a ValueError or an assert in a validator.
_PREFIXES = ("Value error, ", "Assertion failed, ")


def load_settings(cls: type[M], **values: Any) -> M:
    """``cls(**values)`` (a settings class reads the environment and ``.env``), raising
    :class:`InvalidSettings` with :func:`settings_problems` instead of pydantic's error."""
    try:
        return cls(**values)
    except ValidationError as exc:
        # from None: the traceback a Lambda function logs must not carry pydantic's text either
        raise InvalidSettings(settings_problems(exc, cls)) from None


def settings_problems(exc: ValidationError, cls: type[BaseModel]) -> list[str]:
    """One sentence per problem of ``exc``, raised by the settings class ``cls``, in order."""
    prefix = str(cls.model_config.get("env_prefix") or "")
    lines: list[str] = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = error["loc"]
        if not loc:  # a model validator: its message names the variables itself
            line = _message(error)
        else:
            name = str(loc[0])
            variable = prefix + ".".join(str(part) for part in loc).upper()
            reason = _reason(error, cls.model_fields.get(name))
            # A validator that names its variable (or another one) has already said where.
            line = reason if prefix and reason.startswith(prefix) else f"{variable}: {reason}"
        if line not in lines:
            lines.append(line)
    return lines


def _reason(error: ErrorDetails, field: FieldInfo | None) -> str:
    kind = error["type"]
    if kind in _RANGE:
        return "must be " + _limits(field, error.get("ctx") or {})
    if kind in _TYPE:
        return _TYPE[kind]
    if kind == "literal_error":
        return f"must be {(error.get('ctx') or {}).get('expected', 'one of the documented values')}"
    return _message(error)


def _limits(field: FieldInfo | None, ctx: dict[str, Any]) -> str:
    """Every limit of the field (``at least 1 and at most 86400``), else the one pydantic
    reported: both say what to set, where pydantic names only the limit that was crossed."""
    bounds: dict[str, Any] = {}
    for constraint in field.metadata if field is not None else ():
        for key, _ in _LIMITS:
            if getattr(constraint, key, None) is not None:
                bounds[key] = getattr(constraint, key)
    bounds = bounds or ctx
    return " and ".join(
        f"{words} {_number(bounds[key])}" for key, words in _LIMITS if key in bounds
    )


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _message(error: ErrorDetails) -> str:
    text = error["msg"]
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    if text.startswith("Input should "):
        text = "must " + text.removeprefix("Input should ")
    return text
