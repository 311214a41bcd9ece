"""``kvbridge steer``: build steering vectors from contrastive pairs, steer a run by editing its cache,
evaluate the steering against baselines and controls, move a vector to another model."""

from __future__ import annotations

import json

import click

from kvbridge.cli.numbers import SEED, SHARE, count, real

from kvbridge.cli.options import device_option, dtype_option, json_option

REPORT_KIND = "kvbridge.steer-eval"
#: shortcut flags -> method option keys (passed only when given and when the method has the option)
SHORTCUTS = {"ck": "ck", "cv": "cv", "alpha": "alpha", "ca": "coefficient"}


@click.group("steer")
def steer() -> None:
    """KV steering: change what a model does by editing its cache.

    build: K/V (and residual) directions from contrastive pairs; run: one prompt steered vs
    unsteered, side by side; eval: behaviour rates over many seeds against baselines and a
    random control, with costs; transfer: a vector moved to another model through a fitted mapping.
    Steered caches are marked approximate: never a model's own prefix state.
    """


def _tokenizer_fp(loaded, tokenizer_path, tok) -> dict:
    from kvbridge.cli.options import tokenizer_identity

    return tokenizer_identity(loaded, tokenizer_path, tok)


@steer.command("build")
@click.argument("model")
@click.option("--pairs", "pairs_path", required=True, type=click.Path(),
              help="JSONL of contrastive pairs: {\"positive\": TEXT or chat turns, \"negative\": ...} per line.")
@click.option("--out", required=True, type=click.Path(), help="Vector folder to write.")
@click.option("--method", type=click.Choice(["mean", "pca"]), default="mean", show_default=True,
              help="Mean of the differences, or their first principal component.")
@click.option("--position", type=click.Choice(["last", "final", "span"]), default="last", show_default=True,
              help="last: the last cached position (second-to-last token: generation consumes the final one); "
                   "final: the last token; span: the mean over a [[...]] marked span.")
@click.option("--key-space", type=click.Choice(["content", "rotated"]), default="content", show_default=True,
              help="content: keys with RoPE stripped (rotated to each position when applied); rotated: as cached.")
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
    from kvbridge.artifacts import check_replaceable
    from kvbridge.cli.options import open_model_session
    from kvbridge.models import resolve
    from kvbridge.steer.artifact import KIND, read_vector, save_vector
    from kvbridge.steer.pairs import read_pairs
    from kvbridge.steer.vectors import build_vector

    check_replaceable(out, KIND, overwrite=overwrite)
    pairs = read_pairs(pairs_path)  # a bad file fails before the model is loaded
    resolve(model)
    loaded, tok = open_model_session(model, tokenizer, dtype=dtype, device=device)
    vector = build_vector(loaded.model, tok, pairs, position=position, method=method, key_space=key_space)
    path = save_vector(vector, out, loaded.model, tokenizer_fp=_tokenizer_fp(loaded, tokenizer, tok),
                       overwrite=overwrite)
    manifest = read_vector(path)[0]
    if as_json:
        click.echo(json.dumps(manifest, indent=2, ensure_ascii=False))
        return
    norms = manifest["norms"]
    kn = sum(sum(x) for x in norms["keys"]) / max(1, sum(len(x) for x in norms["keys"]))
    vn = sum(sum(x) for x in norms["values"]) / max(1, sum(len(x) for x in norms["values"]))
    click.echo(f"wrote {path}: {manifest['num_pairs']} pairs, method {method}, position {position}, keys in "
               f"{key_space} space, {len(manifest['layers'])} layers x {manifest['model']['num_kv_heads']} KV heads; "
               f"mean head norm K {kn:.3g}, V {vn:.3g}")


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
    from kvbridge.artifacts import check_replaceable
    from kvbridge.cli.options import load_model
    from kvbridge.fit import load_mapping
    from kvbridge.steer.artifact import KIND, load_vector, read_vector, save_vector
    from kvbridge.steer.vectors import transfer_vector

    check_replaceable(out, KIND, overwrite=overwrite)
    read_vector(vector_dir)  # a bad folder fails before the models load
    src = load_model(source, dtype=dtype, device=device)
    tgt = load_model(target, dtype=dtype, device=device)
    vector = load_vector(vector_dir, src.model)
    mapping = load_mapping(mapping_dir, source=src.model, target=tgt.model)
    moved = transfer_vector(vector, mapping, tgt.spec)
    fp = _tokenizer_fp(tgt, None, tgt.tokenizer)
    path = save_vector(moved, out, tgt.model, tokenizer_fp=fp, overwrite=overwrite)
    click.echo(f"wrote {path}: vector of {source} moved to {target} through {mapping_dir} ({mapping.name})")


