"""The ``sendqueue`` command line (Typer + Rich), one module per command group.

Exit status: 0 success, 1 refused (unknown id, illegal transition, conflict), 2 invalid input
(one line on stderr naming the field; CSV problems as a list of rows) or invalid settings (one
line per problem naming the SENDQUEUE_ variable), 3 infrastructure failure (store, scheduler or
mailer unreachable).
"""

from __future__ import annotations

from sendqueue.cli.root import app, main

__all__ = ["app", "main"]
