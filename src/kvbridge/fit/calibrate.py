"""Paired calibration: both models read the same token ids; their content K/V become statistics.

What one calibration observation is: a (sequence, position) both models were run on. For
every layer of both models the key is taken with the model's own RoPE stripped (the exact
codec, :meth:`kvbridge.kvstate.KVState.strip_rope`) and the value as cached. The fitters
regress target content K (V) on source content K (V).

Sampling (all deterministic given ``seed``, independent of how sequences are sharded over
ranks, so a distributed fit sees exactly the observations a single process sees):

- the corpus is tokenised once, concatenated (documents joined by the EOS token when the
  tokenizer has one) and cut into ``seq_len``-token sequences; ``tokens`` caps the total;
- ``heldout`` of the sequences (at least one when there are two or more) are held out, whole
  sequences so that held-out R² is measured on text the fit never saw;
- in each sequence the positions ``skip + o, skip + o + stride, ...`` are kept, ``o`` drawn in
  ``[0, stride)`` per sequence. Neighbouring positions are strongly correlated, so a stride
  buys nearly the same statistics for ``1/stride`` of the accumulation cost;
- ``skip`` drops the first positions of every sequence. The first tokens of a sequence are
  *attention sinks*: every later query attends to them heavily, their keys and values have
  outlying norms and a different geometry from the rest, and a handful of them can dominate
  a least-squares fit. ``skip=0`` (the default) keeps them, which is what a transfer maps;
  ``skip=4`` fits only "ordinary" positions (then consider keeping the first tokens native).

Token ids must be valid for both models: the tokenizers must be identical (the CLI refuses a
pair whose tokenizers ``kvbridge check`` calls blocking, and re-tokenises the corpus with the
target's tokenizer to verify the ids agree).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch

from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.faults import fault_point
from kvbridge.fit.settings import DEFAULT_TOP_K, MIN_OBS_PER_FEATURE  # noqa: F401  (re-exported: their old home)


class CalibrationError(KVBridgeError):
    """The calibration data cannot be used (empty corpus, mismatched tokenizers, bad ids)."""


# -- corpus (read and split by :mod:`kvbridge.corpus`, the one home; re-exported for callers) ----------
from kvbridge.corpus import calibration_span, calibration_texts, corpus_record, load_corpus  # noqa: E402, F401


def tokenize_corpus(texts: Iterable[str], tokenizer, *, seq_len: int, tokens: int | None = None, offset: int = 0):
    """``[N, seq_len]`` token ids: the documents concatenated (EOS between them) and cut.

    ``offset``: skip that many tokens of the stream first (a later chunk of the corpus: runs
    with offsets 0, T, 2T, ... and ``tokens=T`` read disjoint chunks whose kept statistics
    ``kvbridge fit --from-stats A,B,...`` merges)."""
    if seq_len < 2:
        raise CalibrationError(f"--seq-len must be at least 2, got {seq_len}", "use e.g. --seq-len 512")
    eos = getattr(tokenizer, "eos_token_id", None)
    stream: list[int] = []
    offset = max(0, int(offset))
    want = None if tokens is None else int(tokens) + offset
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            stream.append(int(eos))
        if want is not None and len(stream) >= want:
            break
    stream = stream[offset:want]
    n = len(stream) // seq_len
    if n == 0:
        raise CalibrationError(
            f"the corpus gives {len(stream)} tokens after --tokens-offset {offset}, fewer than one sequence of "
            f"--seq-len {seq_len}",
            "pass a bigger corpus, a smaller --seq-len or --tokens-offset, or more --tokens",
        )
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def check_same_tokens(texts: list[str], source_tok, target_tok, *, limit: int = 64) -> None:
    """Refuse when the two tokenizers turn the first ``limit`` documents into different ids."""
    for i, text in enumerate(texts[:limit]):
        a = source_tok(text, add_special_tokens=False)["input_ids"]
        b = target_tok(text, add_special_tokens=False)["input_ids"]
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise CalibrationError(
                f"the two tokenizers give different token ids for corpus document {i} (first difference at "
                f"token {j}): paired calibration needs identical ids",
                "fit between models that share a tokenizer (see `kvbridge check SOURCE TARGET`)",
            )


# -- configuration ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationConfig:
    """How observations are sampled (see the module docstring)."""

    stride: int = 4  # keep every stride-th position
    skip: int = 0  # drop the first `skip` positions of each sequence (attention sinks)
    heldout: float = 0.1  # share of sequences held out for R² and --alpha auto
    seed: int = 0
    batch_size: int = 4  # sequences per forward pass
    seq_len: int | None = None  # tokens per sequence cut from texts / 1-D ids (None: 512 for texts)
    tokens: int | None = None  # calibration tokens to read (None: all)
    offset: int = 0  # calibration tokens to skip first (a later chunk of the corpus; --tokens-offset)

    def __post_init__(self):
        for ok, what, fix in (
            (self.offset >= 0, f"--tokens-offset must be >= 0, got {self.offset}", "use e.g. --tokens-offset 8192"),
            (self.stride >= 1, f"--stride must be >= 1, got {self.stride}", "use e.g. --stride 4"),
            (self.skip >= 0, f"skip must be >= 0, got {self.skip}", "use 0 to keep every position"),
            (0.0 <= self.heldout < 1.0, f"held-out fraction must be in [0, 1), got {self.heldout}", "use e.g. 0.1"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}", "use e.g. 4"),
        ):
            if not ok:
                raise ConfigError(what, fix)


# -- paired calibration ---------------------------------------------------------------------------------
class PairedCalibration:
    """Runs both models on the same token ids and turns their caches into features."""

    def __init__(
        self,
        source_model,
        target_model,
        sequences,
        config: CalibrationConfig = CalibrationConfig(),
        *,
        host=None,
        progress: Callable | None = None,
        checkpoint=None,
        dist=None,
    ):
        from kvbridge.plugins import host_or_default

        self.host = host_or_default(host)
        self.source_model, self.target_model = source_model, target_model
        self.source_adapter = self.host.adapter_for(source_model.config.to_dict())
        self.target_adapter = self.host.adapter_for(target_model.config.to_dict())
        self.source_spec = self.source_adapter.spec_of(source_model)
        self.target_spec = self.target_adapter.spec_of(target_model)
        seqs = torch.as_tensor(sequences, dtype=torch.long)
        if seqs.dim() == 1:
            seqs = seqs[None]
        if seqs.dim() != 2 or seqs.numel() == 0:
            raise CalibrationError(
                f"calibration token ids must be [sequences, seq_len], got {tuple(seqs.shape)}",
                "pass a 2-D tensor of token ids",
            )
        self.sequences = seqs
        self.config = config
        vmax = int(seqs.max())
        for role, spec in (("source", self.source_spec), ("target", self.target_spec)):
            if spec.vocab_size and vmax >= spec.vocab_size:
                raise CalibrationError(
                    f"token id {vmax} is outside the {role} model's vocabulary ({spec.vocab_size})",
                    "tokenise the corpus with the models' shared tokenizer",
                )
        if int(seqs.min()) < 0:
            raise CalibrationError("calibration token ids contain negative values", "pass valid token ids")
        if config.skip >= self.seq_len:
            raise CalibrationError(
                f"skip {config.skip} drops every position of a {self.seq_len}-token sequence",
                "use a smaller skip or a longer --seq-len",
            )
        g = torch.Generator().manual_seed(int(config.seed))
        n = self.num_sequences
        self.offsets = torch.randint(0, config.stride, (n,), generator=g)
        n_held = 0 if config.heldout <= 0 or n < 2 else max(1, int(round(config.heldout * n)))
        self.held = torch.zeros(n, dtype=torch.bool)
        self.held[torch.randperm(n, generator=g)[:n_held]] = True
        self.progress = progress
        self.checkpoint = checkpoint
        self.dist = dist  # kvbridge.fit.distributed.Context or None
        self.device = next(source_model.parameters()).device  # statistics live where the models run
        self.seconds = 0.0  # forward + feature time

    # -- sizes ------------------------------------------------------------------------------------
    @property
    def num_sequences(self) -> int:
        return int(self.sequences.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.sequences.shape[1])

    def positions_of(self, i: int):
        return torch.arange(self.config.skip + int(self.offsets[i]), self.seq_len, self.config.stride)

    def observations(self, split: str = "train") -> int:
        """Observations per (layer, head) in a split over all sequences (all ranks)."""
        want = split == "held"
        return sum(len(self.positions_of(i)) for i in range(self.num_sequences) if bool(self.held[i]) == want)

    @property
    def rank(self) -> int:
        return self.dist.rank if self.dist else 0

    @property
    def world(self) -> int:
        return self.dist.world if self.dist else 1

    def batches(self) -> list[list[int]]:
        """This rank's sequences (``rank, rank + world, ...``) in batches of ``batch_size``."""
        mine = list(range(self.rank, self.num_sequences, self.world))
        bs = self.config.batch_size
        return [mine[i : i + bs] for i in range(0, len(mine), bs)]

    # -- features ---------------------------------------------------------------------------------------
    def _content(self, model, adapter, spec, ids):
        dev = next(model.parameters()).device
        with torch.no_grad():
            state = adapter.extract(model, ids.to(dev), spec=spec).strip_rope(host=self.host)
        if dev != self.device:
            return [k.to(self.device) for k in state.keys], [v.to(self.device) for v in state.values]
        return state.keys, state.values

    def _target_with_repair(self, ids):
        """The target's content K/V and its attention-repair scores ``(r_K, r_V)`` ``[B, L, H_kv, T]``
        (:mod:`kvbridge.fit.repair`), recorded during the same forward with bounded memory."""
        from kvbridge.attention import capture_attention
        from kvbridge.fit.repair import boundaries, repair_scores

        bnd = boundaries(self.seq_len)
        idx = torch.tensor(bnd, dtype=torch.long)

        def reduce(q, k, v, scaling, softcap):
            rk, rv = repair_scores(q.index_select(2, idx.to(q.device)), k, v, bnd, scaling=scaling, softcap=softcap)
            return rk.to(self.device), rv.to(self.device)

        with capture_attention(self.target_model, reduce=reduce) as layers:
            tk, tv = self._content(self.target_model, self.target_adapter, self.target_spec, ids)
        n = self.target_spec.num_layers
        if len(layers) != n:
            raise CalibrationError(
                f"weighting=attention recorded the attention of {len(layers)} of the target's {n} layers",
                "use weighting=uniform for this model (its attention does not run through transformers' interface)",
            )
        rk, rv = (torch.stack([layers[i][j] for i in range(n)], dim=1) for j in (0, 1))
        return tk, tv, rk, rv

    def features(self, seq_idx: list[int], *, attention: bool = False) -> tuple[dict, Any]:
        """``({"xk","xv","yk","yv": [n, layers, heads, dim] float32}, held_mask [n])`` for sequences.

        ``attention``: also ``"rk"``, ``"rv"`` ``[n, target layers, target KV heads]`` (the
        attention-repair scores of :mod:`kvbridge.fit.repair`, mean 1 per sequence and head) and
        ``"seq"`` ``[n]`` (each row's sequence index)."""
        from kvbridge.fit.repair import normalise

        t0 = time.perf_counter()
        # train sequences first, held-out last: each split is a contiguous block of rows
        seq_idx = sorted(seq_idx, key=lambda i: bool(self.held[i]))
        ids = self.sequences[seq_idx]
        pos = [self.positions_of(i).to(self.device) for i in seq_idx]
        # each model's sampled rows are taken as soon as its forward is done and its whole-sequence
        # K/V dropped before the next forward: the target's forward runs beside the source's sampled
        # rows (1/stride of its cache), not beside its whole cache
        sk, sv = self._content(self.source_model, self.source_adapter, self.source_spec, ids)
        out = {"xk": self._sampled(sk, pos), "xv": self._sampled(sv, pos)}
        del sk, sv
        if attention:
            tk, tv, rk, rv = self._target_with_repair(ids)
        else:
            tk, tv = self._content(self.target_model, self.target_adapter, self.target_spec, ids)
        out.update(yk=self._sampled(tk, pos), yv=self._sampled(tv, pos))
        del tk, tv
        if attention:
            for name, r in (("rk", rk), ("rv", rv)):  # [L, H, T] -> sampled, mean 1 -> [n, L, H]
                out[name] = torch.cat(
                    [normalise(r[b].index_select(2, p)).permute(2, 0, 1).to(torch.float32) for b, p in enumerate(pos)]
                )
            out["seq"] = torch.cat(
                [torch.full((len(p),), int(i), dtype=torch.long, device=p.device) for i, p in zip(seq_idx, pos)]
            )
        held = torch.cat([torch.full((len(p),), bool(self.held[i]), device=p.device) for i, p in zip(seq_idx, pos)])
        self.seconds += time.perf_counter() - t0
        return out, held

    @staticmethod
    def _sampled(layers, pos):
        """``[n, L, H, D]`` float32: each sequence's kept positions of every layer's ``[B, H, T, D]``,
        written straight into one buffer (no per-sequence stacks and no concatenated copy)."""
        first = layers[0]
        n = sum(len(p) for p in pos)
        out = torch.empty(n, len(layers), first.shape[1], first.shape[3], dtype=torch.float32, device=first.device)
        row = 0
        for b, p in enumerate(pos):
            for j, t in enumerate(layers):  # [H, T, D] -> [H, n_b, D] -> rows [n_b, H, D] of layer j
                out[row : row + len(p), j].copy_(t[b].index_select(1, p.to(t.device)).transpose(0, 1))
            row += len(p)
        return out

    # -- accumulation ------------------------------------------------------------------------------------
    def accumulate(self, jobs: list, *, tag: str = "pass") -> list:
        """Run this rank's sequences once, updating every job (a :class:`~kvbridge.fit.stats.LayerStats`).

        Checkpoints the statistics after batches (when a checkpoint is set) and resumes from
        one; all-reduces across ranks at the end (when distributed).
        """
        batches = self.batches()
        done = 0 if self.checkpoint is None else self.checkpoint.restore(tag, jobs, rank=self.rank, world=self.world)
        progress = self.progress if self.progress is not None else (lambda event: None)
        progress(("start", tag, sum(len(b) for b in batches[done:]) * self.seq_len))
        attention = any(getattr(job, "needs_attention", False) for job in jobs)
        for bi in range(done, len(batches)):
            feats, held = self.features(batches[bi], attention=attention)
            for job in jobs:
                job.update(feats, held)
            del feats, held  # this batch's rows are not held through the next batch's forwards
            if self.checkpoint is not None:
                self.checkpoint.maybe_save(tag, jobs, done=bi + 1, total=len(batches), rank=self.rank, world=self.world)
            fault_point("fit.batch")
            progress(("advance", tag, len(batches[bi]) * self.seq_len))
        progress(("end", tag, 0))
        if self.dist is not None and self.world > 1:
            from kvbridge.fit.stats import all_reduce

            all_reduce([s for job in jobs for s in job.all_stats()], group=self.dist.group)
        return jobs

    def sample(self, max_obs: int | None = None) -> tuple[dict, Any]:
        """Materialised features of up to ``max_obs`` observations (train and held-out, in order)."""
        parts, masks = [], []
        for batch in self.batches():
            feats, held = self.features(batch)
            parts.append({k: v.cpu() for k, v in feats.items()})  # the sample lives in host memory
            masks.append(held.cpu())
            if self.progress is not None:
                self.progress(("advance", "sample", len(batch) * self.seq_len))
            if max_obs is not None and sum(map(len, masks)) >= max_obs:
                break
        feats = {k: torch.cat([p[k] for p in parts])[:max_obs] for k in parts[0]}  # [:None]: all of them
        return feats, torch.cat(masks)[:max_obs]

    def describe(self) -> dict:
        return {
            **asdict(self.config),
            "seq_len": self.seq_len,
            "sequences": self.num_sequences,
            "tokens": self.num_sequences * self.seq_len,
            "heldout_sequences": int(self.held.sum()),
            "observations_train": self.observations("train"),
            "observations_heldout": self.observations("held"),
        }


__all__ = [
    "PairedCalibration",
    "CalibrationConfig",
    "CalibrationError",
    "load_corpus",
    "tokenize_corpus",
    "check_same_tokens",
]
