import torch

from kvbridge.module_hooks import HookSet


class Doubler(HookSet):
    def __init__(self, module):
        self.handles = [module.register_forward_hook(lambda m, a, out: out * 2)]


def test_hooks_are_removed_on_exit_and_removing_twice_is_harmless():
    lin = torch.nn.Identity()
    x = torch.ones(2)
    with Doubler(lin) as hooks:
        assert torch.equal(lin(x), 2 * x)
    assert torch.equal(lin(x), x) and hooks.handles == []
    hooks.remove()
    d = Doubler(lin)
    try:
        raise RuntimeError
    except RuntimeError:
        d.remove()
    assert torch.equal(lin(x), x)
