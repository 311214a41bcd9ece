"""kvbridge.transfer_run: ``kvbridge transfer`` as one library call on a loaded pair."""

from __future__ import annotations

import pytest

from kvbridge import api
from kvbridge.errors import ConfigError, KVBridgeError
from kvbridge.transfer_run import TransferSettings, check_generation_length, transfer_generate


@pytest.fixture(scope="module")
def same_pair():
    return api.load_pair("zoo:base", "zoo:base")


def test_identity_transfer_matches_the_native_continuation(same_pair):
    res = api.transfer_generate(
        same_pair, TransferSettings(mapping="identity", prompt="Once upon a time", max_new_tokens=4, compare=True)
    )
    assert res.tokens >= 1 and res.r2 is None and res.engine is None
    assert res.compared == 4 and res.agreement == 4 and res.text == res.native_text
    assert res.kl is not None and res.kl < 1e-6 and res.target_prefill_s >= 0


def test_without_compare_no_native_fields(same_pair):
    res = transfer_generate(
        same_pair, TransferSettings(mapping="identity", prompt="Once upon a time", max_new_tokens=2)
    )
    assert res.native_text is None and res.agreement is None and isinstance(res.text, str)


def test_a_one_token_prompt_is_refused(same_pair):
    with pytest.raises(ConfigError, match="fewer than 2 tokens"):
        transfer_generate(same_pair, TransferSettings(mapping="identity", prompt="a"))


def test_identity_needs_one_model():
    pair = api.load_pair("zoo:base", "zoo:wide")
    with pytest.raises(ConfigError, match="--mapping identity needs SOURCE and TARGET to be one model"):
        transfer_generate(pair, TransferSettings(mapping="identity", prompt="Once upon a time"))


def test_generation_length_names_the_flag():
    check_generation_length(10, 5, None)
    check_generation_length(10, 5, 15)
    with pytest.raises(KVBridgeError, match="--max-new-tokens 6 after a 10-token prompt"):
        check_generation_length(10, 6, 15)
    with pytest.raises(KVBridgeError, match="--prompt is 16 tokens"):
        check_generation_length(16, 0, 15)


# -- save_state: the transferred cache as a pack folder for TARGET ---------------------------------------
TEXTS = [f"{i} To be, or not to be, that is the question: whether tis nobler in the mind " * 8 for i in range(24)]


@pytest.fixture(scope="module")
def wide_mapping(tmp_path_factory):
    """A small ridge mapping zoo:base -> zoo:wide (1,024 calibration tokens, top-k 1)."""
    out = tmp_path_factory.mktemp("map") / "base-wide"
    api.fit("zoo:base", "zoo:wide", TEXTS, out=str(out), seq_len=64, tokens=1024, top_k=1)
    return out


def test_save_state_writes_the_transferred_cache_as_an_approximate_pack(wide_mapping, tmp_path):
    """The pack holds exactly the cache TARGET continued from (the prompt minus its last token, through
    the mapping), loads for TARGET without a forward pass, and says it is approximate and where it came from."""
    import torch

    from kvbridge.plugins import get_host
    from kvbridge.prefix.packs import load_pack, read_pack_state
    from kvbridge.transfer import transfer

    pair = api.load_pair("zoo:base", "zoo:wide")
    out = tmp_path / "moved"
    prompt = "To be, or not to be, that is the question"
    res = transfer_generate(
        pair, TransferSettings(mapping=str(wide_mapping), prompt=prompt, max_new_tokens=2, save_state=str(out))
    )
    assert res.saved == str(out) and res.approximate
    manifest, state = read_pack_state(out)
    assert state.approximate and manifest["provenance"]["kind"] == "transferred"
    assert manifest["provenance"]["source"] == "zoo:base" and manifest["model"]["reference"] == "zoo:wide"
    assert manifest["provenance"]["mapping"] == str(wide_mapping.resolve())
    assert state.meta["provenance"] == manifest["provenance"]
    ids = torch.tensor([pair.source.tokenizer(prompt)["input_ids"]])
    assert state.num_tokens == ids.shape[1] - 1 == res.tokens
    host = get_host()
    want = transfer(
        host.adapter_for(pair.source.config).extract(pair.source.model, ids[:, :-1]),
        api.load_mapping(str(wide_mapping), source=pair.source.model, target=pair.target.model),
        host=host,
    )
    for a, b in zip((*want.keys, *want.values), (*state.keys, *state.values)):
        assert torch.equal(a, b)
    loaded = load_pack(out, pair.target.model)
    assert loaded.state.approximate and not loaded.forced
    assert any("approximate, not the model's own exact cache" in n for n in loaded.notes), loaded.notes


