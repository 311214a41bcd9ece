"""Fitted tensors of six zoo fits, to compare two trees bit for bit (a change meant to move memory,
not results).

    PYTHONPATH=/work/main/src python bench/bench_fit_bits.py main.safetensors
    PYTHONPATH=src python bench/bench_fit_bits.py now.safetensors
    python bench/bench_fit_bits.py --compare main.safetensors now.safetensors

The fits (zoo:base -> zoo:stranger, 4,096 seeded random tokens, 1 thread): ridge (seq-len 512,
stride 2, top-k 2); stride 3 + skip 1 + batch 3 (ragged sequences); a blocked fit under a 3 MB
budget (7 passes); ridge-headwise; ``weighting=attention``; ``support=head-local``.
"""

from __future__ import annotations

import argparse
import tempfile


def fits(out: str) -> None:
    import torch
    from safetensors.torch import save_file

    from kvbridge.fit import fit
    from kvbridge.fit.calibrate import CalibrationConfig
    from kvbridge.models import load

    torch.set_num_threads(1)
    src = load("zoo:base", dtype="float32").model
    tgt = load("zoo:stranger", dtype="float32").model
    ids = torch.randint(10, src.config.vocab_size, (4096,), generator=torch.Generator().manual_seed(1))
    cases = {
        "default": dict(calibration=CalibrationConfig(seq_len=512, stride=2), top_k=2),
        "stride3skip1": dict(calibration=CalibrationConfig(seq_len=256, stride=3, skip=1, batch_size=3), top_k=2),
        "blocked": dict(calibration=CalibrationConfig(seq_len=512, stride=2), top_k=2, memory_budget=3_000_000),
        "headwise": dict(calibration=CalibrationConfig(seq_len=512, stride=2), fitter="ridge-headwise"),
        "attention": dict(
            calibration=CalibrationConfig(seq_len=256, stride=2), top_k=2, options={"weighting": "attention"}
        ),
        "headlocal": dict(
            calibration=CalibrationConfig(seq_len=256, stride=2), top_k=2, options={"support": "head-local"}
        ),
    }
    tensors = {}
    for name, kw in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            m = fit(src, tgt, ids, out=tmp + "/m", overwrite=True, distributed=None, **kw)
        for k, v in m.tensors().items():
            tensors[f"{name}.{k}"] = v.contiguous()
        print(f"{name}: {len(m.report.passes or [])} pass(es)")
    save_file(tensors, out)
    print(f"{len(tensors)} tensors -> {out}")


def compare(a: str, b: str) -> None:
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    if ta.keys() != tb.keys():
        raise SystemExit(f"different tensor names: {sorted(set(ta) ^ set(tb))}")
    bad = [k for k in ta if not torch.equal(ta[k], tb[k])]
    print(f"{len(ta)} tensors, {len(bad)} differ" + (f": {bad}" if bad else " (bitwise equal)"))
    raise SystemExit(1 if bad else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
    elif args.out:
        fits(args.out)
    else:
        ap.error("give OUT.safetensors or --compare A B")


if __name__ == "__main__":
    main()
