"""kvbridge-vllm without vLLM: the store format, matching, refusals, per-rank heads, page layouts."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from kvbridge_vllm import engine, store
from kvbridge_vllm.pages import learn_layout, read_slots

from kvbridge.errors import ConfigError, StateError
from kvbridge.plugins import get_host, make_host
from kvbridge.zoo import zoo_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The zoo's `base` model as a folder vLLM would serve, and a KV state of 40 tokens from it."""
    from kvbridge.models import load

    folder = tmp_path_factory.mktemp("served") / "base"
    shutil.copytree(zoo_dir() / "base", folder)
    loaded = load(str(folder))
    ids = torch.arange(3, 43)[None]
    state = get_host().adapter_for(loaded.config).extract(loaded.model, ids)
    return folder, loaded, state


def test_export_import_round_trip_is_exact(base, tmp_path):
    folder, loaded, state = base
    data = engine.export_state(state, str(folder), tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].read_bytes() == data
    entry = store.read_entry_header(files[0])
    assert entry.token_ids == tuple(range(3, 43)) and entry.kv_shape == (4, 2, 2, 40, 32)
    assert entry.manifest["approximate"] is False and entry.manifest["keys"].startswith("post-RoPE")
    back = engine.import_state(files[0], str(folder))
    assert not back.approximate
    for a, b in zip((*state.keys, *state.values), (*back.keys, *back.values)):
        assert torch.equal(a, b)
    assert torch.equal(back.positions, torch.arange(40)[None])


def test_transferred_state_stays_approximate(base, tmp_path):
    folder, _, state = base
    engine.export_state(replace(state, approximate=True), str(folder), tmp_path / "x.safetensors")
    assert store.read_entry_header(tmp_path / "x.safetensors").approximate
    assert engine.import_state(tmp_path / "x.safetensors", str(folder)).approximate


def test_dtype_option_rounds_once_and_records_it(base, tmp_path):
    folder, _, state = base
    engine.export_state(state, str(folder), tmp_path / "b.safetensors", dtype="bfloat16")
    entry = store.read_entry_header(tmp_path / "b.safetensors")
    assert entry.kv_dtype == "bfloat16" and entry.manifest["rounded_from"] == "float32"
    ident = store.model_identity(str(folder))
    assert "dtype bfloat16" in store.mismatch(entry, ident, "float32")
    assert store.mismatch(entry, ident, "bfloat16") is None


def test_entry_for_another_model_is_refused(base, tmp_path):
    folder, _, state = base
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    w = other / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1  # one weight byte differs: another model of the same geometry
    w.write_bytes(bytes(data))
    engine.export_state(state, str(other), tmp_path / "o.safetensors")
    entry = store.read_entry_header(tmp_path / "o.safetensors")
    why = store.mismatch(entry, store.model_identity(str(folder)), "float32")
    assert why and "weights sha256" in why and "\n" not in why
    with pytest.raises(StateError, match="weights sha256"):
        engine.import_state(tmp_path / "o.safetensors", str(folder))


def test_geometry_mismatch_is_refused(base, tmp_path):
    folder, _, state = base
    with pytest.raises(StateError, match="layers"):
        engine.export_state(replace(state, keys=state.keys[:3], values=state.values[:3]), str(folder), tmp_path)
    wide = store.model_identity(str(zoo_dir() / "wide"))
    engine.export_state(state, str(folder), tmp_path / "e.safetensors")
    entry = store.read_entry_header(tmp_path / "e.safetensors")
    assert "geometry" in store.mismatch(entry, wide, "float32")


@pytest.mark.parametrize("cut", [1, 1000, 10_000])
def test_truncated_file_is_one_line(base, tmp_path, cut):
    folder, _, state = base
    data = engine.export_state(state, str(folder))
    path = tmp_path / "t.safetensors"
    path.write_bytes(data[:-cut])
    with pytest.raises(store.EntryError) as info:
        store.read_entry_header(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    with pytest.raises(StateError):
        engine.import_state(path, str(folder))
    scanned = store.scan(tmp_path)
    assert isinstance(scanned[str(path)][1], store.EntryError)


def test_not_an_entry(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "n.safetensors"))
    with pytest.raises(store.EntryError, match="not a kvbridge vLLM store entry"):
        store.read_entry_header(tmp_path / "n.safetensors")


def test_gguf_reference_is_refused_with_the_fix():
    from kvbridge.models import resolve

    try:
        ref = resolve("smollm2")
    except Exception:  # noqa: BLE001
        pytest.skip("smollm2 not fetched")
    with pytest.raises(ConfigError, match="materialize"):
        store.model_identity(ref.gguf_file)


def _entry(ids, path="e"):
    return store.Entry(path=path, manifest={}, token_ids=tuple(ids), kv_shape=(1, 2, 1, len(ids), 1), kv_dtype="f")


