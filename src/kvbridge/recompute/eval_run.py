"""``eval --recompute-*`` (the recompute curve behind the eval command) and the list parsing ``graft`` uses."""

from __future__ import annotations


def split_list(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def eval_recompute(
    smodel,
    tmodel,
    mapping,
    ids,
    *,
    texts,
    tokenizer,
    prefix_len,
    continuation_len,
    layers_spec,
    tokens_spec,
    sweep,
    mode,
    token_rules=("deviation",),
    select,
    group_size,
    calibration_samples,
    batch_size,
    attention,
    bootstrap,
    seed,
    report_dir=None,
    progress=None,
) -> tuple[dict, dict]:
    """Run ``kvbridge eval --recompute-*``: ``(result, written files)``."""
    import torch

    from kvbridge.evaluate import windows
    from kvbridge.recompute import curve, report
    from kvbridge.recompute.layers import calibration, parse_layers
    from kvbridge.recompute.tokens import parse_ratio

    n_layers = tmodel.config.num_hidden_layers
    # one point per ';'-separated spec ("3,7-9" is one set of layers)
    layer_specs = [x.strip() for x in layers_spec.split(";") if x.strip()] if layers_spec else []
    ratios = [parse_ratio(x) for x in split_list(tokens_spec)] if tokens_spec else []
    if sweep in ("tokens", "both"):
        ratios = sorted(set(ratios) | set(curve.TOKEN_SWEEP))
    parsed = [parse_layers(s, n_layers) for s in layer_specs]  # fail early on a typo
    need_calib = sweep in ("layers", "both") or any(p and p[0] == "auto" for p in parsed)
    calib = None
    if need_calib:
        front = "\n".join(texts)
        front = front[: int(len(front) * 0.9)]
        stream = torch.tensor(tokenizer(front, add_special_tokens=False)["input_ids"], dtype=torch.long)
        cal = windows(stream[: len(stream) // 2], calibration_samples, prefix_len + continuation_len + 1)
        calib = calibration(smodel, tmodel, mapping, cal, prefix_len, continuation_len, batch_size=batch_size)
    points = []
    for spec in layer_specs:
        points += curve.layer_points(spec, tmodel, calib, method=select, group_size=group_size)
    if sweep in ("layers", "both"):
        points += curve.layer_sweep(tmodel, calib, method=select, group_size=group_size)
    seen, uniq = set(), []
    for p in points:
        if p[1] not in seen:
            seen.add(p[1])
            uniq.append(p)
    result = curve.run_curve(
        smodel,
        tmodel,
        mapping,
        ids,
        prefix_len=prefix_len,
        continuation_len=continuation_len,
        layer_points_=uniq,
        token_ratios=ratios,
        token_rules=tuple(token_rules),
        mode=mode,
        batch_size=batch_size,
        attention=attention,
        bootstrap=bootstrap,
        seed=seed,
        progress=progress,
    )
    if calib is not None:
        info = next((p[2] for p in uniq if p[2].get("method") != "named"), {})
        result["selection"] = {k: v for k, v in info.items()}
        result["calibration"] = {
            "samples": calibration_samples,
            "source": "the corpus's front (first half of the first 90%), never the evaluation tail",
        }
    written = report.write(result, report_dir, "recompute_curve", "selective recompute") if report_dir else {}
    return result, written


__all__ = ["eval_recompute", "split_list"]
