"""Built-in model-reference schemes, registered through the same hook a plugin uses: ``zoo:NAME``
(a model of kvbridge's embedded tiny zoo)."""

from __future__ import annotations

from kvbridge.errors import ConfigError
from kvbridge.hookspecs import hookimpl


def _zoo(rest: str):
    from kvbridge.zoo import REBUILD, ZOO_NAMES, model_dir

    if not rest:
        raise ConfigError("zoo: needs a model name", f"use one of: {', '.join('zoo:' + n for n in ZOO_NAMES)}")
    folder = model_dir(rest)
    if not (folder / "config.json").is_file():  # a known name whose files were not shipped or built
        raise ConfigError(f"zoo file {folder / 'config.json'} is missing", REBUILD)
    return folder


@hookimpl
def kvbridge_register_model_sources(register) -> None:
    register("zoo", _zoo, "a model of kvbridge's embedded tiny zoo (zoo:base, zoo:wide, ...)")
