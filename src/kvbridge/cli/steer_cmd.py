"""``kvbridge steer``: build steering vectors from contrastive pairs, steer a run by editing its cache,
evaluate the steering against baselines and controls, move a vector to another model."""

from __future__ import annotations

import json

import click

from kvbridge.cli.numbers import SEED, SHARE, count, real

from kvbridge.cli.options import device_option, dtype_option, json_option


@click.group("steer")
def steer() -> None:
    """KV steering: change what a model does by editing its cache.

    build: K/V (and residual) directions from contrastive pairs; run: one prompt steered vs
    unsteered, side by side; eval: behaviour rates over many seeds against baselines and a
    random control, with costs; transfer: a vector moved to another model through a fitted mapping.
    Steered caches are marked approximate: never a model's own prefix state.
    """


def _with_tokenizer(loaded, tokenizer):
    """The loaded model carrying the tokenizer the command opened for it (``--tokenizer`` or its own)."""
    import dataclasses

    return loaded if tokenizer is loaded.tokenizer else dataclasses.replace(loaded, tokenizer=tokenizer)


@steer.command("build")
@click.argument("model")
@click.option(
    "--pairs",
    "pairs_path",
    required=True,
    type=click.Path(),
    help='JSONL of contrastive pairs: {"positive": TEXT or chat turns, "negative": ...} per line.',
)
@click.option("--out", required=True, type=click.Path(), help="Vector folder to write.")
@click.option(
    "--method",
    type=click.Choice(["mean", "pca"]),
    default="mean",
    show_default=True,
    help="Mean of the differences, or their first principal component.",
)
@click.option(
    "--position",
    type=click.Choice(["last", "final", "span"]),
    default="last",
    show_default=True,
    help="last: the last cached position (second-to-last token: generation consumes the final one); "
    "final: the last token; span: the mean over a [[...]] marked span.",
)
@click.option(
    "--key-space",
    type=click.Choice(["content", "rotated"]),
    default="content",
    show_default=True,
    help="content: keys with RoPE stripped (rotated to each position when applied); rotated: as cached.",
)
@click.option("--tokenizer", default=None, help="Tokenizer path (default: MODEL's own tokenizer).")
@dtype_option
@device_option
@click.option("--overwrite", is_flag=True, help="Replace an existing vector folder.")
@json_option(help="Machine-readable output (the manifest).")
def build(model, pairs_path, out, method, position, key_space, tokenizer, dtype, device, overwrite, as_json) -> None:
    """Build a steering vector for MODEL from the contrastive pairs in --pairs, write it to --out.

    Per layer and KV head a K and a V direction (and per layer a residual-stream direction for the
    activation-addition baseline). Chat turns are rendered with the model's chat template. Nothing
    is written when anything is wrong (malformed or empty pairs file, a pair that does not encode,
    OUT exists).
    """
    from kvbridge.cli.options import open_model_session
    from kvbridge.steer.settings import SteerBuildSettings
    from kvbridge.steer.stages import build_steering, prepare_build

    settings = SteerBuildSettings(
        pairs=pairs_path,
        out=out,
        method=method,
        position=position,
        key_space=key_space,
        tokenizer=tokenizer,
        overwrite=overwrite,
    )
    pairs = prepare_build(settings)  # a bad file fails before the model is loaded
    path, manifest = build_steering(
        _with_tokenizer(*open_model_session(model, tokenizer, dtype=dtype, device=device)), settings, pairs=pairs
    )
    if as_json:
        click.echo(json.dumps(manifest, indent=2, ensure_ascii=False))
        return
    norms = manifest["norms"]
    kn = sum(sum(x) for x in norms["keys"]) / max(1, sum(len(x) for x in norms["keys"]))
    vn = sum(sum(x) for x in norms["values"]) / max(1, sum(len(x) for x in norms["values"]))
    click.echo(
        f"wrote {path}: {manifest['num_pairs']} pairs, method {method}, position {position}, keys in "
        f"{key_space} space, {len(manifest['layers'])} layers x {manifest['model']['num_kv_heads']} KV heads; "
        f"mean head norm K {kn:.3g}, V {vn:.3g}"
    )


