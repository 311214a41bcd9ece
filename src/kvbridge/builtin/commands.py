"""kvbridge's own commands, registered through ``kvbridge_register_commands`` like a plugin's.

Each is a :class:`kvbridge.cli.lazy.LazyCommand` (``name -> "module:attr"``), imported only when
invoked or when ``--help`` lists it. The hook runs first (``tryfirst``), so a plugin's command of
the same name is refused and the built-in one is kept.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl

#: built-in commands, in the order they were added; imported on use
COMMANDS = {
    "plugins": "kvbridge.cli.plugins_cmd:plugins",
    "describe": "kvbridge.cli.describe_cmd:describe",
    "models": "kvbridge.cli.models_cmd:models",
    "check": "kvbridge.cli.check_cmd:check",
    "split": "kvbridge.cli.split_cmd:split",
    "pack": "kvbridge.cli.pack_cmd:pack",
    "diverge": "kvbridge.cli.diverge_cmd:diverge",
    "ablate": "kvbridge.cli.ablate_cmd:ablate",
    "demo": "kvbridge.cli.demo_cmd:demo",
    "zoo": "kvbridge.cli.zoo_cmd:zoo",
    "fit": "kvbridge.cli.fit_cmd:fit",
    "transfer": "kvbridge.cli.transfer_cmd:transfer",
    "eval": "kvbridge.cli.eval_cmd:eval_cmd",
    "conformance": "kvbridge.cli.conformance_cmd:conformance",
    "graft": "kvbridge.cli.graft_cmd:graft",
    "harness": "kvbridge.cli.harness_cmd:harness",
    "engine": "kvbridge.cli.engine_cmd:engine",
    "steer": "kvbridge.cli.steer_cmd:steer",
}


@hookimpl(tryfirst=True)
def kvbridge_register_commands(cli) -> None:
    from kvbridge.cli.lazy import LazyCommand

    for name, path in COMMANDS.items():
        cli.add_command(LazyCommand(name, path), name)
