"""Benchmark 16 (sequences) once, at tiny sizes, through the runner: the figures must be well
formed (no value is asserted; the real run is ``python -m bench --only sequences``). Beside
tests/bench/test_bench_smoke.py, which holds every other benchmark's smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.report import render_markdown

from bench import __main__ as bench_main
from bench import sequences
from tests.bench.test_bench_smoke import _summary, _targets

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.xdist_group("many-connections")]


def test_the_sequence_benchmarks_run_on_both_layers(tmp_path: Path) -> None:
    argv = ["--only", "sequences", "--concurrency", "2", "--out", str(tmp_path)]
    argv += ["--sequence-emails", "30", "--sequence-recipients", "200"]
    assert bench_main.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["benchmarks"]) == {"sequences_throughput", "sequences_provisioning"}
    sends = results["benchmarks"]["sequences_throughput"]
    assert set(sends["variants"]) == {"embedded, SQLite", "procrastinate, PostgreSQL"}
    for fig in sends["variants"].values():
        _summary(fig["one_step_per_second"])
        _summary(fig["sequence_per_second"])
        assert fig["ratio"] > 0
    assert [t["limit"] for t in sends["targets"]] == [sequences.THROUGHPUT_TARGET] * 2
    _targets(sends)
    provisioning = results["benchmarks"]["sequences_provisioning"]
    _summary(provisioning["sendqueue_per_second"])
    _summary(provisioning["raw_per_second"])
    assert [t["limit"] for t in provisioning["targets"]] == [sequences.PROVISIONING_TARGET]
    _targets(provisioning)
    markdown = (tmp_path / "results.md").read_text()
    assert markdown == render_markdown(results)
    assert "16 a 3-step campaign's sends, 30 emails" in markdown
    assert "16 provisioning a 3-step sequence, 200 recipients" in markdown
