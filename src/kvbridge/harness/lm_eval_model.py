"""The lm-evaluation-harness model ``kvbridge``: lm-eval requests answered through a transferred cache.

Importing this module registers the model with lm-eval's registry
(``lm_eval.api.registry.register_model("kvbridge")``), after which::

    import kvbridge.harness.lm_eval_model  # noqa: F401 (registers "kvbridge")
    import lm_eval
    lm_eval.simple_evaluate(model="kvbridge", model_args="source=zoo:base,target=zoo:tuned,mapping=DIR",
                            tasks=["my_local_task"], task_manager=lm_eval.tasks.TaskManager(include_path=DIR))

From the shell: ``lm_eval run --model kvbridge --model_args source=SRC,target=TGT,mapping=DIR --tasks
TASK.yaml`` on a task whose ``metadata:`` loads :mod:`kvbridge.harness.lm_eval_plugin`, or
``kvbridge-lm-eval`` (:mod:`kvbridge.harness.lm_eval_cli`) for any task (docs/harness.md says why).

Model arguments: ``source``, ``target`` (model references, as on kvbridge's command line),
``mapping`` (a ``kvbridge fit`` folder or ``identity``), ``condition`` (``transferred``, default;
``target``, ``source``, ``plain``, or a recompute point), ``dtype``, ``max_gen_toks`` (256),
``rolling_window`` (256), ``accept_fingerprint_mismatch``.

- ``loglikelihood``: the request's context is the cached prefix (its last token is fed live), the
  continuation is scored by the target from that cache; ``(sum log p, is greedy)``.
- ``generate_until``: greedy from the context's cache until a stop string or ``max_gen_toks``
  (sampling arguments are ignored: greedy only).
- ``loglikelihood_rolling``: the document in windows of ``rolling_window`` tokens; window ``i`` is
  scored by the target live from the condition's cache of every earlier token (so under
  ``transferred`` the source has read the document so far), the first window after the prefix
  token alone.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry, register_model

from kvbridge.harness.run import _ids

NAME = "kvbridge"


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class KVBridgeLM(LM):
    """lm-eval model answering every request under one kvbridge condition (``self.condition``)."""

    def __init__(
        self,
        source: str = "",
        target: str = "",
        mapping: str = "identity",
        condition: str = "transferred",
        dtype: str | None = None,
        max_gen_toks: int = 256,
        rolling_window: int = 256,
        accept_fingerprint_mismatch: Any = False,
        answerer=None,
        **_ignored,
    ):
        super().__init__()
        self.max_gen_toks = int(max_gen_toks)
        self.rolling_window = int(rolling_window)
        if answerer is None:
            from kvbridge.harness.protocol import HarnessError

            if not source or not target:
                raise HarnessError(
                    "the kvbridge lm-eval model needs source= and target= model references",
                    "pass --model_args source=REF,target=REF,mapping=DIR",
                )
            from types import SimpleNamespace

            from kvbridge.evaluate.run import mapping_of
            from kvbridge.harness.conditions import Answerer
            from kvbridge.models.pair import load_pair
            from kvbridge.run import Run

            pair = load_pair(source, target, dtype=dtype)  # the mapping checked as `kvbridge harness` does
            asked = SimpleNamespace(
                mapping=str(mapping), accept_fingerprint_mismatch=_flag(accept_fingerprint_mismatch)
            )
            mapping_obj = mapping_of(Run.of(pair, asked))
            answerer = Answerer(pair.source.model, pair.target.model, mapping_obj, pair.target.tokenizer)
        self.answerer = answerer
        self.tok = answerer.tokenizer
        self.condition = condition
        answerer.conditions([condition])  # an unknown or inapplicable condition: one-line error now
        self.counts = {"loglikelihood": 0, "loglikelihood_rolling": 0, "generate_until": 0}

    # -- tokenising ------------------------------------------------------------------------------
    def prefix_ids(self) -> list[int]:
        """What an empty context becomes: the tokenizer's special-token prefix (its BOS), else EOS."""
        ids = list(self.tok("", add_special_tokens=True)["input_ids"])
        if ids:
            return ids
        eos = getattr(self.tok, "eos_token_id", None)
        return [int(eos)] if eos is not None else [0]

    def _context(self, text: str) -> list[int]:
        ids = _ids(self.tok, text, True)
        return ids if ids and text else self.prefix_ids() + ids

    def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's convention: trailing spaces of the context move to the continuation; the
        continuation's ids are those of ``context + continuation`` beyond the context's."""
        n = len(context) - len(context.rstrip())
        if n:
            continuation, context = context[-n:] + continuation, context[:-n]
        whole = self._context(context + continuation)
        ctx = self._context(context)
        if whole[: len(ctx)] != ctx:  # the tokenizer merged across the boundary: encode apart
            return ctx, _ids(self.tok, continuation, False)
        return ctx, whole[len(ctx) :]

    # -- the LM interface -------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for req in requests:
            ctx, cont = self._split(req.args[0], req.args[1])
            out.append(self.answerer.loglikelihood(self.condition, ctx, [], cont))
            self.counts["loglikelihood"] += 1
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        w = max(1, self.rolling_window)
        for req in requests:
            toks = _ids(self.tok, req.args[0], False)
            total = 0.0
            for start in range(0, len(toks), w):
                ctx = self.prefix_ids() + toks[:start]
                total += self.answerer.loglikelihood(self.condition, ctx, [], toks[start : start + w])[0]
            out.append(total)
            self.counts["loglikelihood_rolling"] += 1
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            kwargs = dict(req.args[1] or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            steps = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            ctx = self._context(req.args[0])
            out.append(self.answerer.generate(self.condition, ctx, [], max_new_tokens=steps, stop=tuple(until)))
            self.counts["generate_until"] += 1
        return out

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name_or_path", "kvbridge")).replace("/", "__")

    def get_model_info(self) -> dict:
        a = self.answerer
        return {
            "kvbridge_condition": self.condition,
            "kvbridge_source_layers": a.sspec.num_layers,
            "kvbridge_target_layers": a.tspec.num_layers,
            "kvbridge_mapping": getattr(a.mapping, "name", type(a.mapping).__name__),
        }


if NAME not in model_registry:
    register_model(NAME)(KVBridgeLM)
