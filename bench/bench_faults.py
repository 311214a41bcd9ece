"""kill -9 at random points of `fit`, `pack save` and `eval`; then check nothing is corrupt.

For each trial a writer replaces an existing artifact (`--overwrite`) and is killed with
SIGKILL after a random delay (uniform over the command's measured run time). Then:

- the output path holds either the previous artifact byte for byte or a complete new one that
  reads back (checksum, manifest, tensors) — never a half-written one;
- leftovers of the killed writer (temp folders, lock file) are only hidden siblings, and the
  next writer to that output removes them;
- `fit --resume` after the kill finishes with a mapping bit-identical to an uninterrupted fit;
- eval's partial JSONL parses completely (every line a whole record).

Usage: python bench/bench_faults.py [--trials N] [--seed S]   (about 1 min per 3 trials on 2 busy cores)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT / "src"),
    "KVBRIDGE_CHECKPOINT_EVERY": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
CORPUS = (
    "The quick brown fox jumps over the lazy dog. You are a careful assistant. Answer in a numbered list, "
    "one item per line. Define zorp: a zorp is a small blue fruit that tastes like lemon. What colour is a "
    "zorp? List three fruits.\n"
) * 60


def build_models(root: Path) -> tuple[Path, Path, Path]:
    """Two tiny Llamas (seeds 0 and 1) sharing a freshly trained byte-level BPE, and a corpus."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS.split("\n"),
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<s>", "</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=96,
            vocab_size=len(fast),
        )
        folder = root / f"model{seed}"
        AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        fast.save_pretrained(folder)
        out.append(folder)
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS)
    return out[0], out[1], corpus


def kv(*args, check=True, env=None) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [sys.executable, "-m", "kvbridge", *map(str, args)], capture_output=True, text=True, env=env or ENV
    )
    if check and res.returncode not in (0, 1):
        raise SystemExit(f"kvbridge {' '.join(map(str, args))} failed: {res.stderr[-800:]}")
    return res


def snap(path: Path) -> dict:
    return (
        {
            str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*"))
            if p.is_file()
        }
        if path.exists()
        else {}
    )


def killed(args, delay: float) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvbridge", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    t0 = time.monotonic()
    try:
        proc.wait(timeout=delay)
        return -1.0  # finished before the kill
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return time.monotonic() - t0


def hidden_leftovers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


def valid(kind: str, path: Path) -> bool:
    sys.path.insert(0, str(ROOT / "src"))
    from kvbridge.artifacts import read_artifact

    try:
        manifest, _ = read_artifact(path)
        return bool(manifest.get("kind"))
    except Exception:  # noqa: BLE001
        return False


