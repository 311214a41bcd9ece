"""Campaign, class "corrupt or forged artifacts and broken model folders": tampered packs and
mappings (even with the checksum fixed up), manifests missing fields or nested absurdly deep,
and weight files that are truncated, garbage or disagree with their config are all one line
naming the path, exit 2."""

from __future__ import annotations

import json

import pytest


def _fix_checksum(folder, tensor_file):
    from kvbridge.artifacts import sha256_file

    m = json.loads((folder / "manifest.json").read_text())
    m["tensor_sha256"] = sha256_file(folder / tensor_file)
    (folder / "manifest.json").write_text(json.dumps(m))


def _edit_manifest(folder, fn):
    m = json.loads((folder / "manifest.json").read_text())
    fn(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _retype(folder, tensor_file, dtype, *, drop_listing=False, reshape=False):
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / tensor_file))
    out = {}
    for k, v in tensors.items():
        v = v.to(getattr(torch, dtype)) if dtype else v
        out[k] = v.reshape(-1) if reshape and v.dim() > 1 else v
    save_file(out, str(folder / tensor_file))
    _fix_checksum(folder, tensor_file)
    if drop_listing:
        _edit_manifest(folder, lambda m: m.pop("tensors", None))


# -- packs --------------------------------------------------------------------------------------------------
PACK_FIELDS = [
    "model",
    "guide",
    "cache_format",
    "state",
    "model.num_layers",
    "model.weights_fingerprint",
    "guide.token_ids",
    "positions.stop",
    "cache_format.layout",
    "state.spec",
    "tensor_file",
    "kind",
    "schema_version",
]


def _drop(m, dotted):
    parts = dotted.split(".")
    obj = m
    for p in parts[:-1]:
        obj = obj[p]
    obj.pop(parts[-1])


@pytest.mark.parametrize("field", PACK_FIELDS)
@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_pack_manifest_missing_field(world, scratch, c, field, cmd):
    _edit_manifest(scratch / "pack", lambda m: _drop(m, field))
    args = ["pack", "info", scratch / "pack"] if cmd == "info" else ["pack", "verify", scratch / "pack", world.src]
    c.error(c.cli(args), field.split(".")[-1])


@pytest.mark.parametrize(
    "field,value",
    [
        ("model", "x"),
        ("guide", []),
        ("model.num_layers", "2"),
        ("schema_version", 99),
        ("kind", "kvbridge-mapping"),
        ("tensor_file", "../../etc/passwd"),
        ("tensors", "all of them"),
    ],
)
def test_pack_manifest_wrong_type(world, scratch, c, field, value):
    def setv(m):
        parts = field.split(".")
        obj = m
        for p in parts[:-1]:
            obj = obj[p]
        obj[parts[-1]] = value

    _edit_manifest(scratch / "pack", setv)
    c.error(c.cli(["pack", "info", scratch / "pack"]))


@pytest.mark.parametrize("dtype", ["int32", "float16", "float64"])
@pytest.mark.parametrize("drop_listing", [False, True], ids=["listed", "unlisted"])
def test_pack_tensors_retyped_with_the_checksum_fixed_up(world, scratch, c, dtype, drop_listing):
    _retype(scratch / "pack", "kv.safetensors", dtype, drop_listing=drop_listing)
    c.error(c.cli(["pack", "info", scratch / "pack"]), dtype)
    c.error(c.cli(["pack", "verify", scratch / "pack", world.src]), dtype)


def test_pack_tensors_reshaped_with_the_checksum_fixed_up(world, scratch, c):
    _retype(scratch / "pack", "kv.safetensors", None, reshape=True)
    c.error(c.cli(["pack", "info", scratch / "pack"]), "shape")


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "delete"])
def test_pack_tensor_file_damaged(world, scratch, c, damage):
    f = scratch / "pack" / "kv.safetensors"
    raw = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        f.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    elif damage == "garbage":
        f.write_bytes(b"\x00garbage" * 100)
    elif damage == "empty":
        f.write_bytes(b"")
    else:
        f.unlink()
    c.error(c.cli(["pack", "info", scratch / "pack"]), "kv.safetensors")


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 3000 + b"1" + b"}" * 3000, b"\xff\xfe", b"", b"[1, 2]"],
    ids=["deep-list", "deep-obj", "utf16", "empty", "list"],
)
def test_pack_manifest_garbage(world, scratch, c, raw):
    (scratch / "pack" / "manifest.json").write_bytes(raw)
    c.error(c.cli(["pack", "info", scratch / "pack"]), "manifest.json")


