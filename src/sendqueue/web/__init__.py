"""The web UI and HTTP API (FastAPI): thin routes over the service layer."""