def test_save_state_of_the_identity_mapping_is_exact(same_pair, tmp_path):
    """One model: the saved cache is the model's own prefill, bit for bit, and not marked approximate."""
    import torch

    from kvbridge.prefix.packs import load_pack

    out = tmp_path / "same"
    prompt = "Once upon a time there was"
    res = transfer_generate(
        same_pair, TransferSettings(mapping="identity", prompt=prompt, max_new_tokens=1, save_state=str(out))
    )
    assert res.saved == str(out) and not res.approximate
    loaded = load_pack(out, same_pair.target.model)
    assert not loaded.state.approximate
    ids = torch.tensor([same_pair.source.tokenizer(prompt)["input_ids"][:-1]])
    from kvbridge.plugins import get_host

    own = get_host().adapter_for(same_pair.target.config).extract(same_pair.target.model, ids)
    for a, b in zip((*own.keys, *own.values), (*loaded.state.keys, *loaded.state.values)):
        assert torch.equal(a, b)


def test_save_state_refuses_an_existing_folder_before_any_model_runs(same_pair, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(KVBridgeError, match="a folder kvbridge did not write"):
        transfer_generate(
            same_pair, TransferSettings(mapping="identity", prompt="Once upon a time", save_state=str(taken))
        )
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match="--save-state is empty"):
        TransferSettings(mapping="identity", prompt="x", save_state=" ")


def test_save_state_pack_refuses_another_geometry(tmp_path):
    import torch

    from kvbridge.plugins import get_host
    from kvbridge.prefix.packs import save_state_pack

    pair = api.load_pair("zoo:base", "zoo:wide")
    state = get_host().adapter_for(pair.source.config).extract(pair.source.model, torch.arange(3, 13)[None])
    with pytest.raises(ConfigError, match="the KV state caches 4 layers"):
        save_state_pack(pair.target.model, state, tmp_path / "p", tokenizer_fp={}, provenance={"kind": "x"})
    assert not (tmp_path / "p").exists()


def test_an_engine_that_continues_gets_the_transferred_cache_and_the_result_keeps_the_run_fields(same_pair, tmp_path):
    """``engine=NAME``: TARGET continues in the engine's ``continue_from`` from the transferred cache (the
    prompt minus its last token, then that token); the result carries the run's fields (prefix length,
    times, the mapping loader's warnings, the saved pack) and the engine's own."""
    from kvbridge.hookspecs import hookimpl
    from kvbridge.plugin_types import Engine
    from kvbridge.plugins import make_host

    calls = []

    class _Continues:
        name = "fake"

        def export_state(self, state, model, out=None, **options):
            return b""

        def import_state(self, src, model, **options):
            raise NotImplementedError

        def continue_from(self, state, target_ref, last, max_new_tokens, *, native, host):
            calls.append((state.num_tokens, last, max_new_tokens, native))
            return {"tokens": [5, 6, 7], "native_tokens": [5, 6, 8], "native_prefill_s": 0.25}

    class _Plugin:
        @hookimpl
        def kvbridge_register_engines(self, register):
            register(Engine("fake", "a test engine that continues", _Continues()))

    host = make_host(entry_points=False, extra=[("fakeengine", _Plugin())])
    prompt = "Once upon a time there was"
    ids = same_pair.source.tokenizer(prompt)["input_ids"]
    out = tmp_path / "saved"
    res = transfer_generate(
        same_pair,
        TransferSettings(
            mapping="identity", prompt=prompt, max_new_tokens=3, compare=True, engine="fake", save_state=str(out)
        ),
        host=host,
    )
    assert calls == [(len(ids) - 1, ids[-1:], 3, True)]
    assert res.engine == "fake" and res.engine_run["tokens"] == [5, 6, 7] and res.tokens == len(ids) - 1
    assert res.text == same_pair.source.tokenizer.decode([5, 6, 7], skip_special_tokens=True)
    assert res.compared == 3 and res.agreement == 2 and res.target_prefill_s == 0.25
    assert res.source_prefill_s >= 0 and res.map_s >= 0 and res.warnings == () and res.r2 is None
    assert res.saved == str(out) and out.is_dir() and not res.approximate
