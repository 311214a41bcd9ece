"""The real-model demo: SmolLM2-135M-Instruct (``smollm2``) through the exact paths.

Checks, each a function the tests call too:

- :func:`identity_check`: extract -> identity transfer -> inject -> greedy continuation, against
  transformers' own cached continuation: bitwise (state, tokens, logits), with the model's own
  noise (its cached decode vs a full recompute without cache) shown beside it for scale;
- :func:`chat_split`: the exact-token split of a chat (system message = the hidden guide,
  user turn + generation prompt = the live part) on the model's tokenizer and chat template;
- :func:`pack_check`: the guide saved as a prefix pack, restored with zero forward passes
  (counted with forward pre-hooks) and continued: same greedy tokens as an ordinary prefill.

:data:`REAL_SECTIONS` lists the section's parts in order; an integrator adds one with
:func:`add_real_section` (e.g. the real adapter pair) without touching this file's callers.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import click

from kvbridge.handoff import generate, greedy_kwargs
from kvbridge.models import load, resolve
from kvbridge.module_hooks import HookSet
from kvbridge.plugins import get_host

SYSTEM = "You are a concise assistant. Start every bullet point with the word zorp."
USER = "Name three fruits that are red."


@dataclass(frozen=True)
class IdentityCheck:
    dtype: str
    prompt_tokens: int
    new_tokens: int
    state_equal: bool  # the transferred state's K/V == the extracted state's, bit for bit
    tokens_equal: bool  # transferred-cache continuation == the model's own cached continuation
    max_logit_diff: float  # max |logit| difference between those two continuations (0: bitwise)
    noise: float  # context only: the model's own noise, max of the two below
    noise_recompute: float  # max |logit| difference between its cached decode and a full recompute
    noise_chunked: float  # ... between its cached decode after a one-chunk and a two-chunk prefill
    tokens_equal_recompute: bool  # the cached decode's tokens == the full recompute's
    seconds: float

    @property
    def exact(self) -> bool:
        """Bitwise: the same state, the same tokens and the same logits as the model's own cache.

        The model's own noise (cached vs recompute vs chunked prefill) is reported beside it, never
        used as a threshold: it depends on the CPU's kernels (bfloat16 most of all)."""
        return self.state_equal and self.tokens_equal and self.max_logit_diff == 0.0


def _logit_diff(a, b) -> float:
    """The largest |logit| difference between two ``generate`` outputs, step by step."""
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a.logits, b.logits))


