"""The built-in answer to ``kvbridge_resolve_family`` for model types no family file lists, asked last
(``trylast``) so any plugin's claim comes first:

- a multimodal wrapper whose text decoder has a family: that family on ``text_config``;
- otherwise a type transformers' own config classes describe: the generic adapter.
"""

from __future__ import annotations

from kvbridge.hookspecs import hookimpl


@hookimpl(trylast=True)
def kvbridge_resolve_family(config, families):
    from kvbridge.family_adapter import TextConfigAdapter, text_config_of

    model_type = config.get("model_type")
    text = text_config_of(config)
    if text is not None and families is not None and text["model_type"] in families:
        return TextConfigAdapter(
            name=f"{text['model_type']} (in {model_type})",
            model_types=(model_type,),
            inner=families[text["model_type"]],
            wrapper_type=model_type,
        )
    from kvbridge.builtin.families.generic import ADAPTER as GENERIC

    return GENERIC if GENERIC.supports(model_type) else None
