"""kvbridge plugin: the ``vllm`` engine (prefix stores a vLLM KV connector loads).

- :mod:`kvbridge_vllm.store`: the store entry format (one safetensors file per prefix), the
  model identity it is checked against, prefix matching and per-rank head slicing (no vLLM);
- :mod:`kvbridge_vllm.engine`: ``KVState`` <-> store entry (``kvbridge pack export --engine vllm``,
  ``kvbridge engine export/import --engine vllm``);
- :mod:`kvbridge_vllm.pages`: reading vLLM's paged cache back through a layout learned from vLLM's
  own cache-write op;
- :mod:`kvbridge_vllm.connector`: ``KVBridgeConnector``, the vLLM ``KVConnectorBase_V1`` (imported by
  vLLM only: ``kv_connector_module_path="kvbridge_vllm.connector"``).

Importing this module imports neither torch nor vLLM.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Engine

__version__ = "0.1.0"

ENGINE = Engine(
    name="vllm",
    description="vLLM prefix store (one safetensors file per prefix: K/V post-RoPE in the Hugging Face layout, "
    "token ids, model fingerprint) loaded by the KVBridgeConnector KV connector, for the safetensors folder "
    "vLLM serves",
    factory="kvbridge_vllm.engine:ENGINE",
    suffix=".safetensors",
)


@hookimpl
def kvbridge_register_engines(register):
    register(ENGINE)
