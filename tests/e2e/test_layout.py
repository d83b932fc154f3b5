"""Every page fits the screen, at a laptop's width, a small laptop's and a phone's, with
realistic data.

The data (tests/e2e/realistic.py) has long names, addresses and subjects, a local-time campaign
over two senders with emails in every state, a completed campaign, a draft, suppressions, dead
letters, webhooks and a delivery log. On each page: nothing scrolls sideways (neither the page
nor any list, table, chart or card in it), names and subjects wrap only between words, lists
are stacks of cards on the phone, and axe finds nothing serious. A row the live script
redraws reads as the one the server rendered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import Sendqueue
from tests.e2e.realistic import Seeded, seed
from tests.e2e.screenshots import WIDTHS, fill_new_campaign, page_paths, settle
from tests.e2e.test_accessibility import BLOCKING, _audit, _report, axe_script

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

__all__ = ["axe_script"]  # the fixture, shared with test_accessibility

# What is wider than it may be: the page itself, and every container of a list, table, chart,
# card or block of text that is wider than its box (scrollWidth > clientWidth).
OVERFLOW = """() => {
  const root = document.documentElement;
  const found = [];
  if (root.scrollWidth > root.clientWidth) {
    found.push(`the page: ${root.scrollWidth} > ${root.clientWidth}`);
  }
  const boxes = "main, .card, .table-wrap, table, .chart-scroll, pre, ul, ol, dl, form";
  for (const el of document.querySelectorAll(boxes)) {
    if (el.getClientRects().length && el.scrollWidth > el.clientWidth) {
      const name = el.id ? "#" + el.id : el.tagName.toLowerCase() + "." + el.className;
      found.push(`${name}: ${el.scrollWidth} > ${el.clientWidth}`);
    }
  }
  return found;
}"""
# Words of names and subjects that the layout broke across two lines (a word here: what lies
# between spaces, hyphens and dashes; a break after a hyphen or dash is between words).
BROKEN_WORDS = """(selector) => {
  const broken = [];
  for (const el of document.querySelectorAll(selector)) {
    if (!el.getClientRects().length) continue;
    for (const node of el.childNodes) {
      if (node.nodeType !== Node.TEXT_NODE) continue;
      for (const match of node.data.matchAll(/[^\\s\u2010-\u2015-]+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const tops = new Set(Array.from(range.getClientRects(), (r) => Math.round(r.top)));
        if (tops.size > 1) broken.push(match[0]);
      }
    }
  }
  return broken;
}"""
WORDS = (
    '#tasks [data-field="name"], #tasks [data-field="subject"], #campaigns [data-field="name"], '
    "#campaign-name, #preview-sends td:not(.address), .facts dd:not(.address)"
)
# How each list shows on the page: its rows' display and whether its header row is visible.
LIST_SHAPES = """() => Array.from(document.querySelectorAll("table.cards"), (table) => ({
  id: table.id,
  rows: Array.from(table.tBodies[0].rows, (tr) => getComputedStyle(tr).display),
  header: table.tHead ? table.tHead.getBoundingClientRect().height > 1 : false,
}))"""


@pytest.fixture(scope="module")
def seeded(browser: Browser, shared_sendqueue: Sendqueue) -> Iterator[Seeded]:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{shared_sendqueue.url}/")
    try:
        yield seed(page, shared_sendqueue)
    finally:
        context.close()


# The widths of the screenshots, and a small laptop's between them (the table layouts' middle).
@pytest.mark.parametrize("width", sorted({*WIDTHS, 800}, reverse=True))
def test_every_page_fits_its_screen_and_stays_accessible(
    page: Page, shared_sendqueue: Sendqueue, seeded: Seeded, axe_script: Path, width: int
) -> None:
    app = shared_sendqueue
    page.context.add_init_script(path=str(axe_script))
    page.set_viewport_size({"width": width, "height": 900})
    overflow: dict[str, list[str]] = {}
    broken: dict[str, list[str]] = {}
    shapes: dict[str, list[dict[str, Any]]] = {}
    found: dict[str, list[dict[str, Any]]] = {}
    for name, path in page_paths(seeded).items():
        page.goto(f"{app.url}{path}")
        settle(page, name)
        if name == "new":
            fill_new_campaign(page, seeded.senders)
        overflow[name] = page.evaluate(OVERFLOW)
        broken[name] = page.evaluate(BROKEN_WORDS, WORDS)
        shapes[name] = page.evaluate(LIST_SHAPES)
        _audit(page, name, found)

    assert not any(overflow.values()), f"wider than the screen at {width} px: {overflow}"
    assert not any(broken.values()), f"words broken across lines at {width} px: {broken}"
    lists = {(name, s["id"]): s for name, listed in shapes.items() for s in listed if s["rows"]}
    assert {name for name, _ in lists} >= {
        "campaigns", "campaign", "campaign-completed", "new", "suppressions", "dead-letters",
        "webhook",
    }  # fmt: skip
    for where, shape in lists.items():
        if width < 640:  # a stack of cards, with no header row
            assert set(shape["rows"]) == {"grid"} and not shape["header"], (where, shape)
        elif width >= 1280:  # a table (in between, whichever fits: cards below 900 px)
            assert set(shape["rows"]) == {"table-row"} and shape["header"], (where, shape)
    blocking = {w: [v for v in vs if v["impact"] in BLOCKING] for w, vs in found.items()}
    assert not any(blocking.values()), f"at {width} px:\n{_report(blocking)}"


def test_the_emails_table_folds_its_fields_into_rows_of_modest_height(
    page: Page, shared_sendqueue: Sendqueue, seeded: Seeded
) -> None:
    """At 1280 px the table is as wide as its card and no row is a tower (before, a row was
    about 170 px tall in a 1455 px wide table); every email links to its own page."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{shared_sendqueue.url}/campaigns/{seeded.local}")
    settle(page, "campaign")
    table = page.locator("#tasks-table")
    wrap = page.locator(".table-wrap").first
    assert table.evaluate("(el) => el.offsetWidth") <= wrap.evaluate("(el) => el.clientWidth")
    heights = page.locator("#tasks tr").evaluate_all("(rows) => rows.map((r) => r.offsetHeight)")
    assert len(heights) == 12 and max(heights) < 170, heights
    details = page.locator(f'#tasks tr[data-task-id="{seeded.email}"] [data-details]')
    details.click()
    expect(page).to_have_url(
        f"{shared_sendqueue.url}/campaigns/{seeded.local}/emails/{seeded.email}"
    )
    expect(page.locator("#email-facts")).to_contain_text("bounced")
    expect(page.locator("#email-facts")).to_contain_text("Australia/Sydney")


