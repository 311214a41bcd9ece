"""A conversation that switches model mid-way (small -> large -> small) by mapping the cache at each
switch, measured against the same conversation re-prefilled at every switch.

::

    from kvbridge.harness.session import Session, compare_handoff
    s = Session({"small": small, "large": large}, tokenizer, mappings={("small", "large"): m_up,
                                                                      ("large", "small"): m_down})
    reply = s.turn("small", "User: hi\\nAssistant:", max_new_tokens=16)      # prefill + greedy reply
    reply = s.turn("large", "\\nUser: and then?\\nAssistant:")               # cache mapped small -> large
    report = compare_handoff(models, tokenizer, mappings, script, max_new_tokens=16)

:class:`Session` keeps one cache of the whole conversation (every turn's text ids and every
generated token). ``mode="map"``: at a switch the cache is moved to the new model with the mapping
for that direction (:func:`kvbridge.transfer.transfer`), no re-prefill. ``mode="reprefill"``: at a
switch the new model prefills the whole history itself (the reference).

:func:`compare_handoff` runs the reference session first (greedy), then replays the mapped session
on the *same* history (each turn's text, then the reference's reply fed by teacher forcing), so the
two are compared on identical token ids at every turn. Per turn: ``tokens_equal`` (every step's
argmax under the mapped cache is the reference's token: exactly when free greedy decoding would
have produced the same reply), ``top1`` (share of steps that agree), ``kl_mean`` / ``kl_max``
(KL(reference || mapped) over the reply's steps). Before the first switch both sessions hold the
same cache, so their KL is 0 exactly; after it, the KL per turn is the drift the mapped cache adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbridge.harness.protocol import HarnessError

MODES = ("map", "reprefill")


@dataclass(frozen=True)
class TurnResult:
    model: str
    switched: bool
    prompt_ids: tuple
    reply_ids: tuple
    logprobs: object  # Tensor [steps, vocab] (float64): the distribution before each reply token


class Session:
    """One conversation across several models sharing a tokenizer (see the module docstring)."""

    def __init__(self, models: dict, tokenizer, mappings: dict | None = None, *, mode: str = "map", host=None):
        from kvbridge.plugins import get_host

        if mode not in MODES:
            raise HarnessError(f"unknown session mode {mode!r}", f"use one of {', '.join(MODES)}")
        if not models:
            raise HarnessError("a session needs at least one model", "pass models={'name': model, ...}")
        self.host = host or get_host()
        self.models, self.tokenizer, self.mode = dict(models), tokenizer, mode
        self.mappings = dict(mappings or {})
        self.adapters = {n: self.host.adapter_for(m.config.to_dict()) for n, m in self.models.items()}
        self.specs = {n: self.adapters[n].spec_of(m) for n, m in self.models.items()}
        self.current: str | None = None
        self.state = None  # KVState of every id in self.ids, computed (or mapped) for self.current
        self.ids: list[int] = []
        self.switches = 0

    def _mapping(self, a: str, b: str):
        mapping = self.mappings.get((a, b))
        if mapping is None:
            raise HarnessError(
                f"no mapping from {a!r} to {b!r} for the hand-off",
                f"pass mappings={{({a!r}, {b!r}): mapping}} (kvbridge fit for that direction)",
            )
        return mapping

    def _switch(self, name: str) -> bool:
        if name not in self.models:
            raise HarnessError(f"unknown session model {name!r}", f"use one of {', '.join(self.models)}")
        if self.current is None or name == self.current:
            self.current = name
            return False
        if self.state is not None:
            if self.mode == "map":
                from kvbridge.transfer import transfer

                self.state = transfer(self.state, self._mapping(self.current, name), self.specs[name], host=self.host)
            else:
                self.state = self.adapters[name].extract(
                    self.models[name], self._tensor(self.ids), spec=self.specs[name]
                )
        self.current = name
        self.switches += 1
        return True

    @staticmethod
    def _tensor(ids):
        import torch

        return torch.tensor([list(ids)], dtype=torch.long)

    def _state_of(self, cache):
        """The conversation's cache as a KVState (positions 0..T-1, RoPE applied), as a prefill's."""
        import torch

        from kvbridge.family_adapter import prefill_state

        name = self.current
        spec = self.specs[name]
        if spec.rope and spec.rope.is_stateful:
            raise HarnessError(
                f"model {name!r} uses a length-dependent RoPE ({spec.rope.rope_type}); sessions "
                "support fixed RoPE tables only",
                "use models with default/linear/llama3 RoPE",
            )
        adapter, positions = self.adapters[name], torch.arange(len(self.ids))[None]
        keys, values = adapter._cache_tensors(cache, spec)
        return prefill_state(adapter, self.models[name], spec, self._tensor(self.ids), positions, keys, values)

    def turn(self, name: str, text: str | list, *, max_new_tokens: int = 16, force: list | None = None) -> TurnResult:
        """Feed ``text`` (a string, or token ids) to model ``name`` and reply greedily with up to
        ``max_new_tokens`` tokens (stopping at EOS); ``force``: feed these reply tokens instead
        (teacher forcing; the distributions are still recorded)."""
        import torch
        from transformers import DynamicCache

        switched = self._switch(name)
        model, adapter = self.models[name], self.adapters[name]
        prompt = (
            list(text)
            if isinstance(text, (list, tuple))
            else list(self.tokenizer(text, add_special_tokens=not self.ids)["input_ids"])
        )
        if not prompt:
            raise HarnessError("an empty turn", "give the turn some text")
        cache = adapter.inject(self.state, model) if self.state is not None else DynamicCache()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        steps = len(force) if force is not None else int(max_new_tokens)
        logps, reply = [], []
        feed = prompt
        with torch.no_grad():
            for step in range(steps + 1):
                logits = model(input_ids=self._tensor(feed), cache=cache, use_cache=True).logits[0, -1]
                self.ids.extend(feed)
                if step == steps:
                    break
                logp = torch.log_softmax(logits.double(), -1)
                nxt = int(force[step]) if force is not None else int(logp.argmax())
                logps.append(logp)
                reply.append(nxt)
                feed = [nxt]
                if force is None and eos is not None and nxt == eos:
                    self.ids.append(nxt)
                    model(input_ids=self._tensor([nxt]), cache=cache, use_cache=True)
                    break
        self.state = self._state_of(cache)
        logprobs = torch.stack(logps) if logps else torch.zeros(0, 0, dtype=torch.float64)
        return TurnResult(name, switched, tuple(prompt), tuple(reply), logprobs)


def compare_handoff(models: dict, tokenizer, mappings: dict, script, *, max_new_tokens: int = 16, host=None) -> dict:
    """The mapped session against the re-prefill session on the same history (see the module docstring).

    ``script``: ``[(model name, turn text), ...]``. Returns ``{"turns": [...], "switches": k, ...}``.
    """
    import torch

    ref = Session(models, tokenizer, mappings, mode="reprefill", host=host)
    mapped = Session(models, tokenizer, mappings, mode="map", host=host)
    turns = []
    for i, (name, text) in enumerate(script):
        r = ref.turn(name, text, max_new_tokens=max_new_tokens)
        m = mapped.turn(name, list(r.prompt_ids), force=list(r.reply_ids))
        row = {"turn": i, "model": name, "switched": r.switched, "steps": len(r.reply_ids)}
        if not len(r.reply_ids):
            turns.append({**row, "tokens_equal": True, "top1": None, "kl_mean": None, "kl_max": None})
            continue
        p, q = r.logprobs, m.logprobs
        kl = (p.exp() * (p - q)).sum(-1).clamp(min=0)
        agree = (q.argmax(-1) == torch.tensor(list(r.reply_ids), dtype=torch.long)).double()
        turns.append(
            {
                **row,
                "tokens_equal": bool(agree.all()),
                "top1": float(agree.mean()),
                "kl_mean": float(kl.mean()),
                "kl_max": float(kl.max()),
                "reply": tokenizer.decode(list(r.reply_ids))[:200],
            }
        )
    return {
        "turns": turns,
        "switches": ref.switches,
        "history_tokens": len(ref.ids),
        "same_history": ref.ids == mapped.ids,
        "max_new_tokens": max_new_tokens,
    }


def drift_table(result: dict) -> str:
    """A Markdown table of :func:`compare_handoff`'s turns."""
    from kvbridge.evaluate.report import md_table

    f = lambda x, fmt="{:.4f}": "-" if x is None else fmt.format(x)  # noqa: E731
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    heads = ("turn", "model", "switch", "steps", "tokens equal", "top-1", "KL mean", "KL max")
    rows = [
        [str(t["turn"]), str(t["model"]), yes(t["switched"]), str(t["steps"]), yes(t["tokens_equal"])]
        + [f(t["top1"], "{:.2f}"), f(t["kl_mean"]), f(t["kl_max"])]
        for t in result["turns"]
    ]
    return "\n".join(md_table(heads, rows))
