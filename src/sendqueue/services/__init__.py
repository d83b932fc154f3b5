"""The service layer: the use cases the CLI, the web app and the workers share."""
