"""A cursor past the stores' 64-bit range is a bad request, never a 500 (SQLite raised an
unmapped OverflowError for ``?after=100000000000000000000``)."""

from __future__ import annotations

import pytest

from tests.web.conftest import Web

TOO_LARGE = [str(10**20), str(2**63)]


@pytest.mark.parametrize("after", TOO_LARGE)
def test_the_campaign_page_answers_a_cursor_too_large_with_the_400_page(
    web: Web, after: str
) -> None:
    cid = web.active(3)
    response = web.client.get(f"/campaigns/{cid}", params={"after": after})
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "Bad request" in response.text
    assert "after" in response.text
    # the largest cursor there is still works: an empty page
    assert web.client.get(f"/campaigns/{cid}", params={"after": str(2**63 - 1)}).status_code == 200


@pytest.mark.parametrize("after", TOO_LARGE)
def test_the_task_api_refuses_a_cursor_too_large_naming_it(web: Web, after: str) -> None:
    cid = web.active(3)
    response = web.client.get(f"/api/campaigns/{cid}/tasks", params={"after": after})
    assert response.status_code in {400, 422}, response.text
    assert response.json()["error"]["field"] == "after"
    last = web.client.get(f"/api/campaigns/{cid}/tasks", params={"after": str(2**63 - 1)})
    assert last.status_code == 200
    assert last.json() == {"tasks": [], "next": None}
