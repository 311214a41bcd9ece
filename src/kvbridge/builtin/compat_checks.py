"""Built-in compatibility checks (placeholder, filled by the check work)."""
