"""Mail-merge templates: Jinja2 in a sandbox, bounded in source size, output size and time.

The contract :mod:`sendqueue.services.importing.recipients` relies on:

* :func:`compile_templates` refuses a template whose source is too large (``subject`` and
  ``body`` together, ``html`` on its own), has too many tags, or is too deeply nested to
  compile, with
  :class:`InvalidField` naming the part, before any row is read. Templates are compiled once
  per import, never per row.
* :meth:`CompiledTemplates.render` renders one part for one row. It raises
  :class:`TemplateLimitError` (a :class:`jinja2.exceptions.SecurityError`) when the output
  passes the part's cap, when an operator, a format, a filter or a method would build a value
  past it (:mod:`sendqueue.services.templates.sandbox` checks the size first), when
  ``range()`` asks for more numbers than allowed, or when the row's time budget (started by
  :meth:`CompiledTemplates.start_row`) is spent. Anything else a template raises propagates.
* Every template sees ``unsubscribe_url``, rendered as
  :data:`~sendqueue.domain.unsubscribe.UNSUBSCRIBE_URL_PLACEHOLDER`, which the send worker
  replaces with the task's own one-click unsubscribe link.
* Every template sees ``sender.name``, ``sender.email`` and ``sender.signature``, rendered as
  :data:`~sendqueue.domain.sender_fields.SENDER_PLACEHOLDERS`, which the send worker fills in
  with the sender the email goes out from. Since what renders is a placeholder, they may only
  be written as they are (``{{ sender.name }}``): a filter, a test, another attribute or any
  other use of ``sender`` is refused at compile time, naming the part. A column named
  ``sender`` does not hide them (templates reach it as ``row["sender"]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Template, TemplateError, TemplateSyntaxError, nodes
from jinja2.sandbox import SandboxedEnvironment

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.sender_fields import SENDER_ATTRIBUTES, SENDER_PLACEHOLDERS
from sendqueue.domain.unsubscribe import UNSUBSCRIBE_URL_PLACEHOLDER
from sendqueue.services.templates.sandbox import BoundedSandbox, Budget, TemplateLimitError

__all__ = [
    "CompiledTemplates",
    "TemplateLimitError",
    "TemplateLimits",
    "Templates",
    "compile_templates",
]

_VALUE_SHOWN_CHARS = 200
_SENDER = dict(SENDER_PLACEHOLDERS)
_SENDER_USE = (
    "sender.name, sender.email and sender.signature are filled in when the email is sent, so "
    "they are written only as they are, such as {{ sender.name }}, without filters or tests"
)


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on templates (docs/operations.md lists the settings that feed them)."""

    max_source_bytes: int = 64 * 1024
    """UTF-8 bytes of the subject and body templates together."""
    max_html_source_bytes: int = 1024 * 1024
    max_output_chars: int = 100_000
    """Longest rendered subject or text body (the subject's own 998-character limit follows)."""
    max_html_output_chars: int = 1_000_000
    row_seconds: float = 0.1
    """Time to render all parts of one row."""
    max_range: int = 10_000
    """Most numbers one ``range()`` may produce."""
    max_tags: int = 2_000
    """Most ``{{ }}`` and ``{% %}`` tags in one template: compiling costs about 0.2 ms and 8 KB
    per tag, held by the compiled template (docs/performance.md)."""


@dataclass(frozen=True)
class Templates:
    """Jinja2 sources used for rows whose own cell is missing or empty. ``None``: no template."""

    subject: str | None = None
    body: str | None = None
    html: str | None = None


@dataclass(frozen=True)
class CompiledTemplates:
    """:class:`Templates` parsed once, ready to render for every row."""

    subject: Template | None = None
    body: Template | None = None
    html: Template | None = None
    sources: Templates = field(default_factory=Templates)
    limits: TemplateLimits = field(default_factory=TemplateLimits)
    _budget: Budget = field(default_factory=lambda: Budget(math.inf), repr=False)
    # Jinja's render() merges the template's globals into a fresh dict on every call; doing it
    # once here and rendering with a shared context makes a row three times cheaper.
    _globals: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def start_row(self) -> None:
        """Start the time budget of one row (all of its parts)."""
        self._budget.start()

    def end_row(self) -> None:
        self._budget.stop()

    def render(self, part: str, variables: dict[str, object]) -> str:
        """Render ``part`` (subject, body or html, which must have a template) for one row."""
        template: Template = getattr(self, part)
        cap = self.limits.max_html_output_chars if part == "html" else self.limits.max_output_chars
        self._budget.produced = 0
        context = {**self._globals[part], **variables, "sender": _SENDER}
        shared = template.new_context(context, shared=True)
        chunks: list[str] = []
        size = 0
        for chunk in template.root_render_func(shared):
            size += len(chunk)
            if size > cap:
                raise TemplateLimitError(f"output longer than {cap} characters")
            chunks.append(chunk)
        return "".join(chunks)


