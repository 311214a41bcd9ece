"""Artifact IO: atomic writes, checksum-verified reads, never half-written, never pickle."""

from __future__ import annotations

import json

import pytest
import torch

from kvbridge.artifacts import MANIFEST, read_artifact, write_artifact
from kvbridge.errors import ArtifactError


def test_round_trip_and_checksum(tmp_path):
    out = tmp_path / "a"
    write_artifact(out, {"x": torch.arange(6.0).reshape(2, 3)}, {"kind": "test"}, tensor_file="t.safetensors")
    manifest, tensors = read_artifact(out)
    assert manifest["kind"] == "test" and len(manifest["tensor_sha256"]) == 64
    assert torch.equal(tensors["x"], torch.arange(6.0).reshape(2, 3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temp folder left


def test_truncated_file_is_refused_by_checksum(tmp_path):
    out = write_artifact(tmp_path / "a", {"x": torch.ones(100)}, {}, tensor_file="t.safetensors")
    data = (out / "t.safetensors").read_bytes()
    (out / "t.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        read_artifact(out)


def test_existing_output_needs_force_and_nan_writes_nothing(tmp_path):
    out = write_artifact(tmp_path / "a", {"x": torch.ones(2)}, {}, tensor_file="t.safetensors")
    with pytest.raises(ArtifactError, match="already exists"):
        write_artifact(out, {"x": torch.ones(2)}, {}, tensor_file="t.safetensors")
    write_artifact(out, {"x": torch.zeros(2)}, {"v": 2}, tensor_file="t.safetensors", force=True)
    assert read_artifact(out)[0]["v"] == 2
    with pytest.raises(ArtifactError, match="NaN/inf"):
        write_artifact(tmp_path / "b", {"x": torch.tensor([float("nan")])}, {}, tensor_file="t.safetensors")
    assert not (tmp_path / "b").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import kvbridge.artifacts

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(kvbridge.artifacts, "save_safetensors", boom)
    with pytest.raises(OSError):
        write_artifact(tmp_path / "c", {"x": torch.ones(2)}, {}, tensor_file="t.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_bad_manifest_is_one_line(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        read_artifact(tmp_path / "m")
    with pytest.raises(ArtifactError, match="is missing"):
        read_artifact(tmp_path)
    (tmp_path / "m" / MANIFEST).write_text(json.dumps({"tensor_file": "../etc"}))
    with pytest.raises(ArtifactError, match="no valid 'tensor_file'"):
        read_artifact(tmp_path / "m")


def test_state_round_trips_through_an_artifact(tmp_path):
    from kvbridge.kvstate_io import state_from_tensors, state_manifest, state_tensors
    from kvbridge.plugins import make_host

    adapter = make_host(entry_points=False).adapter_for({"model_type": "llama"})
    model = adapter.build_model(adapter.tiny_config())
    state = adapter.extract(model, torch.randint(3, 100, (1, 7)))
    out = write_artifact(tmp_path / "s", state_tensors(state), state_manifest(state), tensor_file="kv.safetensors")
    manifest, tensors = read_artifact(out)
    back = state_from_tensors(tensors, manifest)
    assert back.spec == state.spec and all(torch.equal(a, b) for a, b in zip(back.keys, state.keys))


def test_sparse_attention_indexer_keys_round_trip(tmp_path):
    """A DSA model's state keeps its indexer keys through an artifact (else it could not be injected)."""
    from kvbridge.kvstate_io import state_from_tensors, state_manifest, state_tensors
    from kvbridge.conformance import tiny
    from kvbridge.plugins import make_host

    data = tiny.tiny_config_dict("glm_moe_dsa")
    adapter = make_host(entry_points=False).adapter_for(data)
    model = tiny.build(data)
    state = adapter.extract(model, torch.randint(3, 100, (1, 7)))
    out = write_artifact(tmp_path / "s", state_tensors(state), state_manifest(state), tensor_file="kv.safetensors")
    back = state_from_tensors(*reversed(read_artifact(out)))
    assert [i for i, _ in back.indexer_keys] == list(state.spec.indexer_layers)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back.indexer_keys, state.indexer_keys))
    adapter.inject(back, model)  # validates: the indexer keys fit the model


def test_save_safetensors_writes_save_files_bytes_and_hashes_them_while_writing(tmp_path):
    """The streaming writer: byte for byte what safetensors writes (mixed dtypes, empty and
    non-contiguous tensors), and the sha256 it returns is the file's."""
    import hashlib

    from safetensors.torch import save_file

    from kvbridge.artifacts import save_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(5, 7, generator=g),
        "ids": torch.arange(6),
        "h": torch.randn(3, generator=g).half(),
        "b": torch.randn(4, generator=g).to(torch.bfloat16),
        "d": torch.randn(2, 2, dtype=torch.float64),
        "e": torch.ones(0),
        "t": torch.randn(4, 3, generator=g).T,
        "flag": torch.tensor([True, False]),
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "ref.safetensors"))
    digest = save_safetensors(tensors, tmp_path / "ours.safetensors")
    ours = (tmp_path / "ours.safetensors").read_bytes()
    assert ours == (tmp_path / "ref.safetensors").read_bytes()
    assert digest == hashlib.sha256(ours).hexdigest()


def test_nan_in_a_later_block_of_a_large_tensor_writes_nothing(tmp_path):
    big = torch.zeros(3 << 20)  # 12 MiB: the NaN sits in the third 4 MiB block
    big[-1] = float("inf")
    with pytest.raises(ArtifactError, match="tensor 'big' has NaN/inf"):
        write_artifact(tmp_path / "c", {"a": torch.ones(3), "big": big}, {}, tensor_file="t.safetensors")
    assert list(tmp_path.iterdir()) == []
