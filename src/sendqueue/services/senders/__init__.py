"""Sender mailboxes: their use cases and which sender an email goes out from."""
