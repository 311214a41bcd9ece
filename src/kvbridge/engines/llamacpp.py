"""The ``llamacpp`` engine: kvbridge's :class:`~kvbridge.kvstate.KVState` <-> llama.cpp's sequence state.

:func:`export_state` writes a state as the sequence-state file llama.cpp loads
(``llama_state_seq_load_file``; format in :mod:`kvbridge.engines.llamacpp_format`) for the GGUF
it runs; :func:`import_state` reads a file llama.cpp saved back into a KVState of that GGUF's
model (as transformers loads it: :func:`kvbridge.models.load`). What changes on the way:

- **dtype**: llama.cpp's default cache is F16; a float32 or bfloat16 state is rounded to F16
  once (round to nearest; a value beyond F16's range, |x| > 65504, is refused, not turned into
  inf). ``cache_type="F32"`` / ``"BF16"`` write those types (the context must then be created
  with that ``type_k`` / ``type_v``). Import converts F16/BF16/F32 rows to ``dtype`` (float32
  by default: exact).
- **rotary layout**: keys are cached after RoPE, in the layout the engine rotates. llama.cpp
  rotates adjacent pairs (``LLAMA_ROPE_TYPE_NORM``, :data:`ENGINE_INTERLEAVED` ``True``) for
  ``llama`` GGUFs, whose converter permuted the q/k weight rows so that this equals the
  checkpoint's half-split rotation; transformers' GGUF loader permutes them back. In the
  RoPE codec's vocabulary (:attr:`kvbridge.spec.RopeSpec.interleaved`) the engine's keys
  are ``interleaved`` where the model's are half-split: a per-head index permutation of the
  rotary dims (:func:`layout_index`) maps one to the other exactly. ``qwen2`` / ``qwen3`` use
  the half-split (NEOX) rotation in llama.cpp too: no permutation.
- **tokens and positions**: the file carries the token ids (llama.cpp keeps them as the
  prompt) and one position per cell; on import cells are ordered by position and must match
  the saved tokens one to one.
- **geometry**: the layer count and every layer's K/V row width must be the GGUF's
  (``n_embd_k_gqa = kv_heads x head_dim``), as llama.cpp itself checks on load; token ids must
  be below the vocabulary size; the state's RoPE table (type, theta, rotary dims) must be the
  GGUF's. Each mismatch is one line naming both sides.

llama.cpp's sequence-state file carries no model identity (only geometry), so a file saved for
another model of the *same* geometry cannot be told apart by its bytes; any other model is
refused by the geometry checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvbridge.engines import ModuleEngine, kv_state_summary, llamacpp_format as fmt
from kvbridge.errors import ConfigError, StateError

#: llama.cpp's rotary layout per GGUF architecture (``llama_model_rope_type`` in llama-model.cpp):
#: True = adjacent pairs (LLAMA_ROPE_TYPE_NORM), False = half split (LLAMA_ROPE_TYPE_NEOX). Only
#: architectures with one plain KV cache (no SWA pair, no M-RoPE cell record) are listed.
ENGINE_INTERLEAVED = {"llama": True, "qwen2": False, "qwen3": False}
DEFAULT_CACHE_TYPE = "F16"
F16_MAX = 65504.0


@dataclass(frozen=True)
class EngineModel:
    """What llama.cpp's cache of one GGUF looks like, and the model spec kvbridge pairs it with."""

    gguf_file: str
    name: str
    architecture: str
    spec: Any  # ModelSpec of the model as transformers loads the GGUF (half-split keys for llama)
    interleaved: bool  # the engine's rotary layout (RopeSpec vocabulary)

    @property
    def num_layers(self) -> int:
        return self.spec.num_layers

    def k_width(self, layer: int) -> int:
        return self.spec.kv_heads_of(layer) * self.spec.key_dim_of(layer)

    def v_width(self, layer: int) -> int:
        return self.spec.kv_heads_of(layer) * self.spec.value_dim_of(layer)

    def geometry(self) -> str:
        return f"{self.num_layers} layers x {self.spec.num_kv_heads} KV heads x {self.spec.head_dim}"


