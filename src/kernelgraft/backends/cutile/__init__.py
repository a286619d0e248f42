"""cutile."""
