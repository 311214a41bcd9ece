"""The contract every family adapter (and RoPE variant) must pass.

Third-party plugins run it exactly as the built-ins do::

    from kvbridge.testing.contract import AdapterContract
    from my_plugin import ADAPTER

    class TestMyFamily(AdapterContract):
        adapter = ADAPTER

or call the ``check_*`` functions directly; each returns measured numbers and raises
``AssertionError`` with what mismatched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Fitter, Scorer, SteeringMethod
from kvbridge.plugins import KINDS, host_or_default, make_host


class NotApplicable(Exception):
    """A contract check that does not apply to this model (the reason says why)."""


#: tolerances of the contract (float32)
LOGIT_TOL = 1e-6
ROPE_TOL = 1e-5
SHIFT_TOL = 1e-5


@dataclass(frozen=True)
class IdentityResult:
    max_logit_diff: float  # transferred vs the model's own cached continuation
    # whole-prompt state (last token withheld by the hand-off) vs plain model.generate
    max_logit_diff_generate: float
    tokens_equal: bool
    new_tokens: int


def random_ids(vocab: int, batch: int, length: int, seed: int):
    """``[batch, length]`` seeded random token ids in ``[3, vocab)`` (clear of the usual special ids)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, max(4, vocab), (batch, length), generator=g)


def check_extract_shapes(adapter, config: dict, *, host=None, seq_len: int = 12, batch: int = 2) -> Any:
    """Extracted K/V shapes match the spec on every layer; positions/ids recorded."""
    import torch

    model = adapter.build_model(config)
    spec = adapter.spec_of(model)
    ids = random_ids(spec.vocab_size, batch, seq_len, 1)
    state = adapter.extract(model, ids)
    assert state.num_layers == spec.num_layers, f"{state.num_layers} layers extracted, spec {spec.num_layers}"
    for i, (k, v) in enumerate(zip(state.keys, state.values)):
        want = (batch, spec.num_kv_heads, seq_len, spec.head_dim)
        assert tuple(k.shape) == want, f"layer {i} keys {tuple(k.shape)} != spec {want}"
        assert tuple(v.shape) == want, f"layer {i} values {tuple(v.shape)} != spec {want}"
    assert torch.equal(state.token_ids, ids)
    assert torch.equal(state.positions, torch.arange(seq_len).expand(batch, -1))
    return state


def check_rope_round_trip(rope, *, host=None, seed: int = 0, trials: int = 4, max_position: int = 5000) -> float:
    """strip(apply(x)) == x at random positions for a RopeSpec; returns the max abs error."""
    import torch

    from kvbridge import rope as codec

    host = host_or_default(host)
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(trials):
        pos = torch.randint(0, max_position, (2, 9), generator=g)
        x = torch.randn(2, 3, 9, rope.head_dim, generator=g)
        y = codec.strip(codec.apply(x, pos, rope, host=host), pos, rope, host=host)
        worst = max(worst, float((y - x).abs().max()))
    assert worst <= ROPE_TOL, f"RoPE round trip error {worst:.2e} > {ROPE_TOL} for {rope}"
    return worst


def check_identity_transfer(
    adapter,
    config: dict | None,
    *,
    host=None,
    prompt_len: int = 14,
    new_tokens: int = 6,
    batch: int = 1,
    seed: int = 0,
    model=None,
    tol: float = LOGIT_TOL,
    dtype: str = "float32",
) -> IdentityResult:
    """Extract -> identity transfer -> inject -> generate equals transformers' own cached
    continuation: the transferred state is the extracted one bit for bit, greedy tokens are
    identical and the max abs logit diff is <= ``tol`` (1e-6 by default; 0 where the injected cache
    is the model's own cache class). ``model`` replaces building one from ``config`` in ``dtype``."""
    import torch

    from kvbridge.builtin.families import hf_cache
    from kvbridge.handoff import generate, greedy_kwargs
    from kvbridge.transfer import identity_transfer

    base = model if model is not None else adapter.build_model(config, seed=seed, dtype=dtype)
    # stateful RoPE modules (dynamic) are sticky: every path gets a fresh copy of the model
    fresh = lambda: copy.deepcopy(base)  # noqa: E731
    spec = adapter.spec_of(base)
    ids = random_ids(spec.vocab_size, batch, prompt_len, seed + 7)
    gen = greedy_kwargs(ids, new_tokens)

    # transformers' own cached continuation: its prefill of the prompt prefix, then generate
    try:
        with torch.no_grad():
            model = fresh()
            own = hf_cache.reference_cache(model)  # what generate itself would build
            model(input_ids=ids[:, :-1], cache=own, use_cache=True)
            native = model.generate(input_ids=ids, cache=own, **gen)
            plain = fresh().generate(input_ids=ids, **gen)
    except Exception as exc:  # the reference itself cannot run: nothing to compare against
        raise NotApplicable(f"the model's own cached continuation fails ({type(exc).__name__}: {exc})") from exc

    # 1) the state of the cached prefix, then the prompt's last token: same split as `native`
    model_a, model_b = fresh(), fresh()
    extracted = adapter.extract(model_a, ids[:, :-1])
    moved = identity_transfer(extracted, host=host)
    assert moved.approximate is False, "identity transfer must not be marked approximate"
    changed = [name for name, a, b in _state_tensors(moved, extracted) if not torch.equal(a, b)]
    assert not changed, f"{spec.model_type}: identity transfer changed {changed[:4]} (it must return them bit for bit)"
    # 2) the state of the whole prompt: the hand-off withholds its last token (as plain generate)
    # (a recurrent state summarises every token and cannot drop the last one: path 1 only)
    whole = not getattr(spec, "state_layers", ())
    moved_full = identity_transfer(adapter.extract(model_b, ids), host=host) if whole else None
    with torch.no_grad():
        ours = generate(model_a, moved, ids, host=host, **gen)
        ours_full = generate(model_b, moved_full, ids, host=host, **gen) if whole else plain

    def diff(a, b) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(a.logits, b.logits))

    result = IdentityResult(
        max_logit_diff=diff(ours, native),
        max_logit_diff_generate=diff(ours_full, plain),
        tokens_equal=bool(
            torch.equal(ours.sequences, native.sequences) and torch.equal(ours_full.sequences, plain.sequences)
        ),
        new_tokens=new_tokens,
    )
    assert result.tokens_equal, f"{spec.model_type}: greedy tokens differ from the model's own continuation"
    assert result.max_logit_diff <= tol, f"{spec.model_type}: max abs logit diff {result.max_logit_diff:.2e} > {tol}"
    return result


