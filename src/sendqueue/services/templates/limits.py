"""The error and the integer bound shared by the template sandbox and its method checks."""

from __future__ import annotations

from jinja2.exceptions import SecurityError

# Longest integer (in bits) a template may make or compute with: just above the longest Python
# will print in decimal (4300 digits, about 14,300 bits), far beyond any real template's, and
# small enough that the slowest operation on such numbers (a division) takes under a
# millisecond. Unbounded, a few repeated squarings cost one row minutes and much memory.
MAX_INT_BITS = 16_384


class TemplateLimitError(SecurityError):
    """A template went past a :class:`~sendqueue.services.templates.render.TemplateLimits` bound."""


def too_long_number(what: str) -> TemplateLimitError:
    return TemplateLimitError(f"a number made by {what} would be longer than {MAX_INT_BITS} bits")
