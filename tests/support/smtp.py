"""SMTP test server fixtures (aiosmtpd). Filled in by the mailer work."""
