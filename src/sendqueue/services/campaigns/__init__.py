"""A campaign's use cases: creating it, previewing its plan, its controls, the demo."""
