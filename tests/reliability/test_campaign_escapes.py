"""Campaign, class "escape sequences from files": every string that comes from a file or a plugin
(pack manifests, configs, model manifests, folder names, error messages quoting them) is printed
with its control characters escaped, on stdout and stderr, in text and tables; JSON stays valid."""

from __future__ import annotations

import json
import re

import pytest

#: a window-title change (OSC ... BEL), a screen clear (CSI), a C1 CSI, a bidi override, DEL
HOSTILE = "evil\x1b]0;pwned\x07-\x1b[2J-\x9b31m-\u202e-\x7f-\r-end"
#: what a terminal would act on: every control character but the program's own newline and tab
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def assert_clean(res):
    for name, text in (("stdout", res.stdout), ("stderr", res.stderr)):
        bad = CONTROL.findall(text)
        assert not bad, f"{name} holds control characters {bad!r}: {text[-400:]!r}"
    assert "internal error" not in res.output


def _edit_manifest(folder, fn):
    m = json.loads((folder / "manifest.json").read_text())
    fn(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _hostile_pack(m):
    m["model"]["id"] = HOSTILE
    m["model"]["revision"] = HOSTILE
    m["model"]["model_type"] = m["model"]["model_type"] + "\x1b[31m"
    m["guide"]["text"] = HOSTILE
    m["tokenizer"]["kind"] = HOSTILE


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_pack_info_hostile_manifest(scratch, c, as_json):
    _edit_manifest(scratch / "pack", _hostile_pack)
    res = c.cli(["pack", "info", scratch / "pack", *(["--json"] if as_json else [])])
    assert res.exit_code == 0, res.output
    assert_clean(res)
    if as_json:  # still JSON, and it still says what the file says
        assert json.loads(res.stdout)["manifest"]["model"]["id"] == HOSTILE
    else:
        assert "\\u001b]0;pwned\\u0007" in res.stdout  # shown, visibly


def test_pack_verify_hostile_manifest(world, scratch, c):
    _edit_manifest(scratch / "pack", _hostile_pack)
    res = c.cli(["pack", "verify", scratch / "pack", world.src])
    assert_clean(res)
    assert res.exit_code in (0, 2), res.output


def test_pack_missing_field_named_with_escapes(scratch, c):
    _edit_manifest(scratch / "pack", lambda m: m.update(kind=HOSTILE))
    res = c.cli(["pack", "info", scratch / "pack"])
    assert_clean(res)
    c.error(res)


def test_folder_name_with_escapes(world, tmp_path, c):
    folder = tmp_path / f"model{HOSTILE.replace('/', '_')}"
    folder.mkdir()
    (folder / "config.json").write_text((world.src / "config.json").read_text())
    res = c.cli(["describe", folder])
    assert res.exit_code == 0, res.output
    assert_clean(res)
    res = c.cli(["describe", folder / "missing"])
    assert_clean(res)
    c.error(res)


@pytest.mark.parametrize("cmd", ["describe", "check"])
@pytest.mark.parametrize("field", ["model_type", "rope_scaling", "hidden_act"])
def test_config_string_with_escapes(world, tmp_path, c, cmd, field):
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = json.loads((world.src / "config.json").read_text())
    cfg[field] = {"rope_type": HOSTILE, "factor": 2.0} if field == "rope_scaling" else HOSTILE
    (folder / "config.json").write_text(json.dumps(cfg))
    res = c.cli(["describe", folder] if cmd == "describe" else ["check", folder, world.src])
    assert_clean(res)
    assert res.exit_code in (0, 1, 2), res.output


def test_model_manifest_with_escapes(tmp_path, c, monkeypatch):
    folder = tmp_path / "manifests"
    folder.mkdir()
    record = {
        "id": f"acme/{HOSTILE}",
        "family": "llama",
        "source": HOSTILE,
        "aliases": [HOSTILE],
        "config": {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 64,
            "num_key_value_heads": 2,
        },
    }
    (folder / "acme.json").write_text(json.dumps({"models": [record]}))
    monkeypatch.setenv("KVBRIDGE_MANIFEST_PATH", str(folder))
    for args in (
        ["describe", "--list"],
        ["describe", f"acme/{HOSTILE}"],
        ["describe", "acme/nope\x1b]0;x\x07"],
        ["describe", "--list", "--json"],
    ):
        res = c.cli(args)
        assert_clean(res)


def test_error_quoting_a_path_with_escapes(world, tmp_path, c):
    res = c.cli(
        [
            "fit",
            world.src,
            world.tgt,
            "--corpus",
            tmp_path / f"no{HOSTILE.replace('/', '_')}.txt",
            "--out",
            tmp_path / "m",
        ]
    )
    assert_clean(res)
    c.error(res, "\\u001b]0;pwned")


def test_prompt_text_is_echoed_escaped(world, c):
    res = c.cli(["split", world.src, "--guide", world.guide, "--live", "live\x1b]0;t\x07"])
    assert_clean(res)
