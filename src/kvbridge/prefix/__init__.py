"""Prefix-state tools: exact-token splits, prefix packs restored without a forward,
divergence analysis between generation paths, and K/V ablations (docs/prefix-tools.md)."""
