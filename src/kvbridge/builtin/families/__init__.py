"""Built-in family adapters (placeholder, filled by the families work)."""