def _state_tensors(a, b):
    """``(name, tensor of a, tensor of b)`` for every K/V and indexer-key tensor of two states."""
    for kind in ("keys", "values"):
        for i, (x, y) in enumerate(zip(getattr(a, kind), getattr(b, kind))):
            yield f"{kind}[{i}]", x, y
    for (i, x), (_, y) in zip(a.indexer_keys, b.indexer_keys):
        yield f"indexer_keys[{i}]", x, y


def check_shifted_identity(
    adapter, config: dict, *, host=None, prompt_len: int = 10, offset: int = 37, seed: int = 0
) -> float:
    """A prefix re-positioned by ``offset`` and continued with matching position ids equals the
    model run at those positions (its own prefill of the prefix there, then the tail). Returns
    the max abs logit difference."""
    import torch
    from transformers import DynamicCache

    base = adapter.build_model(config, seed=seed)
    model = copy.deepcopy(base)
    spec = adapter.spec_of(model)
    if spec.positional != "rope":
        raise NotApplicable(f"{spec.model_type} has {spec.positional} positions: a prefix cannot be re-positioned")
    if spec.rope is not None and spec.rope.is_stateful:
        from kvbridge import rope as codec

        host = host_or_default(host)
        old, _ = codec.inv_freq(spec.rope, prompt_len, host=host)
        new, _ = codec.inv_freq(spec.rope, offset + prompt_len, host=host)
        if not torch.equal(old, new):
            raise NotApplicable(
                f"{spec.rope.rope_type} RoPE uses another table at the shifted length: the prefix's "
                "hidden states (layers >= 1) depend on it, so re-positioning is approximate there"
            )
    ids = random_ids(spec.vocab_size, 1, prompt_len + 3, seed + 11)
    prefix, tail = ids[:, :prompt_len], ids[:, prompt_len:]
    state = adapter.extract(model, prefix).reposition(offset, host=host)
    cache = adapter.inject(state, model)
    with torch.no_grad():
        pos_tail = torch.arange(offset + prompt_len, offset + ids.shape[1])[None]
        got = model(input_ids=tail, cache=cache, position_ids=pos_tail, use_cache=True).logits
        own, ref = DynamicCache(), copy.deepcopy(base)
        ref(input_ids=prefix, cache=own, position_ids=torch.arange(offset, offset + prompt_len)[None])
        want = ref(input_ids=tail, cache=own, position_ids=pos_tail, use_cache=True).logits
    err = float((got - want).abs().max())
    assert err <= SHIFT_TOL, f"{spec.model_type}: shifted prefix logits differ by {err:.2e} > {SHIFT_TOL}"
    return err