def _method_options(method_name: str, pairs, host=None, **flags) -> dict:
    from kvbridge.errors import ConfigError
    from kvbridge.fit.protocol import option_fields, parse_pairs
    from kvbridge.steer.methods import resolve_method

    values = parse_pairs(pairs)
    method = resolve_method(method_name, host)
    fields = option_fields(method.Options)
    for flag, key in SHORTCUTS.items():
        value = flags.get(flag)
        if value is None:
            continue
        if key not in fields:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to steering method {method_name!r}",
                              f"its options: {', '.join(fields) or 'none'}")
        if key in values:
            raise ConfigError(f"option {key} is given twice (a flag and -o {key}=...)", "give it once")
        values[key] = value
    return values


def _check_numbers(**values) -> None:
    from kvbridge.steer.edit import coefficient

    for name, value in values.items():
        if value is not None:
            coefficient(value, f"--{name.replace('_', '-')}")


@steer.command("run")
@click.argument("model")
@click.option("--prompt", required=True, help="Prompt text, or @FILE (a user turn under --chat).")
@click.option("--vector", "vector_dir", default=None, type=click.Path(), help="Steering vector folder (steer build).")
@click.option("--method", default="kv-vector", show_default=True,
              help="Steering method (kv-vector, kv-scale, kv-mix, kv-bank, actadd, or a plugin's).")
@click.option("--ck", type=real(), default=None, help="Key coefficient (kv-vector: added multiple; kv-scale: factor).")
@click.option("--cv", type=real(), default=None, help="Value coefficient (kv-vector: added multiple; kv-scale: factor).")
@click.option("--alpha", type=real(), default=None, help="kv-mix: weight of the other prompt's cache (1 = replace).")
@click.option("--ca", type=real(), default=None, help="actadd: residual coefficient.")
@click.option("-o", "--option", "options", multiple=True, help="Method option key=value (repeatable).")
@click.option("--layers", default="all", show_default=True, help="Layers: all, '0,2', '1-3'.")
@click.option("--at", "at", type=click.Choice(["last", "guide", "pack"]), default="last", show_default=True,
              help="Edit the prompt's last cached position, every position of --guide, or of --pack.")
@click.option("--guide", default=None, help="Guide (instruction) text or @FILE for --at guide (a system turn under --chat).")
@click.option("--pack", "pack_dir", default=None, type=click.Path(), help="Prefix pack folder for --at pack.")
@click.option("--other", default=None, help="kv-mix: the other prompt (text or @FILE) whose cache is mixed in.")
@click.option("--max-new-tokens", default=48, show_default=True, type=count(1))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Sampling seed (both runs).")
@click.option("--greedy", is_flag=True, help="Greedy decoding instead of sampling.")
@click.option("--temperature", default=0.7, show_default=True, type=real(0, min_open=True))
@click.option("--top-p", default=0.9, show_default=True, type=SHARE)
@click.option("--chat/--no-chat", default=None, help="Render the prompt with the chat template (default: when the "
                                                     "tokenizer has one).")
