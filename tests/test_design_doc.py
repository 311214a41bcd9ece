"""docs/design.md's table of the files touched to add each kind of thing names real files."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table_rows(text: str) -> list[str]:
    start = text.index("## Adding things: the files you touch")
    section = text[start:].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| adding")]


def test_every_path_in_the_adding_table_exists():
    rows = _table_rows((ROOT / "docs" / "design.md").read_text())
    kinds = {row.split("|")[1].strip() for row in rows}
    assert {
        "model family",
        "fitter",
        "metric",
        "command",
        "model scheme (`name:REF`)",
        "steering method",
        "engine",
        "harness task",
    } <= kinds
    paths = [
        p
        for row in rows
        for p in re.findall(r"`([^`\s]+)`", row)
        if "/" in p and "<" not in p and p.split("/")[0] in ("src", "tests", "docs")
    ]
    assert len(paths) >= 15
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/design.md names files that do not exist: {missing}"


def test_the_layer_list_names_real_modules():
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Layers, and no import cycle") :].split("\n## ", 1)[0]
    names = [n for n in re.findall(r"`([a-z_/]+(?:\.py|/))`", section) if "*" not in n]
    pkg = ROOT / "src" / "kvbridge"
    missing = [n for n in names if not (ROOT / n if n.startswith("tests/") else pkg / n).exists()]
    assert not missing, f"the layer list names modules that do not exist: {missing}"