def engine_model(model: Any, host=None) -> EngineModel:
    """The :class:`EngineModel` of ``model``: a ``.gguf`` path, a reference resolving to one, or an
    :class:`EngineModel` (returned as is)."""
    if isinstance(model, EngineModel):
        return model
    from kvbridge.models import resolve

    ref = model if hasattr(model, "gguf_file") and hasattr(model, "spec") else resolve(str(model), host=host)
    if not ref.gguf_file:
        raise ConfigError(
            f"{ref.ref}: llama.cpp runs GGUF files, and this reference has none",
            "pass the model's .gguf file (the one llama.cpp loads)",
        )
    arch = ref.gguf.architecture
    if arch not in ENGINE_INTERLEAVED:
        raise ConfigError(
            f"{ref.gguf_file}: GGUF architecture {arch!r} is not supported by the llamacpp engine",
            f"use a GGUF of one of: {', '.join(sorted(ENGINE_INTERLEAVED))}",
        )
    spec = ref.spec(host=host)
    if spec.positional != "rope" or spec.rope is None:
        raise ConfigError(f"{ref.gguf_file}: the llamacpp engine expects a RoPE model", "use a RoPE GGUF")
    return EngineModel(
        gguf_file=str(ref.gguf_file),
        name=Path(ref.gguf_file).name,
        architecture=arch,
        spec=spec,
        interleaved=ENGINE_INTERLEAVED[arch],
    )


# -- the rotary layout ---------------------------------------------------------------------------
def layout_index(head_dim: int, rotary_dim: int, *, src_interleaved: bool, dst_interleaved: bool) -> torch.Tensor:
    """``idx`` with ``dst = src[..., idx]``: the head dims of keys rotated in one layout, re-ordered
    into the other (rotary pair ``i`` is dims ``(i, i + R/2)`` half split, ``(2i, 2i+1)``
    interleaved; dims past ``rotary_dim`` stay). Identity when the layouts agree."""
    idx = torch.arange(head_dim)
    if src_interleaved == dst_interleaved:
        return idx
    half = rotary_dim // 2
    i = torch.arange(half)
    inter = torch.stack((i, i + half), dim=1).reshape(-1)  # interleaved slot 2i+h holds half-split dim h*R/2+i
    if dst_interleaved:  # half split -> interleaved
        idx[:rotary_dim] = inter
    else:  # interleaved -> half split: the inverse permutation
        idx[inter] = torch.arange(rotary_dim)
    return idx


def _relayout(k: torch.Tensor, rope, src_interleaved: bool, dst_interleaved: bool) -> torch.Tensor:
    """Keys ``[..., D]`` of a layer rotated by ``rope`` (None: no RoPE, unchanged) in the other layout."""
    if rope is None:
        return k
    idx = layout_index(k.shape[-1], rope.rotary_dim, src_interleaved=src_interleaved, dst_interleaved=dst_interleaved)
    return k[..., idx.to(k.device)]


# -- export --------------------------------------------------------------------------------------
def _check_rope(state_spec, target, what: str) -> None:
    a, b = state_spec.rope, target.spec.rope
    if a is None:
        raise StateError(
            f"{what}: the state's model has no RoPE table, {target.name} rotates keys",
            "transfer the state to this model first (kvbridge transfer)",
        )
    for field in ("rope_type", "theta", "rotary_dim"):
        if getattr(a, field) != getattr(b, field):
            raise StateError(
                f"{what}: keys rotated with RoPE {field} {getattr(a, field)!r}, {target.name} uses "
                f"{getattr(b, field)!r}",
                "re-apply RoPE for this model (state.strip_rope().apply_rope("
                "spec=...)) or transfer the state to it (kvbridge transfer)",
            )


def check_geometry(state, target: EngineModel, what: str = "KV state") -> None:
    """One-line :class:`StateError` unless ``state`` has ``target``'s cache geometry."""
    if state.num_layers != target.num_layers:
        raise StateError(
            f"{what} has {state.num_layers} layers; {target.name} caches {target.num_layers} "
            f"({target.geometry()}), llama.cpp would refuse it",
            "transfer the state to this model first (kvbridge transfer) or pass the GGUF it came from",
        )
    for i in range(state.num_layers):
        k, v = state.keys[i], state.values[i]
        kw, vw = k.shape[1] * k.shape[3], v.shape[1] * v.shape[3]
        if (kw, vw) != (target.k_width(i), target.v_width(i)) or k.shape[3] != target.spec.key_dim_of(i):
            raise StateError(
                f"{what} layer {i} holds K/V rows of {k.shape[1]}x{k.shape[3]} / {v.shape[1]}x"
                f"{v.shape[3]} values; {target.name} caches {target.spec.kv_heads_of(i)}x"
                f"{target.spec.key_dim_of(i)} / {target.spec.kv_heads_of(i)}x{target.spec.value_dim_of(i)}",
                "transfer the state to this model first (kvbridge transfer)",
            )
    if state.spec.positional == "rope":
        _check_rope(state.spec, target, what)
    vocab = target.spec.vocab_size
    if vocab and state.num_tokens and int(state.token_ids.max()) >= vocab:
        raise StateError(
            f"{what} holds token id {int(state.token_ids.max())}, beyond {target.name}'s vocabulary of {vocab}",
            "the state was made with another tokenizer; recompute it for this model",
        )


