"""End-to-end checks of the llamacpp engine against a running llama.cpp (tests and bench call them).

- :func:`continuation_check`: llama.cpp continuing from kvbridge's export of a prompt's cache
  (computed by transformers from the dequantized GGUF) against llama.cpp's own prefill of the
  same prompt: greedy tokens, the first-step logit difference, and beside it the model's own
  noise (transformers float32 logits vs llama.cpp's quantized kernels on the same prompt);
- :func:`import_check`: llama.cpp's cache of a prompt read back (:func:`import_state`) against
  transformers' cache of the same prompt, per layer relative error; then handed to transformers
  (kvbridge's hand-off) and continued;
- :func:`pack_check`: a prefix pack restored into llama.cpp (no llama.cpp prefill of the guide)
  against llama.cpp's prefill of guide + live text, with the time saved;
- :func:`roundtrip_check`: llama.cpp's own cache -> :class:`~kvbridge.kvstate.KVState` -> llama.cpp:
  F16 widened to float32 and rounded back is exact, so the file comes back byte for byte and
  llama.cpp continues bitwise as from its own save.

How greedy tokens are compared (:func:`agreement`): two runs whose logits differ by at most
``d`` per entry can only pick different tokens where the reference's top-2 margin is below
``2 d``; tokens are compared up to the first such near tie (``bound`` is the model's own noise),
so the check holds on any CPU's kernels while a broken cache (wrong layout, wrong positions)
still fails it at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kvbridge.engines import llamacpp as L


def _timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds it took)``."""
    t0 = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - t0


def _max_abs(a, b) -> float:
    import numpy as np

    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def agreement(ours: list, native: list, native_logits: list, bound: float) -> tuple[int, bool]:
    """``(steps compared, tokens equal)``: up to the first step where ``native``'s top-2 margin is
    below ``2 * bound`` (a near tie the model's own noise may flip)."""
    import numpy as np

    for k, (a, b) in enumerate(zip(ours, native)):
        top = np.sort(np.asarray(native_logits[k], dtype=np.float64))[-2:]
        if top[1] - top[0] < 2 * bound:
            return k, True
        if a != b:
            return k, False
    return min(len(ours), len(native)), True


@dataclass(frozen=True)
class ContinuationCheck:
    prompt_tokens: int
    native_tokens: list  # llama.cpp's greedy continuation after its own prefill
    ours_tokens: list  # ... after loading kvbridge's export of transformers' cache
    compared: int  # steps compared before a near tie (see agreement)
    tokens_equal: bool
    first_step_diff: float  # max |logit| ours vs native at the first step
    noise: float  # the model's own noise: max |logit| transformers float32 vs llama.cpp native, first step
    own_reload_diff: float  # llama.cpp's own saved state reloaded vs its prefill (0.0: bitwise)
    native_prefill_s: float
    export_s: float
    load_s: float
    extra: dict = field(default_factory=dict)


def continuation_check(lm, session, ids: list[int], *, new_tokens: int = 8, host=None) -> ContinuationCheck:
    """Prefill ``ids[:-1]`` in transformers, export, load into ``session``, feed ``ids[-1]``, continue."""
    from kvbridge.plugins import get_host

    host = host or get_host()
    ids = [int(t) for t in ids]
    gguf = session.path
    target = L.engine_model(gguf, host=host)
    native_first, native_prefill = _timed(session.prefill, ids)
    native_tokens, native_logits = session.greedy(native_first, new_tokens)
    session.prefill(ids[:-1])
    own = session.state_bytes()
    session.load_state(own)
    own_reload = _max_abs(session.eval([ids[-1]]), native_first)
    adapter = host.adapter_for(lm.model.config.to_dict())
    with torch.no_grad():
        state = adapter.extract(lm.model, torch.tensor([ids[:-1]]))
        hf_first = lm.model(torch.tensor([ids])).logits[0, -1].float().numpy()
    data, export_s = _timed(L.export_state, state, target, v_trans=session.v_trans, host=host)
    _, load_s = _timed(session.load_state, data)
    ours_first = session.eval([ids[-1]])
    ours_tokens, _ = session.greedy(ours_first, new_tokens)
    noise = _max_abs(hf_first, native_first)
    compared, equal = agreement(ours_tokens, native_tokens, native_logits, noise)
    return ContinuationCheck(
        prompt_tokens=len(ids),
        native_tokens=native_tokens,
        ours_tokens=ours_tokens,
        compared=compared,
        tokens_equal=equal,
        first_step_diff=_max_abs(ours_first, native_first),
        noise=noise,
        own_reload_diff=own_reload,
        native_prefill_s=native_prefill,
        export_s=export_s,
        load_s=load_s,
        extra={"state_bytes": len(data)},
    )


