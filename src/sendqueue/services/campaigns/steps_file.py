"""Reading a sequence's steps from a file: YAML, or JSON when its name ends in ``.json``.

The file holds a list of steps, or a mapping whose one key ``steps`` holds it. Each step is a
mapping of:

* ``subject``: a template; required for step 1, optional after it (``Re: <step 1's subject>``);
* ``body`` (the text template) or ``body_file`` (a file holding it), exactly one;
* ``html_file``: a file holding the HTML template (optional);
* ``after``: the wait after the previous step, ``3d``, ``4h`` or ``30m`` (steps 2 on);
* ``new_thread``: true to send it without In-Reply-To and References (default false).

Files are read relative to the steps file's directory, as UTF-8 (a BOM is dropped). The
templates are checked as ``campaign create`` checks its own (``compile_templates``). Any
problem raises :class:`InvalidField` naming ``steps_file``, ``steps`` or ``steps[k].key``
(``k`` counting from 1), and nothing is returned. When step 1 is given apart (``first``), the
file's entries are steps 2 on and named so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import yaml

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import MAX_STEPS, Step, check_steps, parse_delay, shown_value
from sendqueue.services.templates.render import TemplateLimits, Templates, compile_templates

__all__ = ["MAX_STEPS_FILE_BYTES", "read_steps_file", "steps_from_entries"]

#: Largest steps file: bodies of any size go in body_file and html_file.
MAX_STEPS_FILE_BYTES = 1024 * 1024

_KEYS = ("subject", "body", "body_file", "html_file", "after", "new_thread")
# A step given as data rather than in a file (the HTTP API): its templates inline, no paths.
_INLINE_KEYS = ("subject", "body", "html", "after", "new_thread")
_FIELD = "steps_file"


def read_steps_file(
    path: str | os.PathLike[str],
    limits: TemplateLimits | None = None,
    *,
    first: Step | None = None,
) -> list[Step]:
    """The checked steps of the file at ``path`` (module docstring); ``limits`` bound the
    templates as they bound a campaign's (the defaults when None). With ``first`` (step 1,
    given apart, as ``campaign create --subject --body-file`` gives it) the file holds the
    later steps only, numbered from 2, each with its ``after``; the list returned starts with
    ``first``."""
    path = Path(path)
    limits = limits or TemplateLimits()
    text = _read(path, _FIELD, MAX_STEPS_FILE_BYTES)
    data = _parse_json(text) if path.suffix.lower() == ".json" else _parse_yaml(text)
    if isinstance(data, Mapping):
        for key in data:
            if key != "steps":
                raise InvalidField(
                    key if isinstance(key, str) else _FIELD,
                    shown_value(key),
                    "unknown key; the file holds a list of steps, or steps: and that list",
                )
        if "steps" not in data:
            raise InvalidField("steps", str(path), "the file names no steps")
        data = data["steps"]
    wanted = "step 1 first" if first is None else "step 2 first (step 1 is given apart)"
    if not isinstance(data, list) or not data:
        raise InvalidField("steps", shown_value(data), f"expected a list of steps, {wanted}")
    if first is not None and isinstance(data[0], Mapping) and "after" not in data[0]:
        raise InvalidField(
            "steps",
            len(data),
            "step 1 is given apart (a subject and body template), so the file holds the later "
            "steps only, each with its after; the first entry has no after: it reads as step 1",
        )
    start = 1 if first is None else 2
    _check_count(len(data) + start - 1)
    steps = [_step(k, entry, path.parent, limits) for k, entry in enumerate(data, start)]
    return list(check_steps(steps if first is None else [first, *steps]))


def steps_from_entries(entries: object, limits: TemplateLimits | None = None) -> list[Step]:
    """The checked steps of a list of mappings shaped like a steps file's entries, but with
    the templates inline (``subject``, ``body``, ``html``, ``after``, ``new_thread``; no file
    names), as the HTTP API takes them. Errors name ``steps`` or ``steps[k].key``."""
    limits = limits or TemplateLimits()
    if not isinstance(entries, list) or not entries:
        raise InvalidField("steps", shown_value(entries), "expected a list of steps, step 1 first")
    _check_count(len(entries))
    return list(check_steps([_step(k, e, None, limits) for k, e in enumerate(entries, 1)]))


def _check_count(count: int) -> None:
    """Refuse more than MAX_STEPS steps before any entry is built: each one is compiled and
    its files read, so a long list (YAML aliases of one entry, a big JSON body) costs a lot."""
    if count > MAX_STEPS:
        raise InvalidField("steps", count, f"a sequence has 1 to {MAX_STEPS} steps")


def _step(k: int, entry: object, folder: Path | None, limits: TemplateLimits) -> Step:
    """Entry ``k`` (1-based) as a checked :class:`Step`: of a file in ``folder``, or inline
    (``folder`` None)."""
    where = f"steps[{k}]"
    if not isinstance(entry, Mapping):
        raise InvalidField(
            where, shown_value(entry), "expected a mapping such as {subject: ..., body: ...}"
        )
    keys = _KEYS if folder is not None else _INLINE_KEYS
    for key in entry:
        if key not in keys:
            raise InvalidField(
                f"{where}.{key}" if isinstance(key, str) else where,
                shown_value(key),
                f"unknown key; a step takes {', '.join(keys)}",
            )
    subject = _optional_text(entry, "subject", where)
    body, body_key = _body(entry, folder, where, limits)
    html_key = "html_file" if folder is not None else "html"
    html = _optional_text(entry, html_key, where)
    if html is not None and folder is not None:
        html = _read(folder / html, f"{where}.html_file", limits.max_html_source_bytes)
    after = entry.get("after")
    delay = None if after is None else parse_delay(after, f"{where}.after")
    new_thread = entry.get("new_thread", False)  # Step checks it is a bool
    _check_templates(Templates(subject, body, html), where, (body_key, html_key), limits)
    try:
        return Step(k, subject, body, html, delay, new_thread)
    except InvalidField as exc:  # named after the entry's keys rather than the Step's
        step, _, name = exc.field.partition(".")
        name = {"text": body_key, "html": html_key}.get(name, name)
        raise InvalidField(f"{step}.{name}", exc.value, exc.reason) from None


def _body(
    entry: Mapping[Hashable, object], folder: Path | None, where: str, limits: TemplateLimits
) -> tuple[str, str]:
    """The step's text template and the key it came from (``body`` or ``body_file``)."""
    body = _optional_text(entry, "body", where)
    body_file = _optional_text(entry, "body_file", where)
    if body is not None and body_file is not None:
        raise InvalidField(
            f"{where}.body_file", shown_value(body_file), "give body or body_file, not both"
        )
    if body is not None:
        return body, "body"
    if folder is None:
        raise InvalidField(f"{where}.body", None, "give the step a body")
    if body_file is None:
        raise InvalidField(f"{where}.body", None, "give the step a body or a body_file")
    return _read(folder / body_file, f"{where}.body_file", limits.max_source_bytes), "body_file"


