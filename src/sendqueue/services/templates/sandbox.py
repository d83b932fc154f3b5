"""The Jinja2 sandbox mail-merge templates render in, bounded in time and in the size of what
a template can make (used by :mod:`sendqueue.services.templates.render`).

Output is capped per part, but a value is built before it is output: ``'x'|center(10**9)``,
``'%*s' % (10**9, 'x')`` or ``'{:>1000000000}'.format('x')`` would allocate a gigabyte first.
So every operation that can make a text (or a list) much larger than its inputs checks the
size it *would* make against the part's cap first, and raises :class:`TemplateLimitError`
before allocating: ``*``, ``**``, ``+``, ``%``, ``~``, ``str.format``/``format_map``, the
widening ``str`` methods, the widening filters, ``lipsum()``, list, dict and set growth, the
text of every ``{{ }}`` and of every macro, ``{% set %}`` and ``{% filter %}`` block. Lists,
tuples and dicts a template writes or a filter returns count toward the row's text, and
integer arithmetic is bounded to ``_MAX_INT_BITS`` before it is computed.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, ValuesView
from functools import wraps
from itertools import chain
from string import Formatter
from typing import Any

from jinja2 import StrictUndefined, nodes, pass_eval_context
from jinja2.exceptions import TemplateSyntaxError
from jinja2.runtime import Context, markup_join, str_join
from jinja2.sandbox import SandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import Namespace, _PassArg, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer
from markupsafe import escape

from sendqueue.services.templates.limits import MAX_INT_BITS as _MAX_INT_BITS
from sendqueue.services.templates.limits import TemplateLimitError
from sendqueue.services.templates.limits import too_long_number as _too_long_number
from sendqueue.services.templates.methods import METHOD_CHECKS as _METHOD_CHECKS
from sendqueue.services.templates.methods import check_str_replace

__all__ = ["BoundedSandbox", "Budget", "TemplateLimitError"]

# Loops count their items in batches of this many: cheap, and still well inside the budget.
_ITEMS_PER_CHECK = 256
# Steps a row takes before its time budget applies (see Budget).
_MIN_STEPS = 10_000
# Text the {{ }} of one part may produce, macros and blocks included, in output caps: a
# macro's text counts when it is made and again where it is output.
_PRODUCED_CAPS = 4
#: What one item of a list a text method or a slice returns counts as (about the size of a
#: short str object, in bytes), on top of its text.
_PIECE_COST = 48
# A %-conversion: optional (key), flags, width, .precision, length modifier, type.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)
_DIGITS = re.compile(r"\d+")
_END = object()


class Budget:
    """The deadline of the row being rendered (none outside a row) and the text it produced.

    A row fails only once it is past the deadline *and* has taken ``_MIN_STEPS`` steps (loop
    items, calls): an ordinary row takes a few dozen, so a pause of the whole
    process (a garbage collection, a busy machine) cannot fail it; a runaway takes millions.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = math.inf
        self.steps = 0
        self.produced = 0

    def start(self) -> None:
        self.deadline = time.monotonic() + self.seconds
        self.steps = 0
        self.produced = 0

    def stop(self) -> None:
        self.deadline = math.inf

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps >= _MIN_STEPS and time.monotonic() > self.deadline:
            raise TemplateLimitError(
                f"took longer than {self.seconds:g} s for one row; simplify the template"
            )


