"""Build the whole zoo from the corpus: tokenizer, five models, fp16 safetensors and the manifest.

``python -m tools.zoo.build --corpus PATH [--out DIR]`` (from the repository root; the deprecated
``kvbridge zoo build`` runs it too, in a checkout) runs :func:`build_zoo`. By default it writes into
the package (``src/kvbridge/zoo/models``), replacing the shipped zoo. Layout::

    models/manifest.json
    models/tokenizer/{tokenizer.json,tokenizer_config.json}
    models/<name>/{config.json,generation_config.json,model.safetensors,tokenizer*.json}

Each model is evaluated *after* the fp16 round trip, loaded back through
:func:`kvbridge.zoo.load.load_zoo_model`, so the recorded losses are those of the shipped files.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from kvbridge.errors import ArtifactError, ConfigError, KVBridgeError
import kvbridge.zoo
from kvbridge.zoo import CORPUS_NAME, MANIFEST, TOKENIZER_DIR, default_corpus, split_text
from tools.zoo.recipes import CORPUS_SHA256, ZOO, ZooRecipe, canonical_json, recipe_hash

#: all weights together may not exceed this (package-data budget)
MAX_WEIGHTS_BYTES = 16 * 1024 * 1024
#: the manifest records the loss on this many leading held-out tokens, for a quick re-check in tests
CHECK_TOKENS = 2048
MANIFEST_FORMAT = "kvbridge-zoo/1"
#: ``tune_loss`` (the loss on the tune slice, where ``tuned`` was trained) uses this many leading tokens
TUNE_EVAL_TOKENS = 16384

#: the shipped zoo (package data), which a build without ``--out`` replaces
PACKAGE_ZOO = Path(kvbridge.zoo.__file__).resolve().parent / "models"


def read_corpus(path: Path | str | None = None) -> tuple[str, str]:
    """``(text, sha256)`` of the corpus file; a one-line error when it is missing."""
    path = Path(path) if path else default_corpus()
    if not path.is_file():
        raise ConfigError(
            f"corpus not found at {path}",
            f"pass --corpus PATH to a copy of {CORPUS_NAME} (sha256 {CORPUS_SHA256[:12]}...)",
        )
    raw = path.read_bytes()
    return raw.decode("utf-8"), hashlib.sha256(raw).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_records(folder: Path, root: Path) -> dict:
    """``{relative path: {sha256, bytes}}`` for every file under ``folder``."""
    return {
        p.relative_to(root).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def model_recipe_hashes(recipe: ZooRecipe) -> dict[str, str]:
    """Each model's recipe hash: its own recipe, the tokenizer's, the splits, eval and its parent's hash."""
    out: dict[str, str] = {}
    for m in recipe.models:
        out[m.name] = recipe_hash(
            {
                "model": asdict(m),
                "tokenizer": asdict(recipe.tokenizer),
                "splits": [list(s) for s in recipe.splits],
                "parent": out.get(m.init_from) if m.init_from else None,
            }
        )
    return out


