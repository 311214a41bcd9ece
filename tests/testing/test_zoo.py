import pytest

from kvbridge.testing.zoo import zoo_or_skip


def test_a_built_zoo_model_loads_and_a_missing_one_skips(monkeypatch, tmp_path):
    model, tok = zoo_or_skip("base")
    assert model.config.num_hidden_layers >= 1 and tok is not None
    import kvbridge.zoo as zoo_mod

    monkeypatch.setattr(zoo_mod, "model_dir", lambda name: tmp_path / name)
    with pytest.raises(pytest.skip.Exception, match="not built"):
        zoo_or_skip("base")


def test_one_torch_thread_restores_the_count():
    import torch

    from kvbridge.testing.zoo import one_torch_thread

    before = torch.get_num_threads()
    gen = one_torch_thread()
    next(gen)
    assert torch.get_num_threads() == 1
    with pytest.raises(StopIteration):
        next(gen)
    assert torch.get_num_threads() == before
