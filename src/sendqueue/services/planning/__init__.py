"""When each email goes: capacity over shared senders, re-planning, recovery from outages."""