def test_best_match_takes_the_longest_whole_prefix():
    a, b, c = _entry([1, 2, 3], "a"), _entry([1, 2, 3, 4, 5], "b"), _entry([1, 2, 9], "c")
    entry, n, _, _ = store.best_match([1, 2, 3, 4, 5, 6, 7], [a, b, c])
    assert entry is b and n == 5
    # the whole prompt stored: all but its last token (vLLM computes one)
    entry, n, _, _ = store.best_match([1, 2, 3, 4, 5], [a, b])
    assert entry is b and n == 4
    # a stored prefix longer than the prompt, or differing inside: no match, the closest named
    entry, n, closest, k = store.best_match([1, 2, 7, 4], [a, b, c])
    assert entry is None and n == 0 and k == 2 and closest is not None
    entry, n, closest, k = store.best_match([1, 2], [b])
    assert entry is None and closest is b and k == 2


def test_partial_prefix_loads_the_common_rows_only(base, tmp_path):
    folder, _, state = base
    engine.export_state(state, str(folder), tmp_path)
    entry = store.read_entry_header(next(tmp_path.iterdir()))
    kv = store.read_kv(entry, start=7, stop=33, heads=[1])
    assert kv.shape == (4, 2, 1, 26, 32)
    assert torch.equal(kv[2, 0, 0], state.keys[2][0, 1, 7:33]) and torch.equal(kv[3, 1, 0], state.values[3][0, 1, 7:33])


