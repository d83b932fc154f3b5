"""Counts in words, for every message a person reads (the CLI, the pages, the logs).

Written here rather than taken from a library (``inflect``): sendqueue counts a handful of
nouns it names itself, so an explicit plural for the irregular ones is shorter and more
predictable than an English inflection engine. The pages' scripts have the same helper
(``sq.plural`` in ``web/static/common.js``).
"""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and ``word``, in the plural unless ``count`` is 1 or -1: ``plural(1,
    "email")`` is "1 email", ``plural(2, "email")`` "2 emails". ``many`` is the plural of a
    word that does not just take an "s" (``plural(2, "address", "addresses")``)."""
    return f"{count} {word if abs(count) == 1 else many or word + 's'}"
