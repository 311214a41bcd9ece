"""Campaign, class "bad flags and text": every numeric flag of every command, walked from the command
tree, refuses the wrong type, NaN/inf, out-of-range and huge values by name at parse time; prompts
beyond the model's positions, text that is not UTF-8, manifests missing their model id, model paths
that are files, and configs with inconsistent or absurd sizes are one line naming the thing."""

from __future__ import annotations

import json
import shutil

import click
import pytest

try:
    from kvbridge.cli.numbers import Number
except ImportError:  # a kvbridge without the layer: every numeric flag fails the walk below

    class Number:  # type: ignore[no-redef]
        pass


def _walk(cmd=None, path=()):
    from kvbridge.cli.main import build_cli

    cmd = cmd or build_cli()
    ctx = click.Context(cmd, info_name=path[-1] if path else "kvbridge")
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            yield from _walk(cmd.get_command(ctx, name), (*path, name))


def _numeric_options():
    out = []
    for path, cmd in _walk():
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(
                p.type, (click.types.IntParamType, click.types.FloatParamType, Number)
            ):
                out.append((path, p))
    return out


NUMERIC = _numeric_options()


def test_every_numeric_flag_goes_through_the_one_layer():
    assert len(NUMERIC) > 40 and len(CASES) > 200
    bare = [f"{' '.join(path)} {p.opts[0]}" for path, p in NUMERIC if not isinstance(p.type, Number)]
    assert not bare, f"numeric flags without kvbridge.cli.numbers.Number: {bare}"


def _bad_values(t: Number) -> list[str]:
    vals = ["abc", "nan", "inf", "-inf", "1e999", "", "0x10"]
    if t.kind is int:
        vals += ["1.5", "2e3", "9" * 30]
    if t.min is not None:
        vals.append(repr(t.min) if t.min_open else repr(t.min - 1) if t.kind is int else repr(t.min - 0.5))
        if t.kind is int and t.min >= 1:
            vals += ["0", "-1"]
    if t.max is not None:  # one past the largest (HUGE for counts that name no maximum)
        vals.append(repr(t.max) if t.max_open else repr(t.max + 1) if t.kind is int else repr(t.max * 2 + 1))
    return sorted(set(vals))


CASES = [(path, p, v) for path, p in NUMERIC if isinstance(p.type, Number) for v in _bad_values(p.type)]


@pytest.mark.parametrize("path,param,value", CASES, ids=[f"{' '.join(p)} {o.opts[0]}={v}" for p, o, v in CASES])
def test_bad_numeric_flag_is_refused_by_name(c, path, param, value):
    flag = param.opts[0]
    with pytest.raises(click.BadParameter):  # never invoke a command with a value it would run with
        param.type.convert(value, param, None)
    res = c.cli([*path, flag, value])
    c.error(res, flag)


def test_good_values_still_parse():
    from kvbridge.cli.numbers import SHARE, count, real

    assert count(1).convert("3", None, None) == 3 and count(0).convert(0, None, None) == 0
    assert real(0, min_open=True).convert("1e-3", None, None) == 1e-3
    assert SHARE.convert("1", None, None) == 1.0


# -- generation length and text ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e999", "abc"])
def test_transfer_max_new_tokens(world, c, value):
    res = c.cli(
        [
            "transfer",
            world.src,
            world.tgt,
            "--mapping",
            world.mapping,
            "--prompt",
            world.prompt,
            "--max-new-tokens",
            value,
        ]
    )
    c.error(res, "--max-new-tokens")


def test_transfer_prompt_beyond_max_positions(world, c):
    long_prompt = " ".join(["zorp"] * 400)  # the tiny models have 96 positions
    c.error(
        c.cli(["transfer", world.src, world.tgt, "--mapping", world.mapping, "--prompt", long_prompt]),
        "--prompt",
        "positions",
    )
    c.error(
        c.cli(
            [
                "transfer",
                world.src,
                world.tgt,
                "--mapping",
                world.mapping,
                "--prompt",
                world.prompt,
                "--max-new-tokens",
                "500",
            ]
        ),
        "--max-new-tokens",
        "positions",
    )


def test_graft_run_beyond_max_positions(world, c):
    long_text = " ".join(["zorp"] * 200)
    c.error(
        c.cli(["graft", "run", world.src, "--context", long_text, "--chunk", world.guide, "--prompt", world.prompt]),
        "positions",
    )
    c.error(
        c.cli(
            [
                "graft",
                "run",
                world.src,
                "--context",
                world.guide,
                "--chunk",
                world.guide,
                "--prompt",
                world.prompt,
                "--max-new-tokens",
                "90",
            ]
        ),
        "--max-new-tokens",
    )


