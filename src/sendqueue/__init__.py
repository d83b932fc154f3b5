"""sendqueue: scheduled email campaigns, one durable task and one schedule per email."""

__all__ = ["__version__"]

__version__ = "0.1.0"