# -- mappings -----------------------------------------------------------------------------------------------
def _eval_args(world, mapping):
    return [
        "eval",
        world.src,
        world.tgt,
        "--mapping",
        mapping,
        "--corpus",
        world.corpus,
        "--samples",
        2,
        "--prefix-len",
        8,
        "--continuation-len",
        2,
        "--greedy-tokens",
        2,
        "--bootstrap",
        0,
        "--no-attention",
        "--allow-overlap",
    ]


@pytest.mark.parametrize("dtype", ["int32", "float16"])
@pytest.mark.parametrize("drop_listing", [False, True], ids=["listed", "unlisted"])
def test_mapping_tensors_retyped_with_the_checksum_fixed_up(world, scratch, c, dtype, drop_listing):
    _retype(scratch / "mapping", "mapping.safetensors", dtype, drop_listing=drop_listing)
    c.error(c.cli(_eval_args(world, scratch / "mapping")), dtype)


@pytest.mark.parametrize("field", ["source", "target", "fitter", "layer_selection", "mode", "kind"])
def test_mapping_manifest_missing_field(world, scratch, c, field):
    _edit_manifest(scratch / "mapping", lambda m: m.pop(field))
    c.error(c.cli(_eval_args(world, scratch / "mapping")), field if field != "kind" else "mapping")


def test_mapping_manifest_deeply_nested(world, scratch, c):
    (scratch / "mapping" / "manifest.json").write_text('{"kind": ' + "[" * 50_000 + "]" * 50_000 + "}")
    c.error(c.cli(_eval_args(world, scratch / "mapping")), "manifest.json")


def test_mapping_flipped_byte(world, scratch, c):
    f = scratch / "mapping" / "mapping.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-5] ^= 0x01
    f.write_bytes(bytes(raw))
    c.error(c.cli(_eval_args(world, scratch / "mapping")), "checksum")


def test_a_pack_is_not_a_mapping(world, scratch, c):
    c.error(c.cli(_eval_args(world, scratch / "pack")), "mapping")


# -- model folders --------------------------------------------------------------------------------------------
def _break(world, folder, how, DELETE):
    if how == "config-sizes":
        world.edit_config(folder, intermediate_size=80)
    elif how == "config-heads":
        world.edit_config(folder, num_key_value_heads=4)
    elif how == "config-vocab":
        world.edit_config(folder, vocab_size=500)
    elif how == "truncated":
        f = folder / "model.safetensors"
        f.write_bytes(f.read_bytes()[:2000])
    elif how == "garbage":
        (folder / "model.safetensors").write_bytes(b"\x00not weights" * 500)
    elif how == "no-weights":
        (folder / "model.safetensors").unlink()
    elif how == "deep-config":
        (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    elif how == "no-config":
        (folder / "config.json").unlink()
    elif how == "config-not-utf8":
        (folder / "config.json").write_bytes(b"\xff\xfe\x00{")


BREAKS = [
    "config-sizes",
    "config-heads",
    "config-vocab",
    "truncated",
    "garbage",
    "no-weights",
    "deep-config",
    "no-config",
    "config-not-utf8",
]
NEEDLE = {
    "config-sizes": "disagree",
    "config-heads": "disagree",
    "config-vocab": "disagree",
    "truncated": "model.safetensors",
    "garbage": "model.safetensors",
    "no-weights": "model",
    "deep-config": "config.json",
    "no-config": "config.json",
    "config-not-utf8": "config.json",
}


@pytest.mark.parametrize("how", BREAKS)
@pytest.mark.parametrize("cmd", ["pack", "fit"])
def test_broken_model_folder(world, tmp_path, c, how, cmd, DELETE):
    folder = world.model_copy(tmp_path / "model")
    _break(world, folder, how, DELETE)
    if cmd == "pack":
        args = ["pack", "save", folder, "--guide", world.guide, "--out", tmp_path / "out"]
    else:
        args = [
            "fit",
            folder,
            world.tgt,
            "--corpus",
            world.corpus,
            "--out",
            tmp_path / "out",
            "--seq-len",
            32,
            "--tokens",
            256,
            "--top-k",
            1,
            "--quiet",
        ]
    c.error(c.cli(args), NEEDLE[how])
    assert not (tmp_path / "out").exists() and not c.leftovers(tmp_path)


def test_unreadable_model_folder(world, tmp_path, c, monkeypatch):
    """EACCES reading the folder (simulated: the tests may run as root)."""
    import errno
    import pathlib

    folder = world.model_copy(tmp_path / "model")
    real = pathlib.Path.read_bytes

    def deny(self):
        if self.parent == folder:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    real_text = pathlib.Path.read_text

    def deny_text(self, *a, **k):
        if self.parent == folder:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_text(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_bytes", deny)
    monkeypatch.setattr(pathlib.Path, "read_text", deny_text)
    line = c.error(c.cli(["describe", folder]))
    assert "permission" in line.lower() and str(folder) in line
