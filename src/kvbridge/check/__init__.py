"""What a transfer needs, from configs alone: model specs, where configs come from, tokenizer
fingerprints, and the compatibility engine behind ``kvbridge check``.

Nothing here imports torch or transformers at module level.
"""