def timed(args) -> float:
    t0 = time.perf_counter()
    kv(*args)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix="kvbridge-faults-"))
    src, tgt, corpus = build_models(root)
    fit_args = lambda out: [
        "fit",
        src,
        tgt,
        "--corpus",
        corpus,
        "--out",
        out,
        "--seq-len",
        32,
        "--tokens",
        1024,  # noqa: E731
        "--top-k",
        1,
        "--stride",
        2,
        "--batch-size",
        2,
        "--quiet",
    ]
    ref = root / "ref"
    t_fit = timed(fit_args(ref))
    from safetensors.torch import load_file

    ref_t = load_file(str(ref / "mapping.safetensors"))
    pack_args = lambda out: ["pack", "save", src, "--guide", "Define zorp: a zorp is a small blue fruit.", "--out", out]  # noqa: E731
    t_pack = timed(pack_args(root / "pack0"))
    eval_args = lambda rep: [
        "eval",
        src,
        tgt,
        "--mapping",
        ref,
        "--corpus",
        corpus,
        "--samples",
        6,
        "--prefix-len",
        16,  # noqa: E731
        "--continuation-len",
        4,
        "--greedy-tokens",
        2,
        "--bootstrap",
        0,
        "--batch-size",
        1,
        "--report",
        rep,
        "--allow-overlap",
    ]
    t_eval = timed(eval_args(root / "rep0"))
    print(f"uninterrupted: fit {t_fit:.1f} s, pack save {t_pack:.1f} s, eval {t_eval:.1f} s")
    rows, bad = [], 0
    for trial in range(a.trials):
        # fit --overwrite --resume over a previous mapping, killed, then resumed
        out = root / f"fit{trial}"
        shutil.copytree(ref, out)
        before = snap(out)
        at = killed([*fit_args(out), "--overwrite", "--resume"], rng.uniform(0.3, t_fit))
        state = "old" if snap(out) == before else ("new-valid" if valid("mapping", out) else "CORRUPT")
        left = hidden_leftovers(root, out.name)
        kv(*fit_args(out), "--overwrite", "--resume")
        got = load_file(str(out / "mapping.safetensors"))
        identical = got.keys() == ref_t.keys() and all(bool((got[k] == ref_t[k]).all()) for k in got)
        after = hidden_leftovers(root, out.name)
        ok = state != "CORRUPT" and identical and not after
        bad += not ok
        rows.append(("fit", trial, at, state, len(left), identical, len(after), ok))
        # pack save --overwrite over a previous pack
        out = root / f"pack{trial + 1}"
        shutil.copytree(root / "pack0", out)
        before = snap(out)
        at = killed([*pack_args(out), "--overwrite"], rng.uniform(0.3, t_pack))
        state = "old" if snap(out) == before else ("new-valid" if valid("pack", out) else "CORRUPT")
        left = hidden_leftovers(root, out.name)
        kv(*pack_args(out), "--overwrite")
        after = hidden_leftovers(root, out.name)
        ok = state != "CORRUPT" and not after and valid("pack", out)
        bad += not ok
        rows.append(("pack save", trial, at, state, len(left), None, len(after), ok))
        # eval --report over a previous report
        rep = root / f"rep{trial + 1}"
        shutil.copytree(root / "rep0", rep)
        before = snap(rep)
        at = killed(eval_args(rep), rng.uniform(0.3, t_eval))
        state = (
            "old"
            if snap(rep) == before
            else ("new" if (rep / "eval.json").is_file() and json.loads((rep / "eval.json").read_text()) else "CORRUPT")
        )
        partial = Path(str(rep) + ".partial.jsonl")
        units = -1
        if partial.exists():
            units = sum(1 for line in partial.read_text().splitlines() if json.loads(line)["record"] == "unit")
        ok = state != "CORRUPT"
        bad += not ok
        rows.append(("eval", trial, at, state, len(hidden_leftovers(root, rep.name)), units, None, ok))
    # deterministic kills at named points (kvbridge.faults): inside the temp folder, mid-calibration, mid-eval
    points = [
        ("fit", "fit.batch:3:kill"),
        ("fit", "fit.batch:9:kill"),
        ("fit", "artifact.write:1:kill"),
        ("pack save", "artifact.write:1:kill"),
        ("eval", "eval.batch:2:kill"),
        ("eval", "eval.batch:5:kill"),
    ]
    for i, (cmd, point) in enumerate(points):
        env = {**ENV, "KVBRIDGE_FAULT": point}
        name = f"pt{i}"
        if cmd == "fit":
            out = root / name
            shutil.copytree(ref, out)
            before = snap(out)
            res = kv(*fit_args(out), "--overwrite", "--resume", check=False, env=env)
            state = "old" if snap(out) == before else ("new-valid" if valid("mapping", out) else "CORRUPT")
            left = hidden_leftovers(root, out.name)
            kv(*fit_args(out), "--overwrite", "--resume")
            got = load_file(str(out / "mapping.safetensors"))
            extra = got.keys() == ref_t.keys() and all(bool((got[k] == ref_t[k]).all()) for k in got)
            after = hidden_leftovers(root, out.name)
            ok = res.returncode == -9 and state != "CORRUPT" and extra and not after
        elif cmd == "pack save":
            out = root / name
            shutil.copytree(root / "pack0", out)
            before = snap(out)
            res = kv(*pack_args(out), "--overwrite", check=False, env=env)
            state = "old" if snap(out) == before else ("new-valid" if valid("pack", out) else "CORRUPT")
            left = hidden_leftovers(root, out.name)
            kv(*pack_args(out), "--overwrite")
            after, extra = hidden_leftovers(root, out.name), None
            ok = res.returncode == -9 and state == "old" and not after and valid("pack", out)
        else:
            out = root / name
            shutil.copytree(root / "rep0", out)
            before = snap(out)
            res = kv(*eval_args(out), check=False, env=env)
            state = "old" if snap(out) == before else "CORRUPT"
            partial = Path(str(out) + ".partial.jsonl")
            extra = sum(1 for line in partial.read_text().splitlines() if json.loads(line)["record"] == "unit")
            left, after = hidden_leftovers(root, out.name), None
            ok = res.returncode == -9 and state == "old" and extra == int(point.split(":")[1])
        bad += not ok
        rows.append((cmd, point, -2.0, state, len(left), extra, None if after is None else len(after), ok))
    print(
        f"{'command':<10} {'trial':>5} {'killed at s':>11} {'output after kill':<18} {'hidden left':>11} "
        f"{'resume bit-identical / eval partial units':>42} {'left after next run':>19}  ok"
    )
    for cmd, trial, at, state, left, extra, after, ok in rows:
        at_s = "finished" if at == -1.0 else ("at point" if at == -2.0 else f"{at:.1f}")
        print(f"{cmd:<10} {str(trial):>5} {at_s:>11} {state:<18} {left:>11} {str(extra):>42} {str(after):>19}  {ok}")
    print(f"\n{len(rows)} kills ({a.trials * 3} at random times, {len(points)} at named points), {bad} problems")
    shutil.rmtree(root, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
