"""The bounded soak that runs in `make test` and CI (the full one is `make soak`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak.soak import main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_bounded_soak_has_no_violation(tmp_path: Path, policy: str) -> None:
    report = tmp_path / "soak.json"
    code = main(["--duration", "30", "--policy", policy, "--seed", "11", "--json", str(report)])
    data = json.loads(report.read_text())
    assert data["violations"] == []
    assert code == 0
    assert data["sent"] > 50 and data["kills"] >= 1
    if policy == "fail":
        assert data["duplicates"] == 0
