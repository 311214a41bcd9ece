"""What the CLI needs beyond the library: model loading for one model, and ``eval --recompute-*``."""

from __future__ import annotations

from pathlib import Path

from kvbridge.recompute.layers import RecomputeError

SMOLLM2_DIR = Path("~/.cache/kvbridge/models/smollm2-135m-instruct").expanduser()


def load_one(ref: str, *, dtype: str = "float32"):
    """``(model, tokenizer, name)`` of ``zoo:NAME``, ``smollm2``, a ``.gguf`` file, a GGUF folder or a model folder.

    Uses :mod:`kvbridge.models` when it is installed (the loading layer); otherwise this small
    stand-in, offline only (``local_files_only``), never running code shipped with a model.
    """
    try:  # the shared loading layer, when it has landed
        from kvbridge.models import load  # type: ignore

        loaded = load(ref, dtype=dtype)
        return loaded.model.eval(), loaded.tokenizer, ref
    except ImportError:
        pass
    import torch
    from transformers.utils import logging as hf_logging

    from kvbridge.models.hf_loader import model_from_pretrained, tokenizer_from_pretrained

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    kw = {"dtype": getattr(torch, dtype)}
    if ref.startswith("zoo:"):
        from kvbridge.zoo.load import load_zoo_model

        model, tok = load_zoo_model(ref[4:], dtype=getattr(torch, dtype))
        return model, tok, ref
    path = SMOLLM2_DIR if ref == "smollm2" else Path(ref).expanduser()
    gguf = None
    if path.is_file() and path.suffix == ".gguf":
        path, gguf = path.parent, path.name
    elif path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        gguf = found[0].name if found else None
    if not path.exists() or (path.is_dir() and gguf is None and not (path / "config.json").exists()):
        raise RecomputeError(f"{ref}: no model folder, .gguf file or zoo:NAME there",
                             "pass a local model folder, a .gguf file, smollm2 or zoo:base")
    try:
        if gguf:
            model = model_from_pretrained(path, gguf_file=gguf, **kw)
            tok = tokenizer_from_pretrained(path, gguf_file=gguf)
        else:
            model = model_from_pretrained(path, **kw)
            tok = tokenizer_from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise RecomputeError(f"{ref}: cannot load ({' '.join(str(exc).split())[:160]})",
                             "pass a folder written by save_pretrained or a .gguf file") from None
    return model.eval(), tok, ref


def split_list(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def eval_recompute(smodel, tmodel, mapping, ids, *, texts, tokenizer, prefix_len, continuation_len, layers_spec,
                   tokens_spec, sweep, mode, select, group_size, calibration_samples, batch_size, attention, bootstrap,
                   seed, report_dir=None, progress=None) -> tuple[dict, dict]:
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
    result = curve.run_curve(smodel, tmodel, mapping, ids, prefix_len=prefix_len, continuation_len=continuation_len,
                             layer_points_=uniq, token_ratios=ratios, mode=mode, batch_size=batch_size,
                             attention=attention, bootstrap=bootstrap, seed=seed, progress=progress)
    if calib is not None:
        info = next((p[2] for p in uniq if p[2].get("method") != "named"), {})
        result["selection"] = {k: v for k, v in info.items()}
        result["calibration"] = {"samples": calibration_samples, "source": "the corpus's front (first half of the "
                                 "first 90%), never the evaluation tail"}
    written = report.write(result, report_dir, "recompute_curve", "selective recompute") if report_dir else {}
    return result, written


__all__ = ["load_one", "eval_recompute", "split_list"]
