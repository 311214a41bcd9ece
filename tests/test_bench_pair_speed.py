"""bench/bench_pair_speed.py --layerwise: a prefill run a decoder layer at a time, resumable.

It must be the one forward, bitwise (same modules, same arguments, same order), survive being
stopped between layers, and refuse a folder made for another run without touching it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_pair_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_pair_speed", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # puts bench/ on sys.path: _layerwise imports from there
    return mod


@pytest.fixture(scope="module")
def lw(bench):
    import _layerwise

    return _layerwise


def tiny_qwen2(configs: Path, *, sliding: bool = False, seed: int = 0):
    """The real 1.5B's Qwen2 config (RoPE theta, q/k/v biases, tied embeddings) at toy width and depth."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = json.loads((configs / "Qwen__Qwen2.5-1.5B-Instruct" / "config.json").read_text())
    cfg.update(
        hidden_size=64,
        intermediate_size=160,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=4,
        vocab_size=1000,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=256,
    )
    if sliding:  # layers 2 and 3 slide over 8 tokens: each layer type gets its own mask
        cfg.update(use_sliding_window=True, sliding_window=8, max_window_layers=2)
    cfg.pop("torch_dtype", None)
    config = Qwen2Config(**cfg)
    config._attn_implementation = "sdpa"  # what the bench's real models run
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def ids_of(n: int, seed: int = 7):
    return torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def meta_of(lw, ids, *, seed: int = 7):
    return lw.make_meta(model="tiny-qwen2", weights="w", config="c", ids=ids, dtype="float32", threads=1, seed=seed)


def tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def snapshot(folder: Path) -> dict:
    """Every file's bytes (hashed) and modification time."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def quiet(_msg):
    pass


@pytest.mark.parametrize("sliding", [False, True], ids=["full-attention", "sliding-layers"])
def test_layerwise_prefill_is_the_one_forward_bitwise(lw, configs, tmp_path, sliding):
    model = tiny_qwen2(configs, sliding=sliding)
    if sliding:
        assert set(model.config.layer_types) == {"full_attention", "sliding_attention"}
    ids = ids_of(48)  # longer than the 8-token window
    record = lw.run_layerwise(model, ids, tmp_path / "lw", meta_of(lw, ids), log=quiet)
    assert record["complete"] and [r["layer"] for r in record["layers"]] == [0, 1, 2, 3]
    final = tensors(tmp_path / "lw" / lw.FINAL)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # the bench's one forward
        hidden = model.model(input_ids=ids, use_cache=True).last_hidden_state
    assert torch.equal(final["logits"], out.logits)
    assert torch.equal(final["hidden"], hidden)
    for i, layer in enumerate(out.cache.layers):
        kv = tensors(tmp_path / "lw" / f"kv-{i:03d}.safetensors")
        assert torch.equal(kv["keys"], layer.keys) and torch.equal(kv["values"], layer.values), i
    s = record["summary"]
    parts = s["embedding_s"] + s["mask_rotary_other_s"] + s["layers_s"] + s["norm_logits_s"]
    assert s["total_s"] == pytest.approx(parts) and s["layers_s"] == pytest.approx(
        sum(r["wall_s"] for r in record["layers"])
    )
    assert not (tmp_path / "lw" / "hidden-003.safetensors").exists()  # superseded by final.safetensors


def test_the_sliding_masks_matter(lw, configs, tmp_path):
    """The check above can fail: one mask for every layer (the full-attention one) changes the result."""
    model = tiny_qwen2(configs, sliding=True)
    ids = ids_of(48)
    first, inputs, _ = lw.record_layer_inputs(model, ids)
    full_mask = inputs[0][1]["attention_mask"]
    assert any(kw["attention_mask"] is not full_mask for _, kw in inputs)
    with torch.no_grad():
        hidden = first
        for layer, (rest, kw) in zip(model.model.layers, inputs):
            hidden = layer(hidden, *rest, **{**kw, "attention_mask": full_mask})
        wrong = model.lm_head(model.model.norm(hidden)[:, -1:, :])
        right = model(input_ids=ids, use_cache=True, logits_to_keep=1).logits
    assert not torch.equal(wrong, right)


def test_stopped_and_resumed_equals_uninterrupted(lw, configs, tmp_path):
    ids = ids_of(40)
    meta = meta_of(lw, ids)
    whole = lw.run_layerwise(tiny_qwen2(configs), ids, tmp_path / "whole", meta, log=quiet)
    parts = tmp_path / "parts"
    first = lw.run_layerwise(tiny_qwen2(configs), ids, parts, meta, stop_after=1, log=quiet)
    assert not first["complete"] and len(first["layers"]) == 1
    assert sorted(p.name for p in parts.iterdir() if not p.name.startswith(".")) == [
        "hidden-000.safetensors",
        "kv-000.safetensors",
        "record.json",
    ]
    assert "1/4 layers done" in lw.report(first) and "rerun the same command" in lw.report(first)
    # a fresh model each time, as a new process would load it
    second = lw.run_layerwise(tiny_qwen2(configs), ids, parts, meta, stop_after=2, log=quiet)
    assert len(second["layers"]) == 3 and not (parts / "hidden-000.safetensors").exists()
    third = lw.run_layerwise(tiny_qwen2(configs), ids, parts, meta, log=quiet)
    assert third["complete"] and [r["layer"] for r in third["layers"]] == [0, 1, 2, 3]
    assert [s["first_layer"] for s in third["sessions"]] == [0, 1, 3]
    assert [r["session"] for r in third["layers"]] == [0, 1, 1, 2]
    for name in [lw.FINAL, *(f"kv-{i:03d}.safetensors" for i in range(4))]:
        a, b = tensors(tmp_path / "whole" / name), tensors(parts / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert whole["complete"]
    again = lw.run_layerwise(tiny_qwen2(configs), ids, parts, meta, log=quiet)  # complete: nothing runs
    assert len(again["sessions"]) == 3


def test_a_session_killed_mid_layer_resumes_from_the_record(lw, configs, tmp_path):
    """Files a killed session wrote after the record's last layer (or half-wrote) do not leak into the result."""
    ids = ids_of(40)
    meta = meta_of(lw, ids)
    lw.run_layerwise(tiny_qwen2(configs), ids, tmp_path / "whole", meta, log=quiet)
    folder = tmp_path / "killed"
    lw.run_layerwise(tiny_qwen2(configs), ids, folder, meta, stop_after=1, log=quiet)
    from safetensors.torch import save_file

    junk = torch.full((1, 40, 64), 7.0)
    save_file({"hidden": junk}, folder / "hidden-001.safetensors")  # written, record not yet updated
    save_file({"keys": junk, "values": junk.clone()}, folder / "kv-001.safetensors")
    (folder / ".record.json.tmp-99").write_text("{")  # half-written
    record = lw.run_layerwise(tiny_qwen2(configs), ids, folder, meta, log=quiet)
    assert record["complete"] and not list(folder.glob(".*.tmp-*"))
    for name in [lw.FINAL, "kv-001.safetensors"]:
        a, b = tensors(tmp_path / "whole" / name), tensors(folder / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_a_folder_in_use_is_refused(lw, configs, tmp_path):
    import fcntl
    import os

    folder = tmp_path / "lw"
    folder.mkdir()
    fd = os.open(folder / lw.LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        ids = ids_of(16)
        with pytest.raises(lw.Refused, match="another run holds it"):
            lw.run_layerwise(tiny_qwen2(configs), ids, folder, meta_of(lw, ids), log=quiet)
    finally:
        os.close(fd)
    assert [p.name for p in folder.iterdir()] == [lw.LOCK]


def test_max_seconds_stops_between_layers(lw, configs, tmp_path):
    ids = ids_of(24)
    meta = meta_of(lw, ids)
    sessions = 0
    while True:  # max_seconds 0: every session runs its one layer, then stops
        record = lw.run_layerwise(tiny_qwen2(configs), ids, tmp_path / "lw", meta, max_seconds=0, log=quiet)
        sessions += 1
        assert len(record["layers"]) == sessions
        if record["complete"]:
            break
        assert record["sessions"][-1]["stopped"] == "max-seconds 0"
    assert sessions == 4 and record["sessions"][-1]["stopped"] == "complete"


def test_a_folder_for_another_run_is_refused_untouched(lw, configs, tmp_path):
    folder = tmp_path / "lw"
    ids = ids_of(48)
    lw.run_layerwise(tiny_qwen2(configs), ids, folder, meta_of(lw, ids), stop_after=2, log=quiet)
    before = snapshot(folder)
    other = ids_of(40)
    with pytest.raises(lw.Refused) as err:
        lw.run_layerwise(tiny_qwen2(configs), other, folder, meta_of(lw, other), log=quiet)
    msg = str(err.value)
    assert "\n" not in msg and "length 48" in msg and "not length 40" in msg and "--layerwise folder" in msg
    assert "ids_sha256" not in msg  # the length is named, not the ids it implies
    with pytest.raises(lw.Refused, match="threads 1, not threads 2"):
        lw.check_folder(folder, {**meta_of(lw, ids), "threads": 2})
    assert snapshot(folder) == before
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("x")
    with pytest.raises(lw.Refused, match="not empty and has no record.json"):
        lw.run_layerwise(tiny_qwen2(configs), ids, stray, meta_of(lw, ids), log=quiet)
    assert [p.name for p in stray.iterdir()] == ["notes.txt"]


def test_cli_layerwise_on_the_zoo_resumes_refuses_and_verifies(bench, tmp_path, capsys):
    folder, js = tmp_path / "lw", tmp_path / "out.json"
    argv = ["--layerwise", str(folder), "--model", "zoo:base", "--length", "24", "--threads", "1"]
    assert bench.main([*argv, "--max-seconds", "0"]) == 0
    assert "1/4 layers done" in capsys.readouterr().out
    before = snapshot(folder)
    with pytest.raises(SystemExit) as err:
        bench.main([*argv[:5], "32", "--threads", "1"])
    assert "made for length 24, seed 24, not length 32, seed 32" in str(err.value)
    assert "\n" not in str(err.value) and snapshot(folder) == before
    assert bench.main([*argv, "--verify", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "zoo:base prefill, 24 tokens, float32, 1 threads: measured" in out
    assert "logits bitwise equal: True" in out and "K/V bitwise equal over 4 layers: True" in out
    result = json.loads(js.read_text())
    assert result["record"]["complete"] and len(result["record"]["sessions"]) == 2
    assert result["verify"]["logits_equal"] and result["verify"]["kv_equal"]


def test_the_transfer_rows_still_need_a_mapping(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--lengths", "512"])
    assert "--mapping is required" in capsys.readouterr().err