@steer.command("transfer")
@click.argument("vector_dir", type=click.Path())
@click.option("--mapping", "mapping_dir", required=True, type=click.Path(), help="Mapping folder (kvbridge fit).")
@click.option("--source", required=True, help="The model the vector was built on.")
@click.option("--target", required=True, help="The model to move it to (the mapping's target).")
@click.option("--out", required=True, type=click.Path(), help="Vector folder to write (for the target).")
@dtype_option
@device_option
@click.option("--overwrite", is_flag=True, help="Replace an existing vector folder.")
def transfer(vector_dir, mapping_dir, source, target, out, dtype, device, overwrite) -> None:
    """Move the steering vector in VECTOR_DIR from --source to --target through a fitted mapping.

    Keys stay in content space: the mapping's linear part is applied to each direction
    (``f(d) - f(0)``: the bias cancels). The residual directions do not transfer (they are not in
    the cache); the result has K/V directions only.
    """
    from kvbridge.cli.options import load_pair
    from kvbridge.steer.settings import SteerTransferSettings
    from kvbridge.steer.stages import prepare_transfer, transfer_steering

    settings = SteerTransferSettings(vector=vector_dir, mapping=mapping_dir, out=out, overwrite=overwrite)
    prepare_transfer(settings)  # a bad folder fails before the models load
    path, mapping = transfer_steering(load_pair(source, target, dtype=dtype, device=device), settings, prepared=True)
    click.echo(f"wrote {path}: vector of {source} moved to {target} through {mapping_dir} ({mapping.name})")


@steer.command("run")
@click.argument("model")
@click.option("--prompt", required=True, help="Prompt text, or @FILE (a user turn under --chat).")
@click.option("--vector", "vector_dir", default=None, type=click.Path(), help="Steering vector folder (steer build).")
@click.option(
    "--method",
    default="kv-vector",
    show_default=True,
    help="Steering method (kv-vector, kv-scale, kv-mix, kv-bank, actadd, or a plugin's).",
)
@click.option("--ck", type=real(), default=None, help="Key coefficient (kv-vector: added multiple; kv-scale: factor).")
@click.option(
    "--cv", type=real(), default=None, help="Value coefficient (kv-vector: added multiple; kv-scale: factor)."
)
@click.option("--alpha", type=real(), default=None, help="kv-mix: weight of the other prompt's cache (1 = replace).")
@click.option("--ca", type=real(), default=None, help="actadd: residual coefficient.")
@click.option("-o", "--option", "options", multiple=True, help="Method option key=value (repeatable).")
@click.option("--layers", default="all", show_default=True, help="Layers: all, '0,2', '1-3'.")
@click.option(
    "--at",
    "at",
    type=click.Choice(["last", "guide", "pack"]),
    default="last",
    show_default=True,
    help="Edit the prompt's last cached position, every position of --guide, or of --pack.",
)
@click.option(
    "--guide", default=None, help="Guide (instruction) text or @FILE for --at guide (a system turn under --chat)."
)
@click.option("--pack", "pack_dir", default=None, type=click.Path(), help="Prefix pack folder for --at pack.")
@click.option("--other", default=None, help="kv-mix: the other prompt (text or @FILE) whose cache is mixed in.")
@click.option("--max-new-tokens", default=48, show_default=True, type=count(1))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Sampling seed (both runs).")
@click.option("--greedy", is_flag=True, help="Greedy decoding instead of sampling.")
@click.option("--temperature", default=0.7, show_default=True, type=real(0, min_open=True))
@click.option("--top-p", default=0.9, show_default=True, type=SHARE)
@click.option(
    "--chat/--no-chat",
    default=None,
    help="Render the prompt with the chat template (default: when the tokenizer has one).",
)
@dtype_option
@device_option
@json_option
def run(
    model,
    prompt,
    vector_dir,
    method,
    ck,
    cv,
    alpha,
    ca,
    options,
    layers,
    at,
    guide,
    pack_dir,
    other,
    max_new_tokens,
    seed,
    greedy,
    temperature,
    top_p,
    chat,
    dtype,
    device,
    as_json,
) -> None:
    """Continue --prompt with MODEL steered and unsteered (same seed), side by side.

    The steered cache is the unsteered one edited once by --method (or, for actadd / kv-bank, run
    with hooks); everything else is identical, so any difference is the steering's.
    """
    from kvbridge.cli.options import open_model_session
    from kvbridge.prefix.splits import read_text_arg
    from kvbridge.steer.settings import SteerRunSettings
    from kvbridge.steer.run import side_by_side
    from kvbridge.steer.stages import prepare_run, run_steering

    settings = SteerRunSettings(
        prompt=read_text_arg(prompt, "prompt"),
        vector=vector_dir,
        method=method,
        ck=ck,
        cv=cv,
        alpha=alpha,
        ca=ca,
        options=options,
        layers=layers,
        at=at,
        guide=read_text_arg(guide, "guide") if guide else None,
        pack=pack_dir,
        other=read_text_arg(other, "other") if other else None,
        max_new_tokens=max_new_tokens,
        seed=seed,
        greedy=greedy,
        temperature=temperature,
        top_p=top_p,
        chat=chat,
    )
    values = prepare_run(settings)  # method options and the vector folder, before the model loads
    result = run_steering(
        _with_tokenizer(*open_model_session(model, None, dtype=dtype, device=device)), settings, values=values
    )
    record = result["steering"]
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
        return
    what = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("layers",))
    click.echo(f"steering: {what}; layers {layers}; cache marked approximate: {result['approximate']}")
    for line in side_by_side(result["unsteered"]["text"], result["steered"]["text"]):
        click.echo(line)
    click.echo(
        f"first-step KL(unsteered || steered) = {result['first_step_kl']:.4g}; "
        f"{'identical' if result['identical'] else 'different'} continuations"
    )


