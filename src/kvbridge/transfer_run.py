"""``transfer_generate(pair, settings)``: the library form of ``kvbridge transfer``.

SOURCE prefills the prompt (its last token withheld), the cache goes through the mapping
(:func:`kvbridge.transfer.transfer`: strip RoPE, map, re-apply), and TARGET continues from it, in
transformers or in an inference engine; with ``compare`` TARGET also runs natively. The result is
a :class:`TransferResult` the command prints; nothing is printed here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvbridge.errors import ConfigError, KVBridgeError, PluginError
from kvbridge.plugins import host_or_default
from kvbridge.transfer_settings import IDENTITY, TransferSettings


@dataclass(frozen=True)
class TransferResult:
    """What one transfer did. ``text``: TARGET's continuation; ``tokens``: the transferred prefix length;
    times in seconds; ``r2``: the mapping's mean held-out R² (None for identity); ``warnings``: the
    mapping loader's (e.g. an accepted fingerprint mismatch). With ``compare``: ``native_text``,
    ``agreement`` of ``compared`` greedy tokens, ``kl`` (next-token KL(native || transferred)) and
    ``target_prefill_s``. With an engine: ``engine`` and ``engine_run`` (its ``continue_from`` dict).
    ``saved``: the pack folder the transferred cache was written to (``save_state``); ``approximate``:
    whether the transferred cache is marked approximate (a fitted mapping's always is)."""

    text: str
    tokens: int
    source_prefill_s: float
    map_s: float
    r2: float | None = None
    warnings: tuple[str, ...] = ()
    native_text: str | None = None
    agreement: int | None = None
    compared: int | None = None
    kl: float | None = None
    target_prefill_s: float | None = None
    engine: str | None = None
    engine_run: dict = field(default_factory=dict, repr=False)
    saved: str | None = None
    approximate: bool = True


def max_positions_of(model) -> int | None:
    """``max_position_embeddings`` of a loaded model's (text) config, when it has one."""
    config = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    value = getattr(text, "max_position_embeddings", None) or getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_generation_length(
    prompt_tokens: int,
    max_new_tokens: int,
    max_positions: int | None,
    *,
    flag: str = "--max-new-tokens",
    prompt_flag: str = "--prompt",
) -> None:
    """Refuse a prompt (and continuation) beyond the model's maximum positions, naming the flag."""
    if not max_positions:
        return
    if prompt_tokens > max_positions:
        raise KVBridgeError(
            f"{prompt_flag} is {prompt_tokens} tokens, beyond the model's maximum positions ({max_positions})",
            f"shorten {prompt_flag}",
        )
    if prompt_tokens + max_new_tokens > max_positions:
        raise KVBridgeError(
            f"{flag} {max_new_tokens} after a {prompt_tokens}-token prompt goes beyond the model's "
            f"maximum positions ({max_positions})",
            f"use {flag} {max(1, max_positions - prompt_tokens)} or less, or a shorter prompt",
        )


def identity_mapping(pair, host=None):
    """``mapping="identity"``: the ``identity`` fitter's exact mapping (through the host), for a pair that is
    one model (same weights)."""
    if not pair.same_model:
        raise ConfigError(
            f"--mapping identity needs SOURCE and TARGET to be one model; {pair.source.name} and "
            f"{pair.target.name} differ",
            "fit a mapping for this pair (kvbridge fit) and pass its folder",
        )
    return host_or_default(host).get("fitter", IDENTITY).fit(pair.source.spec, pair.target.spec)


def load_pair_mapping(pair, settings: TransferSettings, host) -> tuple[Any, tuple[str, ...]]:
    """``(mapping, warnings)``: ``settings.mapping`` checked against the pair (fingerprints, tokenizer)."""
    import warnings

    from kvbridge.evaluate.run import mapping_of
    from kvbridge.run import Run

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if settings.mapping == IDENTITY:
            mapping = identity_mapping(pair, host)
        else:  # checked against the pair's identities, as eval and harness check it
            mapping = mapping_of(Run.of(pair, settings, host))
    return mapping, tuple(str(w.message) for w in caught)


def transfer_generate(pair, settings: TransferSettings, *, host=None) -> TransferResult:
    """Continue ``pair.target`` from ``pair.source``'s cache of ``settings.prompt`` (see ``kvbridge transfer``).

    ``pair`` is a :class:`~kvbridge.models.pair.ModelPair` (the target's tokenizer is not needed: the
    pair shares one); the prompt is tokenized with the source's tokenizer and must give 2+ tokens."""
    import torch

    from kvbridge.divergence import kl as kl_of
    from kvbridge.handoff import generate, greedy_kwargs
    from kvbridge.transfer import transfer

    host = host_or_default(host)
    smodel, tok, tmodel = pair.source.model, pair.source.tokenizer, pair.target.model
    if settings.engine is not None:  # an engine that cannot continue is refused before any model runs
        engine_continuation(settings.engine, host)
    if settings.save_state is not None:  # before any model runs: an existing folder is refused now
        from kvbridge.artifacts import check_replaceable
        from kvbridge.prefix.packs import PACK_KIND

        check_replaceable(settings.save_state, PACK_KIND, overwrite=settings.overwrite)
    mapping, notes = load_pair_mapping(pair, settings, host)
    ids = torch.tensor([tok(settings.prompt)["input_ids"]], dtype=torch.long)
    if ids.shape[1] < 2:
        raise ConfigError(
            "the prompt gives fewer than 2 tokens: there is no prefix to transfer", "pass a longer --prompt"
        )
    check_generation_length(ids.shape[1], 0, max_positions_of(smodel))  # SOURCE prefills the prompt
    check_generation_length(ids.shape[1], settings.max_new_tokens, max_positions_of(tmodel))  # TARGET continues it
    sad = host.adapter_for(smodel.config.to_dict())
    r2 = ((getattr(mapping, "manifest", None) or {}).get("r2_summary") or {}).get("mean")
    with torch.no_grad():
        t0 = time.perf_counter()
        state = sad.extract(smodel, ids[:, :-1])
        t1 = time.perf_counter()
        moved = transfer(state, mapping, getattr(mapping, "target_spec", None) or pair.target.spec, host=host)
        t2 = time.perf_counter()
        done = dict(
            tokens=state.num_tokens,
            source_prefill_s=t1 - t0,
            map_s=t2 - t1,
            warnings=notes,
            saved=None if settings.save_state is None else str(save_transferred(pair, moved, settings, host=host)),
            approximate=bool(moved.approximate),
        )
        if settings.engine is not None:
            return _continue_in_engine(settings, pair.target.ref, moved, ids, tok, done, host)
        gen = greedy_kwargs(ids, settings.max_new_tokens)
        gen["pad_token_id"] = getattr(tok, "pad_token_id", None) or getattr(tok, "eos_token_id", None) or 0
        ours = generate(tmodel, moved, ids, host=host, **gen)
    result = dict(done, text=tok.decode(ours.sequences[0, ids.shape[1] :], skip_special_tokens=True), r2=r2)
    if settings.compare:
        with torch.no_grad():
            t3 = time.perf_counter()
            tmodel(input_ids=ids[:, :-1], use_cache=True)
            t4 = time.perf_counter()
            native = tmodel.generate(input_ids=ids, **gen)
        n = min(len(ours.logits), len(native.logits))
        start = ids.shape[1]
        result.update(
            native_text=tok.decode(native.sequences[0, start:], skip_special_tokens=True),
            agreement=int((ours.sequences[0, start : start + n] == native.sequences[0, start : start + n]).sum()),
            compared=n,
            kl=float(kl_of(native.logits[0].float(), ours.logits[0].float())),
            target_prefill_s=t4 - t3,
        )
    return TransferResult(**result)


def save_transferred(pair, moved, settings: TransferSettings, *, host=None):
    """Write ``moved`` (the transferred cache of the prompt without its last token) as a pack folder for
    ``pair.target`` at ``settings.save_state``, with the source and mapping it came from. A fitted
    mapping's output is marked approximate; the identity mapping's (one model) is exact, bit for bit."""
    from pathlib import Path

    from kvbridge.models.fingerprint import loaded_tokenizer_identity
    from kvbridge.prefix.packs import model_reference, save_state_pack

    provenance = {
        "kind": "transferred",
        "source": model_reference(pair.source.ref),
        "mapping": settings.mapping
        if settings.mapping == IDENTITY
        else str(Path(settings.mapping).expanduser().resolve()),
        "command": "kvbridge transfer",
    }
    return save_state_pack(
        pair.target.model,
        moved,
        settings.save_state,
        tokenizer_fp=loaded_tokenizer_identity(pair.target),
        provenance=provenance,
        model_dir=pair.target.ref.folder,
        reference=model_reference(pair.target.ref),
        overwrite=settings.overwrite,
        host=host,
    )


def engine_continuation(name: str, host=None):
    """The ``continue_from`` of engine ``name``, or a one-line refusal when the engine only exports caches."""
    run = getattr(host_or_default(host).get("engine", name), "continue_from", None)
    if not callable(run):
        raise PluginError(
            f"engine {name!r} can export a cache but cannot continue from one here",
            f"drop --engine, keep the cache with --save-state DIR and write it with `kvbridge engine export DIR "
            f"--engine {name} ...`, then load it in the engine yourself",
        )
    return run


def _continue_in_engine(settings, target_ref, moved, ids, tok, done: dict, host) -> TransferResult:
    """TARGET continues in the engine from the transferred cache (``done``: the result's fields so far)."""
    name = settings.engine
    run = engine_continuation(name, host)
    out = run(moved, target_ref, ids[0, -1:].tolist(), settings.max_new_tokens, native=settings.compare, host=host)
    result = dict(done, text=tok.decode(out["tokens"], skip_special_tokens=True), engine=name, engine_run=dict(out))
    if settings.compare:
        n = min(len(out["tokens"]), len(out["native_tokens"]))
        result.update(
            native_text=tok.decode(out["native_tokens"], skip_special_tokens=True),
            compared=n,
            agreement=sum(int(a == b) for a, b in zip(out["tokens"][:n], out["native_tokens"][:n])),
            target_prefill_s=out.get("native_prefill_s"),
        )
    return TransferResult(**result)


__all__ = [
    "TransferResult",
    "TransferSettings",
    "transfer_generate",
    "save_transferred",
    "identity_mapping",
    "check_generation_length",
    "max_positions_of",
]
