"""Built-in RoPE variants (placeholder, filled by the RoPE codec work)."""
