"""An experiment's help text, which is its module's docstring: read without importing the module, for `af1 --help`."""

from __future__ import annotations

import ast
import importlib.util


def command_help(doc: str | None, name: str) -> str:
    """An experiment's help: the first paragraph of its module's docstring, after `name: `."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split()).removeprefix(f"{name}: ")
    return text[:1].upper() + text[1:]


def builtin_help(name: str) -> str:
    """A built-in experiment's help, read from its module's source without importing it (or torch)."""
    spec = importlib.util.find_spec(f"af1.experiments.{name}")
    assert spec is not None and spec.origin is not None, name
    with open(spec.origin, encoding="utf-8") as source:
        return command_help(ast.get_docstring(ast.parse(source.read())), name)