def _optional_text(entry: Mapping[Hashable, object], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None or isinstance(value, str):
        return value
    # YAML reads 2026 or yes unquoted as a number or a boolean
    raise InvalidField(f"{where}.{key}", shown_value(value), "expected text (quote it in YAML)")


def _check_templates(
    templates: Templates, where: str, keys: tuple[str, str], limits: TemplateLimits
) -> None:
    """compile_templates, its errors named after the step's keys (``keys``: the body's and
    the HTML's)."""
    try:
        compile_templates(templates, limits)
    except InvalidField as exc:
        key = {"subject": "subject", "body": keys[0], "html": keys[1]}.get(exc.field, exc.field)
        raise InvalidField(f"{where}.{key}", exc.value, exc.reason) from None


def _read(path: Path, field: str, max_bytes: int) -> str:
    """The UTF-8 text of ``path``, at most ``max_bytes`` bytes (a BOM is dropped)."""
    try:
        with path.open("rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidField(field, str(path), f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InvalidField(field, str(path), f"larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidField(field, str(path), "cannot be read: not UTF-8 text") from None


# PyYAML ships no types (and types-PyYAML is not installed), so its classes are Any to mypy
class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """yaml.SafeLoader that refuses a key given twice in one mapping (it keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *defaults" may be overridden by the keys beside it
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                line = key_node.start_mark.line + 1
                raise InvalidField(_FIELD, shown_value(key), f"line {line}: a key given twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise InvalidField(_FIELD, "YAML", f"not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise InvalidField(_FIELD, "YAML", "nested too deeply") from None


def _parse_json(text: str) -> object:
    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        found = dict(pairs)
        if len(found) < len(pairs):
            twice = next(key for key in found if sum(k == key for k, _ in pairs) > 1)
            raise InvalidField(_FIELD, shown_value(twice), "a key given twice in one object")
        return found

    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise InvalidField(_FIELD, "JSON", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidField(_FIELD, "JSON", "nested too deeply") from None


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())
