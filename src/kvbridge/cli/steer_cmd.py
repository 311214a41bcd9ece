"""``kvbridge steer``: build steering vectors from contrastive pairs, steer a run by editing its cache,
evaluate the steering against baselines and controls, move a vector to another model.

Each subcommand's options are generated from its settings (:mod:`kvbridge.steer.settings`); the
command parses them, loads the model (or the pair) and makes one :class:`~kvbridge.run.Run` call of
:mod:`kvbridge.steer.stages`."""

from __future__ import annotations

import click

from kvbridge.cli.options import device_option, dtype_option, echo_result, json_option, settings_from, settings_options
from kvbridge.steer.settings import SteerBuildSettings, SteerEvalSettings, SteerRunSettings, SteerTransferSettings

#: what every subcommand loads its model(s) with
LOADING = [dtype_option, device_option]


@click.group("steer")
def steer() -> None:
    """KV steering: change what a model does by editing its cache.

    build: K/V (and residual) directions from contrastive pairs; run: one prompt steered vs
    unsteered, side by side; eval: behaviour rates over many seeds against baselines and a
    random control, with costs; transfer: a vector moved to another model through a fitted mapping.
    Steered caches are marked approximate: never a model's own prefix state.
    """


def _settings(cls, options: dict, texts=(), given=None):
    """The ``cls`` settings from the parsed options, the ``texts`` options read first (``@FILE`` allowed);
    ``given``: the fields that are arguments."""
    from kvbridge.prefix.splits import read_text_arg

    for name in texts:
        if options.get(name):
            options[name] = read_text_arg(options[name], name)
    return settings_from(cls, options, given=given)


def _model_run(model: str, settings, dtype, device, tokenizer: str | None = None):
    """The run of ``settings`` on MODEL, loaded with the tokenizer the command opened for it (``--tokenizer``
    or its own)."""
    from kvbridge.cli.options import open_model
    from kvbridge.run import Run

    return Run.of(open_model(model, tokenizer, dtype=dtype, device=device), settings)


@steer.command("build")
@click.argument("model")
@settings_options(
    SteerBuildSettings,
    after={"tokenizer": LOADING, "overwrite": [json_option(help="Machine-readable output (the manifest).")]},
)
def build(model, dtype, device, as_json, **options) -> None:
    """Build a steering vector for MODEL from the contrastive pairs in --pairs, write it to --out.

    Per layer and KV head a K and a V direction (and per layer a residual-stream direction for the
    activation-addition baseline). Chat turns are rendered with the model's chat template. Nothing
    is written when anything is wrong (malformed or empty pairs file, a pair that does not encode,
    OUT exists).
    """
    from kvbridge.steer.stages import build_steering, prepare_build

    s = _settings(SteerBuildSettings, options)
    pairs = prepare_build(s)  # a bad file fails before the model is loaded
    path, manifest = build_steering(_model_run(model, s, dtype, device, s.tokenizer), pairs=pairs)
    norms = manifest["norms"]
    kn, vn = (sum(map(sum, norms[k])) / max(1, sum(map(len, norms[k]))) for k in ("keys", "values"))
    text = (
        f"wrote {path}: {manifest['num_pairs']} pairs, method {s.method}, position {s.position}, keys in "
        f"{s.key_space} space, {len(manifest['layers'])} layers x {manifest['model']['num_kv_heads']} KV heads; "
        f"mean head norm K {kn:.3g}, V {vn:.3g}"
    )
    echo_result(manifest, as_json, text, ensure_ascii=False)


@steer.command("transfer")
@click.argument("vector", metavar="VECTOR_DIR", type=click.Path())
@settings_options(
    SteerTransferSettings,
    after={
        "mapping": [
            click.option("--source", required=True, help="The model the vector was built on."),
            click.option("--target", required=True, help="The model to move it to (the mapping's target)."),
        ],
        "out": LOADING,
    },
)
def transfer(vector, source, target, dtype, device, **options) -> None:
    """Move the steering vector in VECTOR_DIR from --source to --target through a fitted mapping.

    Keys stay in content space: the mapping's linear part is applied to each direction
    (``f(d) - f(0)``: the bias cancels). The residual directions do not transfer (they are not in
    the cache); the result has K/V directions only.
    """
    from kvbridge.cli.options import load_pair
    from kvbridge.run import Run
    from kvbridge.steer.stages import prepare_transfer, transfer_steering

    s = _settings(SteerTransferSettings, options, given={"vector": vector})
    prepare_transfer(s)  # a bad folder fails before the models load
    path, mapping = transfer_steering(Run.of(load_pair(source, target, dtype=dtype, device=device), s), prepared=True)
    click.echo(f"wrote {path}: vector of {source} moved to {target} through {s.mapping} ({mapping.name})")


@steer.command("run")
@click.argument("model")
@settings_options(SteerRunSettings, after={"chat": [*LOADING, json_option]})
def run(model, dtype, device, as_json, **options) -> None:
    """Continue --prompt with MODEL steered and unsteered (same seed), side by side.

    The steered cache is the unsteered one edited once by --method (or, for actadd / kv-bank, run
    with hooks); everything else is identical, so any difference is the steering's.
    """
    from kvbridge.steer.run import side_by_side
    from kvbridge.steer.stages import prepare_run, run_steering

    s = _settings(SteerRunSettings, options, texts=("prompt", "guide", "other"))
    values = prepare_run(s)  # method options and the vector folder, before the model loads
    result = run_steering(_model_run(model, s, dtype, device), values=values)
    what = ", ".join(f"{k}={v}" for k, v in result["steering"].items() if k not in ("layers",))
    text = [
        f"steering: {what}; layers {s.layers}; cache marked approximate: {result['approximate']}",
        *side_by_side(result["unsteered"]["text"], result["steered"]["text"]),
        f"first-step KL(unsteered || steered) = {result['first_step_kl']:.4g}; "
        f"{'identical' if result['identical'] else 'different'} continuations",
    ]
    echo_result(result, as_json, text, ensure_ascii=False)


@steer.command("eval")
@click.argument("model")
@settings_options(SteerEvalSettings, after={"chat": LOADING, "overwrite": [json_option]})
def eval_cmd(model, dtype, device, as_json, **options) -> None:
    """Evaluate steering on MODEL: behaviour rate per arm over --samples seeds, paired against no
    steering, with Wilson intervals and costs (see docs/steering.md)."""
    import sys

    from kvbridge.steer.evaluate import lines
    from kvbridge.steer.stages import evaluate_steering, prepare_eval

    s = _settings(SteerEvalSettings, options, texts=("prompt", "instruction"))
    prepared = prepare_eval(s)  # out, the scorer and every vector folder, before the model loads
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    result = evaluate_steering(_model_run(model, s, dtype, device), prepared=prepared, log=log)
    if s.out:
        click.echo(f"wrote {s.out}", err=True)
    echo_result(result, as_json, lambda: lines(result), indent=1, ensure_ascii=False)
    sys.stdout.flush()
