"""Screenshots of every page at a laptop's and a phone's width, for docs/ui.md.

    python -m tests.e2e.screenshots [--out docs/images]

Starts ``sendqueue serve --no-worker`` on SQLite files in a temporary directory, fills it with
:mod:`tests.e2e.realistic`'s data and saves ``<page>-1280.png`` and ``<page>-390.png`` (full
pages, light scheme) with Debian's Chromium. Nothing is fetched from the network.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from playwright.sync_api import expect, sync_playwright

from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, ROOT, Sendqueue, _launch, _shut
from tests.e2e.realistic import Seeded, seed

if TYPE_CHECKING:
    from playwright.sync_api import FilePayload, Page

__all__ = ["WIDTHS", "fill_new_campaign", "main", "page_paths"]

#: The widths every page is shot (and, in test_layout, checked) at.
WIDTHS = (1280, 390)
DEFAULT_OUT = ROOT / "docs" / "images"

# A CSV for the new-campaign form's preview: recipients in several zones.
PREVIEW_CSV = "\n".join(
    [
        "email,name,timezone",
        "ada.lovelace@analytical-engines.example.co.uk,Ada Lovelace,Europe/London",
        "kenji.watanabe@example.jp,Kenji Watanabe,Asia/Tokyo",
        "grace.hopper@navy.example.mil,Grace Hopper,America/New_York",
        "bart@example.org,Bartholomew Featherstonehaugh-Cholmondeley,Australia/Sydney",
        "linus@example.fi,Linus,",
    ]
)


def page_paths(seeded: Seeded) -> dict[str, str]:
    """Every page of the app with realistic data, by the name its screenshots get."""
    return {
        "campaigns": "/",
        "campaign": f"/campaigns/{seeded.local}",
        "campaign-completed": f"/campaigns/{seeded.completed}",
        "campaign-draft": f"/campaigns/{seeded.draft}",
        "email": f"/campaigns/{seeded.local}/emails/{seeded.email}",
        "new": "/campaigns/new",
        "senders": "/senders",
        "suppressions": "/suppressions",
        "dead-letters": "/dead-letters",
        "webhooks": "/webhooks",
        "webhook": f"/webhooks/{seeded.webhook}",
        "not-found": "/campaigns/cnotacampaign",
    }


def settle(page: Page, name: str) -> None:
    """Wait until the page shows what it will show (the campaign page's stream is open)."""
    if name.startswith("campaign") and name != "campaigns":
        expect(page.locator("#connection")).to_have_attribute(
            "data-connection", re.compile("live|idle")
        )
    page.wait_for_load_state("load")


def fill_new_campaign(page: Page, senders: tuple[str, ...]) -> None:
    """Fill the new-campaign form (two senders, local time) and show its preview."""
    csv: FilePayload = {
        "name": "people.csv", "mimeType": "text/csv", "buffer": (PREVIEW_CSV + "\n").encode(),
    }  # fmt: skip
    page.set_input_files("#f-file", files=[csv])
    page.fill("#f-name", "Winter product update")
    page.fill("#f-subject", "What is new this winter, {{ name }}")
    page.fill("#f-body", "Hello {{ name }}")
    page.fill("#f-timezone", "Europe/Berlin")
    for sender in senders:
        page.check(f"#f-sender-{sender}")
    page.check("#f-local-time")
    page.click("#preview-button")
    expect(page.locator("#preview-sends tbody tr")).to_have_count(5)


def shoot(page: Page, app: Sendqueue, seeded: Seeded, out: Path, width: int) -> list[Path]:
    """Every page at ``width``, saved in ``out``; returns the files."""
    page.set_viewport_size({"width": width, "height": 900})
    saved = []
    for name, path in page_paths(seeded).items():
        page.goto(f"{app.url}{path}")
        settle(page, name)
        if name == "new":
            fill_new_campaign(page, seeded.senders)
        target = out / f"{name}-{width}.png"
        page.screenshot(path=str(target), full_page=True)
        saved.append(target)
    return saved


def run(out: Path, *, report: Callable[[str], None] = print) -> list[Path]:
    """Start an app, fill it, shoot every page at every width into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="sq-shots-") as home:
        app = _launch(Path(home) / "sq", None, None)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                context = browser.new_context(color_scheme="light")
                page = context.new_page()
                page.goto(f"{app.url}/")
                seeded = seed(page, app)
                for width in WIDTHS:
                    saved += shoot(page, app, seeded, out, width)
                browser.close()
        finally:
            _shut(app)
    for path in saved:
        report(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    return saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the PNGs go")
    args = parser.parse_args(argv)
    run(args.out.resolve())


if __name__ == "__main__":
    main()
