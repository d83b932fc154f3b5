"""The Mailer adapters: SMTP, a Maildir outbox and SES, over one MIME builder.

:func:`~sendqueue.adapters.mail.factory.mailer_from_url` picks the configured one.
"""
