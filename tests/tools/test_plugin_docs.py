"""docs/plugins.md is what tools/plugin_docs.py writes today, and documents every hook."""


def test_every_hook_is_on_the_reference_page_with_types_and_an_example(repo_root):
    """docs/plugins.md (generated: python -m tools.plugin_docs) documents every hookspec."""
    import inspect

    from kvbridge import hookspecs
    from tools.plugin_docs import hook_reference

    page = (repo_root / "docs" / "plugins.md").read_text()
    hooks = [n for n in dir(hookspecs) if n.startswith("kvbridge_")]
    for name in hooks:
        fn = getattr(hookspecs, name)
        doc = inspect.cleandoc(fn.__doc__ or "")
        assert f"### {name}\n" in page, f"hook {name} is not on docs/plugins.md (regenerate it)"
        assert "Example::" in doc, f"hook {name} needs an example in its docstring"
        if name != "kvbridge_register_model_sources":  # the loader's hook states its types in prose
            sig = inspect.signature(fn)
            assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name
            assert sig.return_annotation is not inspect.Signature.empty, name
        assert doc.splitlines()[0].replace("``", "`") in page
    # the page's hook section is what the generator writes from the hookspecs today
    assert hook_reference() in page, "docs/plugins.md is stale: python -m tools.plugin_docs > docs/plugins.md"
