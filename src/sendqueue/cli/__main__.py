"""``python -m sendqueue.cli``: the same as the ``sendqueue`` command."""

from __future__ import annotations

from sendqueue.cli.root import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
