"""Steering vectors: built from pairs (mean / PCA / positions), the random control, the transfer
through a mapping (the bias cancels), the artifact round trip and its refusal of another model."""

from __future__ import annotations

import json

import pytest
import torch

from kvbridge.steer.artifact import VectorMismatchError, load_vector, read_vector, save_vector
from kvbridge.steer.vectors import SteerError, _pca, build_vector, random_like, transfer_vector


def test_mean_vector_is_the_mean_of_the_pair_differences_in_content_space(zoo_base, zoo_vector, pairs_file):
    from kvbridge.plugins import get_host
    from kvbridge.steer.pairs import encode_side, read_pairs

    model, tok = zoo_base
    adapter = get_host().adapter_for(model.config.to_dict())
    dk, dv = [], []
    for p in read_pairs(pairs_file):
        reads = []
        for side in (p.positive, p.negative):
            enc = encode_side(tok, side, "last")
            st = adapter.extract(model, torch.tensor([list(enc.ids)])).strip_rope()
            reads.append((st.keys[2][0, :, enc.start], st.values[2][0, :, enc.start]))
        dk.append(reads[0][0] - reads[1][0])
        dv.append(reads[0][1] - reads[1][1])
    v_mean, k_mean = torch.stack(dv).mean(0), torch.stack(dk).mean(0)
    assert torch.allclose(zoo_vector.values[2], v_mean, atol=1e-5)
    assert torch.allclose(zoo_vector.keys[2], k_mean, atol=1e-5)
    assert len(zoo_vector.residual) == 4 and zoo_vector.residual[0].shape == (model.config.hidden_size,)
    assert zoo_vector.info["num_pairs"] == 3 and zoo_vector.key_space == "content"


def test_pca_recovers_a_planted_direction_with_the_mean_projection_as_scale():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(16, generator=g)
    u = u / u.norm()
    scales = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    diffs = scales[:, None] * u + 1e-3 * torch.randn(6, 16, generator=g)
    got = _pca(diffs)
    assert torch.allclose(got / got.norm(), u, atol=1e-3)
    assert abs(float(got.norm()) - float(scales.mean())) < 1e-2


def test_pca_build_and_rotated_key_space(zoo_base, pairs_file):
    from kvbridge.steer.pairs import read_pairs

    model, tok = zoo_base
    pairs = read_pairs(pairs_file)
    pca = build_vector(model, tok, pairs, method="pca", position="final")
    assert pca.info["method"] == "pca" and pca.info["position"] == "final"
    rotated = build_vector(model, tok, pairs[:1], key_space="rotated")
    content = build_vector(model, tok, pairs[:1])
    assert torch.equal(rotated.values[0], content.values[0]) and not torch.allclose(rotated.keys[0], content.keys[0])
    with pytest.raises(SteerError, match="at least 2 pairs"):
        build_vector(model, tok, pairs[:1], method="pca")


def test_random_control_has_the_same_norms_and_another_direction(zoo_vector):
    r = random_like(zoo_vector, seed=3)
    for a, b in zip((*r.keys, *r.values), (*zoo_vector.keys, *zoo_vector.values)):
        assert torch.allclose(a.norm(dim=-1), b.norm(dim=-1), rtol=1e-5)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).abs()
        assert bool((cos < 0.9).all())
    assert torch.equal(random_like(zoo_vector, seed=3).keys[1], r.keys[1])


def test_transfer_through_identity_is_exact_and_through_a_map_is_its_linear_part(zoo_vector):
    from kvbridge.fit.mapping import FittedMapping, LayerMap
    from kvbridge.transfer import IdentityMapping

    same = transfer_vector(zoo_vector, IdentityMapping(), zoo_vector.spec)
    assert all(torch.equal(a, b) for a, b in zip((*same.keys, *same.values), (*zoo_vector.keys, *zoo_vector.values)))
    assert same.residual == () and "transferred" in same.info["method"]
    spec = zoo_vector.spec
    H, D = spec.num_kv_heads, spec.head_dim
    g = torch.Generator().manual_seed(0)
    layers = []
    for i in range(spec.num_layers):
        src = (i, (i + 1) % spec.num_layers)  # each target layer reads two source layers
        w = lambda: torch.randn(2 * H * D, H * D, generator=g) / 8  # noqa: E731
        layers.append(
            LayerMap("dense", src, w(), torch.randn(H * D, generator=g), w(), torch.randn(H * D, generator=g))
        )
    mapping = FittedMapping(spec, spec, layers)
    moved = transfer_vector(zoo_vector, mapping)
    for i, lm in enumerate(layers):
        x = torch.cat([zoo_vector.keys[j].reshape(-1) for j in lm.sources])
        assert torch.allclose(moved.keys[i], (x @ lm.wk).reshape(H, D), atol=1e-4)  # no bias: it cancels
        x = torch.cat([zoo_vector.values[j].reshape(-1) for j in lm.sources])
        assert torch.allclose(moved.values[i], (x @ lm.wv).reshape(H, D), atol=1e-4)
    from dataclasses import replace

    with pytest.raises(SteerError, match="rotated keys"):
        transfer_vector(replace(zoo_vector, key_space="rotated"), mapping)


def test_artifact_round_trip_and_refusal_of_another_model(zoo_base, zoo_vector, tmp_path):
    from kvbridge.models import load

    model, tok = zoo_base
    out = save_vector(zoo_vector, tmp_path / "vec", model)
    manifest, again = read_vector(out)
    assert manifest["kind"] == "kvbridge.steering-vector" and manifest["schema_version"] == 1
    assert manifest["num_pairs"] == 3 and manifest["position"]["kind"] == "last" and manifest["key_space"] == "content"
    assert len(manifest["norms"]["keys"]) == 4 and manifest["model"]["weights_fingerprint"]
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            (*again.keys, *again.values, *again.residual), (*zoo_vector.keys, *zoo_vector.values, *zoo_vector.residual)
        )
    )
    load_vector(out, model)
    tuned = load("zoo:tuned").model
    with pytest.raises(VectorMismatchError) as err:
        load_vector(out, tuned)
    assert "weights" in str(err.value) and "\n" not in str(err.value)
    odd = load("zoo:odd").model
    with pytest.raises(VectorMismatchError, match="geometry"):
        load_vector(out, odd)


def test_a_tampered_or_malformed_artifact_is_refused(zoo_base, zoo_vector, tmp_path):
    from kvbridge.errors import ArtifactError

    model, _ = zoo_base
    out = save_vector(zoo_vector, tmp_path / "vec", model)
    m = json.loads((out / "manifest.json").read_text())
    m["kind"] = "kvbridge.prefix-pack"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="not a steering vector"):
        read_vector(out)
    out2 = save_vector(zoo_vector, tmp_path / "vec2", model)
    data = bytearray((out2 / "vector.safetensors").read_bytes())
    data[-4:] = b"\x00\x00\xc0\x7f"  # a NaN in the last float
    (out2 / "vector.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum"):
        read_vector(out2)
