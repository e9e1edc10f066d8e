"""Every shape suffix in af1's names uses only letters of the one legend (af1.shapes)."""

from __future__ import annotations

import re
from pathlib import Path

from af1.shapes import LEGEND

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)*_([0-9]*[A-Z][A-Za-z0-9]*)\b")


def test_every_shape_letter_is_in_the_legend():
    unknown = {}
    for path in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]:
        for match in SUFFIX.finditer(path.read_text()):
            letters = {c for c in match.group(1) if not c.isdigit()}
            if letters - set(LEGEND):
                unknown.setdefault(match.group(0), str(path.relative_to(ROOT)))
    assert not unknown, f"shape letters missing from af1.shapes.LEGEND: {unknown}"


def test_the_legend_names_each_letter_once():
    assert all(len(k) == 1 for k in LEGEND) and len(set(LEGEND.values())) == len(LEGEND)