def to_seq_state(
    state, model: Any, *, cache_type: str = DEFAULT_CACHE_TYPE, v_trans: bool = True, n_stream: int = 1, host=None
) -> fmt.SeqState:
    """The :class:`~kvbridge.engines.llamacpp_format.SeqState` llama.cpp would hold for ``state``."""
    target = engine_model(model, host=host)
    if cache_type not in fmt.TYPE_IDS:
        raise ConfigError(
            f"cache type {cache_type!r} is not one kvbridge writes", f"use one of: {', '.join(fmt.TYPE_IDS)}"
        )
    if state.batch_size != 1:
        raise StateError(
            f"KV state has a batch of {state.batch_size}; a llama.cpp sequence state holds one sequence",
            "export one row (state.slice_tokens / index the batch) at a time",
        )
    if state.states or state.indexer_keys:
        raise StateError(
            "KV state carries recurrent or indexer state llama.cpp's KV file cannot hold",
            "export states of plain attention models",
        )
    check_geometry(state, target)
    if not state.rope_applied:
        state = state.apply_rope(host=host)
    dtype = dict((n, d) for n, d in fmt.CACHE_TYPES.values())[cache_type]
    keys, values = [], []
    for i in range(state.num_layers):
        k = _relayout(state.keys[i][0], target.spec.rope_for_layer(i), state.spec.rope.interleaved, target.interleaved)
        for name, t, out in (("keys", k, keys), ("values", state.values[i][0], values)):
            rows = t.permute(1, 0, 2).reshape(t.shape[1], -1)  # [T, H*D]: a cell's heads one after the other
            if dtype == torch.float16 and rows.numel() and float(rows.abs().max()) > F16_MAX:
                raise StateError(
                    f"KV state layer {i} {name} reach {float(rows.abs().max()):.4g}, beyond F16's range ({F16_MAX:g})",
                    "export with cache_type F32 and run llama.cpp with an F32 cache",
                )
            out.append(rows.to(device="cpu", dtype=dtype).contiguous())
    return fmt.SeqState(
        token_ids=tuple(int(x) for x in state.token_ids[0].tolist()),
        positions=tuple(int(p) for p in state.positions[0].tolist()),
        keys=tuple(keys),
        values=tuple(values),
        k_type=cache_type,
        v_type=cache_type,
        v_trans=bool(v_trans),
        n_stream=int(n_stream),
    )


def export_state(
    state,
    model: Any,
    out: str | os.PathLike | None = None,
    *,
    cache_type: str = DEFAULT_CACHE_TYPE,
    v_trans: bool = True,
    n_stream: int = 1,
    host=None,
) -> bytes:
    """The llama.cpp sequence-state file of ``state`` for the GGUF ``model`` (bytes; also written
    atomically to ``out`` when given). ``v_trans``: V stored transposed, as a llama.cpp context
    without flash attention keeps it (the default of llama-cpp-python's ``Llama``, flash_attn=False;
    pass False for a flash-attention context: llama.cpp checks it on load); ``n_stream``: the
    context's KV streams."""
    data = fmt.write(to_seq_state(state, model, cache_type=cache_type, v_trans=v_trans, n_stream=n_stream, host=host))
    if out is not None:
        from kvbridge.artifacts import write_file_atomic

        out = Path(out)
        if out.is_dir():
            raise ConfigError(f"{out} is a folder", "pass a file path for the llama.cpp state (--out FILE)")
        write_file_atomic(out, data)
    return data


# -- import --------------------------------------------------------------------------------------
def _read(src: Any) -> tuple[bytes, str]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src), "state"
    path = Path(src)
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})", "check the path") from None


def check_file_geometry(seq: fmt.SeqState, target: EngineModel, where: str) -> None:
    """One-line error unless the file's cache geometry is ``target``'s (the file is for another model)."""
    fix = "import it with the GGUF whose llama.cpp context saved it"
    if seq.num_cells == 0:
        raise StateError(
            f"{where}: the llama.cpp state holds no cells (an empty sequence)", "save the sequence after a prefill"
        )
    if seq.num_layers != target.num_layers:
        raise StateError(
            f"{where}: llama.cpp state of {seq.num_layers} layers, but {target.name} has "
            f"{target.num_layers} ({target.geometry()}): the file is for another model",
            fix,
        )
    for i in range(seq.num_layers):
        kw, vw = seq.keys[i].shape[1], seq.values[i].shape[1]
        if (kw, vw) != (target.k_width(i), target.v_width(i)):
            raise StateError(
                f"{where}: layer {i} K/V rows of {kw}/{vw} values, but {target.name} caches "
                f"{target.k_width(i)}/{target.v_width(i)} ({target.geometry()}): the file is for "
                "another model",
                fix,
            )
    vocab = target.spec.vocab_size
    if vocab and seq.token_ids and max(seq.token_ids) >= vocab:
        raise StateError(
            f"{where}: token id {max(seq.token_ids)} is beyond {target.name}'s vocabulary of {vocab}: "
            "the file is for another model",
            fix,
        )


