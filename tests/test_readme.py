"""The README's Python tour runs as written."""

from __future__ import annotations

import re


def test_readme_tour_runs(repo_root, capsys):
    text = (repo_root / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    tour = next(b for b in blocks if "kvbridge.extract" in b)
    exec(compile(tour, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()