def build_zoo(
    corpus: Path | str | None = None,
    out: Path | str | None = None,
    recipe: ZooRecipe = ZOO,
    log=None,
    corpus_text: str | None = None,
) -> dict:
    """Train and write the whole zoo; returns the manifest (also written to ``out/manifest.json``).

    ``corpus_text`` (tests) replaces reading ``corpus`` from disk.
    """
    import tokenizers
    import torch
    import transformers

    from kvbridge.zoo import load as zload
    from tools.zoo import train as T
    from tools.zoo.tokenizer import build_tokenizer, save_tokenizer

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out) if out else PACKAGE_ZOO
    if corpus_text is None:
        text, corpus_sha = read_corpus(corpus)
        corpus_name = Path(corpus).name if corpus else CORPUS_NAME
    else:
        text, corpus_sha, corpus_name = corpus_text, hashlib.sha256(corpus_text.encode()).hexdigest(), "<text>"
    if corpus_text is None and corpus_sha != CORPUS_SHA256:
        log(
            f"warning: corpus sha256 {corpus_sha[:12]}... differs from the recipe's {CORPUS_SHA256[:12]}...; "
            "the zoo will not match the shipped one"
        )

    transformers.utils.logging.disable_progress_bar()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        t_start = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        hashes = model_recipe_hashes(recipe)

        # tokenizer ----------------------------------------------------------------------------
        tok = build_tokenizer(split_text(text, recipe.tokenizer.split), recipe.tokenizer)
        tok_dir = out / TOKENIZER_DIR
        shutil.rmtree(tok_dir, ignore_errors=True)
        save_tokenizer(tok, tok_dir)
        vocab = len(tok)
        special_id = tok.convert_tokens_to_ids(recipe.tokenizer.special_tokens[0])
        log(f"tokenizer: byte-level BPE, {vocab} ids")

        splits = {}
        tokens = {}
        for name, _, _ in recipe.splits:
            a, b = T.split_bounds(text, name)
            tokens[name] = T.encode(tok, text[a:b])
            splits[name] = {
                "chars": [a, b],
                "tokens": int(tokens[name].numel()),
                "chars_per_token": round((b - a) / max(1, tokens[name].numel()), 4),
            }
        held = tokens["heldout"]
        targets = T.scored_targets(held, recipe.eval_seq_len, recipe.eval_max_tokens)
        entropy = T.unigram_entropy(targets, vocab)
        counts = torch.bincount(tokens["base"], minlength=vocab).double() + 1.0  # add-one unigram fit on base
        cross = float(-(counts / counts.sum()).log()[targets].mean())
        log(
            f"held-out: {targets.numel()} scored tokens, unigram entropy {entropy:.4f} nats/token "
            f"(unigram fitted on base: {cross:.4f})"
        )

        models = {}
        weights_bytes = 0
        for m in recipe.models:
            log(f"model {m.name}: {m.description}")
            config = T.make_config(m.arch, vocab, special_id)
            if m.init_from:
                parent = recipe.model(m.init_from)
                if m.init_from not in models:
                    raise ConfigError(
                        f"zoo recipe: {m.name} continues {m.init_from}, which is not built before it",
                        "order the recipe's models so parents come first",
                    )
                if parent.arch != m.arch:
                    raise ConfigError(
                        f"zoo recipe: {m.name} continues {m.init_from} but changes its architecture",
                        "use the parent's ArchRecipe",
                    )
                model, _ = zload.load_zoo_model(m.init_from, dtype=torch.float32, root=out)
            else:
                model = T.init_model(config, m.train.seed)
            n_params = sum(p.numel() for p in model.parameters())
            result = T.train(model, tokens[m.train.split], m.train, log=log, log_every=max(1, m.train.steps // 8))

            folder = out / m.name
            shutil.rmtree(folder, ignore_errors=True)
            model.to(getattr(torch, m.weights_dtype)).save_pretrained(str(folder))
            save_tokenizer(tok, folder)
            if not (folder / "model.safetensors").is_file():
                raise ArtifactError(f"save_pretrained wrote no model.safetensors in {folder}")
            for p in folder.iterdir():  # safetensors writes 0600; package data should be world-readable
                p.chmod(0o644)
            del model

            shipped, _ = zload.load_zoo_model(m.name, dtype=torch.float32, root=out)
            loss, n_scored = T.heldout_loss(shipped, held, recipe.eval_seq_len, recipe.eval_max_tokens)
            check, n_check = T.heldout_loss(
                shipped, held, recipe.eval_seq_len, min(CHECK_TOKENS, recipe.eval_max_tokens)
            )
            tune_loss, _ = T.heldout_loss(
                shipped, tokens["tune"], recipe.eval_seq_len, min(TUNE_EVAL_TOKENS, recipe.eval_max_tokens)
            )
            text_sample = T.sample(shipped, tok, recipe.sample_prompt, recipe.sample_tokens, seed=recipe.sample_seed)
            del shipped
            files = file_records(folder, out)
            weights_bytes += (folder / "model.safetensors").stat().st_size
            parent_tokens = models[m.init_from]["total_training_tokens"] if m.init_from else 0
            models[m.name] = {
                "description": m.description,
                "recipe_hash": hashes[m.name],
                "recipe": asdict(m),
                "seed": m.train.seed,
                "init_from": m.init_from,
                "architecture": {
                    "model_type": config.model_type,
                    "num_hidden_layers": m.arch.num_hidden_layers,
                    "hidden_size": m.arch.hidden_size,
                    "intermediate_size": m.arch.intermediate_size,
                    "num_attention_heads": m.arch.num_attention_heads,
                    "num_key_value_heads": m.arch.num_key_value_heads,
                    "head_dim": m.arch.head_dim,
                    "rope_theta": m.arch.rope_theta,
                    "max_position_embeddings": m.arch.max_position_embeddings,
                    "vocab_size": vocab,
                },
                "params": int(n_params),
                "weights_dtype": m.weights_dtype,
                "train_split": m.train.split,
                "training_tokens": result.tokens,
                "total_training_tokens": parent_tokens + result.tokens,
                "train_seconds": round(result.seconds, 1),
                "tokens_per_second": round(result.tokens / max(result.seconds, 1e-9)),
                "final_train_loss": round(result.final_loss, 4),
                "train_log": result.losses,
                "heldout_loss": round(loss, 4),
                "heldout_scored_tokens": n_scored,
                "unigram_entropy": round(entropy, 4),
                "heldout_check": {"tokens": n_check, "loss": round(check, 5)},
                "tune_loss": round(tune_loss, 4),
                "sample": {
                    "prompt": recipe.sample_prompt,
                    "seed": recipe.sample_seed,
                    "new_tokens": recipe.sample_tokens,
                    "temperature": 0.8,
                    "top_k": 40,
                    "text": text_sample,
                },
                "files": files,
            }
            log(
                f"  {m.name}: held-out {loss:.4f} nats/token vs unigram entropy {entropy:.4f}; "
                f"{result.tokens} tokens in {result.seconds:.0f}s"
            )

        if weights_bytes > MAX_WEIGHTS_BYTES:
            raise ArtifactError(
                f"zoo weights total {weights_bytes} bytes, over the {MAX_WEIGHTS_BYTES} budget", "shrink the recipes"
            )
        manifest = {
            "format": MANIFEST_FORMAT,
            "zoo_recipe_hash": recipe_hash(recipe),
            "built_with": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": platform.python_version(),
                "num_threads": recipe.num_threads,
                "machine": platform.machine(),
            },
            "build_seconds": round(time.perf_counter() - t_start, 1),
            "corpus": {"name": corpus_name, "sha256": corpus_sha, "chars": len(text), "recipe_sha256": CORPUS_SHA256},
            "splits": splits,
            "heldout": {
                "split": "heldout",
                "seq_len": recipe.eval_seq_len,
                "scored_tokens": int(targets.numel()),
                "unigram_entropy": round(entropy, 4),
                "unigram_cross_entropy_base_fit": round(cross, 4),
            },
            "tokenizer": {
                "kind": "byte-level BPE (tokenizers)",
                "vocab_size": vocab,
                "special_token": recipe.tokenizer.special_tokens[0],
                "special_id": special_id,
                "recipe": asdict(recipe.tokenizer),
                "recipe_hash": recipe_hash(recipe.tokenizer),
                "folder": TOKENIZER_DIR,
                "files": file_records(tok_dir, out),
            },
            "weights_bytes_total": weights_bytes,
            "names": list(models),  # build order (the JSON keys below are sorted)
            "models": models,
        }
        (out / MANIFEST).write_text(canonical_json_pretty(manifest), encoding="utf-8")
        log(f"zoo written to {out} ({weights_bytes / 1e6:.1f} MB of weights, {manifest['build_seconds']:.0f}s)")
        return manifest
    finally:
        torch.set_num_threads(threads_before)


def canonical_json_pretty(obj) -> str:
    import json

    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    """``python -m tools.zoo.build [--corpus PATH] [--out DIR]``: build, then print the zoo's table."""
    from kvbridge.cli.zoo_cmd import manifest_table

    ap = argparse.ArgumentParser(prog="python -m tools.zoo.build", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=None, help=f"{CORPUS_NAME} (default: ../shared/corpora/)")
    ap.add_argument("--out", type=Path, default=None, help="where to write the zoo (default: the package's)")
    args = ap.parse_args(argv)
    try:
        manifest = build_zoo(corpus=args.corpus, out=args.out)
    except KVBridgeError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 2
    print(manifest_table(manifest))
    return 0


__all__ = [
    "build_zoo",
    "default_corpus",
    "read_corpus",
    "sha256_file",
    "file_records",
    "model_recipe_hashes",
    "MAX_WEIGHTS_BYTES",
    "canonical_json",
]


if __name__ == "__main__":
    raise SystemExit(main())