def compile_templates(
    templates: Templates, limits: TemplateLimits = TemplateLimits()
) -> CompiledTemplates:
    """Parse the templates up front, so a bad template is reported before any row is read.

    Raises :class:`InvalidField` naming ``subject``, ``body`` or ``html``.
    """
    _check_sizes(templates, limits)
    budget = Budget(limits.row_seconds)
    text_cap, html_cap = limits.max_output_chars, limits.max_html_output_chars
    # The subject drops a trailing newline (a template read from a file usually ends in one and
    # a header cannot hold it); bodies keep theirs, since it is part of the text.
    subject_env = BoundedSandbox(budget, text_cap, limits.max_range, autoescape=False)
    text_env = BoundedSandbox(
        budget, text_cap, limits.max_range, autoescape=False, keep_trailing_newline=True
    )
    html_env = BoundedSandbox(
        budget, html_cap, limits.max_range, autoescape=True, keep_trailing_newline=True
    )
    for env in (subject_env, text_env, html_env):
        # Rendered before the task exists: the worker puts each task's own link in its place
        # at send time (sendqueue.domain.unsubscribe). A column of that name wins over it.
        env.globals["unsubscribe_url"] = UNSUBSCRIBE_URL_PLACEHOLDER
        env.globals["sender"] = _SENDER

    def compile_one(env: SandboxedEnvironment, name: str, source: str | None) -> Template | None:
        if source is None:
            return None
        try:
            tree = env.parse(source)  # parsed once: checked, then compiled
            if (why := _sender_misuse(tree)) is not None:
                raise InvalidField(name, _clip(source), why)
            return env.from_string(tree)
        except InvalidField:
            raise
        except TemplateSyntaxError as exc:
            raise InvalidField(
                name, _clip(source), f"template syntax error on line {exc.lineno}: {exc.message}"
            ) from exc
        # ValueError: a decimal literal past Python's 4300-digit limit on int(), from the lexer.
        except (TemplateError, ValueError) as exc:
            raise InvalidField(name, _clip(source), f"template error: {exc}") from exc
        # Python's own limits on the code Jinja generates: too many nested blocks (SyntaxError),
        # too many indentation levels (IndentationError), the parser's recursion.
        except (SyntaxError, RecursionError, MemoryError) as exc:
            raise InvalidField(
                name, _clip(source), f"template too deeply nested to compile ({exc})"
            ) from exc

    compiled = {
        "subject": compile_one(subject_env, "subject", templates.subject),
        "body": compile_one(text_env, "body", templates.body),
        "html": compile_one(html_env, "html", templates.html),
    }
    return CompiledTemplates(
        **compiled,
        sources=templates,
        limits=limits,
        _budget=budget,
        _globals={k: dict(t.globals) for k, t in compiled.items() if t is not None},
    )


def _sender_misuse(tree: nodes.Template) -> str | None:
    """Why the template's use of ``sender`` cannot be filled in at send time, or None: only
    ``{{ sender.ATTR }}`` of a known attribute, output as it is, can."""
    printed: set[int] = set()
    for output in tree.find_all(nodes.Output):
        for child in output.nodes:
            if (
                isinstance(child, nodes.Getattr)
                and isinstance(child.node, nodes.Name)
                and child.node.name == "sender"
            ):
                if child.attr not in SENDER_ATTRIBUTES:
                    return f"sender has no attribute {child.attr!r}: {_SENDER_USE}"
                printed.add(id(child.node))
    for name in tree.find_all(nodes.Name):
        if name.name == "sender" and id(name) not in printed:
            return _SENDER_USE
    return None


def _check_sizes(templates: Templates, limits: TemplateLimits) -> None:
    subject = len(templates.subject.encode("utf-8", "surrogatepass")) if templates.subject else 0
    body = len(templates.body.encode("utf-8", "surrogatepass")) if templates.body else 0
    html = len(templates.html.encode("utf-8", "surrogatepass")) if templates.html else 0
    cap = limits.max_source_bytes
    if subject > cap:
        raise InvalidField("subject", f"{subject} bytes", f"template larger than {cap} bytes")
    if subject + body > cap:
        raise InvalidField(
            "body",
            f"{body} bytes",
            f"subject and body templates together larger than {cap} bytes",
        )
    if html > limits.max_html_source_bytes:
        raise InvalidField(
            "html", f"{html} bytes", f"template larger than {limits.max_html_source_bytes} bytes"
        )
    for part in ("subject", "body", "html"):
        source = getattr(templates, part) or ""
        tags = source.count("{{") + source.count("{%")
        if tags > limits.max_tags:
            raise InvalidField(
                part,
                f"{tags} tags",
                f"template has more than {limits.max_tags} {{{{ }}}} or {{% %}} tags",
            )


def _clip(value: str) -> str:
    if len(value) > _VALUE_SHOWN_CHARS:
        return value[:_VALUE_SHOWN_CHARS] + f"... ({len(value)} characters)"
    return value
