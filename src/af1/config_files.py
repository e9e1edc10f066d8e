"""Reading a YAML or TOML file (a study plan, a task file) into a mapping; a bad file is one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from af1.errors import Af1Error


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping a .yaml/.yml/.toml file holds; `what` names the file in errors ("plan", "task file")."""
    if not path.is_file():
        raise Af1Error(f"no such {what}: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif path.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # Python 3.10
                import tomli as tomllib

            data = tomllib.loads(text)
        else:
            raise Af1Error(f"{what} {path}: expected a .yaml, .yml or .toml file")
    except Af1Error:
        raise
    except Exception as exc:
        raise Af1Error(f"{what} {path} is not valid {path.suffix[1:].upper()}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise Af1Error(f"{what} {path}: expected a mapping of keys")
    return data