def check_defaults(adapter, model_type: str | None = None) -> list[str]:
    """The adapter's defaults equal transformers' config-class defaults of ``model_type``.

    Describes the class defaults twice: from the full ``AutoConfig.for_model(model_type)``
    dict, and from only its ``model_type`` and the sizes every adapter requires (layers, heads,
    hidden size), so every other fact comes from the adapter's own defaults. Raises
    AssertionError naming the facts that differ (a wrong default RoPE theta, window, KV heads ...);
    returns the keys compared.
    """
    from kvbridge.models.hf_loader import config_for_model

    model_type = model_type or adapter.model_types[0]
    full = config_for_model(model_type).to_dict()
    full = {k: v for k, v in full.items() if v is not None or k in ("sliding_window", "rope_scaling")}
    required = ("num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "hidden_size", "n_embd", "n_embed")
    minimal = {k: full[k] for k in ("model_type", *required) if k in full}
    want = adapter.describe(full).to_dict()
    got = adapter.describe(minimal).to_dict()
    want.pop("dtype"), got.pop("dtype")
    diff = [
        f"{k}: adapter default {got.get(k)!r} != transformers {want.get(k)!r}"
        for k in sorted(set(want) | set(got))
        if want.get(k) != got.get(k)
    ]
    assert not diff, f"{adapter.name} ({model_type}) defaults differ from transformers: " + "; ".join(diff)
    return sorted(want)


def adapter_configs(adapter) -> dict:
    """Named tiny configs of an adapter (``tiny_configs()`` if it has one)."""
    many = getattr(adapter, "tiny_configs", None)
    return dict(many()) if callable(many) else {"default": adapter.tiny_config()}


def host_with(kind: str, record: Any, same=None):
    """A built-ins-only host where ``record`` is registered as a ``kind`` (:data:`kvbridge.plugins.KINDS`) by a
    contract plugin, unless a built-in registers that name already: then ``same(built-in)`` (default: equal
    to ``record``) must hold, or the contract fails on the name."""
    host = make_host(entry_points=False)
    have = host.registry(kind).items.get(record.name)
    if have is not None:
        assert (same or (lambda built_in: built_in == record))(have), (
            f"a built-in {kind} is already called {record.name!r}: give yours another name"
        )
        return host

    def register_hook(self, register):
        register(record)

    plugin = type("_Plugin", (), {KINDS[kind][1]: hookimpl(register_hook)})
    return make_host(entry_points=False, extra=[(f"contract-{record.name}", plugin())])


def host_with_factory(kind: str, obj: Any):
    """``(host, record)``: ``obj`` (a ``fitter``, ``steering_method`` or ``scorer`` record, or the class, instance
    or function it wraps, described by its docstring's first line) registered by :func:`host_with`; a built-in
    of the same name must load the very same factory (or the class of the instance given)."""
    cls = {"fitter": Fitter, "steering_method": SteeringMethod, "scorer": Scorer}[kind]
    doc = (obj.__doc__ or "").strip().splitlines()
    name = getattr(obj, "name", None) or getattr(obj, "__name__", kind)
    record = obj if isinstance(obj, cls) else cls(name, doc[0] if doc else kind, obj)
    factory = record.load()
    return host_with(kind, record, lambda have: have.load() in (factory, type(factory))), record


def run_or_skip(check, *args, **kwargs):
    """``check(*args, **kwargs)`` under pytest: a :class:`NotApplicable` becomes a skip with its reason."""
    try:
        return check(*args, **kwargs)
    except NotApplicable as why:
        import pytest

        pytest.skip(str(why))


class AdapterContract:
    """Subclass with ``adapter = MY_ADAPTER`` to run the contract under pytest."""

    adapter: Any = None

    def test_describe_is_torch_free_and_complete(self):
        for name, cfg in adapter_configs(self.adapter).items():
            spec = self.adapter.describe(cfg)
            assert spec.num_layers > 0 and spec.num_kv_heads > 0 and spec.head_dim > 0, name
            assert spec.model_type == cfg["model_type"], name

    def test_defaults_match_transformers(self):
        for model_type in self.adapter.model_types:
            check_defaults(self.adapter, model_type)

    def test_extracted_shapes_match_spec(self):
        for cfg in adapter_configs(self.adapter).values():
            check_extract_shapes(self.adapter, cfg)

    def test_rope_round_trip(self):
        for cfg in adapter_configs(self.adapter).values():
            spec = self.adapter.describe(cfg)
            for layer in range(spec.num_layers):
                rope = spec.rope_for_layer(layer)
                if rope is not None:
                    check_rope_round_trip(rope)

    def test_identity_transfer_exact(self):
        for cfg in adapter_configs(self.adapter).values():
            check_identity_transfer(self.adapter, cfg)

    def test_shifted_identity(self):
        run_or_skip(check_shifted_identity, self.adapter, next(iter(adapter_configs(self.adapter).values())))


class RopeVariantContract:
    """Subclass with ``variant = MY_VARIANT`` and ``specs = [RopeSpec(...), ...]`` (whose
    ``rope_type`` is the variant's name) to prove a RoPE variant plugin round-trips exactly
    at random positions through kvbridge's codec, via a host that has it registered."""

    variant: Any = None
    specs: tuple = ()

    def _host(self):
        return host_with("rope_variant", self.variant)

    def test_specs_name_the_variant(self):
        assert self.specs, "give at least one RopeSpec"
        assert all(s.rope_type == self.variant.name for s in self.specs)

    def test_round_trip_at_random_positions(self):
        host = self._host()
        for i, spec in enumerate(self.specs):
            check_rope_round_trip(spec, host=host, seed=i)

    def test_inv_freq_shape_and_scaling(self):
        from kvbridge import rope as codec

        host = self._host()  # through the codec, as kvbridge calls it: either documented signature works
        for spec in self.specs:
            freqs, scaling = codec.inv_freq(spec, None, host=host)
            assert tuple(freqs.shape) == (spec.rotary_dim // 2,), f"inv_freq shape {tuple(freqs.shape)}"
            assert bool((freqs > 0).all()), "inverse frequencies must be positive"
            assert float(scaling) > 0