@dtype_option
@device_option
@json_option
def run(model, prompt, vector_dir, method, ck, cv, alpha, ca, options, layers, at, guide, pack_dir, other,
        max_new_tokens, seed, greedy, temperature, top_p, chat, dtype, device, as_json) -> None:
    """Continue --prompt with MODEL steered and unsteered (same seed), side by side.

    The steered cache is the unsteered one edited once by --method (or, for actadd / kv-bank, run
    with hooks); everything else is identical, so any difference is the steering's.
    """
    from kvbridge.cli.options import open_model_session
    from kvbridge.errors import KVBridgeError
    from kvbridge.prefix.splits import read_text_arg
    from kvbridge.steer.prompts import chat_mode, guide_scenario, guide_texts, prompt_scenario
    from kvbridge.steer.run import check_length, prefix_state, run_pair, setup_for, side_by_side

    _check_numbers(ck=ck, cv=cv, alpha=alpha, ca=ca, temperature=temperature, top_p=top_p)
    prompt_text = read_text_arg(prompt, "prompt")
    guide_text = read_text_arg(guide, "guide") if guide else None
    other_text = read_text_arg(other, "other") if other else None
    if at == "guide" and not guide_text:
        raise KVBridgeError("--at guide needs --guide TEXT", "pass the guide (instruction) to steer")
    if at == "pack" and not pack_dir:
        raise KVBridgeError("--at pack needs --pack DIR", "pass a prefix pack folder (kvbridge pack save)")
    values = _method_options(method, options, ck=ck, cv=cv, alpha=alpha, ca=ca)
    if vector_dir:
        from kvbridge.steer.artifact import read_vector

        read_vector(vector_dir)  # a bad folder fails before the model loads
    loaded, tok = open_model_session(model, None, dtype=dtype, device=device)
    m = loaded.model
    vector = None
    if vector_dir:
        from kvbridge.steer.artifact import load_vector

        vector = load_vector(vector_dir, m, tokenizer_fp=_tokenizer_fp(loaded, None, tok))
    use_chat = chat_mode(tok, chat)
    prefix = None
    if at == "last":
        scenario = prompt_scenario(tok, prompt_text, chat=use_chat)
    elif at == "guide":
        scenario = guide_scenario(tok, guide_text, prompt_text, chat=use_chat)
    else:
        from kvbridge.prefix.packs import load_pack
        from kvbridge.steer.prompts import Scenario

        pack = load_pack(pack_dir, m, tokenizer=tok, tokenizer_fp=_tokenizer_fp(loaded, None, tok))
        live_text = guide_texts(tok, "x", prompt_text, chat=use_chat)[1] if use_chat else prompt_text
        report, split = pack.split_for(tok, live_text, "" if use_chat else "\n")
        keep = len(report.special_prefix) if tuple(split.ghost[:len(report.special_prefix)]) == report.special_prefix else 0
        scenario = Scenario(tuple(split.ghost), tuple(split.live), (keep, len(split.ghost)), report.text, "guide",
                            split.ghost_text)
        prefix = pack.state_for(m)
    check_length(m, scenario, max_new_tokens)
    other_state = None
    if other_text is not None:
        other_state = prefix_state(m, prompt_scenario(tok, other_text, chat=use_chat).prefix_ids)
    base, _ = setup_for(m, scenario, prefix=prefix)
    steered, record = setup_for(m, scenario, method=method, options=values, vector=vector, other=other_state,
                                layers=layers, prefix=prefix)
    result = run_pair(m, tok, base, steered, max_new_tokens=max_new_tokens, seed=None if greedy else seed,
                      temperature=temperature, top_p=top_p)
    result["steering"] = record
    result["approximate"] = bool(steered.prefix is not None and steered.prefix.approximate)
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
        return
    what = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("layers",))
    click.echo(f"steering: {what}; layers {layers}; cache marked approximate: {result['approximate']}")
    for line in side_by_side(result["unsteered"]["text"], result["steered"]["text"]):
        click.echo(line)
    click.echo(f"first-step KL(unsteered || steered) = {result['first_step_kl']:.4g}; "
               f"{'identical' if result['identical'] else 'different'} continuations")


def _floats(text: str, name: str) -> tuple:
    from kvbridge.errors import KVBridgeError
    from kvbridge.steer.edit import coefficient

    if not text:
        return ()
    try:
        return tuple(coefficient(x.strip(), name) for x in text.split(",") if x.strip())
    except KVBridgeError:
        raise
    except Exception:  # noqa: BLE001
        raise KVBridgeError(f"cannot read {name} {text!r}", "pass numbers separated by commas") from None


@steer.command("eval")
@click.argument("model")
@click.option("--vector", "vector_dir", required=True, type=click.Path(), help="Steering vector folder.")
@click.option("--prompt", required=True, help="Prompt text or @FILE (a user turn under --chat).")
@click.option("--scorer", required=True, help="Behaviour scorer (json_object, json_start, bullets, positive_sentiment, "
                                              "negative_sentiment, code_comments, or a plugin's).")
@click.option("--instruction", default=None, help="The instruction for the visible and pack arms (text or @FILE).")
@click.option("--arms", default="none,visible,pack,kv,actadd,random", show_default=True,
              help="Arms to run (none is always run: it is the reference).")
@click.option("--extra", multiple=True, help="NAME=DIR: another vector for this model (e.g. moved from another "
                                             "model), run as an arm like kv (repeatable).")
