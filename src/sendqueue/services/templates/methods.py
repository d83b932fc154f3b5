"""Checks of the ``str``, ``bytes``, ``list``, ``dict``, ``set`` and ``int`` methods that make
a value much larger than their arguments, run by
:meth:`~sendqueue.services.templates.sandbox.BoundedSandbox.wrap_str_format` before the method."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sendqueue.services.templates.limits import MAX_INT_BITS, too_long_number

if TYPE_CHECKING:
    from sendqueue.services.templates.sandbox import BoundedSandbox


def _check_width(env: BoundedSandbox, s: Any, width: int = 0, *args: Any) -> None:
    env._check(max(len(s), width), "a padded value (center, ljust, rjust, zfill)")


def _check_expandtabs(env: BoundedSandbox, s: Any, tabsize: int = 8) -> None:
    env._check(len(s) + s.count("\t" if isinstance(s, str) else b"\t") * tabsize, "expandtabs()")


def check_str_replace(env: BoundedSandbox, s: Any, old: Any, new: Any, count: int = -1) -> None:
    found = len(s) + 1 if not old else s.count(old)
    found = found if count is None or count < 0 else min(found, count)
    env._check(len(s) + found * max(0, len(new) - len(old)), "a replaced value (replace)")


def _check_str_join(env: BoundedSandbox, s: Any, iterable: Any) -> None:
    items = iterable if isinstance(iterable, list | tuple | str | bytes) else ()
    env._check(env._text(items) + len(items) * len(s), "a joined value (join)")


def _check_translate(env: BoundedSandbox, s: Any, table: Any) -> None:
    values = table.values() if isinstance(table, dict) else table
    longest = max((len(v) for v in values if isinstance(v, str)), default=1)
    env._check(len(s) * longest, "a translated value (translate)")


def _check_growth(env: BoundedSandbox, container: Any, *args: Any, **kwargs: Any) -> None:
    # A list, dict or set holds at most the cap's number of items; the text it is given counts
    # toward the row's text, so a loop cannot keep copies of a big text in it.
    added = args[-1] if args else kwargs
    more = len(added) if isinstance(added, list | tuple | dict | set | range) else 1
    if len(container) + more > env.max_chars:
        raise env._too_big(f"a {type(container).__name__}")
    env._check(env._text(args) + env._text(kwargs), f"a {type(container).__name__}'s items")


def _check_to_bytes(env: BoundedSandbox, n: Any, length: int = 1, *args: Any, **kw: Any) -> None:
    env._check(length, "int.to_bytes()")


def _check_from_bytes(env: BoundedSandbox, cls: Any, data: Any, *args: Any, **kw: Any) -> None:
    if len(data) * 8 > MAX_INT_BITS:
        raise too_long_number("int.from_bytes()")


METHOD_CHECKS: dict[tuple[type | None, str], Callable[..., None]] = {
    **{(t, m): _check_width for t in (str, bytes) for m in ("center", "ljust", "rjust", "zfill")},
    **{(t, "expandtabs"): _check_expandtabs for t in (str, bytes)},
    **{(t, "replace"): check_str_replace for t in (str, bytes)},
    **{(t, "join"): _check_str_join for t in (str, bytes)},
    (str, "translate"): _check_translate,
    **{(list, m): _check_growth for m in ("append", "extend", "insert")},
    **{(dict, m): _check_growth for m in ("update", "setdefault")},
    **{(set, m): _check_growth for m in ("add", "update")},
    (int, "to_bytes"): _check_to_bytes,
    (int, "from_bytes"): _check_from_bytes,
}
