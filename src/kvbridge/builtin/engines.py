"""The built-in inference engines, as one plugin (imports nothing heavy).

``llamacpp``: llama.cpp's sequence-state files (``llama_state_seq_save_file`` / ``load_file``),
implemented in :mod:`kvbridge.engines.llamacpp` and loaded only when an engine command runs.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Engine

ENGINES = (
    Engine(
        name="llamacpp",
        description="llama.cpp sequence-state files (llama_state_seq_save_file/load_file, version 3): F16 cache "
        "rows in llama.cpp's rotary layout, for the GGUF the engine runs",
        factory="kvbridge.engines.llamacpp:ENGINE",
        suffix=".llamacpp-seq",
    ),
)


@hookimpl
def kvbridge_register_engines(register):
    for engine in ENGINES:
        register(engine)
