"""sendqueue's benchmarks: ``python -m bench`` (``make bench``); see docs/performance.md."""
