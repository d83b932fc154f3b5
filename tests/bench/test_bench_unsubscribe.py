"""The unsubscribe latency benchmark once, at a tiny size: it must run, check every answer and
produce well-formed figures (no timing is asserted; the real run is
``python -m bench.unsubscribe``)."""

from __future__ import annotations

import pytest

from bench import unsubscribe

pytestmark = pytest.mark.slow


def test_the_unsubscribe_benchmark_runs_and_checks_its_answers() -> None:
    figures = unsubscribe.run(recipients=5, others=1)
    assert figures["requests"] == 5
    assert 0 < figures["median_ms"] <= figures["p99_ms"] <= figures["max_ms"]
