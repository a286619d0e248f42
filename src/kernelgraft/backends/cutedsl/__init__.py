"""cutedsl."""
