"""Candidate selection by what the target does (``ridge -o select=kl``).

Each candidate mapping is scored on the calibration's **held-out** sequences (whole sequences
the statistics' training split never saw): the first ``prefix`` tokens are prefilled by the
source and mapped, the target then reads the next ``suffix`` tokens from that cache, and the
score is the mean over suffix positions and sequences of ``KL(native || mapped)`` between the
target's next-token distributions from its own cache and from the mapped one (nats; lower is
better). The native logits and the source prefill are computed once for all candidates.
"""

from __future__ import annotations

import torch

from kvbridge.fit.solve import FitError
from kvbridge.transfer import transfer


def held_sequences(calibration) -> torch.Tensor:
    held = calibration.held
    if not bool(held.any()):
        raise FitError(
            "-o select=kl needs held-out calibration sequences, there are none",
            "give more sequences (more --tokens) or a non-zero --heldout, or use -o select=r2",
        )
    return calibration.sequences[held]


def suffix_kl(calibration, mappings: list, *, prefix_share: float = 0.5, suffix: int = 32) -> list[float]:
    """Mean suffix KL(native || mapped) per mapping in ``mappings`` (see the module docstring)."""
    ids = held_sequences(calibration)
    n, t = ids.shape
    p = max(1, min(t - 1, int(round(prefix_share * t))))
    s = max(1, min(int(suffix), t - p))
    src, tgt = calibration.source_model, calibration.target_model
    sad, tad = calibration.source_adapter, calibration.target_adapter
    dev = next(tgt.parameters()).device
    totals = [0.0] * len(mappings)
    bs = max(1, int(calibration.config.batch_size))
    with torch.no_grad():
        for a in range(0, n, bs):
            rows = ids[a : a + bs].to(dev)
            # native row j predicts token j + 1; the suffix read from the mapped cache gives rows p .. p + s - 1
            native = tgt(input_ids=rows[:, : p + s]).logits[:, p : p + s].float().log_softmax(-1)
            state = sad.extract(src, rows[:, :p], spec=calibration.source_spec)
            for j, mapping in enumerate(mappings):
                mapped = transfer(state, mapping, calibration.target_spec, host=calibration.host)
                cache = tad.inject(mapped, tgt)
                got = tgt(input_ids=rows[:, p : p + s], cache=cache, use_cache=True).logits.float().log_softmax(-1)
                kl = (native.exp() * (native - got)).sum(-1)
                totals[j] += float(kl.sum())
    return [x / (n * s) for x in totals]  # every held-out sequence scores s suffix positions
