"""Mail-merge templates: Jinja2 in a sandbox bounded in size and time."""