@pytest.mark.parametrize("how", ["argv", "file"])
def test_transfer_prompt_not_utf8(world, tmp_path, c, how):
    bad = tmp_path / "p.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    prompt = "caf\udce9 ok" if how == "argv" else f"@{bad}"
    c.error(c.cli(["transfer", world.src, world.tgt, "--mapping", world.mapping, "--prompt", prompt]), "prompt")


@pytest.mark.parametrize("flag", ["--context", "--chunk", "--prompt"])
def test_graft_run_text_file_not_utf8_names_the_flag(world, tmp_path, c, flag):
    bad = tmp_path / "p.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    args = {"--context": world.guide, "--chunk": world.guide, "--prompt": world.prompt}
    args[flag] = f"@{bad}"
    c.error(c.cli(["graft", "run", world.src, *[x for kv in args.items() for x in kv]]), flag)


# -- manifests and model paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_pack_manifest_missing_model_id(world, scratch, c, cmd):
    m = json.loads((scratch / "pack" / "manifest.json").read_text())
    del m["model"]["id"]
    (scratch / "pack" / "manifest.json").write_text(json.dumps(m))
    args = ["pack", "info", scratch / "pack"] if cmd == "info" else ["pack", "verify", scratch / "pack", world.src]
    c.error(c.cli(args), "model.id")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors", "tokenizer_config.json"])
@pytest.mark.parametrize("cmd", ["pack-verify", "pack-save", "diverge"])
def test_model_path_that_is_a_file(world, tmp_path, c, name, cmd):
    path = world.src / name
    args = {
        "pack-verify": ["pack", "verify", world.pack, path],
        "pack-save": ["pack", "save", path, "--guide", world.guide, "--out", tmp_path / "p"],
        "diverge": ["diverge", path, "--guide", world.guide, "--prompt", world.prompt, "--greedy"],
    }[cmd]
    c.error(c.cli(args), name)
    assert not (tmp_path / "p").exists()


# -- configs: KV heads and absurd sizes, named by field, before any weight is read ------------------------------
def _model_with(world, tmp_path, **changes):
    folder = tmp_path / "model"
    shutil.copytree(world.src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _commands(world, m, tmp_path):
    return {
        "describe": ["describe", m],
        "check": ["check", m, world.src],
        "pack-save": ["pack", "save", m, "--guide", world.guide, "--out", tmp_path / "p"],
        "fit": [
            "fit",
            m,
            world.tgt,
            "--corpus",
            world.corpus,
            "--out",
            tmp_path / "map",
            "--seq-len",
            32,
            "--tokens",
            256,
            "--top-k",
            1,
            "--quiet",
        ],
        "transfer": [
            "transfer",
            m,
            world.tgt,
            "--mapping",
            world.mapping,
            "--prompt",
            world.prompt,
            "--accept-fingerprint-mismatch",
        ],
    }


@pytest.mark.parametrize("cmd", ["describe", "check", "pack-save", "fit", "transfer"])
def test_kv_heads_that_do_not_divide(world, tmp_path, c, cmd):
    m = _model_with(world, tmp_path, num_key_value_heads=3)  # 4 attention heads
    c.error(c.cli(_commands(world, m, tmp_path)[cmd]), "num_key_value_heads")
    assert not (tmp_path / "p").exists() and not (tmp_path / "map").exists()


@pytest.mark.parametrize(
    "field,value", [("num_hidden_layers", 2**40), ("hidden_size", 2**40), ("num_attention_heads", 2**40)]
)
@pytest.mark.parametrize("cmd", ["describe", "check", "pack-save", "fit"])
def test_absurd_sizes_name_the_field(world, tmp_path, c, cmd, field, value):
    m = _model_with(world, tmp_path, **{field: value})
    line = c.error(c.cli(_commands(world, m, tmp_path)[cmd]), field)
    assert "out of memory" not in line


@pytest.mark.parametrize("cmd", ["describe", "check"])
def test_a_large_layer_count_is_named_not_described(world, tmp_path, c, cmd):
    m = _model_with(world, tmp_path, num_hidden_layers=100_000)
    c.error(c.cli(_commands(world, m, tmp_path)[cmd]), "num_hidden_layers")
