"""The README's Python tour runs as written (its blocks share one namespace, in order)."""

from __future__ import annotations

import re


def test_readme_tour_runs(repo_root, capsys):
    text = (repo_root / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    tour = [b for b in blocks if "kvbridge.extract" in b]
    assert len(tour) >= 2
    namespace: dict = {}
    for block in tour:
        exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "True" in out  # the transferred state is marked approximate