def identity_check(model, input_ids, *, new_tokens: int = 8, host=None) -> IdentityCheck:
    """Identity transfer of ``input_ids[:, :-1]``'s cache vs transformers' own continuation."""
    import torch
    from transformers import DynamicCache

    from kvbridge.transfer import identity_transfer

    host = host or get_host()
    t0 = time.perf_counter()
    ids = torch.as_tensor(input_ids).view(1, -1)
    gen = greedy_kwargs(ids, new_tokens)
    with torch.no_grad():
        own = DynamicCache(config=model.config)
        model(input_ids=ids[:, :-1], cache=own, use_cache=True)
        native = model.generate(input_ids=ids, cache=own, **gen)
        recompute = model.generate(input_ids=ids, use_cache=False, **gen)
        chunks = DynamicCache(config=model.config)
        half = max(1, (ids.shape[1] - 1) // 2)
        model(input_ids=ids[:, :half], cache=chunks, use_cache=True)
        model(input_ids=ids[:, half:-1], cache=chunks, use_cache=True)
        chunked = model.generate(input_ids=ids, cache=chunks, **gen)
        extracted = host.adapter_of(model).extract(model, ids[:, :-1])
        moved = identity_transfer(extracted, host=host)
        ours = generate(model, moved, ids, host=host, **gen)

    same = all(torch.equal(a, b) for a, b in zip((*moved.keys, *moved.values), (*extracted.keys, *extracted.values)))
    return IdentityCheck(
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        prompt_tokens=int(ids.shape[1]),
        new_tokens=new_tokens,
        state_equal=same,
        tokens_equal=bool(torch.equal(ours.sequences, native.sequences)),
        max_logit_diff=_logit_diff(ours, native),
        noise=max(_logit_diff(native, recompute), _logit_diff(native, chunked)),
        noise_recompute=_logit_diff(native, recompute),
        noise_chunked=_logit_diff(native, chunked),
        tokens_equal_recompute=bool(torch.equal(native.sequences, recompute.sequences)),
        seconds=time.perf_counter() - t0,
    )


def chat_texts(tokenizer, system: str = SYSTEM, user: str = USER) -> tuple[str, str]:
    """``(guide, live)``: the rendered system turn, and the rest of the chat up to the generation prompt
    (:func:`kvbridge.steer.prompts.guide_texts`)."""
    from kvbridge.steer.prompts import guide_texts

    return guide_texts(tokenizer, system, user, chat=True)[:2]


def chat_split(tokenizer, system: str = SYSTEM, user: str = USER):
    """The :class:`~kvbridge.prefix.splits.SplitReport` of the chat (guide = system turn, sep '')."""
    from kvbridge.prefix.splits import split_text

    guide, live = chat_texts(tokenizer, system, user)
    return split_text(tokenizer, guide, live, "")


class ForwardCounter(HookSet):
    """Counts forward calls of a model (and its decoder) while active."""

    def __init__(self, model):
        self.calls = 0
        mods = [model] + [m for m in (getattr(model, "model", None),) if m is not None]
        self.handles = [m.register_forward_pre_hook(self._hook) for m in mods]

    def _hook(self, *_):
        self.calls += 1


@dataclass(frozen=True)
class PackCheck:
    guide_tokens: int
    forwards_during_restore: int
    restore_ms: float
    prefill_ms: float
    tokens_equal: bool  # the pack's continuation == the model's own (its cached prefill of the guide)
    max_logit_diff: float  # ... and their max |logit| difference (0: bitwise)
    max_logit_diff_prefill: float = 0.0  # for scale: vs one prefill of the whole prompt (another computation)
    folder: str = ""


def pack_check(
    model,
    tokenizer,
    *,
    system: str = SYSTEM,
    user: str = USER,
    new_tokens: int = 8,
    folder: str | None = None,
    host=None,
) -> PackCheck:
    """Save the system turn as a pack, restore it with zero forwards, continue the chat from it."""
    import torch

    from kvbridge.prefix.packs import load_pack, save_pack

    split = chat_split(tokenizer, system, user).require_safe()
    with tempfile.TemporaryDirectory(prefix="kvbridge-pack-") as tmp:
        out = folder or f"{tmp}/pack"
        save_pack(model, out, guide_text=split.ghost_text, tokenizer=tokenizer, overwrite=folder is not None, host=host)
        counter = ForwardCounter(model)
        t0 = time.perf_counter()
        try:
            pack = load_pack(out, model, tokenizer=tokenizer, host=host)
            pack.cache(model, host=host)
        finally:
            counter.remove()
        restore = time.perf_counter() - t0
    ids = torch.tensor([list(split.ids)], dtype=torch.long)
    gen = greedy_kwargs(ids, new_tokens)
    from transformers import DynamicCache

    with torch.no_grad():
        own = DynamicCache(config=model.config)
        t1 = time.perf_counter()
        model(input_ids=ids[:, : len(split.ghost)], cache=own, use_cache=True)
        prefill = time.perf_counter() - t1
        ours = pack.generate(model, ids, host=host, **gen)
        native = model.generate(input_ids=ids, cache=own, **gen)
        whole = model.generate(input_ids=ids, **gen)

    return PackCheck(
        guide_tokens=len(split.ghost),
        forwards_during_restore=counter.calls,
        restore_ms=1e3 * restore,
        prefill_ms=1e3 * prefill,
        tokens_equal=bool(torch.equal(ours.sequences, native.sequences)),
        max_logit_diff=_logit_diff(ours, native),
        max_logit_diff_prefill=_logit_diff(ours, whole),
        folder=folder or "",
    )


# -- the section -------------------------------------------------------------------------------------
@dataclass
class RealContext:
    """What the real-model parts share: the reference, loaded models by dtype, options, results."""

    ref: str = "smollm2"
    new_tokens: int = 8
    dtypes: tuple = ("float32", "bfloat16")
    report_dir: str | None = None
    loaded: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    ok: bool = True

    def model(self, dtype: str = "float32"):
        """The model in ``dtype``: loaded once in float32, other dtypes cast from it (what loading
        a GGUF in that dtype does: dequantize to float32, then cast), saving a second dequantization."""
        if dtype not in self.loaded:
            self.loaded[dtype] = cast(self.model(), dtype) if dtype != "float32" else load(self.ref, dtype=dtype)
        return self.loaded[dtype]


def cast(loaded, dtype: str):
    """A copy of a :class:`~kvbridge.models.LoadedModel` with its parameters cast to ``dtype``.

    Like ``from_pretrained(dtype=...)``, float buffers (the rotary ``inv_freq``) stay float32: a
    whole-module ``.to(bfloat16)`` would round them and change the model's own RoPE tables."""
    import copy

    import torch

    model = copy.deepcopy(loaded.model)
    with torch.no_grad():  # parameters only: buffers (RoPE inv_freq) stay float32, as from_pretrained(dtype=...)
        for param in model.parameters():
            param.data = param.data.to(getattr(torch, dtype))
    model.config.dtype = dtype
    spec = get_host().adapter_of(model).spec_of(model)
    return replace(loaded, model=model, spec=spec, fingerprint=dict(loaded.fingerprint, dtype=dtype))


def _identity_part(ctx: RealContext) -> None:
    click.echo("\n-- identity transfer on the real weights (chat prompt, greedy) --")
    for dtype in ctx.dtypes:
        lm = ctx.model(dtype)
        guide, live = chat_texts(lm.tokenizer)
        ids = lm.tokenizer(guide + live, add_special_tokens=False)["input_ids"]
        res = identity_check(lm.model, ids, new_tokens=ctx.new_tokens)
        ctx.results[f"identity_{dtype}"] = dict(res.__dict__, exact=res.exact)
        ctx.ok &= res.exact
        click.echo(
            f"  {dtype:<9} {res.prompt_tokens} prompt tokens, {res.new_tokens} new: state "
            f"{'bitwise equal' if res.state_equal else 'CHANGED'}; tokens {'equal' if res.tokens_equal else 'DIFFER'}; "
            f"max|dlogit| vs the model's own cached continuation {res.max_logit_diff:.2e} "
            f"({'exact' if res.exact else 'NOT EXACT'}; for scale, the model's own noise: cached vs recompute "
            f"{res.noise_recompute:.2e}, vs two-chunk prefill {res.noise_chunked:.2e}) ({res.seconds:.1f} s)"
        )


def _split_part(ctx: RealContext) -> None:
    report = chat_split(ctx.model("float32").tokenizer)
    safe = report.safe
    ctx.results["split"] = {
        "joint": len(report.joint),
        "naive_matches": report.naive.matches_joint,
        "safe": None if safe is None else safe.to_dict(),
    }
    ctx.ok &= safe is not None and safe.ids == report.joint
    click.echo("\n-- exact-token split of the chat (system turn hidden, user turn live) --")
    click.echo(
        f"  joint {len(report.joint)} tokens; naive split "
        f"{'matches' if report.naive.matches_joint else 'differs at token %s' % report.naive.first_difference}; "
        + (
            f"safe split: ghost {len(safe.ghost)} + live {len(safe.live)} == joint ids"
            if safe is not None
            else f"NO safe split ({report.reason})"
        )
    )


def _pack_part(ctx: RealContext) -> None:
    lm = ctx.model("float32")
    folder = f"{ctx.report_dir}/smollm2-system-pack" if ctx.report_dir else None
    if folder:
        Path(ctx.report_dir).mkdir(parents=True, exist_ok=True)
    res = pack_check(lm.model, lm.tokenizer, new_tokens=ctx.new_tokens, folder=folder)
    ctx.results["pack"] = res.__dict__
    ctx.ok &= res.forwards_during_restore == 0 and res.tokens_equal and res.max_logit_diff == 0.0
    click.echo("\n-- prefix pack of the system turn --")
    click.echo(
        f"  {res.guide_tokens} guide tokens restored with {res.forwards_during_restore} forward passes in "
        f"{res.restore_ms:.1f} ms (prefill {res.prefill_ms:.1f} ms); continuation tokens "
        f"{'equal' if res.tokens_equal else 'DIFFER'}, max|dlogit| vs the model's own cached guide "
        f"{res.max_logit_diff:.2e} ({'exact' if res.max_logit_diff == 0 else 'NOT EXACT'}; vs one prefill of "
        f"the whole prompt {res.max_logit_diff_prefill:.2e})" + (f"; pack in {folder}" if folder else "")
    )


#: the parts of the real-model section, in order: (name, function of a RealContext). The real
#: adapter pair (a fit and an eval: minutes on 2 cores) is its own opt-in demo section,
#: ``adapter`` (:func:`adapter_section`), so the default demo stays within 3 minutes
REAL_SECTIONS: list[tuple[str, Callable[[RealContext], Any]]] = [
    ("identity", _identity_part),
    ("split", _split_part),
    ("pack", _pack_part),
]


def add_real_section(name: str, part: Callable[[RealContext], Any]) -> None:
    """Append a part (e.g. the real adapter pair) to :data:`REAL_SECTIONS`; it may set ``ctx.ok``."""
    REAL_SECTIONS.append((name, part))


def real_section(
    *,
    ref: str = "smollm2",
    new_tokens: int = 8,
    dtypes=("float32", "bfloat16"),
    report_dir: str | None = None,
    only: tuple = (),
) -> RealContext:
    """Run every part of :data:`REAL_SECTIONS` (or those named in ``only``) on ``ref``."""
    t0 = time.perf_counter()
    resolved = resolve(ref)
    click.echo(
        f"\n== Real model: {resolved.name} ({resolved.kind}: {resolved.path}"
        + (f", {resolved.quantization} dequantized" if resolved.quantization else "")
        + ")"
    )
    ctx = RealContext(ref=ref, new_tokens=new_tokens, dtypes=tuple(dtypes), report_dir=report_dir)
    for name, part in REAL_SECTIONS:
        if not only or name in only:
            part(ctx)
    click.echo(f"\nreal-model section: {'all exact' if ctx.ok else 'FAILED'} ({time.perf_counter() - t0:.1f} s)")
    return ctx


def adapter_section(*, ref: str = "smollm2", report_dir: str | None = None) -> bool:
    """Demo section ``adapter`` (opt-in): the real adapter pair, SmolLM2 -> SmolLM2 + the shipped
    Shakespeare LoRA: check, fit and eval; plain reuse and the fitted mapping against native
    (RESULTS.md). Quality, not exactness: True unless it cannot run (an error)."""
    from kvbridge.adapters.pair import AdapterPairSettings, run_adapter_pair

    click.echo("\n-- real adapter pair: smollm2 -> smollm2 + shakespeare LoRA (check, fit, eval) --")
    t0 = time.perf_counter()
    click.echo(run_adapter_pair(settings=AdapterPairSettings(samples=24, calibration_tokens=2048)).render())
    click.echo(f"  ({time.perf_counter() - t0:.1f} s)")
    return True