@pytest.mark.parametrize(
    "total,tp,want",
    [
        (4, 1, [[0, 1, 2, 3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (2, 4, [[0], [0], [1], [1]]),  # more ranks than heads: each head replicated
        (1, 2, [[0], [0]]),
    ],
)
def test_rank_heads(total, tp, want):
    assert [store.rank_heads(total, tp, r) for r in range(tp)] == want


@pytest.mark.parametrize("total,tp", [(3, 2), (2, 3)])
def test_rank_heads_refuses_uneven_splits(total, tp):
    with pytest.raises(ValueError):
        store.rank_heads(total, tp, 0)


def test_per_rank_slices_rebuild_the_whole_cache(base, tmp_path):
    folder, _, state = base
    engine.export_state(state, str(folder), tmp_path)
    entry = store.read_entry_header(next(tmp_path.iterdir()))
    whole = store.read_kv(entry, start=0, stop=40)
    parts = [store.read_kv(entry, start=0, stop=40, heads=store.rank_heads(2, 2, r)) for r in range(2)]
    assert torch.equal(torch.cat(parts, dim=2), whole)


def _cpu_like_writer(block_size):
    """A cache write laying each (block, head) page out as K transposed [D, bs] then V [bs, D]."""

    def write(k, v, cache, slots):
        D = k.shape[-1]
        for t, s in enumerate(slots.tolist()):
            b, o = divmod(s, block_size)
            page = cache[b].reshape(k.shape[1], -1)
            for h in range(k.shape[1]):
                page[h, : D * block_size].view(D, block_size)[:, o] = k[t, h]
                page[h, D * block_size :].view(block_size, D)[o] = v[t, h]

    return write


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learned_layout_reads_pages_back_exactly(dtype):
    bs, H, D = 8, 2, 4
    write = _cpu_like_writer(bs)
    pos = learn_layout(write, (H, bs, 2 * D), dtype, bs, H, D)
    cache = torch.zeros((3, H, bs, 2 * D), dtype=dtype)
    k, v = torch.randn(13, H, D).to(dtype), torch.randn(13, H, D).to(dtype)
    slots = torch.tensor([8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4])
    write(k, v, cache, slots)
    rk, rv = read_slots(cache, pos, slots, bs)
    assert torch.equal(rk, k) and torch.equal(rv, v)


def test_a_lossy_cache_write_is_refused():
    def drops(k, v, cache, slots):  # writes K only
        cache[0, :, :, : k.shape[-1]] = k.transpose(0, 1)

    with pytest.raises(ValueError, match="not each once"):
        learn_layout(drops, (2, 8, 8), torch.float32, 8, 2, 4)


def test_registered_through_the_entry_point():
    host = make_host()
    names = {r.name: r for r in host.records}
    if "vllm" not in names:
        pytest.skip("kvbridge-vllm is not installed (pip install -e plugins/kvbridge-vllm)")
    assert names["vllm"].error is None
    assert host.get("engine", "vllm").name == "vllm"


def test_a_transferred_cache_saved_by_the_cli_goes_to_the_store_marked_approximate(tmp_path):
    """`kvbridge transfer --save-state` then `kvbridge engine export --engine vllm`: the entry holds the
    pack's K/V unchanged, is marked approximate and names where it came from; `pack info` and `engine
    import` say so too."""
    import json

    from click.testing import CliRunner

    from kvbridge import api
    from kvbridge.cli.main import cli
    from kvbridge.prefix.packs import read_pack_state

    def run(*args):
        res = CliRunner().invoke(cli, [str(a) for a in args])
        assert res.exit_code == 0, res.output
        return res.output

    wide = tmp_path / "wide"
    shutil.copytree(zoo_dir() / "wide", wide)
    texts = [f"{i} To be, or not to be, that is the question: whether tis nobler " * 8 for i in range(24)]
    api.fit("zoo:base", str(wide), texts, out=str(tmp_path / "map"), seq_len=64, tokens=1024, top_k=1)
    saved = tmp_path / "moved"
    prompt = "To be, or not to be, that is the question"
    run("transfer", "zoo:base", wide, "--mapping", tmp_path / "map", "--prompt", prompt, "--max-new-tokens", 1,
        "--save-state", saved)  # fmt: skip
    info = run("pack", "info", saved)
    assert "transferred (source zoo:base" in info and "approximate, not the model's own exact cache" in info
    out = json.loads(
        run("engine", "export", saved, "--engine", "vllm", "--model", wide, "--out", tmp_path / "s", "--json")
    )
    assert out["approximate"] is True
    (entry_file,) = (tmp_path / "s").iterdir()
    entry = store.read_entry_header(entry_file)
    assert entry.approximate and entry.manifest["provenance"].startswith("transferred, source zoo:base, mapping ")
    _, state = read_pack_state(saved)
    back = engine.import_state(entry_file, str(wide))
    assert back.approximate and back.token_ids.tolist() == state.token_ids.tolist()
    for a, b in zip((*state.keys, *state.values), (*back.keys, *back.values)):
        assert torch.equal(a, b)
    assert "approximate (transferred or steered" in run("engine", "import", entry_file, wide, "--engine", "vllm")


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_save_parts_join_into_the_whole_entry(base, tmp_path, tp):
    """kvbridge_save under tensor parallelism: each rank writes its KV heads (vLLM's sharding, replicated
    heads when ranks outnumber them); nothing is an entry until the last part, and the joined entry is
    the single-rank one bit for bit (plus its tensor_parallel record); the parts are gone."""
    folder, _, state = base
    ident = store.model_identity(str(folder))
    kv = torch.stack([torch.stack((k[0], v[0])) for k, v in zip(state.keys, state.values)])
    ids = state.token_ids[0].tolist()
    joined = None
    for rank in reversed(range(tp)):  # any order: the last writer joins
        assert joined is None and not list(tmp_path.glob("*.safetensors"))
        heads = store.rank_heads(2, tp, rank)
        store.write_part(kv[:, :, heads], heads, ids, ident, tmp_path, rank=rank, tp=tp)
        joined = store.join_parts(tmp_path, ids, ident, tp=tp, approximate=False, provenance="vllm-prefill")
    assert joined is not None and [p.name for p in tmp_path.iterdir()] == [joined.name]
    entry = store.read_entry_header(joined)
    assert entry.manifest["tensor_parallel"] == tp and not entry.approximate
    assert torch.equal(store.read_kv(entry, start=0, stop=40), kv)
    assert list(store.scan(tmp_path)) == [str(joined)]


def test_tensor_parallel_parts_of_other_tokens_are_refused(base, tmp_path):
    folder, _, state = base
    ident = store.model_identity(str(folder))
    kv = torch.stack([torch.stack((k[0], v[0])) for k, v in zip(state.keys, state.values)])
    ids = state.token_ids[0].tolist()
    store.write_part(kv[:, :, [0]], [0], ids, ident, tmp_path, rank=0, tp=2)
    part = store.part_path(tmp_path, ids, ident, 1, 2)
    store.write_part(kv[:, :, [1]], [1], ids[:-1] + [7], ident, tmp_path, rank=1, tp=2)
    store.part_path(tmp_path, ids[:-1] + [7], ident, 1, 2).rename(part)  # a stale part under this name
    with pytest.raises(store.EntryError, match="other token ids"):
        store.join_parts(tmp_path, ids, ident, tp=2, approximate=False, provenance="vllm-prefill")
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.joining"))


def test_transfer_into_vllm_directly_is_refused_with_the_save_state_route(tmp_path):
    """`kvbridge transfer --engine vllm`: vLLM runs in its own process, so the command refuses in one line
    (naming --save-state and `engine export`) before the models load, and writes nothing."""
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    out = tmp_path / "moved"
    args = ["transfer", "zoo:base", "zoo:base", "--mapping", "identity", "--prompt", "Once upon a time"]
    res = CliRunner().invoke(cli, [*args, "--engine", "vllm", "--save-state", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "cannot continue from one here" in res.output and "--save-state DIR" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()
