"""Running it: the set-up checks, the dead-letter queue and what needs a person now."""