@dataclass(frozen=True)
class ImportCheck:
    prompt_tokens: int
    key_rel_err: list  # per layer ||imported - transformers|| / ||transformers||
    value_rel_err: list
    key_rel_err_unpermuted: float  # layer 1 keys without the layout permutation (what a wrong layout costs)
    import_s: float
    save_s: float
    hf_tokens: list  # transformers' greedy continuation from its own prefill
    handoff_tokens: list  # transformers continuing from the imported llama.cpp cache
    compared: int
    tokens_equal: bool
    first_step_diff: float  # max |logit| handoff vs transformers' own, first step
    noise: float  # the model's own noise: transformers float32 vs llama.cpp on the same prompt, first step


def import_check(lm, session, ids: list[int], *, new_tokens: int = 8, host=None) -> ImportCheck:
    """llama.cpp prefills ``ids[:-1]``; its saved state is imported and compared with transformers'."""
    from kvbridge.handoff import generate, greedy_kwargs
    from kvbridge.plugins import get_host

    host = host or get_host()
    ids = [int(t) for t in ids]
    target = L.engine_model(session.path, host=host)
    session.prefill(ids[:-1])
    data, save_s = _timed(session.state_bytes)
    llama_first = session.eval([ids[-1]])
    imported, import_s = _timed(L.import_state, data, target, host=host)
    adapter = host.adapter_for(lm.model.config.to_dict())
    x = torch.tensor([ids])
    gen = greedy_kwargs(x, new_tokens)
    with torch.no_grad():
        ref = adapter.extract(lm.model, x[:, :-1])
        native = lm.model.generate(input_ids=x, **gen)
        ours = generate(lm.model, imported, x, host=host, **gen)

    def rel(a, b) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    d = ref.spec.head_dim
    idx = L.layout_index(d, ref.spec.rope.rotary_dim, src_interleaved=False, dst_interleaved=True)
    native_logits = [t[0].float().numpy() for t in native.logits]
    ours_logits = [t[0].float().numpy() for t in ours.logits]
    n = x.shape[1]
    hf_tokens = native.sequences[0, n:].tolist()
    handoff_tokens = ours.sequences[0, n:].tolist()
    noise = _max_abs(native_logits[0], llama_first)
    compared, equal = agreement(handoff_tokens, hf_tokens, native_logits, noise)
    return ImportCheck(
        prompt_tokens=len(ids),
        key_rel_err=[rel(a, b) for a, b in zip(imported.keys, ref.keys)],
        value_rel_err=[rel(a, b) for a, b in zip(imported.values, ref.values)],
        key_rel_err_unpermuted=rel(imported.keys[1][..., idx], ref.keys[1]),
        import_s=import_s,
        save_s=save_s,
        hf_tokens=hf_tokens,
        handoff_tokens=handoff_tokens,
        compared=compared,
        tokens_equal=equal,
        first_step_diff=_max_abs(ours_logits[0], native_logits[0]),
        noise=noise,
    )


