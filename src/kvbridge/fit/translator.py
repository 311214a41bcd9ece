"""The ``translator`` fitter: the ridge map, then a trained residual per target layer.

1. The ``ridge`` fitter (:class:`kvbridge.fit.ridge.RidgeFitter`, called, not re-implemented)
   fits the dense map on the calibration's statistics (``top_k``, ``alpha``, ``memory_budget``).
2. One more pass of both models collects what the residual trains on
   (:mod:`kvbridge.fit.translator_data`): source content K/V, the ridge-mapped target cache,
   the target's queries at ``queries`` positions per sequence and their native attention outputs.
3. ``steps`` AdamW steps (``lr``, ``weight_decay``; ``batch`` training sequences per step, drawn
   from ``seed`` and the step number) on the mean over target layers of the relative
   attention-output error; the residual is low rank (``rank``) or a bottleneck MLP
   (``hidden``), its output layer zero at the start, so step 0 is the ridge map exactly.
4. Optionally ``kl_steps`` more steps on the next-token KL to the target's native logits over the
   last ``kl_suffix`` tokens of each sequence, through the frozen target (gradients reach the
   residual through the mapped cache only).

Deterministic under ``seed`` (same inputs, same threads: bitwise equal artifacts). Resumable:
with ``resume=DIR`` (or ``kvbridge fit --resume``: ``.<out>.fitstate/translator/``) the training
state (weights, AdamW moments, step) is written to ``DIR/translator-state.safetensors`` every
``checkpoint_every`` steps and a run with the same inputs continues from it, giving the result
of an uninterrupted run. The manifest's ``training`` records the losses before and after, on
the training and the held-out sequences, the held-out attention-output cosine, the loss curve
and the time per step.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from kvbridge.faults import fault_point
from kvbridge.fit.settings import DEFAULT_TOP_K
from kvbridge.fit.ridge import RidgeFitter, RidgeOptions, check_alpha, check_top_k
from kvbridge.fit.solve import DEFAULT_ALPHA, LOW_R2, FitError, require_calibration

STATE_FILE = "translator-state.safetensors"


def _bad(name: str, value, want: str, example: str) -> FitError:
    return FitError(f"translator option {name}={value!r} {want}", f"pass e.g. -o {name}={example}")


@dataclass(frozen=True)
class TranslatorOptions:
    """Options of ``translator`` (``-o key=value``): the ridge's, then the residual and its training."""

    top_k: int = DEFAULT_TOP_K  # ridge: source layers per target layer
    alpha: float | str = DEFAULT_ALPHA  # ridge strength, or "auto"
    memory_budget: int | None = None  # ridge statistics bytes
    low_r2: float = LOW_R2  # warn below this mean held-out R² (of the ridge)
    rank: int = 16  # low-rank residual of this rank (used when hidden is 0)
    hidden: int = 0  # > 0: a bottleneck MLP residual with this many hidden units instead
    steps: int = 200  # AdamW steps on the attention-output error
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    batch: int = 2  # training sequences per step
    queries: int = 64  # query positions per sequence in the loss (0: every position)
    kl_steps: int = 0  # then this many steps on next-token KL to the native logits
    kl_suffix: int = 16  # tokens at the end of each sequence the KL stage scores
    kl_lr: float | None = None  # learning rate of the KL stage (None: lr)
    init: str | None = None  # start from this ridge mapping folder (kvbridge fit --fitter ridge) instead of fitting one
    resume: str | None = None  # folder of the training checkpoint (continue from it when present)
    checkpoint_every: int = 50  # steps between checkpoints (with resume)

    def __post_init__(self):
        check_top_k(self.top_k)
        check_alpha(self.alpha)
        for name, example in (
            ("rank", 16),
            ("hidden", 16),
            ("steps", 100),
            ("kl_steps", 100),
            ("queries", 100),
            ("seed", 0),
        ):
            if getattr(self, name) < 0:
                raise _bad(name, getattr(self, name), "must be >= 0", example)
        if self.rank > 0 and self.hidden > 0:
            raise FitError(
                f"translator options rank={self.rank} and hidden={self.hidden} both set: the residual is "
                "low rank or an MLP, not both",
                "pass -o rank=0 -o hidden=64 (MLP) or leave hidden at 0 (low rank)",
            )
        if self.rank == 0 and self.hidden == 0:
            raise FitError(
                "translator options rank=0 and hidden=0 leave no residual", "pass -o rank=16 or -o hidden=64"
            )
        for name in ("lr",) + (("kl_lr",) if self.kl_lr is not None else ()):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise _bad(name, v, "must be a positive number", "1e-3")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise _bad("weight_decay", self.weight_decay, "must be a number >= 0", "0.01")
        for name in ("batch", "kl_suffix", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise _bad(name, getattr(self, name), "must be >= 1", 2)

    @property
    def kind(self) -> str:
        return "mlp" if self.hidden > 0 else "lowrank"

    def ridge(self) -> RidgeOptions:
        return RidgeOptions(top_k=self.top_k, alpha=self.alpha, memory_budget=self.memory_budget, low_r2=self.low_r2)


# -- the residual's parameters and a deterministic AdamW ------------------------------------------------
def init_params(data, options: TranslatorOptions, out_dim: int) -> tuple[dict, dict]:
    """``(params, fixed)``: per ``"k"|"v"`` the trainable tensors stacked over target layers (output
    layer zero) and the fixed normalisation (``mu``, ``inv`` ``[L, F]``) from the training
    sequences' features; ``data.x`` is normalised in place."""
    g = torch.Generator().manual_seed(int(options.seed))
    train = data.train_index
    params, fixed = {}, {}
    for name in ("k", "v"):
        x = data.x[name]
        xt = x[train].double()
        mu = xt.mean((0, 2))  # [L, F]
        sd = xt.var((0, 2), unbiased=False).sqrt()
        del xt
        inv = 1.0 / torch.maximum(sd, 1e-6 * sd.amax(1, keepdim=True).clamp_min(1e-30))
        mu, inv = mu.float(), inv.float()
        x.sub_(mu[:, None]).mul_(inv[:, None])
        fixed[name] = {"mu": mu, "inv": inv}
        lt, f = mu.shape
        if options.kind == "lowrank":
            params[name] = {
                "a": torch.randn(lt, f, options.rank, generator=g) / math.sqrt(f),
                "b": torch.zeros(lt, options.rank, out_dim),
            }
        else:
            params[name] = {
                "w1": torch.randn(lt, f, options.hidden, generator=g) / math.sqrt(f),
                "b1": torch.zeros(lt, options.hidden),
                "w2": torch.zeros(lt, options.hidden, out_dim),
                "b2": torch.zeros(lt, out_dim),
            }
    return params, fixed


class AdamW:
    """AdamW over a flat list of tensors, its state a plain dict of tensors (checkpointed as is)."""

    def __init__(self, tensors: list, lr: float, weight_decay: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.tensors, self.lr, self.wd, self.betas, self.eps = tensors, lr, weight_decay, betas, eps
        self.m = [torch.zeros_like(t) for t in tensors]
        self.v = [torch.zeros_like(t) for t in tensors]
        self.step_count = 0

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.step_count += 1
        c1, c2 = 1 - b1**self.step_count, 1 - b2**self.step_count
        for p, m, v in zip(self.tensors, self.m, self.v):
            if p.grad is None:
                continue
            p.mul_(1 - lr * self.wd)
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m / c1, (v / c2).sqrt_().add_(self.eps), value=-lr)
            p.grad = None


def _run_key(options: TranslatorOptions, data, ridge) -> str:
    """What a checkpoint must match to be continued: options (less the checkpointing ones), the
    token ids and the ridge map."""
    h = hashlib.sha256()
    opts = {k: v for k, v in asdict(options).items() if k not in ("resume", "checkpoint_every", "steps", "kl_steps")}
    h.update(json.dumps(opts, sort_keys=True, default=str).encode())
    h.update(data.ids.contiguous().numpy().tobytes())
    for name, t in sorted(ridge.tensors().items()):
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def save_state(folder: Path, key: str, params: dict, opt: AdamW, step: int, curve: list) -> None:
    from safetensors.torch import save

    from kvbridge.artifacts import write_file_atomic

    trios = enumerate(zip(opt.tensors, opt.m, opt.v))  # parameter, first and second moments
    tensors = {f"{n}.{i}": t.detach().contiguous() for i, trio in trios for n, t in zip("pmv", trio)}
    meta = {"key": key, "step": str(step), "adam_step": str(opt.step_count), "curve": json.dumps(curve)}
    folder.mkdir(parents=True, exist_ok=True)
    write_file_atomic(folder / STATE_FILE, save(tensors, metadata=meta))


def load_state(folder: Path, key: str, opt: AdamW) -> tuple[int, list] | None:
    """Restore the state in ``folder`` into ``opt`` (its tensors are the parameters); ``(step, curve)``,
    or None when there is none. A state of another run is refused."""
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if meta.get("key") != key:
            raise FitError(
                f"{path} holds the training state of another translator run (options, data or ridge map differ)",
                "start afresh: remove it, or pass another -o resume=DIR",
            )
        with torch.no_grad():
            for i, trio in enumerate(zip(opt.tensors, opt.m, opt.v)):  # parameter, first and second moments
                for n, t in zip("pmv", trio):
                    t.copy_(fh.get_tensor(f"{n}.{i}"))
    opt.step_count = int(meta["adam_step"])
    return int(meta["step"]), json.loads(meta.get("curve", "[]"))


class TranslatorFitter:
    """``translator``: ridge, then a residual trained on the target's per-layer attention-output error."""

    name = "translator"
    Options = TranslatorOptions

    @staticmethod
    def _start(source_spec, target_spec, calibration, options: TranslatorOptions):
        """The ridge map the residual starts from: fitted here, or loaded from ``options.init`` (a
        ``ridge`` mapping of these very models, fingerprints checked)."""
        if options.init is None:
            return RidgeFitter().fit(source_spec, target_spec, calibration, options.ridge())
        from kvbridge.fit.artifact import load_mapping

        ridge = load_mapping(options.init, source=calibration.source_model, target=calibration.target_model)
        if ridge.fitter != "ridge" or ridge.mode != "dense" or type(ridge).__name__ != "FittedMapping":
            raise FitError(
                f"translator option init={options.init!r} is a {ridge.fitter} ({ridge.mode}) mapping, not a ridge one",
                "pass a folder written by `kvbridge fit --fitter ridge`, or leave init out",
            )
        return ridge

    def fit(self, source_spec, target_spec, calibration=None, options: TranslatorOptions = TranslatorOptions()):
        from kvbridge.fit.translator_data import collect, kl_loss, layer_losses, measure
        from kvbridge.fit.translator_mapping import TranslatorMapping, tensor_name
        from kvbridge.progress import Progress

        require_calibration(calibration, "translator", "trains in one process")
        if options.kl_steps and options.kl_suffix >= calibration.seq_len:
            raise _bad("kl_suffix", options.kl_suffix, f"must be below --seq-len {calibration.seq_len}", 16)
        ridge = self._start(source_spec, target_spec, calibration, options)
        seq_len = calibration.seq_len
        show = calibration.progress is not None and getattr(calibration.progress, "enabled", True)
        t0 = time.perf_counter()
        bar = Progress(calibration.num_sequences * seq_len, label="translator data", unit="tokens", enabled=show)
        data = collect(
            calibration,
            ridge,
            queries=options.queries,
            suffix=options.kl_suffix * bool(options.kl_steps),
            progress=lambda n: bar.update(bar.done + n, tokens=n),
        )
        bar.close()
        collect_s = time.perf_counter() - t0
        train, held = data.train_index, data.held_index
        if len(train) == 0:
            raise FitError("the translator needs training sequences (all are held out)", "lower --heldout")
        params, fixed = init_params(data, options, target_spec.num_kv_heads * target_spec.head_dim)
        kind = options.kind
        trained = [params[c][n].requires_grad_(True) for c in sorted(params) for n in sorted(params[c])]
        opt = AdamW(trained, options.lr, options.weight_decay)
        key = _run_key(options, data, ridge)
        folder = Path(options.resume) if options.resume else None
        ck = getattr(calibration, "checkpoint", None)
        if folder is None and ck is not None:
            folder = Path(ck.folder) / "translator"
        resume_from = getattr(ck, "resume", True) if options.resume is None else True

        def measured():
            return {"train": measure(data, params, kind, train), "heldout": measure(data, params, kind, held)}

        before = measured()
        got = load_state(folder, key, opt) if folder is not None and resume_from else None
        start, curve = got or (0, [])
        total = options.steps + options.kl_steps
        bar = Progress(total, label="translator", unit="steps", enabled=show)
        bar.update(start)
        frozen = [p for p in calibration.target_model.parameters() if p.requires_grad]
        t_train = time.perf_counter()
        try:
            for p in frozen:
                p.requires_grad_(False)
            with torch.enable_grad():
                for step in range(start, total):
                    g = torch.Generator().manual_seed(int(options.seed) * 1_000_003 + step)
                    rows = train[torch.randperm(len(train), generator=g)[: options.batch]]
                    attention = step < options.steps  # else the KL stage
                    if attention:
                        loss = layer_losses(data, params, kind, rows).mean()
                    else:
                        loss = kl_loss(data, params, kind, rows, calibration.target_model)
                    loss.backward()
                    opt.step(lr=options.lr if attention or options.kl_lr is None else options.kl_lr)
                    if step % max(1, total // 20) == 0 or step == total - 1:
                        curve.append([step, "attention" if attention else "kl", round(float(loss.detach()), 6)])
                    done = step + 1
                    if folder is not None and (done % options.checkpoint_every == 0 or done == total):
                        save_state(folder, key, params, opt, done, curve)
                    bar.update(done, tokens=len(rows) * seq_len)
                    fault_point("translator.step")
        finally:
            for p in frozen:
                p.requires_grad_(True)
            bar.close()
        train_s = time.perf_counter() - t_train
        for t in opt.tensors:
            t.requires_grad_(False)
        after = measured()
        residual = {
            tensor_name(layer, name, n): t[layer].detach().clone()
            for name in ("k", "v")
            for n, t in {**fixed[name], **params[name]}.items()
            for layer in range(target_spec.num_layers)
        }
        training = {
            "objective": "mean over target layers of ||attn(q, K_map, V_map) - attn(q, K, V)||^2 / ||attn(q, K, V)||^2",
            "before": before,
            "after": after,
            "curve": curve,
            "steps": options.steps,
            "kl_steps": options.kl_steps,
            "resumed_at_step": start,
            "ridge_from": options.init,
            "ridge_calibration": (ridge.manifest or {}).get("calibration") if options.init else None,
            "query_positions": int(len(data.qpos)),
            "train_sequences": int(len(train)),
            "heldout_sequences": int(len(held)),
            "collect_seconds": round(collect_s, 3),
            "train_seconds": round(train_s, 3),
            "seconds_per_step": round(train_s / (total - start), 4) if total > start else None,
            "data_bytes": data.nbytes(),
        }
        report = replace(
            ridge.report,
            fitter=self.name,
            params={**ridge.report.params, **{k: v for k, v in asdict(options).items() if k not in ("resume",)}},
            training=training,
        )
        return TranslatorMapping(
            ridge.source_spec,
            ridge.target_spec,
            ridge.layers,
            fitter=self.name,
            report=report,
            residual=residual,
            residual_kind=kind,
            residual_size=options.hidden or options.rank,  # the one that is set (both >= 0, one > 0)
        )