def import_state(src: Any, model: Any, *, dtype: torch.dtype = torch.float32, host=None):
    """The :class:`~kvbridge.kvstate.KVState` of a llama.cpp sequence-state file (bytes or a path) for
    the GGUF ``model``: keys back in the model's rotary layout, rows in ``dtype``, cells in
    position order, the file's token ids."""
    from kvbridge.kvstate import KVState

    data, where = _read(src)
    target = engine_model(model, host=host)
    seq = fmt.parse(data, where)
    check_file_geometry(seq, target, where)
    if len(seq.token_ids) != seq.num_cells:
        raise StateError(
            f"{where}: the llama.cpp state holds {seq.num_cells} cells but {len(seq.token_ids)} token ids",
            "save the state with its prompt tokens (llama_state_seq_save_file(..., tokens, n))",
        )
    order = sorted(range(seq.num_cells), key=lambda c: seq.positions[c])
    perm = torch.tensor(order)
    keys, values = [], []
    for i in range(seq.num_layers):
        heads, kd, vd = target.spec.kv_heads_of(i), target.spec.key_dim_of(i), target.spec.value_dim_of(i)
        k = seq.keys[i][perm].to(dtype).reshape(-1, heads, kd).permute(1, 0, 2)  # [H, T, D]
        k = _relayout(k, target.spec.rope_for_layer(i), target.interleaved, target.spec.rope.interleaved)
        keys.append(k.unsqueeze(0).contiguous())
        values.append(seq.values[i][perm].to(dtype).reshape(-1, heads, vd).permute(1, 0, 2).unsqueeze(0).contiguous())
    return KVState(
        keys=tuple(keys),
        values=tuple(values),
        # the saved prompt is in token order; cells, sorted by position, follow it
        token_ids=torch.tensor([list(seq.token_ids)], dtype=torch.long),
        positions=torch.tensor([[seq.positions[c] for c in order]], dtype=torch.long),
        spec=target.spec.with_dtype(str(dtype).removeprefix("torch.")),
        rope_applied=True,
        meta={"engine": "llamacpp", "file": where, **{k: v for k, v in seq.summary().items() if k != "positions"}},
    ).validate(what=f"{where} (llama.cpp state)")


def describe_file(src: Any, model: Any, host=None) -> dict:
    """What ``kvbridge engine import`` reports: the file's header and the KVState it becomes."""
    state = import_state(src, model, host=host)
    return {
        "file": state.meta["file"],
        "model": engine_model(model, host=host).name,
        **{k: v for k, v in state.meta.items() if k not in ("engine", "file")},
        "kv_state": kv_state_summary(state),
    }


@dataclass(frozen=True)
class LlamaCppEngine(ModuleEngine):
    """The engine object the ``llamacpp`` plugin registers (see :class:`kvbridge.plugin_types.EngineProtocol`)."""

    name: str = "llamacpp"
    module: str = __name__

    def continue_from(self, state, model, live_ids, max_new_tokens: int, *, native: bool = False, host=None) -> dict:
        """Run the engine from ``state`` (the cache of the prompt's first tokens): load it into a llama.cpp
        context on ``model`` (its .gguf), decode ``live_ids`` (the prompt's last token) and continue
        greedily. ``native``: also run llama.cpp's own prefill of the whole prompt (the reference).
        Returns ``{"tokens", "load_s", "export_s", "bytes"}`` (+ ``native_tokens``, ``native_prefill_s``,
        ``first_step_diff``)."""
        import time

        import numpy as np

        from kvbridge.engines.llamacpp_runtime import LlamaCppSession

        target = engine_model(model, host=host)
        ids = [int(t) for t in state.token_ids[0].tolist()] + [int(t) for t in live_ids]
        with LlamaCppSession(target.gguf_file, n_ctx=max(256, len(ids) + max_new_tokens + 8)) as session:
            t0 = time.perf_counter()
            data = export_state(state, target, v_trans=session.v_trans, host=host)
            t1 = time.perf_counter()
            session.load_state(data)
            t2 = time.perf_counter()
            first = session.eval([int(t) for t in live_ids])
            tokens, _ = session.greedy(first, max_new_tokens)
            out = {"tokens": tokens, "export_s": t1 - t0, "load_s": t2 - t1, "bytes": len(data)}
            if native:
                t3 = time.perf_counter()
                native_first = session.prefill(ids)
                out["native_prefill_s"] = time.perf_counter() - t3
                out["native_tokens"], _ = session.greedy(native_first, max_new_tokens)
                out["first_step_diff"] = float(np.abs(native_first.astype(np.float64) - first).max())
        return out


ENGINE = LlamaCppEngine()