# Each row as the browser sees it: its visible text, and its elements with their attributes
# (the whitespace between the template's tags aside).
ROWS = """() => Array.from(document.querySelectorAll("#tasks tr"), (tr) => {
  const shape = (node) => node.nodeType === Node.TEXT_NODE
    ? (node.data.trim() ? node.data : null)
    : [node.tagName, Array.from(node.attributes, (a) => a.name + "=" + a.value).sort(),
       Array.from(node.childNodes, shape).filter((c) => c !== null)];
  return {id: tr.dataset.taskId, text: tr.innerText, shape: JSON.stringify(shape(tr))};
})"""


def test_a_row_the_script_draws_is_the_row_the_server_renders(
    page: Page, shared_sendqueue: Sendqueue, seeded: Seeded
) -> None:
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{shared_sendqueue.url}/campaigns/{seeded.local}")
    settle(page, "campaign")
    served = {row["id"]: row for row in page.evaluate(ROWS)}
    # filtering to the Running email drops the other rows; showing all again makes the
    # script draw them from the API's tasks (newRow, updateRow)
    page.select_option("#filter-state", "Running")
    expect(page.locator("#tasks tr")).to_have_count(1)
    page.select_option("#filter-state", "")
    expect(page.locator("#tasks tr")).to_have_count(12)
    drawn = {row["id"]: row for row in page.evaluate(ROWS)}
    assert drawn.keys() == served.keys()
    for task_id, row in served.items():
        assert drawn[task_id]["text"] == row["text"], task_id
        assert drawn[task_id]["shape"] == row["shape"], task_id
