"""Adapters: the ports implemented on real backends (SQL, embedded scheduler, SMTP, Maildir)."""