@steer.command("eval")
@click.argument("model")
@click.option("--vector", "vector_dir", required=True, type=click.Path(), help="Steering vector folder.")
@click.option("--prompt", required=True, help="Prompt text or @FILE (a user turn under --chat).")
@click.option(
    "--scorer",
    required=True,
    help="Behaviour scorer (json_object, json_start, bullets, positive_sentiment, "
    "negative_sentiment, code_comments, or a plugin's).",
)
@click.option("--instruction", default=None, help="The instruction for the visible and pack arms (text or @FILE).")
@click.option(
    "--arms",
    default="none,visible,pack,kv,actadd,random",
    show_default=True,
    help="Arms to run (none is always run: it is the reference).",
)
@click.option(
    "--extra",
    multiple=True,
    help="NAME=DIR: another vector for this model (e.g. moved from another model), run as an arm like kv (repeatable).",
)
@click.option("--samples", default=64, show_default=True, type=count(1), help="Seeds 0..N-1 per arm.")
@click.option("--max-new-tokens", default=48, show_default=True, type=count(1))
@click.option("--ck", default=0.0, show_default=True, type=real(), help="kv arms: key coefficient.")
@click.option("--cv", default=4.0, show_default=True, type=real(), help="kv arms: value coefficient.")
@click.option("--ca", default=4.0, show_default=True, type=real(), help="actadd arm: residual coefficient.")
@click.option(
    "--layers", default="all", show_default=True, help="Layers of the kv arms (and actadd unless --actadd-layers)."
)
@click.option("--actadd-layers", default="", help="Layers of the actadd arm (default: --layers).")
@click.option(
    "--at",
    "at",
    type=click.Choice(["last", "prompt"]),
    default="last",
    show_default=True,
    help="kv arms edit the prompt's last cached position, or every cached prompt position.",
)
@click.option("--sweep", default="", help="Coefficient multipliers for kv / actadd / random, e.g. 0.25,0.5,1,2,4.")
@click.option("--sweep-samples", default=0, type=count(0), help="Samples per sweep point (0: --samples).")
@click.option("--temperature", default=0.7, show_default=True, type=real(0, min_open=True))
@click.option("--top-p", default=0.9, show_default=True, type=SHARE)
@click.option("--chat/--no-chat", default=None, help="Chat template (default: when the tokenizer has one).")
@dtype_option
@device_option
@click.option("--out", default=None, type=click.Path(), help="Write report.json, report.md and sweep.png here.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out report folder.")
@json_option
def eval_cmd(
    model,
    vector_dir,
    prompt,
    scorer,
    instruction,
    arms,
    extra,
    samples,
    max_new_tokens,
    ck,
    cv,
    ca,
    layers,
    actadd_layers,
    at,
    sweep,
    sweep_samples,
    temperature,
    top_p,
    chat,
    dtype,
    device,
    out,
    overwrite,
    as_json,
) -> None:
    """Evaluate steering on MODEL: behaviour rate per arm over --samples seeds, paired against no
    steering, with Wilson intervals and costs (see docs/steering.md)."""
    import sys

    from kvbridge.cli.options import open_model_session
    from kvbridge.prefix.splits import read_text_arg
    from kvbridge.steer.evaluate import lines
    from kvbridge.steer.settings import SteerEvalSettings
    from kvbridge.steer.stages import evaluate_steering, prepare_eval

    settings = SteerEvalSettings(
        vector=vector_dir,
        prompt=read_text_arg(prompt, "prompt"),
        scorer=scorer,
        instruction=read_text_arg(instruction, "instruction") if instruction else None,
        arms=arms,
        extra=extra,
        samples=samples,
        max_new_tokens=max_new_tokens,
        ck=ck,
        cv=cv,
        ca=ca,
        layers=layers,
        actadd_layers=actadd_layers,
        at=at,
        sweep=sweep,
        sweep_samples=sweep_samples,
        temperature=temperature,
        top_p=top_p,
        chat=chat,
        out=out,
        overwrite=overwrite,
    )
    prepared = prepare_eval(settings)  # out, the scorer and every vector folder, before the model loads
    result = evaluate_steering(
        _with_tokenizer(*open_model_session(model, None, dtype=dtype, device=device)),
        settings,
        prepared=prepared,
        log=lambda msg: click.echo(msg, err=True),
    )
    if out:
        click.echo(f"wrote {out}", err=True)
    if as_json:
        click.echo(json.dumps(result, indent=1, ensure_ascii=False))
        return
    for line in lines(result):
        click.echo(line)
    sys.stdout.flush()