@click.option("--samples", default=64, show_default=True, type=count(1), help="Seeds 0..N-1 per arm.")
@click.option("--max-new-tokens", default=48, show_default=True, type=count(1))
@click.option("--ck", default=0.0, show_default=True, type=real(), help="kv arms: key coefficient.")
@click.option("--cv", default=4.0, show_default=True, type=real(), help="kv arms: value coefficient.")
@click.option("--ca", default=4.0, show_default=True, type=real(), help="actadd arm: residual coefficient.")
@click.option("--layers", default="all", show_default=True, help="Layers of the kv arms (and actadd unless "
                                                                 "--actadd-layers).")
@click.option("--actadd-layers", default="", help="Layers of the actadd arm (default: --layers).")
@click.option("--at", "at", type=click.Choice(["last", "prompt"]), default="last", show_default=True,
              help="kv arms edit the prompt's last cached position, or every cached prompt position.")
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
def eval_cmd(model, vector_dir, prompt, scorer, instruction, arms, extra, samples, max_new_tokens, ck, cv, ca, layers,
             actadd_layers, at, sweep, sweep_samples, temperature, top_p, chat, dtype, device, out, overwrite,
             as_json) -> None:
    """Evaluate steering on MODEL: behaviour rate per arm over --samples seeds, paired against no
    steering, with Wilson intervals and costs (see docs/steering.md)."""
    import sys

    from kvbridge.artifacts import atomic_dir, check_replaceable
    from kvbridge.cli.options import open_model_session
    from kvbridge.errors import KVBridgeError
    from kvbridge.prefix.splits import read_text_arg
    from kvbridge.steer.artifact import load_vector, read_vector
    from kvbridge.steer.evaluate import EvalSettings, evaluate, lines, plot_sweep
    from kvbridge.steer.scorers import resolve_scorer

    _check_numbers(ck=ck, cv=cv, ca=ca, temperature=temperature, top_p=top_p)
    multipliers = _floats(sweep, "--sweep")
    if out:
        check_replaceable(out, REPORT_KIND, overwrite=overwrite)
    if sweep_samples > samples:
        raise KVBridgeError("--sweep-samples exceeds --samples", "pass --sweep-samples <= --samples")
    score = resolve_scorer(scorer)
    prompt_text = read_text_arg(prompt, "prompt")
    instruction_text = read_text_arg(instruction, "instruction") if instruction else None
    extras = {}
    for item in extra:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path:
            raise KVBridgeError(f"--extra {item!r} is not NAME=DIR", "pass e.g. --extra moved=vec-moved/")
        extras[name.strip()] = path
    arm_list = tuple(a.strip() for a in arms.split(",") if a.strip())
    read_vector(vector_dir)
    for path in extras.values():
        read_vector(path)
    loaded, tok = open_model_session(model, None, dtype=dtype, device=device)
    m = loaded.model
    fp = _tokenizer_fp(loaded, None, tok)
    vector = load_vector(vector_dir, m, tokenizer_fp=fp)
    extra_vectors = {name: load_vector(path, m, tokenizer_fp=fp) for name, path in extras.items()}
    settings = EvalSettings(samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            ck=ck, cv=cv, ca=ca, layers=layers, at=at, actadd_layers=actadd_layers, chat=chat,
                            arms=arm_list + tuple(n for n in extra_vectors if n not in arm_list), sweep=multipliers,
                            sweep_samples=sweep_samples, sweep_arms=("kv", "actadd", "random") + tuple(extra_vectors))
    result = evaluate(m, tok, vector, prompt=prompt_text, scorer=score, instruction=instruction_text,
                      settings=settings, extra_vectors=extra_vectors, scorer_name=scorer,
                      log=lambda msg: click.echo(msg, err=True))
    result["model"] = model
    result["vector_dir"] = str(vector_dir)
    if out:
        with atomic_dir(out, kind=REPORT_KIND, overwrite=overwrite) as tmp:
            (tmp / "report.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
            (tmp / "report.md").write_text("\n".join(lines(result)) + "\n")
            plot_sweep(result, tmp / "sweep.png", title=f"{model}: {scorer}")
        click.echo(f"wrote {out}", err=True)
    if as_json:
        click.echo(json.dumps(result, indent=1, ensure_ascii=False))
        return
    for line in lines(result):
        click.echo(line)
    sys.stdout.flush()