def _size(value: object) -> int:
    """Characters a value stands for: a text's length, a sequence's texts and items."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(len(item) if isinstance(item, str | bytes) else 1 for item in value)
    return 0


def _text_size(value: object, limit: int) -> tuple[int, int]:
    """About how many characters ``str(value)`` takes (containers walked, shared items counted
    each time they appear, as ``str`` writes them), and the deepest nesting seen; the walk
    stops once past ``limit``, so a cycle or a huge structure costs at most ``limit`` steps."""
    total = depth = 0
    pending: list[Iterator[Any]] = [iter((value,))]
    while pending:
        item = next(pending[-1], _END)
        if item is _END:
            pending.pop()
            continue
        total += 2  # a separator or the brackets around it
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            total += item.bit_length() // 3
        elif isinstance(item, dict):
            pending.append(chain.from_iterable(item.items()))
        elif isinstance(item, list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
            pending.append(iter(item))
        elif isinstance(item, Namespace):
            pending.append(iter((object.__getattribute__(item, "_Namespace__attrs"),)))
        else:  # numbers, dates, undefined, loop and macro objects: short texts
            total += 30
        depth = max(depth, len(pending))
        if total > limit:
            break
    return total, depth


class BoundedSandbox(SandboxedEnvironment):
    """The sandbox with a time budget, a smaller ``range`` and capped value sizes.

    Every ``{% for %}`` iterates through :meth:`bounded`, every ``~`` is joined by
    :meth:`concat` and every list, tuple and dict literal is charged by :meth:`charged`
    (rewritten in :meth:`_parse`); calls, macros included, count in
    :meth:`call`; output grows only through loops and calls, so chunks need no count. Hooks,
    not a thread or a signal: rendering runs in the web server's worker threads, where a
    signal cannot reach and a watchdog thread cannot stop Python code.
    """

    # Every arithmetic operator: Jinja folds the others at compile time, unchecked.
    intercepted_binops = frozenset({"*", "**", "+", "-", "/", "//", "%"})

    def __init__(self, budget: Budget, max_chars: int, max_range: int, **options: Any) -> None:
        super().__init__(undefined=StrictUndefined, finalize=self._finalize, **options)
        self.budget = budget
        self.max_chars = max_chars
        self.max_range = max_range
        # The generated code joins macro, {% set %} and {% filter %} buffers with this.
        self.concat = self._concat  # type: ignore[method-assign]
        self.globals["range"] = self.bounded_range
        self.globals["lipsum"] = self._lipsum
        self.filters["sendqueue:bounded"] = self.bounded
        self.filters["sendqueue:concat"] = self.concat_parts
        self.filters["sendqueue:charged"] = self.charged
        self.filters["sendqueue:sliced"] = self.sliced
        checks: dict[str, Callable[..., None]] = {
            "center": self._check_center,
            "indent": self._check_indent,
            "format": self._check_format_filter,
            "wordwrap": self._check_wordwrap,
            "batch": self._check_batch,
            "slice": self._check_batch,
            "replace": self._check_replace,
            "tojson": self._check_tojson,
            "pprint": self._check_tojson,
            "round": self._check_round,
        }
        for name in ("string", "e", "escape", "forceescape", "safe", "xmlattr", "urlize"):
            checks[name] = self._check_text_filter
        for name, filter_ in list(self.filters.items()):
            if not name.startswith("sendqueue:"):
                check = checks.get(name, self._check_text_input)
                self.filters[name] = _guarded(filter_, check, self._check_result)
        join = self.filters["join"]

        @pass_eval_context
        def bounded_join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
            items = list(value)  # an iterator is measured before it is joined
            self._check(self._text(items) + len(items) * len(str(d)), "a joined value (join)")
            return join(eval_ctx, items, d, attribute)  # type: ignore[no-any-return]

        self.filters["join"] = bounded_join

    def _too_big(self, what: str) -> TemplateLimitError:
        return TemplateLimitError(f"{what} would be longer than {self.max_chars} characters")

    def _fits(self, size: int, what: str) -> None:
        if size > self.max_chars:
            raise self._too_big(what)

    def _check(self, size: int, what: str) -> None:
        """One value of ``size`` characters is about to be made: at most the cap, and the
        row's part may make at most ``_PRODUCED_CAPS`` caps of text in all (so a loop cannot
        keep many capped values, in a list or a macro's buffer)."""
        self._fits(size, what)
        budget = self.budget
        budget.produced += size
        if budget.produced > _PRODUCED_CAPS * self.max_chars:
            raise TemplateLimitError(
                f"made more than {_PRODUCED_CAPS * self.max_chars} characters of text in all"
            )

    def _text(self, value: object) -> int:
        return _text_size(value, self.max_chars)[0]

    def bounded_range(self, *args: int) -> range:
        numbers = range(*args)
        if len(numbers) > self.max_range:
            raise TemplateLimitError(f"range() of more than {self.max_range} numbers")
        return numbers

    def bounded(self, iterable: Iterable[Any]) -> Iterator[Any]:
        tick = self.budget.tick
        tick()
        for count, item in enumerate(iterable, 1):
            if not count % _ITEMS_PER_CHECK:
                tick(_ITEMS_PER_CHECK)
            yield item

    @pass_eval_context
    def concat_parts(self, eval_ctx: Any, parts: tuple[Any, ...]) -> str:
        """``a ~ b ~ c``: measured before any text is made, joined as Jinja joins it (escaping
        plain parts when autoescaping and a part is markup), and charged to the row."""
        what = "a joined value (~)"
        size = 0
        for part in parts:
            size += len(part) if isinstance(part, str) else self._text(part)
            self._fits(size, what)
        if eval_ctx.autoescape and any(hasattr(part, "__html__") for part in parts):
            # Escaping makes a plain part up to five times longer (``"`` is ``&#34;``).
            escaped, size = [], 0
            for part in parts:
                escaped.append(escape(part))
                size += len(escaped[-1])
                self._fits(size, what)
            self._check(size, what)
            return markup_join(escaped)
        self._check(size, what)
        return (markup_join if eval_ctx.autoescape else str_join)(parts)

    def charged(self, value: Any) -> Any:
        """A list, tuple or dict the template wrote counts as the text it holds."""
        self._check(self._text(value), f"a {type(value).__name__} of the template")
        return value

    def _check_result(self, value: Any) -> None:
        """What a filter returned: a container counts as its text; a number is bounded."""
        if isinstance(value, list | tuple | dict | set):
            self._check(self._text(value), f"a {type(value).__name__} made by a filter")
        elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            raise _too_long_number("a filter")

    def _finalize(self, value: Any) -> Any:
        # Runs for every {{ }} of every row: a text (a row's cell, mostly) is measured inline.
        self._check(len(value) if type(value) is str else self._text(value), "a {{ }} value")
        return value

    def _concat(self, chunks: Iterable[str]) -> str:
        parts, size = [], 0
        for chunk in chunks:
            size += len(chunk)
            if size > self.max_chars:
                raise self._too_big("a macro's or block's text")
            parts.append(chunk)
        return "".join(parts)

    def _lipsum(self, n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        self._check(n * max * 15, "lipsum()")  # words of at most 14 letters and a space
        return generate_lorem_ipsum(n, html, min, max)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if isinstance(left, int) and isinstance(right, int):
            self._check_numbers(operator, left, right)
        elif operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(times, int) and times > 0 and _size(seq):
                    self._check(_size(seq) * times, "a repeated value (*)")
        elif operator == "%":
            if isinstance(left, str | bytes):
                self._check_percent(left, right)
        elif operator == "+" and (_size(left) or _size(right)):
            self._check(_size(left) + _size(right), "a sum (+)")
        return super().call_binop(context, operator, left, right)

    def _check_numbers(self, operator: str, left: int, right: int) -> None:
        """An integer result longer than ``_MAX_INT_BITS`` is refused before it is computed,
        as is any arithmetic on a longer operand (a division's cost grows with both)."""
        bits = max(left.bit_length(), right.bit_length()) + (operator in ("+", "-"))
        if operator == "*":
            bits = left.bit_length() + right.bit_length()
        elif operator == "**" and right > 0 and abs(left) > 1:
            # |left| ** right has right * log2|left| bits; a huge right is refused unconverted.
            bits = right + 1 if right > _MAX_INT_BITS else int(right * math.log2(abs(left))) + 1
        if bits > _MAX_INT_BITS:
            raise _too_long_number(f"({operator})")
        # Big operands cost time in proportion to the product of their lengths: counted as
        # steps (about a microsecond each), so a loop of them meets the row's time budget.
        cost = left.bit_length() * right.bit_length() >> 18
        if cost:
            self.budget.tick(cost)

    def _check_percent(self, fmt: str | bytes, values: Any, what: str = "a % format") -> None:
        """Widths and precisions (``*`` ones taken from ``values``) and the values' text."""
        text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
        positional = list(values) if isinstance(values, tuple) else [values]
        size = len(text) + self._text(values)
        for match in _PERCENT_SPEC.finditer(text):
            for number in match.group(1, 2):
                if number == "*":
                    star = positional.pop(0) if positional else 0
                    size += abs(star) if isinstance(star, int) else 0
                elif number:
                    size += int(number)
            if match.group(3) != "%" and positional:
                positional.pop(0)
            self._fits(size, what)
        self._check(size, what)

    def wrap_str_format(self, value: Any) -> Callable[..., Any] | None:
        """``str.format`` and ``format_map`` with bounded fields; the widening methods of
        ``str``, ``bytes`` and ``list`` checked first. Wrapped where they are looked up, as
        Jinja does for ``format``, so they are bounded however they are called."""
        owner = getattr(value, "__self__", None)
        name = getattr(value, "__name__", "")
        if isinstance(owner, str) and name in ("format", "format_map"):
            return self._bounded_format(owner, name == "format_map")
        kinds: tuple[type, ...] = (str, bytes, list, dict, set)
        kind: type | None = next((t for t in kinds if isinstance(owner, t)), None)
        if owner is int or isinstance(owner, int):  # int.from_bytes is bound to the class
            kind = int
        check = _METHOD_CHECKS.get((kind, name))
        if check is not None:
            method = value

            @wraps(method)
            def checked(*args: Any, **kwargs: Any) -> Any:
                if name == "join" and args:  # an iterator is measured before it is joined
                    args = (list(args[0]), *args[1:])
                check(self, owner, *args, **kwargs)
                return method(*args, **kwargs)

            return checked
        if kind in (str, bytes) and name not in ("format", "format_map"):
            # Any other text method (upper, strip, split, ...) makes at most a copy of its
            # text, or a list of its pieces: what it returns counts toward the row's text, so
            # copies kept in variables are bounded too.
            method = value

            @wraps(method)
            def charged(*args: Any, **kwargs: Any) -> Any:
                result = method(*args, **kwargs)
                self._charge_copy(result, f"{kind.__name__}.{name}()")
                return result

            return charged
        return super().wrap_str_format(value)

    def _charge_copy(self, value: Any, what: str) -> None:
        if isinstance(value, str | bytes):
            self._check(len(value), what)
        elif isinstance(value, list | tuple):
            # A piece is an object of its own, ~50 bytes however short: it counts as that
            # many characters, so many short pieces cost what they take.
            self._check(self._text(value) + _PIECE_COST * len(value), what)

    def sliced(self, value: Any) -> Any:
        """``s[1:]`` copies (Jinja compiles a slice inline, past ``getitem``): the copy counts
        toward the row's text, so slices kept in variables are bounded too."""
        self._charge_copy(value, "a slice")
        return value

    def _bounded_format(self, fmt: str, is_format_map: bool) -> Callable[..., str]:
        formatter: SandboxedFormatter
        if hasattr(fmt, "__html__"):
            formatter = _BoundedEscapeFormatter(self, escape=fmt.escape)  # type: ignore[attr-defined]
        else:
            formatter = _BoundedFormatter(self)

        def bounded_format(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                return type(fmt)(formatter.vformat(fmt, (), args[0]))
            return type(fmt)(formatter.vformat(fmt, args, kwargs))

        return bounded_format

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.budget.tick()
        return super().call(__context, __obj, *args, **kwargs)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        return _Bounds().visit(tree)  # type: ignore[no-any-return]

    # Checks of the widening filters: each takes the filter's own arguments.

    def _check_text_input(self, value: Any, *args: Any, **kwargs: Any) -> None:
        """Any other filter: a text in may come out as a new text of about its size."""
        if isinstance(value, str | bytes):
            self._check(len(value), "a filtered value")

    def _check_text_filter(self, value: Any, *args: Any, **kwargs: Any) -> None:
        self._check(self._text(value) + self._text(args), "a filtered value")

    def _check_center(self, value: Any, width: int = 80) -> None:
        self._check(max(self._text(value), width), "a centred value (center)")

    def _check_indent(self, s: Any, width: int | str = 4, *args: Any, **kwargs: Any) -> None:
        text = self._text(s)
        self._fits(text, "an indented value (indent)")
        step = len(width) if isinstance(width, str) else width
        self._check(text + (str(s).count("\n") + 1) * step, "an indented value (indent)")

    def _check_format_filter(self, value: Any, *args: Any, **kwargs: Any) -> None:
        self._check_percent(str(value), kwargs or args, "a formatted value (format)")

    def _check_wordwrap(
        self,
        s: Any,
        width: int = 79,
        break_long_words: bool = True,
        wrapstring: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        # Two neighbouring lines of a paragraph hold more than ``width`` characters (the
        # next word did not fit), so a paragraph of n characters breaks at most 2n/width times.
        text = self._text(s)
        self._fits(text, "a wrapped value (wordwrap)")
        breaks = 2 * text // max(1, width) + 2 * (str(s).count("\n") + 1)
        self._check(text + breaks * len(wrapstring or "\n"), "a wrapped value (wordwrap)")

    def _check_batch(self, value: Any, count: int, fill_with: Any = None) -> None:
        self._fits(count, "a batch or slice count")

    def _check_replace(self, eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> None:
        check_str_replace(self, str(s), str(old), str(new), -1 if count is None else count)

    def _check_round(self, value: Any, precision: Any = 0, method: str = "common") -> None:
        # Rounding computes 10 ** precision (or 10 ** -precision) as an integer first.
        if isinstance(precision, int) and abs(precision) * 4 > _MAX_INT_BITS:
            raise _too_long_number("round()")

    def _check_tojson(self, value: Any, indent: Any = None) -> None:
        size, depth = _text_size(value, self.max_chars)
        step = 1 if indent is None else len(indent) if isinstance(indent, str) else indent
        self._check(size * (1 + step * depth), "a serialised value (tojson, pprint)")


def _guarded(
    filter_: Callable[..., Any], check: Callable[..., None], check_result: Callable[[Any], None]
) -> Callable[..., Any]:
    """``filter_`` run after ``check`` had its arguments (Jinja's context argument dropped);
    its result then goes through ``check_result``."""
    skip = 1 if _PassArg.from_obj(filter_) is not None else 0

    @wraps(filter_)  # keeps jinja_pass_arg
    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        result = filter_(*args, **kwargs)
        check_result(result)
        return result

    return guarded


class _FieldsBounded(Formatter):
    """``str.format`` whose fields are checked before they are formatted: their widths and
    precisions (the digits of the spec, nested ``{}`` already filled in) and their values,
    added up over the whole format."""

    env: BoundedSandbox
    made = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self.made = len(format_string)
        text = super().vformat(format_string, args, kwargs)
        self.env._check(len(text), "a str.format() text")
        return text

    def format_field(self, value: Any, format_spec: str) -> Any:
        widths = sum(int(n) for n in _DIGITS.findall(format_spec))
        self.made += widths + self.env._text(value)
        self.env._fits(self.made, "a str.format() text")
        return super().format_field(value, format_spec)


class _BoundedFormatter(_FieldsBounded, SandboxedFormatter):
    def __init__(self, env: BoundedSandbox, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self.env = env


class _BoundedEscapeFormatter(_FieldsBounded, SandboxedEscapeFormatter):
    def __init__(self, env: BoundedSandbox, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self.env = env


class _Bounds(NodeTransformer):
    """Routes every loop's iterable through ``bounded``, every ``~`` through ``concat``, every
    slice through ``sliced`` and every list, tuple and dict literal through ``charged``."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        assert isinstance(node.iter, nodes.Expr)  # the parser makes it one
        node.iter = _hook("bounded", node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load")  # not visited: the parts are not charged twice
        parts.set_lineno(node.lineno)
        return _hook("concat", parts)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Expr:
        self.generic_visit(node)
        return _hook("sliced", node) if isinstance(node.arg, nodes.Slice) else node

    def visit_Const(self, node: nodes.Const) -> nodes.Const:
        if isinstance(node.value, int) and node.value.bit_length() > _MAX_INT_BITS:
            raise TemplateSyntaxError(f"a number longer than {_MAX_INT_BITS} bits", node.lineno)
        return node

    def visit_List(self, node: nodes.List) -> nodes.Filter:
        self.generic_visit(node)
        return _hook("charged", node)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Filter:
        self.generic_visit(node)
        return _hook("charged", node)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        self.generic_visit(node)
        return node if node.ctx != "load" else _hook("charged", node)


def _hook(method: str, value: nodes.Expr) -> nodes.Filter:
    # A filter is called directly, without the sandbox's call checks; its name holds a ":",
    # which no template can write.
    hook = nodes.Filter(value, f"sendqueue:{method}", [], [], None, None)
    hook.set_lineno(value.lineno)
    return hook