@dataclass(frozen=True)
class PackCheck:
    guide_tokens: int
    live_tokens: int
    native_tokens: list  # llama.cpp: prefill of guide + live, greedy
    pack_tokens: list  # llama.cpp: pack exported and loaded, live text decoded, greedy
    compared: int
    tokens_equal: bool
    first_step_diff: float
    guide_prefill_s: float  # llama.cpp's own prefill of the guide (what the pack saves)
    export_s: float  # pack read + checksum + export to the llama.cpp file
    load_s: float  # llama.cpp loading the file
    bound: float

    @property
    def saved_s(self) -> float:
        return self.guide_prefill_s - (self.export_s + self.load_s)


def pack_check(
    pack_folder: str,
    session,
    guide_ids: list[int],
    live_ids: list[int],
    *,
    noise: float,
    new_tokens: int = 8,
    host=None,
) -> PackCheck:
    """Restore the pack in ``pack_folder`` into ``session`` (no prefill of the guide) and continue
    ``live_ids``, against llama.cpp's prefill of ``guide_ids + live_ids``. ``noise``: the logit
    bound of :func:`agreement` (the model's own transformers-vs-llama.cpp noise)."""
    from kvbridge.kvstate_io import state_from_tensors
    from kvbridge.prefix.packs import read_pack

    target = L.engine_model(session.path, host=host)
    _, guide_prefill = _timed(session.prefill, guide_ids)
    native_first = session.eval(live_ids)
    native_tokens, native_logits = session.greedy(native_first, new_tokens)
    session.reset()
    t0 = time.perf_counter()
    manifest, tensors = read_pack(pack_folder)
    state = state_from_tensors(tensors, manifest["state"])
    data = L.export_state(state, target, v_trans=session.v_trans, host=host)
    export_s = time.perf_counter() - t0
    n, load_s = _timed(session.load_state, data)
    assert n == len(guide_ids)
    first = session.eval(live_ids)
    tokens, _ = session.greedy(first, new_tokens)
    compared, equal = agreement(tokens, native_tokens, native_logits, noise)
    return PackCheck(
        guide_tokens=len(guide_ids),
        live_tokens=len(live_ids),
        native_tokens=native_tokens,
        pack_tokens=tokens,
        compared=compared,
        tokens_equal=equal,
        first_step_diff=_max_abs(first, native_first),
        guide_prefill_s=guide_prefill,
        export_s=export_s,
        load_s=load_s,
        bound=noise,
    )


@dataclass(frozen=True)
class RoundTripCheck:
    prompt_tokens: int
    same_bytes: bool  # export(import(llama.cpp's file)) == llama.cpp's file
    reload_diff: float  # max |logit| after loading the round-tripped file vs after loading llama.cpp's own
    tokens_equal: bool  # greedy continuations of the two loads
    save_s: float
    import_s: float
    export_s: float
    load_s: float


def roundtrip_check(session, ids: list[int], *, new_tokens: int = 4, host=None) -> RoundTripCheck:
    """llama.cpp prefills ``ids[:-1]`` and saves; the file is imported into a KVState (float32) and
    exported again; both files are loaded and continued with ``ids[-1]``."""
    ids = [int(t) for t in ids]
    target = L.engine_model(session.path, host=host)
    session.prefill(ids[:-1])
    own, save_s = _timed(session.state_bytes)
    state, import_s = _timed(L.import_state, own, target, host=host)
    back, export_s = _timed(L.export_state, state, target, v_trans=session.v_trans, host=host)
    session.load_state(own)
    own_tokens, own_logits = session.greedy(session.eval([ids[-1]]), new_tokens)
    _, load_s = _timed(session.load_state, back)
    tokens, logits = session.greedy(session.eval([ids[-1]]), new_tokens)
    return RoundTripCheck(
        prompt_tokens=len(ids),
        same_bytes=back == own,
        reload_diff=max(_max_abs(a, b) for a, b in zip(logits, own_logits)),
        tokens_equal=tokens == own_tokens,
        save_s=save_s,
        import_s=import_s,
        export_s=export_s,
        load_s=load_s,
    )


__all__ = [
    "agreement",
    "continuation_check",
    "ContinuationCheck",
    "import_check",
    "ImportCheck",
    "pack_check",
    "PackCheck",
    "roundtrip_check",
    "RoundTripCheck",
]
