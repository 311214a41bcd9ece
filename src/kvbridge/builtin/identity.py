"""Built-in identity baseline (placeholder)."""
